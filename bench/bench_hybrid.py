"""Hybrid search speed on PostgreSQL: the gateway before and after BM25 (issue 43), at two sizes.

Documents with the word statistics of the standard library's docstrings (``stdlib_docs.synthetic``:
windows of 10 to 60 words of them) and clustered 384-d vectors (``bench_vectors.clustered``),
payload ``{"text", "tag": i % 200}``, in a collection with ``text_field`` "text". Queries: four
words of one document (two of its five rarest, two others, as ``stdlib_docs.text_queries``
makes them) with a clustered query vector. Each tree (``--trees name=DIR``: DIR's own
``.venv/bin/storage-gateway``, one worker, its own databases on one PostgreSQL) is loaded
through the Python client in batches of 500, searched once its HNSW index is ready, through a
key scoped to the bench namespace; cells, at concurrency 1 and 8 (QPS, p50, p99 ms):

- ``vector``: the same vectors without a query (the vector half alone);
- ``hybrid``: with the query (RRF, limit 10): the vector half, the text half and the fusion;
- ``hybrid tag=``: with a filter on one tag (0.5% of the documents) as well.

The trees are loaded side by side and their cells measured one after the other (each cell:
every tree, then the next cell), so that a busy machine weighs alike on both.

The text half's cost is hybrid less vector, and (this tree only) each half is also timed alone
in the bench's process on one connection (``halves``: the vector search of the pool of 40 and
the text search with the vector hits' scores, query by query in turn). PostgreSQL runs with ``shared_buffers`` a quarter of
RAM (pgserver's PostgreSQL 16, pgvector 0.6.2). The "before" tree is a worktree of the commit
before BM25 with its own virtualenv::

    git worktree add --detach /tmp/bm25-before 6a44ad4 && make -C /tmp/bm25-before .venv/.installed-run
    .venv/bin/python bench/bench_hybrid.py --sizes 30000,300000 --trees before=/tmp/bm25-before,after=.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "clients" / "python"))
import stdlib_docs  # noqa: E402
from bench_vectors import clustered, timed_searches  # noqa: E402
from bench_vectors_scale import postgres_databases, start_postgres  # noqa: E402

BATCH = 500
DIM = 384
K = 10
TAGS = 200
NAMESPACE = "bench"
QUERIES = 200
RAM_MB = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20


def corpus(n: int) -> list[str]:
    docs = stdlib_docs.documents()
    return ([d.text for d in docs] + stdlib_docs.synthetic(docs, max(0, n - len(docs))))[:n]


def queries(texts: list[str], n: int, seed: int = 5) -> list[str]:
    """Four words of ``n`` documents: two of each one's five rarest words, two others."""
    docs = [stdlib_docs.Doc(str(i), t) for i, t in enumerate(texts)]
    rng = random.Random(seed)
    picked = [docs[i] for i in rng.sample(range(len(docs)), n)]
    df = stdlib_docs.document_frequencies(docs)
    out = []
    for d in picked:
        cands = [w for w in dict.fromkeys(stdlib_docs.words(d.text)) if len(w) >= 3 and not w.isdigit()]
        by_rarity = sorted(cands, key=lambda w: (stdlib_docs._df_of(w, df), w))
        chosen = rng.sample(by_rarity[:5], min(2, len(by_rarity)))
        rest = [w for w in cands if w not in chosen]
        chosen += rng.sample(rest, min(2, len(rest)))
        out.append(" ".join(chosen))
    return out


def start_gateway(tree: Path, pg, tag: str, workdir: Path):
    """The gateway of ``tree`` (one worker) on new databases (PostgreSQL's ``bhyb_<tag>_*``, or
    SQLite files with ``pg`` None), and a key scoped to the bench namespace."""
    from tests.conftest import Backend, Server, backend_env, free_port, gateway_env

    data_dir = workdir / f"gw-{tag}"
    data_dir.mkdir(exist_ok=True)
    if pg is None:
        urls = {db: f"sqlite+aiosqlite:///{data_dir}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
    else:
        urls = postgres_databases(pg, f"bhyb_{tag}")
    backend = Backend("postgres" if pg is not None else "sqlite", backend_env(urls, data_dir), urls)
    exe = str(tree / ".venv" / "bin" / "storage-gateway")
    for args in (["migrate"], ["keys", "create", "--namespace", NAMESPACE, "--scope", "vectors:*"]):
        done = subprocess.run([exe, *args], env=gateway_env(backend), capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
    key = re.search(r"^key: (\S+)$", done.stdout, re.M).group(1)
    port = free_port()
    log = workdir / f"gateway-{tag}.log"
    process = subprocess.Popen([exe, "serve", "--port", str(port), "--workers", "1"], env=gateway_env(backend),
                               stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return Server(backend, url, process, log), key
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(log.read_text())


async def load_tree(url: str, key: str, texts: list[str], data: np.ndarray) -> dict:
    """Load the collection (two batches in flight) and wait until its HNSW index is ready."""
    from storage_gateway_client import GatewayClient

    out: dict = {}
    async with GatewayClient(url, namespace=NAMESPACE, api_key=key, timeout=600) as gw:
        await gw.vectors.setup_collection("h", DIM, "cosine", text_field="text")
        ids = [str(i) for i in range(len(texts))]
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(2)

        async def load(s: int) -> None:
            async with sem:
                await gw.vectors.upsert_points(
                    "h", data[s:s + BATCH], [{"text": t, "tag": (s + i) % TAGS} for i, t in enumerate(texts[s:s + BATCH])],
                    ids[s:s + BATCH],
                )

        await asyncio.gather(*(load(s) for s in range(0, len(texts), BATCH)))
        out["load_s"] = time.perf_counter() - t0
        while (await gw.vectors.describe_collection("h"))["index"]["state"] != "ready":
            await asyncio.sleep(2)
        out["indexed_s"] = time.perf_counter() - t0
    print(f"  loaded in {out['load_s']:.0f} s, indexed in {out['indexed_s']:.0f} s", flush=True)
    return out


CELLS = (("vector", False, False), ("hybrid", True, False), ("hybrid tag=", True, True))


async def measure(url: str, key: str, cell: str, concurrency: int, qtexts: list[str], qvecs: np.ndarray) -> dict:
    from storage_gateway_client import GatewayClient

    _, query, filtered = next(c for c in CELLS if c[0] == cell)
    async with GatewayClient(url, namespace=NAMESPACE, api_key=key, timeout=600) as gw:
        async def search(i: int) -> list[str]:
            hits = await gw.vectors.search(
                "h", qvecs[i], K, query=qtexts[i] if query else None, filters={"tag": i % TAGS} if filtered else None,
            )
            return [h["id"] for h in hits]

        items = list(range(len(qtexts)))
        await timed_searches(search, items[:20], concurrency, seconds=1)  # warm
        qps, p50, p99, _ = await timed_searches(search, items, concurrency)
    return {"qps": qps, "p50": p50, "p99": p99}


async def halves(vectors_url: str, qtexts: list[str], qvecs: np.ndarray, rounds: int = 3) -> dict:
    """Each half of this tree's hybrid search timed alone, in this process, on one connection:
    ``VectorIndex.search`` and ``VectorIndex.text_search`` (with the vector hits' scores), the
    pool a limit of 10 asks for (40), query by query in turn; p50 ms of each."""
    from array import array

    from sqlalchemy import text as sql
    from sqlalchemy.ext.asyncio import create_async_engine

    from app.vectors.backend import CollectionInfo
    from app.vectors.pgvector import PgVectorIndex, detect_version, install_vector_codec
    from app.vectors.text import query_terms

    engine = create_async_engine(vectors_url)
    install_vector_codec(engine, 100)
    vector_ms, text_ms = [], []
    try:
        async with engine.connect() as conn:
            row = (await conn.execute(sql("SELECT * FROM vector_collections WHERE namespace = :ns AND collection = 'h'"),
                                      {"ns": NAMESPACE})).mappings().one()
            info = CollectionInfo(
                id=row["id"], namespace=row["namespace"], collection=row["collection"], vector_size=row["vector_size"],
                distance=row["distance"], index=json.loads(row["index_options"]), text_field=row["text_field"],
                created_at=row["created_at"], text_language=row["text_language"],
            )
            index = PgVectorIndex(await detect_version(conn))
            await conn.rollback()
            for _ in range(rounds):
                for i, q in enumerate(qtexts):
                    t0 = time.perf_counter()
                    hits, _ = await index.search(conn, info, array("f", qvecs[i]), 4 * K, None, None, 0)
                    t1 = time.perf_counter()
                    await index.text_search(conn, info, query_terms(q, info.text_language or "english"), 4 * K, None,
                                            also=[h.id for h in hits])
                    t2 = time.perf_counter()
                    await conn.rollback()  # the transaction SQLAlchemy began for the text half
                    vector_ms.append((t1 - t0) * 1000)
                    text_ms.append((t2 - t1) * 1000)
    finally:
        await engine.dispose()
    return {"vector half p50": float(np.percentile(vector_ms, 50)), "text half p50": float(np.percentile(text_ms, 50))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="30000,300000")
    ap.add_argument("--trees", default=f"after={ROOT}", help="name=DIR,... (each DIR with its own .venv)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--shared-buffers", default=f"{RAM_MB // 4}MB")
    args = ap.parse_args()
    trees = {name: Path(d).resolve() for name, d in (t.split("=", 1) for t in args.trees.split(","))}
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-hybrid-"))
    workdir.mkdir(parents=True, exist_ok=True)
    pg = start_postgres(workdir / "pgdata", args.shared_buffers)
    results: dict = {}
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            texts = corpus(n)
            data = clustered(n, DIM, seed=1)
            qvecs = clustered(QUERIES, DIM, seed=2)
            qtexts = queries(texts, QUERIES)
            servers = {}
            try:
                for name, tree in trees.items():
                    print(f"== {name} ({tree}), {n} documents", flush=True)
                    servers[name] = start_gateway(tree, pg, f"{name}_{n}", workdir)
                    results[f"{name} {n}"] = asyncio.run(load_tree(servers[name][0].url, servers[name][1], texts, data))
                # the trees' cells one after the other, so that the machine's load is alike for both
                for cell, _, _ in CELLS:
                    for c in (1, 8):
                        for name, (server, key) in servers.items():
                            r = results[f"{name} {n}"][f"{cell} c{c}"] = asyncio.run(
                                measure(server.url, key, cell, c, qtexts, qvecs))
                            print(f"  {name:8} {cell:12} c{c}: {r['qps']:7.1f} QPS  p50 {r['p50']:6.2f} ms  "
                                  f"p99 {r['p99']:6.2f} ms", flush=True)
                for name, tree in trees.items():
                    if tree == ROOT:  # this tree's code is the one this process can import
                        r = results[f"{name} {n}"]["halves"] = asyncio.run(
                            halves(servers[name][0].backend.urls["vectors"], qtexts, qvecs))
                        print(f"  {name:8} halves alone: vector {r['vector half p50']:.2f} ms, "
                              f"text {r['text half p50']:.2f} ms (p50)", flush=True)
            finally:
                for server, _ in servers.values():
                    server.process.terminate()
                    server.process.wait(timeout=60)
            for name in trees:
                for db in ("metadata", "vectors", "checkpoints"):
                    pg.psql(f"DROP DATABASE IF EXISTS bhyb_{name}_{n}_{db};")
    finally:
        pg.cleanup()
    print(json.dumps(results))
    print_table(results)


def print_table(results: dict) -> None:
    print(f"\n{datetime.date.today()}: one gateway worker, PostgreSQL (pgserver), limit {K}, RRF")
    cells = ["vector c1", "vector c8", "hybrid c1", "hybrid c8", "hybrid tag= c1", "hybrid tag= c8"]
    print("| tree, documents | " + " | ".join(cells) + " |")
    print("|---|" + "---|" * len(cells))
    for name, r in results.items():
        print(f"| {name} | " + " | ".join(f"{r[c]['qps']:.0f} QPS, p50 {r[c]['p50']:.1f} ms" for c in cells) + " |")
    for name, r in results.items():
        if "halves" in r:
            print(f"{name}: each half alone, p50: vector {r['halves']['vector half p50']:.2f} ms, "
                  f"text {r['halves']['text half p50']:.2f} ms")


if __name__ == "__main__":
    main()
