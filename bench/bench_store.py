"""Benchmark: LangGraph long-term memory through the gateway next to LangGraph's own stores.

Four stores on the same items (one 384-dimension vector each, clustered; a small JSON value with a
`group` field): ``GatewayStore`` through the gateway over HTTP on PostgreSQL (one uvicorn worker, a
namespace-scoped key), LangGraph's ``AsyncPostgresStore`` connected directly to the same PostgreSQL
(a pool of 16 connections, its HNSW index, cosine), ``GatewayStore`` on the embedded SQLite
default, and ``AsyncSqliteStore`` on a local file. Each is loaded with the same N items through
its batch API (1,000 puts a call, 4 calls at a time; the vectors precomputed, the embedding
function a lookup), its HNSW index built after the load (the gateway's once the last item is in;
AsyncPostgresStore's dropped before and built again after, as a bulk load does), then each cell runs for a few seconds per store, the stores one after another
within a cell (drift in a shared machine's load falls on all alike): ``aput`` of new items,
``aget`` of a random item, ``asearch`` with a filter and no query, ``asearch`` with a query (the
embedding of a random item's neighbour), at concurrency 1 and 16 (16 tasks on one store object:
``AsyncBatchedBaseStore`` batches a tick's operations for every store alike). Recall@10 of the
query search is measured against the exact cosine top 10 (numpy) over 50 queries.

    .venv/bin/python bench/bench_store.py [--items 10000 100000] [--seconds N]

Targets (issue 45): on PostgreSQL the gateway reaches >= 0.5x AsyncPostgresStore's throughput in
every cell, and at least its recall@10.
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
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import app  # noqa: E402,F401  (first: a sqlite3 that can load extensions, for AsyncSqliteStore's sqlite-vec too)
from langgraph.store.base import BaseStore, PutOp  # noqa: E402

from storage_gateway_client import GatewayClient  # noqa: E402
from tests.conftest import Backend, backend_env, create_postgres_databases, run_cli, start_server, stop_server  # noqa: E402

ADMIN_KEY = "bench-admin-key-" + uuid.uuid4().hex
NS = "bench_store"
DIMS = 384
CLUSTERS = 100
LOAD_BATCH = 1000  # puts per batch call while loading (GatewayStore sends them 500 a request)
LOAD_CALLS = 4  # batch calls at a time while loading
QUERIES = 50
PREFIX = ("users", "u1", "memories")


class Corpus:
    """Items and their embeddings; the embedding function every store is given looks texts up."""

    def __init__(self, n: int, seed: int = 45) -> None:
        rng = np.random.default_rng(seed)
        centres = rng.normal(size=(CLUSTERS, DIMS)).astype(np.float32)
        self.vectors = (centres[rng.integers(0, CLUSTERS, size=n)] + 0.6 * rng.normal(size=(n, DIMS))).astype(np.float32)
        self.unit = self.vectors / np.linalg.norm(self.vectors, axis=1, keepdims=True)
        self.n = n
        self.extra: dict[str, list[float]] = {}
        self.queries = [(self.vectors[i] + 0.3 * rng.normal(size=DIMS)).astype(np.float32) for i in rng.integers(0, n, QUERIES)]
        for j, q in enumerate(self.queries):
            self.extra[f"query {j}"] = q.tolist()

    def text(self, i: int) -> str:
        return f"memory {i}"

    def value(self, i: int) -> dict[str, Any]:
        return {"text": self.text(i), "group": i % 10, "kind": "note"}

    def embed(self, texts: list[str]) -> list[list[float]]:
        out = []
        for t in texts:
            if t.startswith("memory "):
                out.append(self.vectors[int(t.split()[1])].tolist())
            else:
                out.append(self.extra[t])
        return out

    def exact_top(self, q: np.ndarray, k: int = 10) -> list[str]:
        scores = self.unit @ (q / np.linalg.norm(q))
        return [f"k{i}" for i in np.argsort(-scores)[:k]]


async def measure(ops: list[Callable[[], Awaitable[None]]], seconds: float) -> tuple[float, float]:
    """ops/s and p50 ms of each task's ``op`` run in a loop for ``seconds`` (after one round of all)."""
    await asyncio.gather(*(op() for op in ops))
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
    return len(latencies) / elapsed, statistics.median(latencies) * 1000


async def load(store: BaseStore, corpus: Corpus) -> float:
    """Put every item through the store's batch API, ``LOAD_BATCH`` puts a call and
    ``LOAD_CALLS`` calls at a time; items/s."""
    started = time.perf_counter()
    gate = asyncio.Semaphore(LOAD_CALLS)

    async def put(start: int) -> None:
        async with gate:
            await store.abatch([PutOp(PREFIX, f"k{i}", corpus.value(i)) for i in range(start, min(corpus.n, start + LOAD_BATCH))])

    await asyncio.gather(*(put(start) for start in range(0, corpus.n, LOAD_BATCH)))
    return corpus.n / (time.perf_counter() - started)


async def recall(store: BaseStore, corpus: Corpus) -> float:
    hits = 0
    for j, q in enumerate(corpus.queries):
        found = [item.key for item in await store.asearch(PREFIX, query=f"query {j}", limit=10)]
        hits += len(set(found) & set(corpus.exact_top(q)))
    return hits / (10 * len(corpus.queries))


async def bench(stores: dict[str, BaseStore], corpus: Corpus, seconds: float) -> dict[str, dict[Any, Any]]:
    out: dict[str, dict[Any, Any]] = {name: {} for name in stores}
    for name, store in stores.items():
        before, after = LOADING.get(name, (None, None))
        if before is not None:
            await before()
        out[name]["load/s"] = await load(store, corpus)
        started = time.perf_counter()
        if after is not None:
            await after()
        await ready(name, store)
        out[name]["index s"] = time.perf_counter() - started
        print(f"{name}: {corpus.n:,} items loaded at {out[name]['load/s']:,.0f}/s, index ready "
              f"{out[name]['index s']:.0f} s later", flush=True)
    if SETTLE:
        waited = await settled(SETTLE[-1])
        print(f"autovacuum after the loads: done {waited:.0f} s later", flush=True)
    for name, store in stores.items():
        out[name]["recall@10"] = await recall(store, corpus)

    def putter(store: BaseStore) -> Callable[[], Awaitable[None]]:
        async def op() -> None:
            i = random.randrange(corpus.n)
            await store.aput(PREFIX, f"new-{uuid.uuid4().hex}", corpus.value(i))
        return op

    def getter(store: BaseStore) -> Callable[[], Awaitable[None]]:
        async def op() -> None:
            i = random.randrange(corpus.n)
            assert (await store.aget(PREFIX, f"k{i}")) is not None
        return op

    def filtered(store: BaseStore) -> Callable[[], Awaitable[None]]:
        async def op() -> None:
            assert len(await store.asearch(PREFIX, filter={"group": random.randrange(10)}, limit=10)) == 10
        return op

    def queried(store: BaseStore) -> Callable[[], Awaitable[None]]:
        async def op() -> None:
            assert len(await store.asearch(PREFIX, query=f"query {random.randrange(QUERIES)}", limit=10)) == 10
        return op

    for conc in (1, 16):
        for label, make in (("get", getter), ("search (filter)", filtered), ("search (query)", queried), ("put", putter)):
            for name, store in stores.items():
                out[name][(label, conc)] = await measure([make(store) for _ in range(conc)], seconds)
    return out


READY: dict[str, Callable[[], Awaitable[bool]]] = {}
LOADING: dict[str, tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]] = {}
"""What runs before and after a store's load (AsyncPostgresStore's HNSW index is dropped and built
again, as a bulk load does; the gateway builds its own once the last item is in)."""


async def ready(name: str, store: BaseStore) -> None:
    """Wait until a store's ANN index is built (the gateway builds it in the background)."""
    check = READY.get(name)
    deadline = time.monotonic() + 900
    while check is not None and not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: no HNSW index after 15 minutes")
        await asyncio.sleep(1)


def reindexed(dsn: str) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """Drop AsyncPostgresStore's HNSW index before a bulk load, build it again (as ``setup``
    defines it, with the gateway's ``maintenance_work_mem``) and analyze after it."""
    import asyncpg

    definition: list[str] = []

    async def before() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            definition.append(await conn.fetchval("SELECT pg_get_indexdef('store_vectors_embedding_idx'::regclass)"))
            await conn.execute("DROP INDEX store_vectors_embedding_idx")
        finally:
            await conn.close()

    async def after() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("SET maintenance_work_mem = '1024MB'")
            await conn.execute(definition[0], timeout=3600)
            await conn.execute("ANALYZE store, store_vectors", timeout=3600)
        finally:
            await conn.close()

    return before, after


SETTLE: list[str] = []  # a DSN of the PostgreSQL server: the cells wait for its autovacuum


async def settled(dsn: str, limit: float = 600) -> float:
    """Wait until no autovacuum worker runs on the server (the loads leave 100,000s of new rows
    to vacuum and analyze, on the same two cores the cells measure); seconds waited."""
    import asyncpg

    started = time.perf_counter()
    conn = await asyncpg.connect(dsn)
    try:
        while time.perf_counter() - started < limit:
            busy = await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'")
            if not busy:
                break
            await asyncio.sleep(1)
    finally:
        await conn.close()
    return time.perf_counter() - started


async def hnsw_valid(dsn: str) -> bool:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return bool(await conn.fetchval(
            "SELECT coalesce(bool_and(i.indisvalid), false) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = $1", f"store_hnsw_{DIMS}",
        ))
    finally:
        await conn.close()


@asynccontextmanager
async def gateway_store(url: str, corpus: Corpus) -> AsyncIterator[BaseStore]:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        r = await admin.post("/v1/admin/keys", json={"namespace": NS, "scopes": ["store:write"]})
        r.raise_for_status()
        key = r.json()["key"]
    async with GatewayClient(url, namespace=NS, api_key=key) as gw:
        yield gw.store(index={"dims": DIMS, "embed": corpus.embed, "fields": ["text"]})  # type: ignore[typeddict-item]


@asynccontextmanager
async def postgres_store(dsn: str, corpus: Corpus) -> AsyncIterator[BaseStore]:
    from langgraph.store.postgres.aio import AsyncPostgresStore
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    async with AsyncConnectionPool(dsn, min_size=16, max_size=16, open=False,
                                   kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}) as pool:
        store = AsyncPostgresStore(pool, index={"dims": DIMS, "embed": corpus.embed, "fields": ["text"]})  # type: ignore[arg-type]
        await store.setup()
        yield store


@asynccontextmanager
async def sqlite_store(path: Path, corpus: Corpus) -> AsyncIterator[BaseStore]:
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    async with AsyncSqliteStore.from_conn_string(str(path), index={"dims": DIMS, "embed": corpus.embed, "text_fields": ["text"]}) as store:  # type: ignore[typeddict-unknown-key]
        await store.setup()
        yield store


def libpq(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def start_gateway(backend: Backend, log: Path, items: int) -> Any:
    """One worker; its HNSW index built once the last of ``items`` is in (looked for every 5 s)."""
    result = run_cli(backend, "migrate", GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY)
    if result.returncode != 0:
        raise SystemExit(result.stderr)
    return start_server(backend, log, "--workers", "1", GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY, GATEWAY_LOG_LEVEL="warning",
                        GATEWAY_STORE__INDEX_SWEEP_SECONDS="5", GATEWAY_STORE__INDEX_MIN_VECTORS=str(items))


def run_size(n: int, pg_uri: str, work: Path, seconds: float) -> dict[str, dict[Any, Any]]:
    corpus = Corpus(n)
    urls = create_postgres_databases(pg_uri, f"benchgw_{uuid.uuid4().hex[:8]}")
    direct = libpq(create_postgres_databases(pg_uri, f"benchpg_{uuid.uuid4().hex[:8]}")["vectors"])
    pg_gateway = start_gateway(Backend("postgres", backend_env(urls, work / f"data-{n}"), urls), work / f"gw-pg-{n}.log", n)
    sqlite_dir = work / f"sqlite-{n}"
    sqlite_urls = {db: f"sqlite+aiosqlite:///{sqlite_dir}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
    sqlite_dir.mkdir()
    try:
        sq_gateway = start_gateway(Backend("sqlite", backend_env(sqlite_urls, sqlite_dir), sqlite_urls), work / f"gw-sq-{n}.log", n)
        try:
            READY["gateway (pg)"] = lambda: hnsw_valid(libpq(urls["vectors"]))
            SETTLE.append(direct)
            LOADING["AsyncPostgresStore"] = reindexed(direct)

            async def run() -> dict[str, dict[Any, Any]]:
                async with (
                    gateway_store(pg_gateway.url, corpus) as gw_pg,
                    postgres_store(direct, corpus) as pg,
                    gateway_store(sq_gateway.url, corpus) as gw_sq,
                    sqlite_store(work / f"langgraph-{n}.db", corpus) as sq,
                ):
                    return await bench({"gateway (pg)": gw_pg, "AsyncPostgresStore": pg, "gateway (sqlite)": gw_sq,
                                        "AsyncSqliteStore": sq}, corpus, seconds)

            return asyncio.run(run())
        finally:
            stop_server(sq_gateway)
    finally:
        stop_server(pg_gateway)


def print_table(n: int, results: dict[str, dict[Any, Any]], seconds: float) -> None:
    names = list(results)
    print(f"\nstore benchmark: {n:,} items of {DIMS} dimensions, {seconds:g} s per cell, one gateway worker, "
          f"{os.cpu_count()} CPUs")
    header = f"{'operation':<16} {'conc':>4} | " + " | ".join(f"{name:>18} ops/s {'p50 ms':>7}" for name in names) + " | gw/pg"
    print(header)
    print("-" * len(header))
    gw, pg = results["gateway (pg)"], results["AsyncPostgresStore"]
    for key in [k for k in gw if isinstance(k, tuple)]:
        cells = " | ".join(f"{results[name][key][0]:>24.0f} {results[name][key][1]:>7.2f}" for name in names)
        print(f"{key[0]:<16} {key[1]:>4} | {cells} | {gw[key][0] / pg[key][0]:>5.2f}")
    print("bulk load (items/s; then s until the index is ready): " + ", ".join(
        f"{name} {results[name]['load/s']:,.0f} ({results[name]['index s']:.0f} s)" for name in names))
    print("recall@10: " + ", ".join(f"{name} {results[name]['recall@10']:.3f}" for name in names))
    ratio = min(gw[k][0] / pg[k][0] for k in gw if isinstance(k, tuple))
    print(f"target every cell >= 0.5x AsyncPostgresStore: min {ratio:.2f} {'OK' if ratio >= 0.5 else 'MISSED'}; "
          f"target recall >= AsyncPostgresStore's: {'OK' if gw['recall@10'] >= pg['recall@10'] else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per cell (default 3)")
    args = parser.parse_args()

    import pgserver

    work = Path(tempfile.mkdtemp(prefix="bench-store-"))
    pg = pgserver.get_server(work / "pg", cleanup_mode="stop")
    try:
        for n in args.items:
            print_table(n, run_size(n, pg.get_uri(), work, args.seconds), args.seconds)
    finally:
        pg.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
