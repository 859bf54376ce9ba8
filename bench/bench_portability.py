"""Benchmark: namespace export and import (issue 47) per capability on both backends, and promote.

For each backend (SQLite; PostgreSQL from pgserver, files in the database) a gateway of one worker
is seeded through the API with ``--mib`` MiB (default 32) spread over one namespace per
capability (``bench_kv``: 1 KiB values; ``bench_records``: 1 KiB records; ``bench_files``: 1 MiB
files; ``bench_vectors``: 384-dimension points with a payload; ``bench_checkpoints``: 10 KiB
checkpoints). Each namespace is exported (``GET /v1/{ns}/export``, the client streaming it to a
file) and imported under another name (``POST /v1/{ns}/import``, streamed from the file) with a
key holding ``namespace:admin`` on ``bench_*`` only: items/s and MiB/s of the archive, and the
gateway's RSS growth during each (``/proc/<pid>/status`` VmRSS every 20 ms, peak minus the value
before). The CLI's ``export``/``import`` of the largest namespace give its peak RSS above an
export of an empty namespace.

Then ``storage-gateway promote`` of the SQLite deployment (the imported copies deleted first, with
``DELETE /v1/{ns}``) into fresh PostgreSQL databases is timed next to ``pg_dump -Fc | pg_restore``
of the promoted databases into fresh ones (pgserver's binaries): the floor a DBA would compare it
with. One measurement each (a shared 2-core machine: the load average is printed).

    .venv/bin/python bench/bench_portability.py [--mib 32] [--backends sqlite,postgres] [--no-promote]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "clients" / "python"))

import httpx  # noqa: E402

from storage_gateway_client import GatewayClient  # noqa: E402
from tests.conftest import (  # noqa: E402
    BIN,
    Backend,
    Server,
    backend_env,
    create_postgres_databases,
    gateway_env,
    run_cli,
    start_server,
    stop_server,
)

ADMIN_KEY = os.environ.setdefault("GATEWAY_TEST_ADMIN_KEY", "bench-admin-" + uuid.uuid4().hex)
MiB = 1024 * 1024
DIM = 384
CAPS = ("kv", "records", "files", "vectors", "checkpoints")
SHARE = {"kv": 0.1, "records": 0.1, "files": 0.5, "vectors": 0.25, "checkpoints": 0.05}


class Rss:
    """Peak VmRSS of a process above its value at the start, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = self.peak = self.read() or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> int | None:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            value = self.read()
            if value is None:
                return
            self.peak = max(self.peak, value)

    def __enter__(self) -> Rss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.start) / MiB


async def seed(url: str, mib: float) -> dict[str, int]:
    """Each capability's share of ``mib`` in its namespace; the items written by capability."""
    rnd = os.urandom
    out: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=url, timeout=120, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
        async def ok(r: Any) -> None:
            response = await r
            assert response.status_code < 300, response.text

        n = int(SHARE["kv"] * mib * 1024)
        for start in range(0, n, 500):
            items = [{"key": f"k{i:08d}", "value": base64.b64encode(rnd(750)).decode()} for i in range(start, min(n, start + 500))]
            await ok(http.post("/v1/bench_kv/kv/settings", json={"items": items}))
        out["kv"] = n
        n = int(SHARE["records"] * mib * 1024)
        for start in range(0, n, 500):
            records = [{"key": f"{i:016d}", "value": {"text": base64.b64encode(rnd(750)).decode()}} for i in range(start, min(n, start + 500))]
            await ok(http.post("/v1/bench_records/records/history", json={"records": records}))
        out["records"] = n
        n = max(1, int(SHARE["files"] * mib))
        for i in range(n):
            await ok(http.put(f"/v1/bench_files/files/blobs/f{i:05d}", content=rnd(MiB)))
        out["files"] = n
        n = int(SHARE["vectors"] * mib * MiB / (DIM * 4 + 64))
        await ok(http.put("/v1/bench_vectors/vectors/docs", json={
            "vector_size": DIM, "distance": "cosine", "payload_indexes": [{"field": "user", "kind": "keyword"}],
        }))
        import random

        r = random.Random(47)
        for start in range(0, n, 250):
            points = [{"id": f"p{i}", "vector": [r.random() for _ in range(DIM)], "payload": {"user": f"u{i % 50}", "n": i}}
                      for i in range(start, min(n, start + 250))]
            await ok(http.post("/v1/bench_vectors/vectors/docs/points", json={"points": points}))
        out["vectors"] = n
        n = max(1, int(SHARE["checkpoints"] * mib * 1024 / 10))
        for i in range(n):
            data = base64.b64encode(rnd(10 * 1024)).decode()
            await ok(http.post("/v1/bench_checkpoints/checkpoints/put", json={
                "thread_id": f"t{i // 5}", "checkpoint_id": f"c{i % 5:04d}",
                "checkpoint": {"type": "bytes", "data": data}, "channel_versions": {}, "metadata": {"step": i % 5},
            }))
        out["checkpoints"] = n
    return out


async def scoped_key(url: str) -> str:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
        r = await http.post("/v1/admin/keys", json={"namespace": "bench_*", "scopes": ["namespace:admin"], "description": "bench"})
        assert r.status_code == 201, r.text
        return str(r.json()["key"])


async def round_trip(server: Server, key: str, cap: str, work: Path) -> dict[str, Any]:
    ns = f"bench_{cap}"
    path = work / f"{server.backend.name}-{cap}.tar"
    async with GatewayClient(server.url, ns, key) as gw:
        with Rss(server.process.pid) as rss_out:
            t = time.perf_counter()
            size = await gw.export_namespace(path)
            export_s = time.perf_counter() - t
        with Rss(server.process.pid) as rss_in:
            t = time.perf_counter()
            report = await gw.import_namespace(path, namespace=f"{ns}_in")
            import_s = time.perf_counter() - t
    items = sum(n for part, n in report["loaded"].get(cap, {}).items() if part != "blobs")
    return {"cap": cap, "items": items, "mib": size / MiB, "export_s": export_s, "import_s": import_s,
            "rss_export": rss_out.growth_mib, "rss_import": rss_in.growth_mib}


def cli_peak(backend: Backend, *args: str) -> float:
    """Peak RSS (MiB) of a CLI run."""
    process = subprocess.Popen([str(BIN / "storage-gateway"), *args], env=gateway_env(backend, GATEWAY_LOG_LEVEL="warning"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with Rss(process.pid) as rss:
        process.wait()
    assert process.returncode == 0, args
    return rss.peak / MiB


def bench_backend(backend: Backend, mib: float, work: Path, logs: Path) -> tuple[list[dict[str, Any]], dict[str, float], Server]:
    assert run_cli(backend, "migrate").returncode == 0
    server = start_server(backend, logs / f"gateway-{backend.name}.log", "--workers", "1", GATEWAY_LOG_LEVEL="warning")
    t = time.perf_counter()
    seeded = asyncio.run(seed(server.url, mib))
    print(f"# {backend.name}: seeded {seeded} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    key = asyncio.run(scoped_key(server.url))
    rows = [asyncio.run(round_trip(server, key, cap, work)) for cap in CAPS]
    out = work / f"{backend.name}-cli.tar"
    base = cli_peak(backend, "export", "bench_empty", "-o", str(work / "empty.tar"))
    cli = {
        "export": cli_peak(backend, "export", "bench_files", "-o", str(out)) - base,
        "import": cli_peak(backend, "import", "bench_files_cli", str(out)) - base,
    }
    return rows, cli, server


def pg_dump_restore(base_url: str, urls: dict[str, str]) -> float:
    """Seconds of ``pg_dump -Fc | pg_restore`` of the three databases into fresh ones."""
    import pgserver
    from sqlalchemy.engine import make_url

    bin_dir = Path(pgserver.__file__).parent / "pginstall" / "bin"
    fresh = create_postgres_databases(base_url, f"bpr_{uuid.uuid4().hex[:6]}")
    t = time.perf_counter()
    for db, url in urls.items():
        u, v = make_url(url), make_url(fresh[db])
        host = u.query.get("host") or u.host
        common = ["-h", str(host), "-U", u.username or "postgres"]
        if u.port:
            common += ["-p", str(u.port)]
        dump = subprocess.Popen([str(bin_dir / "pg_dump"), "-Fc", *common, str(u.database)], stdout=subprocess.PIPE)
        restore = subprocess.run([str(bin_dir / "pg_restore"), *common, "-d", str(v.database)], stdin=dump.stdout,
                                 capture_output=True, text=True)
        dump.wait()
        assert dump.returncode == 0 and restore.returncode == 0, restore.stderr[-2000:]
    return time.perf_counter() - t


def promote(sqlite: Backend, server: Server, base_url: str, work: Path) -> dict[str, float]:
    async def drop_copies() -> None:
        async with GatewayClient(server.url, "bench_kv", ADMIN_KEY) as gw:
            for cap in CAPS:
                await gw.delete_namespace(namespace=f"bench_{cap}_in")
            await gw.delete_namespace(namespace="bench_files_cli")

    asyncio.run(drop_copies())
    stop_server(server)
    data = Path(sqlite.env["GATEWAY_DATA_DIR"])
    size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file() and ".db" in f.name) / MiB
    urls = create_postgres_databases(base_url, f"bpm_{uuid.uuid4().hex[:6]}")
    to = work / "target.yaml"
    to.write_text(json.dumps({"databases": {db: {"url": u} for db, u in urls.items()}}))
    process = subprocess.Popen([str(BIN / "storage-gateway"), "promote", "--to", str(to)],
                               env=gateway_env(sqlite, GATEWAY_LOG_LEVEL="warning"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    t = time.perf_counter()
    with Rss(process.pid) as rss:
        out, _ = process.communicate()
    seconds = time.perf_counter() - t
    assert process.returncode == 0, out
    return {"sqlite_mib": size, "promote_s": seconds, "promote_rss": rss.peak / MiB, "pg_dump_restore_s": pg_dump_restore(base_url, urls)}


def table(results: dict[str, list[dict[str, Any]]], cli: dict[str, dict[str, float]]) -> str:
    lines = [
        "| backend | capability | items | archive MiB | export items/s | export MiB/s | import items/s | import MiB/s "
        "| gateway RSS growth export / import (MiB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rows in results.items():
        for r in rows:
            lines.append(
                f"| {name} | {r['cap']} | {r['items']:,} | {r['mib']:.1f} | {r['items'] / r['export_s']:,.0f} | "
                f"{r['mib'] / r['export_s']:.1f} | {r['items'] / r['import_s']:,.0f} | {r['mib'] / r['import_s']:.1f} | "
                f"{r['rss_export']:.1f} / {r['rss_import']:.1f} |"
            )
    for name, c in cli.items():
        lines.append(f"\nCLI on {name}, files namespace: peak RSS above an empty export: export {c['export']:.1f} MiB, import {c['import']:.1f} MiB")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=32, help="data per backend, MiB (default 32)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--no-promote", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-port-"))
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average {os.getloadavg()}, one gateway worker, --mib {args.mib}")
    import pgserver

    pg = pgserver.get_server(work / "pg", cleanup_mode="stop")
    base_url = pg.get_uri()
    results: dict[str, list[dict[str, Any]]] = {}
    cli: dict[str, dict[str, float]] = {}
    sqlite_run: tuple[Backend, Server] | None = None
    try:
        for name in args.backends.split(","):
            d = work / name
            d.mkdir()
            if name == "sqlite":
                urls = {db: f"sqlite+aiosqlite:///{d}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
            else:
                urls = create_postgres_databases(base_url, f"bp_{uuid.uuid4().hex[:6]}")
            backend = Backend(name, {**backend_env(urls, d), "GATEWAY_FILES__BACKEND": "database"}, urls)
            rows, cli[name], server = bench_backend(backend, args.mib, work, work)
            results[name] = rows
            if name == "sqlite" and not args.no_promote:
                sqlite_run = (backend, server)
            else:
                stop_server(server)
        print(table(results, cli))
        if sqlite_run is not None:
            p = promote(*sqlite_run, base_url, work)
            print(f"\npromote of the SQLite deployment ({p['sqlite_mib']:.0f} MiB of SQLite files and WALs, the imported copies deleted): {p['promote_s']:.1f} s "
                  f"(CLI peak RSS {p['promote_rss']:.0f} MiB); pg_dump -Fc | pg_restore of the promoted databases: "
                  f"{p['pg_dump_restore_s']:.1f} s; ratio {p['promote_s'] / p['pg_dump_restore_s']:.1f}x")
        print(f"# load average at the end {os.getloadavg()}")
    finally:
        pg.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
