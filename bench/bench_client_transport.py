"""Benchmark: the client's own HTTP/1.1 transport against httpx's default, on the same gateway.

One gateway (SQLite files, ``--workers N``) and one Python client process: ``GatewayClient`` with
``transport="http11"`` (``clients/python/storage_gateway_client/_http11.py``, the default for
``http://``) and with ``transport="httpx"`` (httpcore + h11 + anyio), a key scoped to the
``bench`` namespace, kv get and a vector search (64 dimensions, 2,000 points) at concurrency 1
and 16 from one event loop, in alternating rounds (best of each kept). Columns: calls/s, p50 and
p99 ms, and the client's own CPU per call (``time.process_time``), which is what a transport
costs an agent process.

    .venv/bin/python bench/bench_client_transport.py [--seconds N] [--rounds N] [--workers N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "clients" / "python"))

from storage_gateway_client import GatewayClient  # noqa: E402
from tests.conftest import ADMIN_KEY, Backend, backend_env, run_cli, start_server, stop_server  # noqa: E402

NS, KEYS, POINTS, DIMS = "bench", 200, 2000, 64
TRANSPORTS = ("http11", "httpx")


def _vector(i: int) -> list[float]:
    return [((i * 7919 + d * 104729) % 1000) / 1000 for d in range(DIMS)]


async def setup(url: str) -> str:
    async with GatewayClient(url, NS, ADMIN_KEY) as admin:
        response = await admin._transport.request(  # the admin route has no client method
            "POST", "/v1/admin/keys", json={"namespace": NS, "scopes": ["kv:write", "vectors:write"]}
        )
        key: str = response.json()["key"]
        for i in range(KEYS):
            await admin.kv.set("settings", f"key-{i:04d}", {"n": i, "text": "hello " * 8})
        await admin.vectors.create_collection("docs", DIMS)
        for start in range(0, POINTS, 500):
            await admin.vectors.upsert_points(
                "docs", [_vector(i) for i in range(start, start + 500)], [{"n": i} for i in range(start, start + 500)]
            )
    return key


async def measure(call: Callable[[int], Awaitable[object]], concurrency: int, seconds: float) -> tuple[float, float, float, float]:
    """calls/s, p50 ms, p99 ms, client CPU µs per call."""
    for i in range(20):
        await call(i)
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        i = w * 1_000_000
        while (t0 := time.perf_counter()) < stop:
            await call(i)
            latencies.append(time.perf_counter() - t0)
            i += 1

    cpu0, start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    latencies.sort()
    return (len(latencies) / elapsed, statistics.median(latencies) * 1000,
            latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, cpu / len(latencies) * 1e6)


async def run(url: str, key: str, seconds: float, rounds: int) -> dict:
    results: dict[tuple[str, str, int], tuple[float, float, float, float]] = {}
    query = _vector(3)
    for _ in range(rounds):
        for op in ("kv get", "vector search"):
            for concurrency in (1, 16):
                for transport in TRANSPORTS:
                    async with GatewayClient(url, NS, key, transport=transport) as client:
                        if op == "kv get":
                            async def call(i: int, c: GatewayClient = client) -> object:
                                return await c.kv.get("settings", f"key-{i % KEYS:04d}")
                        else:
                            async def call(i: int, c: GatewayClient = client) -> object:
                                return await c.vectors.search("docs", query, 10)
                        cell = await measure(call, concurrency, seconds)
                    previous = results.get((transport, op, concurrency))
                    if previous is None or cell[0] > previous[0]:
                        results[(transport, op, concurrency)] = cell
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-transport-"))
    try:
        urls = {db: f"sqlite+aiosqlite:///{work}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
        backend = Backend("sqlite", backend_env(urls, work / "data"), urls)
        assert run_cli(backend, "migrate", GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY).returncode == 0
        server = start_server(backend, work / "gateway.log", "--workers", str(args.workers),
                              GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY, GATEWAY_LOG_LEVEL="warning")
        try:
            key = asyncio.run(setup(server.url))
            results = asyncio.run(run(server.url, key, args.seconds, args.rounds))
        finally:
            stop_server(server)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nclient transports: best of {args.rounds} alternating rounds of {args.seconds:g} s, gateway on SQLite, "
          f"workers: {args.workers}, {os.cpu_count()} CPUs, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"{'operation':<14} {'c':>2} | {'http11 calls/s':>14} {'p50':>6} {'p99':>6} {'µs/call':>7} | "
          f"{'httpx calls/s':>13} {'p50':>6} {'p99':>6} {'µs/call':>7} | {'x':>5}")
    for op in ("kv get", "vector search"):
        for c in (1, 16):
            a, b = results[("http11", op, c)], results[("httpx", op, c)]
            print(f"{op:<14} {c:>2} | {a[0]:>14.0f} {a[1]:>6.2f} {a[2]:>6.2f} {a[3]:>7.0f} | "
                  f"{b[0]:>13.0f} {b[1]:>6.2f} {b[2]:>6.2f} {b[3]:>7.0f} | {a[0] / b[0]:>5.2f}")
    print(json.dumps({f"{t} {o} c{c}": [round(v, 2) for v in cell] for (t, o, c), cell in results.items()}))


if __name__ == "__main__":
    main()
