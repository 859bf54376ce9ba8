"""LangChain's ``similarity_search`` through ``GatewayVectorStore`` next to the stores a LangChain
user would otherwise pick, on the same documents in the same run.

30,000 documents (384-d clustered vectors, each text mapped to its vector by a lookup embedding,
so no model runs and every store gets the same vectors) are loaded into:

- PostgreSQL (one pgserver): ``GatewayVectorStore`` on the gateway (pgvector; its HNSW index is
  built in the background, waited for), next to langchain-postgres' ``PGVector`` (async mode,
  psycopg 3) as it comes (no index: an exact scan) and with an HNSW index made by hand
  (``vector_cosine_ops``, pgvector's defaults), in another database of the same server;
- SQLite, the embedded default: ``GatewayVectorStore`` on the gateway (sqlite-vec, exact), next to
  langchain-core's ``InMemoryVectorStore`` (numpy, exact, in this process: the in-process store
  a LangChain user starts with; Chroma is not in the lock files).

Every cell is ``asimilarity_search(text, k=10)`` at concurrency 1 and 8 from one asyncio process,
for at least ``BENCH_SEARCH_SECONDS`` (4 s): QPS, p50/p99 ms, recall@10 against exact numpy
search (cosine). The raw client's ``vectors.search`` on the same collection is a row of its own,
so the adapter's share shows. ``GatewayByteStore.amget`` of 100 keys is timed beside the 100
single-key GETs it took before the kv batch routes. The gateway runs with ``--workers`` (default: the machine's cores)
and is called with a key scoped to the bench namespace (``vectors:write``), never the admin key.

    .venv/bin/python bench/bench_langchain.py                  # 30,000 documents, both backends
    .venv/bin/python bench/bench_langchain.py --n 5000 --targets sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "clients" / "python"))

from bench.bench_vectors import clustered, ground_truth, recall  # noqa: E402

from langchain_core.embeddings import Embeddings  # noqa: E402

K = 10
BATCH = 500
CORES = os.cpu_count() or 1
SEARCH_SECONDS = float(os.environ.get("BENCH_SEARCH_SECONDS", "4"))


class LookupEmbedding(Embeddings):
    """Each bench text's precomputed vector (queries included), natively async: no model runs,
    and every store searches the same vectors."""

    def __init__(self, vectors: dict[str, list[float]]) -> None:
        self.vectors = vectors

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.vectors[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.vectors[text]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embed_documents(texts)

    async def aembed_query(self, text: str) -> list[float]:
        return self.embed_query(text)


async def timed(search: Callable[[str], Awaitable[list[int]]], queries: list[str], concurrency: int) -> dict[str, Any]:
    """QPS, p50/p99 ms and the ids found: every query once, then round again until the cell's time."""
    lat: list[float] = []
    found: list[list[int]] = [[] for _ in queries]
    issued = 0
    t0 = time.perf_counter()
    deadline = t0 + SEARCH_SECONDS

    async def worker() -> None:
        nonlocal issued
        while issued < len(queries) or time.perf_counter() < deadline:
            i = issued
            issued += 1
            t = time.perf_counter()
            ids = await search(queries[i % len(queries)])
            lat.append(time.perf_counter() - t)
            if i < len(queries):
                found[i] = ids

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"qps": len(lat) / wall, "p50": np.percentile(lat, 50) * 1000, "p99": np.percentile(lat, 99) * 1000, "found": found}


async def cells(name: str, search: Callable[[str], Awaitable[list[int]]], queries: list[str], truth: np.ndarray,
                warm_up: int = 8) -> list[dict[str, Any]]:
    for conc in (1, 8):  # warm-up: connections opened, caches filled
        await asyncio.gather(*(search(q) for q in queries[: conc + warm_up]))
    rows = []
    for conc in (1, 8):
        r = await timed(search, queries, conc)
        rows.append({"store": name, "concurrency": conc, "qps": r["qps"], "p50": r["p50"], "p99": r["p99"],
                     "recall": recall(r["found"], truth)})
        print(f"  {name:<46} c={conc}: {r['qps']:7.1f} QPS  p50 {r['p50']:6.2f} ms  recall {rows[-1]['recall']:.3f}", flush=True)
    return rows


def ids_of(docs: list[Any]) -> list[int]:
    return [int(d.id) for d in docs]


# --- the gateway ---------------------------------------------------------------------------------


def gateway(kind: str, workdir: Path, pg_uri: str | None, workers: int) -> tuple[Any, str]:
    """A migrated gateway on ``kind`` with ``workers`` workers, and a key scoped to the bench namespace."""
    import httpx

    from tests.conftest import ADMIN_KEY, Backend, backend_env, create_postgres_databases, run_cli, start_server

    data_dir = workdir / f"gw-{kind}"
    data_dir.mkdir()
    if kind == "sqlite":
        urls = {db: f"sqlite+aiosqlite:///{data_dir}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
    else:
        assert pg_uri is not None
        urls = create_postgres_databases(pg_uri, f"bench_lc_{os.getpid()}")
    backend = Backend(kind, backend_env(urls, data_dir), urls)
    result = run_cli(backend, "migrate")
    if result.returncode != 0:
        raise RuntimeError(result.stderr)
    server = start_server(backend, workdir / f"gateway-{kind}.log", "--workers", str(workers))
    made = httpx.post(f"{server.url}/v1/admin/keys", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                      json={"namespace": "bench", "scopes": ["vectors:write", "kv:write"], "description": "bench_langchain"})
    made.raise_for_status()
    return server, made.json()["key"]


async def bench_gateway(url: str, key: str, embedding: LookupEmbedding, texts: list[str], queries: list[str],
                        truth: np.ndarray, label: str) -> list[dict[str, Any]]:
    from storage_gateway_client import GatewayClient, GatewayVectorStore

    async with GatewayClient(url, "bench", key, timeout=300) as gw:
        store = GatewayVectorStore(gw, "docs", embedding)
        t = time.perf_counter()
        for start in range(0, len(texts), BATCH):
            await store.aadd_texts(texts[start:start + BATCH], ids=[str(i) for i in range(start, min(start + BATCH, len(texts)))])
        while (await gw.vectors.describe_collection("docs"))["index"]["state"] not in ("ready", "exact"):
            await asyncio.sleep(0.2)
        print(f"  loaded and indexed {len(texts)} documents in {time.perf_counter() - t:.1f} s", flush=True)
        # On pgvector a ready index is then calibrated in the background (sampled points searched
        # exactly): searched only once that is done, so that no cell shares the CPU with it.
        deadline = time.monotonic() + 300
        while (index := (await gw.vectors.describe_collection("docs"))["index"])["kind"] != "exact" and index.get(
            "state"
        ) == "ready" and index.get("calibration") is None and time.monotonic() < deadline:
            await asyncio.sleep(0.5)

        async def adapter(q: str) -> list[int]:
            return ids_of(await store.asimilarity_search(q, k=K))

        async def client(q: str) -> list[int]:
            return [int(h["id"]) for h in await gw.vectors.search("docs", embedding.vectors[q], K)]

        return [*await cells(f"GatewayVectorStore ({label})", adapter, queries, truth),
                *await cells(f"  the client's vectors.search ({label})", client, queries, truth)]


async def bench_byte_store(url: str, key: str, label: str) -> dict[str, Any]:
    """``GatewayByteStore.amget`` of 100 keys (cached 384-d float32 embeddings, 1,536 bytes each)
    next to what a ByteStore had to do before the kv batch routes: a GET per key, one after
    another or eight at a time. p50 ms of 30 rounds each."""
    from storage_gateway_client import GatewayByteStore, GatewayClient

    async with GatewayClient(url, "bench", key, timeout=300) as gw:
        store = GatewayByteStore(gw, "cache")
        keys = [f"embedding:{i:03}" for i in range(100)]
        await store.amset([(k, os.urandom(1536)) for k in keys])
        gate = asyncio.Semaphore(8)

        async def batch() -> None:
            assert None not in await store.amget(keys)

        async def one_by_one() -> None:
            for k in keys:
                await gw.kv.get("cache", k)

        async def eight_at_a_time() -> None:
            async def one(k: str) -> None:
                async with gate:
                    await gw.kv.get("cache", k)

            await asyncio.gather(*(one(k) for k in keys))

        row: dict[str, Any] = {"store": label}
        for name, fn in (("batch", batch), ("sequential", one_by_one), ("eight", eight_at_a_time)):
            await fn()  # warm-up
            times = []
            for _ in range(30):
                t = time.perf_counter()
                await fn()
                times.append(time.perf_counter() - t)
            row[name] = float(np.percentile(times, 50) * 1000)
        print(f"  mget of 100 keys ({label}): {row['batch']:.2f} ms in one request; {row['sequential']:.1f} ms as 100 GETs, "
              f"{row['eight']:.1f} ms as 100 GETs 8 at a time", flush=True)
        return row


# --- the references ------------------------------------------------------------------------------


async def bench_pgvector(pg_uri: str, embedding: LookupEmbedding, texts: list[str], queries: list[str],
                         truth: np.ndarray, dim: int) -> list[dict[str, Any]]:
    import psycopg
    from langchain_postgres import PGVector
    from sqlalchemy.engine import make_url

    admin = make_url(pg_uri)
    dbname = f"bench_pgvector_{os.getpid()}"
    with psycopg.connect(admin.set(drivername="postgresql").render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    url = admin.set(drivername="postgresql+psycopg", database=dbname).render_as_string(hide_password=False)
    store = PGVector(embedding, connection=url, collection_name="docs", embedding_length=dim, async_mode=True,
                     engine_args={"pool_size": 10})
    t = time.perf_counter()
    for start in range(0, len(texts), BATCH):
        await store.aadd_texts(texts[start:start + BATCH], ids=[str(i) for i in range(start, min(start + BATCH, len(texts)))])
    print(f"  PGVector loaded {len(texts)} documents in {time.perf_counter() - t:.1f} s", flush=True)

    async def search(q: str) -> list[int]:
        return ids_of(await store.asimilarity_search(q, k=K))

    rows = await cells("PGVector, as it comes (no index: exact)", search, queries, truth)
    plain = admin.set(drivername="postgresql", database=dbname).render_as_string(hide_password=False)
    t = time.perf_counter()
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute("CREATE INDEX ON langchain_pg_embedding USING hnsw (embedding vector_cosine_ops)")
        conn.execute("ANALYZE langchain_pg_embedding")
    print(f"  PGVector's HNSW index built in {time.perf_counter() - t:.1f} s", flush=True)
    rows += await cells("PGVector + an HNSW index made by hand", search, queries, truth)
    await store._async_engine.dispose()  # noqa: SLF001 (its engine: closed before the server stops)
    return rows


async def bench_in_memory(embedding: LookupEmbedding, texts: list[str], queries: list[str], truth: np.ndarray) -> list[dict[str, Any]]:
    from langchain_core.vectorstores import InMemoryVectorStore

    store = InMemoryVectorStore(embedding)
    await store.aadd_texts(texts, ids=[str(i) for i in range(len(texts))])

    async def search(q: str) -> list[int]:
        return ids_of(await store.asimilarity_search(q, k=K))

    # It builds its matrix again for every search (about 2 s at 30,000 here): 20 queries, no warm-up.
    few = min(20, len(queries))
    return await cells("InMemoryVectorStore (langchain-core, in process)", search, queries[:few], truth[:few], warm_up=0)


def print_byte_table(rows: list[dict[str, Any]]) -> None:
    print("\nGatewayByteStore.amget of 100 keys (1,536-byte values), p50 ms of 30 rounds")
    print("| gateway | one batch request (now) | 100 GETs, one after another | 100 GETs, 8 at a time |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['store']} | {r['batch']:.2f} | {r['sequential']:.1f} | {r['eight']:.1f} |")


def print_table(rows: list[dict[str, Any]], n: int, dim: int, nq: int, workers: int) -> None:
    print(f"\nsimilarity_search, k={K}: {n} documents of {dim} dimensions, {nq} queries, "
          f"gateway with {workers} worker(s), {CORES} cores shared with the databases and this client")
    print("| store | concurrency | QPS | p50 ms | p99 ms | recall@10 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        qps = f"{r['qps']:.0f}" if r["qps"] >= 10 else f"{r['qps']:.1f}"
        print(f"| {r['store'].strip()} | {r['concurrency']} | {qps} | {r['p50']:.2f} | {r['p99']:.2f} | {r['recall']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=30_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--targets", default="postgres,sqlite")
    parser.add_argument("--workers", type=int, default=CORES, help="gateway workers (default: the machine's cores)")
    args = parser.parse_args()
    from tests.conftest import stop_server

    both = clustered(args.n + args.queries, args.dim, seed=1)
    data, query_vectors = both[: args.n], both[args.n:]
    truth = ground_truth(data, query_vectors)
    texts = [f"document {i}" for i in range(args.n)]
    queries = [f"query {i}" for i in range(args.queries)]
    embedding = LookupEmbedding({t: v.tolist() for t, v in zip(texts + queries, both, strict=True)})
    targets = args.targets.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="bench-langchain-"))
    rows: list[dict[str, Any]] = []
    byte_rows: list[dict[str, Any]] = []
    pg = None
    try:
        if "postgres" in targets:
            import pgserver

            pg = pgserver.get_server(workdir / "pg", cleanup_mode="stop")
            print("PostgreSQL", flush=True)
            server, key = gateway("postgres", workdir, pg.get_uri(), args.workers)
            try:
                rows += asyncio.run(bench_gateway(server.url, key, embedding, texts, queries, truth, "postgres"))
                byte_rows.append(asyncio.run(bench_byte_store(server.url, key, "postgres")))
            finally:
                stop_server(server)
            rows += asyncio.run(bench_pgvector(pg.get_uri(), embedding, texts, queries, truth, args.dim))
        if "sqlite" in targets:
            print("SQLite", flush=True)
            server, key = gateway("sqlite", workdir, None, args.workers)
            try:
                rows += asyncio.run(bench_gateway(server.url, key, embedding, texts, queries, truth, "sqlite"))
                byte_rows.append(asyncio.run(bench_byte_store(server.url, key, "sqlite")))
            finally:
                stop_server(server)
            rows += asyncio.run(bench_in_memory(embedding, texts, queries, truth))
    finally:
        if pg is not None:
            pg.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(rows, args.n, args.dim, args.queries, args.workers)
    print_byte_table(byte_rows)


if __name__ == "__main__":
    main()
