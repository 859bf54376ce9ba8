"""Vectors benchmark: the gateway (SQLite and PostgreSQL) vs Chroma's server vs pgvector direct.

Same clustered 384-d vectors for every target, in one run: insert throughput (batches of 500, one
and two batches in flight, the same for every target), the seconds from the first insert until
the collection is searchable with its index ("indexed s": the gateway on PostgreSQL builds its
HNSW index in the background after the load, so it polls describe until the index is ready;
Chroma and pgvector direct index inline, so theirs is the insert time), and
search QPS, p50/p99 latency at concurrency 1 and 8, recall@10 against exact numpy ground truth
(cosine), searched once the index is ready; each search cell runs the queries round for at least
``BENCH_SEARCH_SECONDS`` (4 s).

The gateway is loaded once with as many workers as the machine has cores, then searched with
each of ``--workers`` (default: one worker, and ``os.cpu_count()``), restarted on the same
databases; every row says its worker count. Every point has a payload ``{"tag": i % 200}``, so
a filter on one tag matches 0.5% of the points: the filtered cells (``tag=``) search each query
with the filter on one tag, for the gateway (``filters``) and Chroma (``where``), with recall@10
against exact numpy search over that tag's points. pgvector direct is searched unfiltered only.
The gateway is always called with a key scoped to the bench namespace (never the admin key). Chroma runs from its own virtualenv (``--chroma-python``, default
``$CHROMA_PYTHON`` or ``/tmp/vt/chroma-venv/bin/python``) so its many dependencies stay out of
the gateway's lock files; this script re-runs itself there as the Chroma worker.

    .venv/bin/python bench/bench_vectors.py            # 50,000 vectors
    .venv/bin/python bench/bench_vectors.py --quick    # 10,000 vectors
    .venv/bin/python bench/bench_vectors.py --quick --workers 1 --targets postgres,chroma
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# The tree whose gateway and client run: this script's own, or $BENCH_TREE (to run one copy of
# the script against two trees).
ROOT = Path(os.environ.get("BENCH_TREE") or Path(__file__).resolve().parent.parent)
BATCH = 500
CORES = os.cpu_count() or 1
K = 10
TAGS = 200  # distinct payload values: a filter on one matches 1/TAGS of the points (0.5%)
# Each search cell runs at least this long (the 200 queries go round again): one pass is < 0.5 s.
SEARCH_SECONDS = float(os.environ.get("BENCH_SEARCH_SECONDS", "4"))


def clustered(n: int, dim: int, seed: int, centers: int = 100, latent: int = 32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centers, latent)) * 2.0
    labels = rng.integers(0, centers, size=n)
    points = c[labels] + rng.normal(size=(n, latent))
    projection = rng.normal(size=(latent, dim)) / np.sqrt(latent)
    scale = rng.uniform(0.5, 1.5, size=(n, 1))
    return ((points @ projection + 0.05 * rng.normal(size=(n, dim))) * scale).astype(np.float32)


def ground_truth(data: np.ndarray, queries: np.ndarray) -> np.ndarray:
    d = data / np.linalg.norm(data, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    return np.argsort(-(q @ d.T), axis=1)[:, :K]


def point_tags(n: int) -> np.ndarray:
    """Each point's ``tag`` payload value."""
    return np.arange(n) % TAGS


def query_tags(nq: int) -> np.ndarray:
    """The tag each query filters on in the filtered cells (spread over all tags)."""
    return (np.arange(nq) * 37) % TAGS


def filtered_truth(data: np.ndarray, queries: np.ndarray, tags: np.ndarray, qtags: np.ndarray) -> np.ndarray:
    """Exact top-K ids (cosine) among the points whose tag is the query's."""
    d = data / np.linalg.norm(data, axis=1, keepdims=True)
    out = np.empty((len(queries), K), dtype=np.int64)
    for i, (q, t) in enumerate(zip(queries, qtags)):
        ids = np.flatnonzero(tags == t)
        scores = d[ids] @ (q / np.linalg.norm(q))
        out[i] = ids[np.argsort(-scores)[:K]]
    return out


def fmt_filter(filtered: bool) -> str:
    return f"tag=(1/{TAGS})" if filtered else "-"


def recall(found: list[list[int]], truth: np.ndarray) -> float:
    return float(np.mean([len(set(f[:K]) & set(t.tolist())) / K for f, t in zip(found, truth)]))


INSERT_CONCURRENCY = (1, 2)
LAST_CLIENT_CPU = [0.0]  # the client's CPU per search (us) of the last timed_searches


async def timed_inserts(insert_batch, n: int, concurrency: int) -> float:
    """Vectors/s inserting ``n`` vectors in batches of ``BATCH``, ``concurrency`` batches in flight."""
    sem = asyncio.Semaphore(concurrency)

    async def one(start: int) -> None:
        async with sem:
            await insert_batch(start, min(start + BATCH, n))

    t = time.perf_counter()
    await asyncio.gather(*(one(s) for s in range(0, n, BATCH)))
    return n / (time.perf_counter() - t)


async def timed_searches(
    search, queries: np.ndarray, concurrency: int, seconds: float | None = None
) -> tuple[float, float, float, list[list[int]]]:
    """QPS, p50 ms, p99 ms and the ids found, running ``search(q)`` with ``concurrency`` in flight
    (the client process's CPU per search goes to ``LAST_CLIENT_CPU``).

    Every query runs once (the ids found are for recall); then the queries go round again until
    ``seconds`` have passed, so that a fast target's cell is not a fraction of a second of noise.
    """
    seconds = SEARCH_SECONDS if seconds is None else seconds
    lat: list[float] = []
    found: list[list[int]] = [[] for _ in queries]
    issued = 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + seconds

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
    LAST_CLIENT_CPU[0] = (time.process_time() - cpu0) / len(lat) * 1e6
    return len(lat) / wall, float(np.percentile(lat, 50) * 1000), float(np.percentile(lat, 99) * 1000), found


# --- the gateway ---------------------------------------------------------------------------


async def load_gateway(server_url: str, api_key: str | None, data: np.ndarray, tags: np.ndarray) -> dict:
    """Insert rates (one and two batches in flight) and the seconds until the last load is indexed."""
    sys.path.insert(0, str(ROOT / "clients" / "python"))
    from storage_gateway_client import GatewayClient

    async with GatewayClient(server_url, namespace="bench", api_key=api_key, timeout=300) as gw:
        ids = [str(i) for i in range(len(data))]
        payloads = [{"tag": int(t)} for t in tags]
        rates = {}
        for ic in sorted(INSERT_CONCURRENCY, reverse=True):  # the last one (1) is searched
            await gw.vectors.drop_collection("b")
            await gw.vectors.setup_collection("b", data.shape[1], "cosine")

            async def insert_batch(start: int, stop: int) -> None:
                await gw.vectors.upsert_points("b", data[start:stop], payloads[start:stop], ids=ids[start:stop])

            started = time.perf_counter()
            rates[ic] = await timed_inserts(insert_batch, len(data), ic)
        # The searched collection (one batch at a time): until its index is ready.
        while (await gw.vectors.describe_collection("b"))["index"]["state"] not in ("ready", "exact"):
            await asyncio.sleep(0.1)
        return {"insert_vps": rates[1], "insert_vps_c2": rates[2], "indexed_s": time.perf_counter() - started}


async def search_gateway(server_url: str, api_key: str | None, queries: np.ndarray, qtags: np.ndarray,
                         truth, ftruth) -> list[dict]:
    """Unfiltered and filtered search cells at concurrency 1 and 8."""
    sys.path.insert(0, str(ROOT / "clients" / "python"))
    from storage_gateway_client import GatewayClient

    rows = []
    async with GatewayClient(server_url, namespace="bench", api_key=api_key, timeout=300) as gw:
        tag_of = {q.tobytes(): int(t) for q, t in zip(queries, qtags)}

        async def search(q: np.ndarray) -> list[int]:
            return [int(h["id"]) for h in await gw.vectors.search("b", q, K)]

        async def search_filtered(q: np.ndarray) -> list[int]:
            return [int(h["id"]) for h in await gw.vectors.search("b", q, K, filters={"tag": tag_of[q.tobytes()]})]

        for filtered, fn, want in ((False, search, truth), (True, search_filtered, ftruth)):
            for conc in (1, 8):  # warm-up at each concurrency (connections opened, caches filled)
                await timed_searches(fn, queries[: 2 * conc + 8], conc, seconds=0)
            for conc in (1, 8):
                qps, p50, p99, found = await timed_searches(fn, queries, conc)
                rows.append({"filtered": filtered, "concurrency": conc, "qps": qps, "p50_ms": p50, "p99_ms": p99,
                             "recall@10": recall(found, want), "client_us": LAST_CLIENT_CPU[0]})
    return rows


def gateway_backend(kind: str, workdir: Path, pg_uri: str | None):
    sys.path.insert(0, str(ROOT))
    from tests.conftest import Backend, backend_env, create_postgres_databases, run_cli

    data_dir = workdir / f"gw-{kind}"
    data_dir.mkdir()
    if kind == "sqlite":
        urls = {db: f"sqlite+aiosqlite:///{data_dir}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
    else:
        urls = create_postgres_databases(pg_uri, f"bench_{os.getpid()}_{kind}")
    backend = Backend(kind, backend_env(urls, data_dir), urls)
    result = run_cli(backend, "migrate")
    if result.returncode != 0:
        raise RuntimeError(result.stderr)
    return backend


def start_gateway(backend, workdir: Path, workers: int, key: str | None = None):
    """The gateway with ``workers`` workers, and a key for the bench namespace only (as each
    plugin runs, never the admin key): ``key`` if given, else a new one."""
    from tests.conftest import ADMIN_KEY, start_server

    server = start_server(backend, workdir / f"gateway-{backend.name}-{workers}.log", "--workers", str(workers))
    if key is None:
        import httpx

        made = httpx.post(f"{server.url}/v1/admin/keys", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                          json={"namespace": "bench", "scopes": ["vectors:write"], "description": "bench"})
        made.raise_for_status()
        key = made.json()["key"]
    return server, key


def bench_gateway(kind: str, workdir: Path, pg_uri: str | None, worker_counts: list[int], data, queries, qtags,
                  truth, ftruth) -> list[dict]:
    """Load with one worker per core, then search with each worker count (same databases)."""
    backend = gateway_backend(kind, workdir, pg_uri)  # puts ROOT on sys.path first
    from tests.conftest import stop_server

    server, key = start_gateway(backend, workdir, CORES)
    try:
        load = asyncio.run(load_gateway(server.url, key, data, point_tags(len(data))))
    finally:
        stop_server(server)
    rows = []
    for workers in worker_counts:
        server, _ = start_gateway(backend, workdir, workers, key)
        try:
            for r in asyncio.run(search_gateway(server.url, key, queries, qtags, truth, ftruth)):
                rows.append({"workers": workers, **load, **r})
        finally:
            stop_server(server)
    return rows


# --- pgvector direct (the reference) -----------------------------------------------------------


async def bench_pgvector_direct(pg_uri: str, data: np.ndarray, queries: np.ndarray, truth) -> list[dict]:
    import asyncpg

    from app.vectors.pgvector import decode_vector, encode_vector

    async def init(conn) -> None:  # noqa: ANN001
        await conn.set_type_codec("vector", schema="public", encoder=encode_vector, decoder=decode_vector, format="binary")
        # ef_search per connection, as the gateway sets it: a search is then one statement (one
        # round trip), not BEGIN, SET LOCAL, SELECT, COMMIT.
        await conn.execute(f"SET hnsw.ef_search = {ef}")

    admin = await asyncpg.connect(pg_uri)
    await admin.execute("DROP DATABASE IF EXISTS bench_direct")
    await admin.execute("CREATE DATABASE bench_direct")
    await admin.close()
    uri = pg_uri.rsplit("/", 1)[0] + "/bench_direct" if "?" not in pg_uri else pg_uri.replace("/postgres?", "/bench_direct?")
    conn = await asyncpg.connect(uri)
    await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    await conn.close()
    from app.vectors.settings import VectorsSettings

    defaults = VectorsSettings()  # the gateway's index parameters, built inline (pgvector's usual way)
    m, efc, ef = defaults.hnsw_m, defaults.hnsw_ef_construction, defaults.ef_search
    pool = await asyncpg.create_pool(uri, min_size=8, max_size=8, init=init)
    dim = data.shape[1]
    rates = {}
    for ic in sorted(INSERT_CONCURRENCY, reverse=True):
        await pool.execute("DROP TABLE IF EXISTS items")
        await pool.execute(f"CREATE TABLE items (id text PRIMARY KEY, embedding vector({dim}) NOT NULL)")
        await pool.execute(
            f"CREATE INDEX ON items USING hnsw (embedding vector_cosine_ops) WITH (m = {m}, ef_construction = {efc})"
        )

        async def insert_batch(start: int, stop: int) -> None:
            await pool.execute(
                "INSERT INTO items SELECT * FROM unnest($1::text[], $2::vector[])",
                [str(i) for i in range(start, stop)],
                [encode_vector(_arr(data[i])) for i in range(start, stop)],
            )

        rates[ic] = await timed_inserts(insert_batch, len(data), ic)
    rows = []

    async def search(q: np.ndarray) -> list[int]:
        res = await pool.fetch("SELECT id FROM items ORDER BY embedding <=> $1 LIMIT 10", encode_vector(_arr(q)))
        return [int(r[0]) for r in res]

    for conc in (1, 8):  # warm-up at each concurrency (connections opened, caches filled)
        await timed_searches(search, queries[: 2 * conc + 8], conc, seconds=0)
    for conc in (1, 8):
        qps, p50, p99, found = await timed_searches(search, queries, conc)
        rows.append({"workers": None, "filtered": False, "concurrency": conc, "insert_vps": rates[1],
                     "insert_vps_c2": rates[2], "indexed_s": len(data) / rates[1], "qps": qps, "p50_ms": p50,
                     "p99_ms": p99, "recall@10": recall(found, truth), "client_us": LAST_CLIENT_CPU[0]})
    await pool.close()
    return rows


def _arr(v: np.ndarray):
    from array import array

    return array("f", v.astype(np.float32).tobytes())


# --- Chroma (run in its own virtualenv) ----------------------------------------------------------


def chroma_worker(args: argparse.Namespace) -> None:
    """Runs under Chroma's Python: start ``chroma run``, insert, search, print JSON rows."""
    import socket

    import chromadb

    data = np.load(args.data)
    queries = np.load(args.queries)
    truth = np.load(args.truth)
    ftruth = np.load(args.ftruth)
    tags = point_tags(len(data))
    qtags = query_tags(len(queries))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tempfile.mkdtemp(prefix="chroma-bench-")
    chroma_bin = str(Path(sys.executable).parent / "chroma")
    log = open(Path(path) / "chroma.log", "wb")
    proc = subprocess.Popen([chroma_bin, "run", "--path", path, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                chromadb.HttpClient(host="127.0.0.1", port=port).heartbeat()
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("chroma did not start: " + (Path(path) / "chroma.log").read_text()[-2000:])
                time.sleep(0.3)

        async def run() -> list[dict]:
            client = await chromadb.AsyncHttpClient(host="127.0.0.1", port=port)
            rates = {}
            for ic in sorted(INSERT_CONCURRENCY, reverse=True):
                if ic != max(INSERT_CONCURRENCY):
                    await client.delete_collection("bench")
                coll = await client.create_collection("bench", metadata={"hnsw:space": "cosine"})

                async def insert_batch(start: int, stop: int) -> None:
                    await coll.add(ids=[str(i) for i in range(start, stop)], embeddings=data[start:stop],
                                   metadatas=[{"tag": int(t)} for t in tags[start:stop]])

                rates[ic] = await timed_inserts(insert_batch, len(data), ic)

            tag_of = {q.tobytes(): int(t) for q, t in zip(queries, qtags)}

            async def search(q: np.ndarray) -> list[int]:
                res = await coll.query(query_embeddings=[q], n_results=K, include=[])
                return [int(i) for i in res["ids"][0]]

            async def search_filtered(q: np.ndarray) -> list[int]:
                res = await coll.query(query_embeddings=[q], n_results=K, where={"tag": tag_of[q.tobytes()]}, include=[])
                return [int(i) for i in res["ids"][0]]

            rows = []
            for filtered, fn, want in ((False, search, truth), (True, search_filtered, ftruth)):
                for conc in (1, 8):  # warm-up at each concurrency (connections opened, caches filled)
                    await timed_searches(fn, queries[: 2 * conc + 8], conc, seconds=0)
                for conc in (1, 8):
                    qps, p50, p99, found = await timed_searches(fn, queries, conc)
                    rows.append({"workers": None, "filtered": filtered, "concurrency": conc, "insert_vps": rates[1],
                                 "insert_vps_c2": rates[2], "indexed_s": len(data) / rates[1], "qps": qps,
                                 "p50_ms": p50, "p99_ms": p99, "recall@10": recall(found, want),
                                 "client_us": LAST_CLIENT_CPU[0]})
            return rows

        print(json.dumps(asyncio.run(run())))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(path, ignore_errors=True)


def bench_chroma(chroma_python: str, workdir: Path, data, queries, truth, ftruth) -> list[dict]:
    for name, arr in (("data", data), ("queries", queries), ("truth", truth), ("ftruth", ftruth)):
        np.save(workdir / f"{name}.npy", arr)
    result = subprocess.run(
        [chroma_python, __file__, "--chroma-worker", "--data", str(workdir / "data.npy"),
         "--queries-file", str(workdir / "queries.npy"), "--truth", str(workdir / "truth.npy"),
         "--ftruth", str(workdir / "ftruth.npy")],
        capture_output=True, text=True, timeout=3600,
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


# --- main -------------------------------------------------------------------------------------


def print_table(results: dict[str, list[dict] | str], n: int, dim: int, nq: int) -> None:
    print(f"\nvectors: {n} x {dim} clustered, cosine, {nq} queries, top-{K}, batches of {BATCH}; "
          f"{CORES} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    header = (f"{'target':<28}{'wrk':>4}{'filter':>12}{'conc':>5}{'insert v/s':>11}{'ins c=2':>8}{'indexed s':>10}"
              f"{'QPS':>9}{'p50 ms':>8}{'p99 ms':>8}{'recall@10':>10}{'cli us':>7}")
    print(header)
    print("-" * len(header))
    for name, rows in results.items():
        if isinstance(rows, str):
            print(f"{name:<28}  not measured: {rows}")
            continue
        for r in rows:
            workers = "-" if r["workers"] is None else str(r["workers"])
            print(f"{name:<28}{workers:>4}{fmt_filter(r['filtered']):>12}{r['concurrency']:>5}{r['insert_vps']:>11.0f}"
                  f"{r['insert_vps_c2']:>8.0f}{r['indexed_s']:>10.1f}{r['qps']:>9.1f}{r['p50_ms']:>8.2f}"
                  f"{r['p99_ms']:>8.2f}{r['recall@10']:>10.3f}{r.get('client_us', 0):>7.0f}")
    print("(wrk: gateway workers, loaded with one per core; filter tag=(1/200): a payload value 0.5% of the points "
          "hold; insert v/s: batches one at a time; ins c=2: two batches in flight; indexed s: from the first insert "
          "until searchable with the index, one batch at a time; conc: searches in flight; cli us: the client process's "
          "CPU per search)")
    for gateway in ("gateway postgres (pgvector)", "gateway sqlite (sqlite-vec)"):
        gw = results.get(gateway)
        if not isinstance(gw, list):
            continue
        short = "gateway-pg" if "postgres" in gateway else "gateway-sqlite"
        for other in ("chroma server", "pgvector direct (asyncpg)") if short == "gateway-pg" else ("chroma server",):
            ref = results.get(other)
            if not isinstance(ref, list):
                continue
            cells = {(r["filtered"], r["concurrency"]): r for r in ref}
            for a in gw:
                b = cells.get((a["filtered"], a["concurrency"]))
                if b is None:
                    continue
                print(f"{short} ({a['workers']} wrk) / {other}, {fmt_filter(a['filtered'])}, concurrency "
                      f"{a['concurrency']}: QPS x{a['qps'] / b['qps']:.2f}, recall {a['recall@10']:.3f} vs "
                      f"{b['recall@10']:.3f}")
            a, b = gw[0], ref[0]
            print(f"{short} / {other} insert: x{a['insert_vps'] / b['insert_vps']:.2f} (one batch at a time), "
                  f"x{a['insert_vps_c2'] / b['insert_vps_c2']:.2f} (two in flight); indexed: {a['indexed_s']:.1f} s "
                  f"vs {b['indexed_s']:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--quick", action="store_true", help="10,000 vectors, 100 queries")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--targets", default="sqlite,postgres,direct,chroma")
    parser.add_argument("--chroma-python", default=os.environ.get("CHROMA_PYTHON", "/tmp/vt/chroma-venv/bin/python"))
    parser.add_argument("--workers", default=f"1,{CORES}",
                        help="gateway worker counts searched, comma-separated (default: 1 and the machine's cores)")
    parser.add_argument("--chroma-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data")
    parser.add_argument("--queries-file", dest="queries_file")
    parser.add_argument("--truth")
    parser.add_argument("--ftruth")
    args, _ = parser.parse_known_args()
    if args.chroma_worker:
        chroma_worker(argparse.Namespace(data=args.data, queries=args.queries_file, truth=args.truth, ftruth=args.ftruth))
        return
    worker_counts = list(dict.fromkeys(int(w) for w in args.workers.split(",")))
    n, nq = (10_000, 100) if args.quick else (args.n, args.queries)
    both = clustered(n + nq, args.dim, seed=1)
    data, queries = both[:n], both[n:]
    truth = ground_truth(data, queries)
    qtags = query_tags(nq)
    ftruth = filtered_truth(data, queries, point_tags(n), qtags)
    targets = args.targets.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="bench-vectors-"))
    results: dict[str, list[dict] | str] = {}
    pg = None
    try:
        if {"postgres", "direct"} & set(targets):
            import pgserver

            pg = pgserver.get_server(workdir / "pg", cleanup_mode="stop")
        for kind in ("sqlite", "postgres"):
            if kind not in targets:
                continue
            name = "gateway sqlite (sqlite-vec)" if kind == "sqlite" else "gateway postgres (pgvector)"
            results[name] = bench_gateway(kind, workdir, pg.get_uri() if pg else None, worker_counts, data, queries,
                                          qtags, truth, ftruth)
        if "direct" in targets and pg is not None:
            results["pgvector direct (asyncpg)"] = asyncio.run(bench_pgvector_direct(pg.get_uri(), data, queries, truth))
        if "chroma" in targets:
            if not Path(args.chroma_python).exists():
                results["chroma server"] = f"no Chroma Python at {args.chroma_python} (set --chroma-python)"
            else:
                try:
                    results["chroma server"] = bench_chroma(args.chroma_python, workdir, data, queries, truth, ftruth)
                except Exception as exc:  # report, keep the rest
                    results["chroma server"] = f"failed: {str(exc).strip().splitlines()[-1][:200]}"
    finally:
        if pg is not None:
            pg.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(results, n, args.dim, nq)


if __name__ == "__main__":
    main()
