"""Benchmark: the cost of quota accounting on kv set and record upsert at concurrency 16 (or `--concurrency`).

Two gateways of one worker each on each backend, on databases of their own: one with quota
accounting on (the default; the bench namespace given a quota far above what it stores, so that
every write is counted and checked), one with ``quotas.accounting: false`` (no usage triggers).
They are measured in turns (on, off, on, off, ...; ``--rounds``), one at a time, with a
namespace-scoped key (``kv:write records:write`` on ``bench``), over keep-alive HTTP/1.1; each
cell is the median of its rounds, and the ratio the median of the rounds' on/off throughputs
(each round measures both, one right after the other, each first in turn).

    .venv/bin/python bench/bench_quotas.py [--seconds N] [--rounds N] [--concurrency N] [--no-postgres]

Target (issue 44): accounting costs under 5% (ratio >= 0.95) on both backends, for kv set and
record upsert; a batch of 100 records (all new rows) is shown for
information.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_kv_records import ADMIN_KEY, NS, VALUE_BYTES, HttpConnection, measure  # noqa: E402
from tests.conftest import Backend, Server, backend_env, create_postgres_databases, run_cli, start_server, stop_server  # noqa: E402

CONCURRENCY = 16


def ops() -> dict[str, Callable[[HttpConnection, int], Awaitable[None]]]:
    async def kv_set(c: HttpConnection, i: int) -> None:
        await c.request("PUT", f"/v1/{NS}/kv/settings/set-{i % 5000:05d}", VALUE_BYTES)

    async def record_upsert(c: HttpConnection, i: int) -> None:
        await c.request("PUT", f"/v1/{NS}/records/upserts/{i:020d}", VALUE_BYTES)

    batch = {"records": [{"key": f"{j:04d}", "value": json.loads(VALUE_BYTES)} for j in range(100)]}

    async def record_batch(c: HttpConnection, i: int) -> None:  # for information: a trigger call per row on SQLite
        await c.request("POST", f"/v1/{NS}/records/batch-{i}", json.dumps(batch).encode())

    return {"kv set": kv_set, "record upsert": record_upsert, "records batch (100)": record_batch}


async def prepare(url: str, quota: bool) -> str:
    host, port = url.removeprefix("http://").split(":")
    conn = HttpConnection(host, int(port))
    await conn.open()
    if quota:
        for cap in ("kv", "records"):
            body = json.dumps({"max_bytes": 10**12, "max_items": 10**9}).encode()
            await conn.request("PUT", f"/v1/admin/quotas/{NS}/{cap}", body)
    body = json.dumps({"namespace": NS, "scopes": ["kv:write", "records:write"], "description": "bench"}).encode()
    _, data = await conn.request("POST", "/v1/admin/keys", body)
    await conn.close()
    key: str = json.loads(data)["key"]
    return key


async def one_round(server: Server, key: str, seconds: float) -> dict[str, float]:
    host, port = server.url.removeprefix("http://").split(":")
    out = {}
    for name, op in ops().items():
        async def make(_w: int, op: Callable[[HttpConnection, int], Awaitable[None]] = op) -> Callable[[int], Awaitable[None]]:
            conn = HttpConnection(host, int(port), key)
            await conn.open()
            return lambda i: op(conn, i)

        out[name] = (await measure(make, CONCURRENCY, seconds))[0]
    return out


def start(backend: Backend, logs: Path, accounting: bool) -> Server:
    result = run_cli(backend, "migrate", GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY)
    if result.returncode != 0:
        raise SystemExit(result.stderr)
    label = "on" if accounting else "off"
    return start_server(
        backend, logs / f"gateway-{backend.name}-{label}.log", "--workers", "1", GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY,
        GATEWAY_LOG_LEVEL="warning", GATEWAY_QUOTAS__ACCOUNTING=str(accounting).lower(),
        # the harness warms each connection up in turn: a batch's warm-up outlasts the 5 s default
        GATEWAY_LIMITS__KEEP_ALIVE_SECONDS="120",
    )


def bench_backend(
    backends: dict[bool, Backend], logs: Path, seconds: float, rounds: int
) -> dict[str, tuple[float, float, float, float, float]]:
    """By operation: the median ops/s on and off, and the median, least and greatest of the
    rounds' on/off ratios (each round measures both, one right after the other)."""
    servers = {on: start(b, logs, on) for on, b in backends.items()}
    try:
        keys = {on: asyncio.run(prepare(s.url, quota=on)) for on, s in servers.items()}
        runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for n in range(rounds):
            for on in ((True, False) if n % 2 == 0 else (False, True)):  # each goes first in turn
                runs[on].append(asyncio.run(one_round(servers[on], keys[on], seconds)))
    finally:
        for s in servers.values():
            stop_server(s)
    out = {}
    for name in ops():
        ratios = sorted(a[name] / b[name] for a, b in zip(runs[True], runs[False], strict=True))
        out[name] = (
            statistics.median(r[name] for r in runs[True]), statistics.median(r[name] for r in runs[False]),
            statistics.median(ratios), ratios[0], ratios[-1],
        )
    return out


def main() -> None:
    global CONCURRENCY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per cell and round (default 2)")
    parser.add_argument("--rounds", type=int, default=9, help="turns of on and off (default 9)")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help=f"clients at once (default {CONCURRENCY})")
    args = parser.parse_args()
    CONCURRENCY = args.concurrency
    work = Path(tempfile.mkdtemp(prefix="bench-quotas-"))
    results: dict[str, dict[str, tuple[float, float, float, float, float]]] = {}
    pg = None
    try:
        sqlite = {}
        for on in (True, False):
            d = work / f"sqlite-{on}"
            urls = {db: f"sqlite+aiosqlite:///{d}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
            sqlite[on] = Backend("sqlite", backend_env(urls, d), urls)
        results["SQLite"] = bench_backend(sqlite, work, args.seconds, args.rounds)
        if not args.no_postgres:
            import pgserver

            pg = pgserver.get_server(work / "pg", cleanup_mode="stop")
            postgres = {}
            for on in (True, False):
                urls = create_postgres_databases(pg.get_uri(), f"bq_{uuid.uuid4().hex[:8]}")
                postgres[on] = Backend("postgres", backend_env(urls, work / f"pgdata-{on}"), urls)
            results["PostgreSQL"] = bench_backend(postgres, work, args.seconds, args.rounds)
    finally:
        if pg is not None:
            pg.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"quota accounting on vs off, concurrency {CONCURRENCY}, 1 worker, scoped key, "
          f"median of {args.rounds} rounds of {args.seconds:g} s ({when})\n")
    print("| backend | operation | on (ops/s) | off (ops/s) | on/off, median of rounds (least - greatest) |")
    print("|---|---|---:|---:|---:|")
    for backend, rows in results.items():
        for name, (on, off, ratio, least, most) in rows.items():
            print(f"| {backend} | {name} | {on:,.0f} | {off:,.0f} | {ratio:.3f} ({least:.2f} - {most:.2f}) |")


if __name__ == "__main__":
    main()
