"""Benchmark: LangGraph checkpoints through the gateway next to LangGraph's own savers.

Per step a graph saves a checkpoint and its task's writes (``aput`` + ``aput_writes``); reads are
``aget_tuple`` (the newest) and ``alist(limit=10)``, each at concurrency 1 and 8. Three savers on
the same state: ``GatewayCheckpointSaver`` through the gateway over HTTP (one uvicorn worker,
PostgreSQL backend, a namespace-scoped key), LangGraph's ``AsyncPostgresSaver`` connected
directly to the same PostgreSQL (a pool of 8 connections), and ``AsyncSqliteSaver`` on a local
file, measured one after another within each cell (the machines are shared: drift in their load
falls on all three alike). Then the bytes each stores per 100-step thread: what five such threads add to the tables
and indexes (after ``VACUUM FULL``; for SQLite, the file's pages in use), divided by five.

    .venv/bin/python bench/bench_checkpoints.py [--seconds N]

Targets (issue 15): at concurrency 8 the gateway reaches >= 0.5x AsyncPostgresSaver's
throughput, and stores no more bytes per thread than it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint  # noqa: E402
from langgraph.checkpoint.base.id import uuid6  # noqa: E402

from storage_gateway_client import GatewayClient  # noqa: E402
from tests.conftest import Backend, backend_env, create_postgres_databases, run_cli, start_server, stop_server  # noqa: E402

ADMIN_KEY = "bench-admin-key-" + uuid.uuid4().hex
NS = "bench_checkpoints"
STEPS = 100  # steps per thread
BYTES_THREADS = 5
CHANNELS = ("messages", "step", "branch:to:agent")


def message(thread: str, i: int) -> dict[str, Any]:
    return {"role": "assistant" if i % 2 else "user", "id": f"{thread}-{i}", "content": f"message {i} " + "lorem ipsum " * 16}


class Thread:
    """One graph run's checkpoints: a message list that grows by one message per step."""

    def __init__(self, saver: BaseCheckpointSaver) -> None:
        self.saver = saver
        self.id = uuid.uuid4().hex
        self.config: dict[str, Any] = {"configurable": {"thread_id": self.id, "checkpoint_ns": ""}}
        self.versions: dict[str, Any] = {}
        self.messages: list[dict[str, Any]] = []
        self.step = 0

    async def advance(self) -> None:
        """``aput`` the next checkpoint, then ``aput_writes`` its task's writes."""
        i = self.step
        new = message(self.id, i)
        self.messages = [*self.messages, new]
        seen = dict(self.versions)
        new_versions = {ch: self.saver.get_next_version(self.versions.get(ch), None) for ch in CHANNELS}
        self.versions.update(new_versions)
        checkpoint = Checkpoint(
            v=4, id=str(uuid6(clock_seq=i)), ts=datetime.now(timezone.utc).isoformat(),
            channel_values={"messages": self.messages, "step": i, "branch:to:agent": None},
            channel_versions=dict(self.versions), versions_seen={"agent": seen, "__input__": {}},
            updated_channels=list(CHANNELS),
        )
        metadata = {"source": "loop", "step": i, "parents": {}, "run_id": self.id}
        self.config = await self.saver.aput(self.config, checkpoint, metadata, new_versions)
        await self.saver.aput_writes(self.config, [("messages", [new]), ("step", i + 1)], str(uuid.uuid4()), "~__pregel_pull, agent")
        self.step += 1


# --- measuring ---------------------------------------------------------------------------------


async def measure(ops: list[Callable[[], Awaitable[None]]], seconds: float) -> tuple[float, float, float]:
    """ops/s, p50 ms, p99 ms of each worker's ``op`` run in a loop for ``seconds``."""
    for op in ops:
        for _ in range(5):
            await op()
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    start = time.perf_counter()

    async def run(op: Callable[[], Awaitable[None]]) -> None:
        perf = time.perf_counter
        while perf() < stop:
            t0 = perf()
            await op()
            latencies.append(perf() - t0)

    await asyncio.gather(*(run(op) for op in ops))
    elapsed = time.perf_counter() - start
    latencies.sort()
    return len(latencies) / elapsed, statistics.median(latencies) * 1000, latencies[int(len(latencies) * 0.99)] * 1000


async def bench_savers(savers: dict[str, tuple[BaseCheckpointSaver, Callable[[], Awaitable[int]]]], seconds: float) -> dict[str, dict[Any, Any]]:
    """Every cell for every saver, the savers one after another within each cell, so that the
    load of a shared machine drifting during the run falls on all of them alike."""
    out: dict[str, dict[Any, Any]] = {name: {} for name in savers}
    threads: dict[str, list[str]] = {}
    for name, (saver, size) in savers.items():
        # bytes: what BYTES_THREADS complete threads add to the store
        empty = await size()
        written = [Thread(saver) for _ in range(BYTES_THREADS)]
        for t in written:
            for _ in range(STEPS):
                await t.advance()
        out[name]["bytes"] = (await size() - empty) / BYTES_THREADS
        threads[name] = [t.id for t in written]

    def writer(saver: BaseCheckpointSaver) -> Callable[[], Awaitable[None]]:
        state = {"thread": Thread(saver)}

        async def op() -> None:
            if state["thread"].step >= STEPS:
                state["thread"] = Thread(saver)
            await state["thread"].advance()
        return op

    def get_tuple(saver: BaseCheckpointSaver, ids: list[str]) -> Callable[[], Awaitable[None]]:
        async def op() -> None:
            tup = await saver.aget_tuple({"configurable": {"thread_id": random.choice(ids), "checkpoint_ns": ""}})
            assert tup is not None and len(tup.checkpoint["channel_values"]["messages"]) == STEPS
        return op

    def list10(saver: BaseCheckpointSaver, ids: list[str]) -> Callable[[], Awaitable[None]]:
        async def op() -> None:
            config = {"configurable": {"thread_id": random.choice(ids), "checkpoint_ns": ""}}
            assert len([t async for t in saver.alist(config, limit=10)]) == 10
        return op

    for conc in (1, 8):
        for label, make in (
            ("aput + aput_writes", lambda saver, ids: writer(saver)),
            ("aget_tuple", get_tuple),
            ("alist(limit=10)", list10),
        ):
            for name, (saver, _size) in savers.items():
                out[name][(label, conc)] = await measure([make(saver, threads[name]) for _ in range(conc)], seconds)
    return out


# --- the three savers --------------------------------------------------------------------------


async def pg_size(dsn: str, tables: list[str]) -> int:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        for table in tables:
            await conn.execute(f'VACUUM FULL "{table}"')
        return sum([await conn.fetchval("SELECT pg_total_relation_size($1::regclass)", f'"{t}"') for t in tables])
    finally:
        await conn.close()


GATEWAY_TABLES = ["checkpoint_threads", "checkpoint_retention", "checkpoints", "checkpoint_blobs",
                  "checkpoint_writes", "checkpoint_metadata_terms"]
POSTGRES_TABLES = ["checkpoint_migrations", "checkpoints", "checkpoint_blobs", "checkpoint_writes"]


@asynccontextmanager
async def gateway_saver(url: str, dsn: str) -> AsyncIterator[tuple[BaseCheckpointSaver, Callable[[], Awaitable[int]]]]:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        r = await admin.post("/v1/admin/keys", json={"namespace": NS, "scopes": ["checkpoints:write"]})
        r.raise_for_status()
        key = r.json()["key"]
    async with GatewayClient(url, namespace=NS, api_key=key) as gw:
        yield gw.checkpointer(), lambda: pg_size(dsn, GATEWAY_TABLES)


@asynccontextmanager
async def postgres_saver(dsn: str) -> AsyncIterator[tuple[BaseCheckpointSaver, Callable[[], Awaitable[int]]]]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    async with AsyncConnectionPool(dsn, min_size=8, max_size=8, open=False,
                                   kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        yield saver, lambda: pg_size(dsn, POSTGRES_TABLES)


@asynccontextmanager
async def sqlite_saver(path: Path) -> AsyncIterator[tuple[BaseCheckpointSaver, Callable[[], Awaitable[int]]]]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        await saver.setup()

        async def size() -> int:  # the pages in use (the file less its free list)
            async def pragma(name: str) -> int:
                async with saver.conn.execute(f"PRAGMA {name}") as cur:
                    return (await cur.fetchone())[0]
            return (await pragma("page_count") - await pragma("freelist_count")) * await pragma("page_size")
        yield saver, size


def libpq(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def run_all(gateway_url: str, gateway_dsn: str, postgres_dsn: str, sqlite_path: Path, seconds: float) -> dict[str, dict[Any, Any]]:
    async with (
        gateway_saver(gateway_url, gateway_dsn) as gw,
        postgres_saver(postgres_dsn) as pg,
        sqlite_saver(sqlite_path) as sq,
    ):
        return await bench_savers({"gateway (pg)": gw, "AsyncPostgresSaver": pg, "AsyncSqliteSaver": sq}, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per cell (default 3)")
    args = parser.parse_args()

    import pgserver

    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    pg = pgserver.get_server(work / "pg", cleanup_mode="stop")
    try:
        urls = create_postgres_databases(pg.get_uri(), f"benchgw_{uuid.uuid4().hex[:8]}")
        backend = Backend("postgres", backend_env(urls, work / "data"), urls)
        result = run_cli(backend, "migrate", GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY)
        if result.returncode != 0:
            raise SystemExit(result.stderr)
        server = start_server(backend, work / "gateway.log", "--workers", "1",
                              GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY, GATEWAY_LOG_LEVEL="warning")
        direct = create_postgres_databases(pg.get_uri(), f"benchpg_{uuid.uuid4().hex[:8]}")["checkpoints"]
        (work / "sqlite").mkdir()
        try:
            results = asyncio.run(run_all(
                server.url, libpq(urls["checkpoints"]), libpq(direct), work / "sqlite" / "checkpoints.db", args.seconds
            ))
        finally:
            stop_server(server)
    finally:
        pg.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    print_table(results, args.seconds)


def print_table(results: dict[str, dict[str, Any]], seconds: float) -> None:
    names = list(results)
    print(f"\ncheckpoints benchmark: {seconds:g} s per cell, {STEPS}-step threads, one gateway worker, {os.cpu_count()} CPUs")
    header = f"{'operation':<20} {'conc':>4} | " + " | ".join(f"{n + ' ops/s':>24} {'p50 ms':>7}" for n in names) + " | gw/pg"
    print(header)
    print("-" * len(header))
    gw, pgs = results["gateway (pg)"], results["AsyncPostgresSaver"]
    for key in [k for k in gw if isinstance(k, tuple)]:
        cells = " | ".join(f"{results[n][key][0]:>24.0f} {results[n][key][1]:>7.2f}" for n in names)
        print(f"{key[0]:<20} {key[1]:>4} | {cells} | {gw[key][0] / pgs[key][0]:>5.2f}")
    print("bytes per 100-step thread: " + ", ".join(f"{n} {results[n]['bytes'] / 1024:,.1f} KiB" for n in names))
    c8 = [gw[k][0] / pgs[k][0] for k in gw if isinstance(k, tuple) and k[1] == 8]
    ratio = gw["bytes"] / pgs["bytes"]
    print(f"target c8 ratio >= 0.5: min {min(c8):.2f} {'OK' if min(c8) >= 0.5 else 'MISSED'}; "
          f"target bytes <= AsyncPostgresSaver: {ratio:.2f}x {'OK' if ratio <= 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
