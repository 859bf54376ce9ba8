"""Benchmark: what each fast path (``app.core.fast``) buys against the plain path, on the same routes.

For each backend (SQLite files, a throwaway pgserver PostgreSQL) one set of databases is served by
several gateway processes at once, each started with ``--workers N`` and one ``fast_paths``
setting: ``fast`` (every piece on, the default), one with each piece off (``no plans``, ``no
one_statement``, ``no inline_sqlite``; ``no one_statement`` also turns the inline path off, which
needs it) and ``plain`` (every piece off). The hot routes are loaded with a key scoped to the
``bench`` namespace, at concurrency 1 and 16, in alternating rounds (each configuration in turn,
cell by cell; the best round of each is kept), so that the machine's noise falls on all alike.

What each piece buys is read from one table: ``plans`` = fast / no plans; ``inline_sqlite`` =
fast / no inline_sqlite (SQLite); ``one_statement`` = fast / no one_statement on PostgreSQL, and
no inline_sqlite / no one_statement on SQLite (the driver path alone). A piece that buys less
than 15% on every hot route (throughput, p50 or p99, at c1 or c16) is removed
(``docs/architecture.md``, "Fast paths").

    .venv/bin/python bench/bench_fast_paths.py [--quick] [--seconds N] [--rounds N] [--workers N]
        [--backends sqlite,postgres] [--ops kv get,...] [--configs fast,plain,...] [--points N]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_kv_records import ADMIN_KEY, VALUE  # noqa: E402
from bench.bench_peers import Cell, PeerConnection, best, cell, spread  # noqa: E402
from tests.conftest import Backend, backend_env, create_postgres_databases, run_cli, start_server, stop_server  # noqa: E402

NS = "bench"
PRELOAD_KEYS, LIST_RECORDS, POINTS, DIMS, CHECKPOINTS = 200, 500, 2000, 64, 50
FILE_BYTES = os.urandom(1 << 20)
DOWNLOAD_FILES, UPLOAD_FILES_PER_WORKER, MAX_WORKERS = 8, 4, 16
OCTETS = "application/octet-stream"

CONFIGS: dict[str, dict[str, str]] = {
    "fast": {},
    "no plans": {"GATEWAY_FAST_PATHS__PLANS": "false"},
    "no one_statement": {"GATEWAY_FAST_PATHS__ONE_STATEMENT": "false"},
    "no inline_sqlite": {"GATEWAY_FAST_PATHS__INLINE_SQLITE": "false"},
    "plain": {f"GATEWAY_FAST_PATHS__{p}": "false" for p in ("PLANS", "ONE_STATEMENT", "INLINE_SQLITE")},
}
Op = Callable[[PeerConnection, int], Awaitable[None]]
WRITES = itertools.count()  # keys and checkpoint ids never written before, across configurations


def _vector(i: int) -> list[float]:
    return [((i * 7919 + d * 104729) % 1000) / 1000 for d in range(DIMS)]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _checkpoint(thread: str, n: int) -> dict:
    return {
        "thread_id": thread, "checkpoint_id": f"1ef{n:033d}", "checkpoint": {"type": "msgpack", "data": _b64(b"\x80" * 200)},
        "channel_versions": {"messages": f"{n:032d}.0"}, "metadata": {"source": "loop", "step": n},
        "blobs": [{"channel": "messages", "version": f"{n:032d}.0", "type": "msgpack", "data": _b64(b"m" * 300)}],
    }


def operations() -> dict[str, Op]:
    v1 = f"/v1/{NS}"
    value = json.dumps(VALUE, separators=(",", ":")).encode()
    search = json.dumps({"vector": _vector(3), "limit": 10}).encode()
    listing = json.dumps({"thread_id": "read", "limit": 10}).encode()

    async def kv_get(c: PeerConnection, i: int) -> None:
        await c.request("GET", f"{v1}/kv/settings/key-{i % PRELOAD_KEYS:05d}")

    async def kv_set(c: PeerConnection, i: int) -> None:
        await c.request("PUT", f"{v1}/kv/settings/key-{i % PRELOAD_KEYS:05d}", value)

    async def record_upsert(c: PeerConnection, i: int) -> None:
        await c.request("PUT", f"{v1}/records/upserts/{next(WRITES):020d}", value)

    async def record_get(c: PeerConnection, i: int) -> None:
        await c.request("GET", f"{v1}/records/history/{i % LIST_RECORDS:020d}")

    async def newest_50(c: PeerConnection, i: int) -> None:
        await c.request("GET", f"{v1}/records/history?order=desc&limit=50")

    async def vector_search(c: PeerConnection, i: int) -> None:
        await c.request("POST", f"{v1}/vectors/docs/search", search)

    async def checkpoint_put(c: PeerConnection, i: int) -> None:
        await c.request("POST", f"{v1}/checkpoints/put", json.dumps(_checkpoint(f"put-{c.slot}", next(WRITES))).encode())

    async def checkpoint_get(c: PeerConnection, i: int) -> None:
        await c.request("GET", f"{v1}/checkpoints/tuple?thread_id=read")

    async def checkpoint_search(c: PeerConnection, i: int) -> None:
        await c.request("POST", f"{v1}/checkpoints/search", listing)

    async def file_download(c: PeerConnection, i: int) -> None:
        while True:
            try:
                _, data = await c.request("GET", f"{v1}/files/blobs/dl-{i % DOWNLOAD_FILES}")
                break
            except RuntimeError as exc:  # 503 past files.max_downloads_per_namespace: retry shortly
                if ": 503 " not in str(exc):
                    raise
                await asyncio.sleep(0.01)
        assert len(data) == len(FILE_BYTES)

    async def file_upload(c: PeerConnection, i: int) -> None:
        await c.request("PUT", f"{v1}/files/blobs/up-{c.slot:02d}-{i % UPLOAD_FILES_PER_WORKER}", FILE_BYTES, OCTETS)

    return {
        "kv get": kv_get, "kv set": kv_set, "record upsert": record_upsert, "record get": record_get,
        "newest-50": newest_50, "vector search": vector_search, "checkpoint put": checkpoint_put,
        "checkpoint get": checkpoint_get, "checkpoint search": checkpoint_search,
        "file download 1MiB": file_download, "file upload 1MiB": file_upload,
    }


async def setup(host: str, port: int) -> str:
    """Preload the bench namespace; a key scoped to it."""
    conn = PeerConnection(host, port, ADMIN_KEY)
    await conn.open()
    scopes = [f"{c}:write" for c in ("kv", "records", "vectors", "checkpoints", "files")]
    _, data = await conn.request("POST", "/v1/admin/keys", json.dumps({"namespace": NS, "scopes": scopes}).encode())
    conn.key = key = json.loads(data)["key"]
    v1 = f"/v1/{NS}"
    value = json.dumps(VALUE).encode()
    await spread(host, port, key, [("PUT", f"{v1}/kv/settings/key-{i:05d}", value, "application/json") for i in range(PRELOAD_KEYS)])
    batch = {"records": [{"key": f"{i:020d}", "value": VALUE} for i in range(LIST_RECORDS)]}
    await conn.request("POST", f"{v1}/records/history", json.dumps(batch).encode())
    await conn.request("PUT", f"{v1}/vectors/docs", json.dumps({"vector_size": DIMS, "distance": "cosine"}).encode())
    for start in range(0, POINTS, 500):
        points = [{"id": f"p{i}", "vector": _vector(i), "payload": {"n": i}} for i in range(start, min(start + 500, POINTS))]
        await conn.request("POST", f"{v1}/vectors/docs/points", json.dumps({"points": points}).encode())
    for n in range(CHECKPOINTS):
        await conn.request("POST", f"{v1}/checkpoints/put", json.dumps(_checkpoint("read", n)).encode())
    await spread(host, port, key, [("PUT", f"{v1}/files/blobs/dl-{i}", FILE_BYTES, OCTETS) for i in range(DOWNLOAD_FILES)])
    await spread(host, port, key, [("PUT", f"{v1}/files/blobs/up-{w:02d}-{j}", FILE_BYTES, OCTETS)
                                   for w in range(MAX_WORKERS) for j in range(UPLOAD_FILES_PER_WORKER)])
    await conn.close()
    return key


async def run_rounds(gateways: dict[str, tuple[str, int, int]], key: str, ops: list[str], seconds: float, rounds: int) -> dict:
    results: dict[tuple[str, str, int], Cell] = {}
    table = operations()
    for round_no in range(rounds):
        for name in ops:
            for concurrency in (1, 16):
                for config, (host, port, pid) in gateways.items():
                    c = await cell(host, port, key, table[name], concurrency, seconds, pid)
                    results[(config, name, concurrency)] = best(results.get((config, name, concurrency)), c)
        print(f"round {round_no + 1}/{rounds} done", file=sys.stderr)
    return results


def bench_backend(backend: Backend, logs: Path, configs: list[str], ops: list[str], seconds: float, rounds: int, workers: int) -> dict:
    result = run_cli(backend, "migrate", GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY)
    if result.returncode != 0:
        raise SystemExit(result.stderr)
    servers = {}
    try:
        for config in configs:
            servers[config] = start_server(
                backend, logs / f"gateway-{backend.name}-{config.replace(' ', '_')}.log", "--workers", str(workers),
                GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY, GATEWAY_LOG_LEVEL="warning", **CONFIGS[config],
            )
        first = servers[configs[0]]
        host, port = first.url.removeprefix("http://").split(":")
        key = asyncio.run(setup(host, int(port)))
        gateways = {c: (*s.url.removeprefix("http://").split(":"), s.process.pid) for c, s in servers.items()}
        gateways = {c: (h, int(p), pid) for c, (h, p, pid) in gateways.items()}
        return asyncio.run(run_rounds(gateways, key, ops, seconds, rounds))
    finally:
        for server in servers.values():
            stop_server(server)


def print_table(backend: str, results: dict, configs: list[str], ops: list[str], seconds: float, rounds: int, workers: int) -> None:
    print(f"\n{backend}: best of {rounds} alternating rounds of {seconds:g} s per cell, gateway workers: {workers} "
          f"per configuration, {os.cpu_count()} CPUs, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; "
          "ops/s, p50/p99 ms, server CPU µs/op; x: ops/s relative to `fast`")
    header = f"{'operation':<19} {'c':>2} | " + " | ".join(f"{c:^31}" for c in configs)
    print(header)
    print("-" * len(header))
    for name in ops:
        for conc in (1, 16):
            base = results[(configs[0], name, conc)][0]
            cells = []
            for config in configs:
                ops_s, p50, p99, _client, server, _refused = results[(config, name, conc)]
                cells.append(f"{ops_s:>6.0f} {p50:>5.2f}/{p99:<6.2f} {server:>5.0f} x{ops_s / base:4.2f}")
            print(f"{name:<19} {conc:>2} | " + " | ".join(cells))


def main() -> None:
    global POINTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 0.5 s per cell")
    parser.add_argument("--seconds", type=float, default=1.5, help="seconds per cell and round (default 1.5)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds, best kept (default 2)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes of each gateway (default 1)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--ops", default=",".join(operations()), help="comma-separated operations (default: all)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configurations, `fast` first")
    parser.add_argument("--points", type=int, default=POINTS, help=f"points in the searched collection (default {POINTS})")
    args = parser.parse_args()
    POINTS = args.points
    seconds, rounds = (0.5, 1) if args.quick else (args.seconds, args.rounds)
    ops = [o.strip() for o in args.ops.split(",")]
    wanted = [c.strip() for c in args.configs.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-fast-"))
    try:
        for backend_name in args.backends.split(","):
            configs = [c for c in wanted if not (backend_name == "postgres" and c == "no inline_sqlite")]
            if backend_name == "sqlite":
                urls = {db: f"sqlite+aiosqlite:///{work}/sqlite/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
                backend = Backend("sqlite", backend_env(urls, work / "sqlite"), urls)
                results = bench_backend(backend, work, configs, ops, seconds, rounds, args.workers)
                print_table(backend_name, results, configs, ops, seconds, rounds, args.workers)
            else:
                import pgserver

                pg = pgserver.get_server(work / "pg", cleanup_mode="stop")
                # Several gateways at once, each pooling up to 16 connections per database.
                pg.psql("ALTER SYSTEM SET max_connections = 500;")
                pg.cleanup()
                pg = pgserver.get_server(work / "pg", cleanup_mode="stop")
                try:
                    urls = create_postgres_databases(pg.get_uri(), f"bench_{uuid.uuid4().hex[:8]}")
                    backend = Backend("postgres", backend_env(urls, work / "pgdata"), urls)
                    results = bench_backend(backend, work, configs, ops, seconds, rounds, args.workers)
                    print_table(backend_name, results, configs, ops, seconds, rounds, args.workers)
                finally:
                    pg.cleanup()
    finally:
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
