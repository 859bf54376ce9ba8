"""Where a kv GET's time goes: the same read served by progressively fuller stacks.

One uvicorn worker each (uvloop, httptools, no access log), the same row of the same
PostgreSQL, the same statement, at concurrency 1 and 16:

1. raw ASGI + an asyncpg pool (no framework)
2. a FastAPI route + the asyncpg pool
3. a FastAPI route + a SQLAlchemy connection, statement on its asyncpg driver connection
4. a FastAPI route + SQLAlchemy ``execute``
5. as 4, with the connection from a FastAPI generator dependency (the gateway's pattern)
6. the gateway itself (auth, names, ETag, request id, metrics, access log)

The load comes from ``wrk`` when it is installed (a C load generator costs the shared CPUs
little), else from the minimal Python client of ``bench_kv_records.py``.

    .venv/bin/python bench/bench_http_floor.py [--seconds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_kv_records import ADMIN_KEY, HttpConnection, libpq_dsn, measure  # noqa: E402
from tests.conftest import (  # noqa: E402
    BIN, Backend, backend_env, create_postgres_databases, free_port, run_cli, start_server, stop_server,
)

BEARER = {"key": ADMIN_KEY}  # replaced by a namespace-scoped key once the gateway runs

NS, COLL, KEY = "bench", "settings", "key-00001"


def start_uvicorn(app: str, env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "uvicorn"), "--app-dir", str(ROOT / "bench"), app, "--port", str(port), "--loop", "uvloop",
         "--http", "httptools", "--no-access-log", "--log-level", "warning"],
        env={**os.environ, **env}, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/", timeout=1)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(log.read_text())


def with_wrk(url: str, concurrency: int, seconds: float) -> tuple[float, float, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--latency",
         "-H", f"Authorization: Bearer {BEARER['key']}", url],
        capture_output=True, text=True, check=True,
    ).stdout

    def ms(label: str) -> float:
        value, unit = re.search(rf"{label}\s+([\d.]+)(us|ms|s)", out).groups()
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), ms("50%"), ms("99%")


def with_python(url: str, concurrency: int, seconds: float) -> tuple[float, float, float]:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    path = "/" + url.removeprefix("http://").split("/", 1)[1]

    async def make(_w: int):  # noqa: ANN202
        conn = HttpConnection(host, int(port), BEARER["key"])
        await conn.open()
        return lambda _i: conn.request("GET", path)

    return asyncio.run(measure(make, concurrency, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--load", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python",
                        help="load generator (default: wrk when installed)")
    args = parser.parse_args()
    load = with_wrk if args.load == "wrk" else with_python
    import pgserver

    work = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    pg = pgserver.get_server(work / "pg", cleanup_mode="stop")
    procs: list[subprocess.Popen] = []
    gateway = None
    try:
        urls = create_postgres_databases(pg.get_uri(), f"floor_{uuid.uuid4().hex[:8]}")
        backend = Backend("postgres", backend_env(urls, work / "data"), urls)
        assert run_cli(backend, "migrate").returncode == 0
        gateway = start_server(backend, work / "gateway.log", "--workers", "1",
                               GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY, GATEWAY_LOG_LEVEL="warning")
        httpx.put(f"{gateway.url}/v1/{NS}/kv/{COLL}/{KEY}", json={"role": "user", "content": "hello world " * 4},
                  headers={"Authorization": f"Bearer {ADMIN_KEY}"}).raise_for_status()
        # Every row is loaded with a key for this namespace only, as each plugin runs.
        made = httpx.post(f"{gateway.url}/v1/admin/keys", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                          json={"namespace": NS, "scopes": ["kv:read"]})
        made.raise_for_status()
        BEARER["key"] = made.json()["key"]
        env = {"FLOOR_DSN": libpq_dsn(urls["metadata"])}
        raw, raw_url = start_uvicorn("_floor_apps:raw_asgi", env, work / "raw.log")
        fast, fast_url = start_uvicorn("_floor_apps:fastapi_app", env, work / "fastapi.log")
        procs += [raw, fast]
        tail = f"/{NS}/kv/{COLL}/{KEY}"
        stacks = [
            ("1 raw ASGI + asyncpg pool", f"{raw_url}/x{tail}"),
            ("2 FastAPI + asyncpg pool", f"{fast_url}/asyncpg{tail}"),
            ("3 + SQLAlchemy connection", f"{fast_url}/sa-driver{tail}"),
            ("4 + SQLAlchemy execute", f"{fast_url}/sa{tail}"),
            ("5 + generator dependency", f"{fast_url}/sa-dep{tail}"),
            ("6 the gateway", f"{gateway.url}/v1{tail}"),
        ]
        rows = []
        for name, url in stacks:
            assert httpx.get(url, headers={"Authorization": f"Bearer {BEARER['key']}"}).status_code == 200, url
            rows.append((name, load(url, 1, args.seconds), load(url, 16, args.seconds)))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        if gateway is not None:
            stop_server(gateway)
        pg.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nkv GET through fuller and fuller stacks: one worker, {os.cpu_count()} CPUs, "
          f"load from {'wrk' if load is with_wrk else 'the Python client'}, {args.seconds:.0f} s per cell")
    header = f"{'stack':<28} | {'c1 req/s':>9} {'p50 ms':>7} | {'c16 req/s':>9} {'p50 ms':>7} {'p99 ms':>7} | {'vs raw':>8}"
    print(header)
    print("-" * len(header))
    first = rows[0][2][0]
    for name, (r1, p1, _), (r16, p16, p99) in rows:
        print(f"{name:<28} | {r1:>9.0f} {p1:>7.2f} | {r16:>9.0f} {p16:>7.2f} {p99:>7.2f} | {r16 / first:>8.2f}")


if __name__ == "__main__":
    main()
