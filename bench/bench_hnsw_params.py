"""HNSW build parameters at scale: what ``m`` and ``ef_construction`` buy at 500,000 points.

Issue 18 asks for index parameters for large collections "measured, not guessed". This bench
takes the points of a collection that ``bench_vectors_scale.py --workdir DIR`` loaded through the
gateway (its PostgreSQL is kept in ``DIR/pg``), copies them into a scratch table next to it, and
for each ``m:ef_construction`` in ``--params`` builds an HNSW index the way the gateway's builder
does (``maintenance_work_mem`` as the gateway's 2 GB, PostgreSQL's parallel build), then measures
at each ``ef_search`` of ``--ef``:

- recall@10 of the bench's 100 held-out queries against exact numpy (cosine);
- the SQL-level p50 / p99 of one search, one connection, no gateway (its overhead does not
  depend on the graph: ``bench_vectors_scale.py`` gives the end-to-end numbers);
- how many of 200 stored points the graph finds as their own nearest neighbour ("self"):
  a point the greedy walk cannot reach from the entry point is lost to every query.

    .venv/bin/python bench/bench_hnsw_params.py --workdir /work/scale --size 500000 \\
        --params 16:128,24:128,32:128,16:256

The scratch table and its indexes are dropped at the end; the gateway's own table is only read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from bench_vectors import clustered, ground_truth  # noqa: E402
from bench_vectors_scale import DIM, K, recall, start_postgres  # noqa: E402

SCRATCH = "hnsw_params_probe"


async def main_async(args: argparse.Namespace) -> None:
    import asyncpg
    from sqlalchemy.engine import make_url

    from app.vectors.pgvector import encode_vector

    workdir = Path(args.workdir)
    pg = start_postgres(workdir / "pg", args.shared_buffers)
    try:
        n = args.size
        both = clustered(n + args.queries, DIM, seed=1)
        data, queries = both[:n], both[n:]
        truth = [[int(j) for j in top] for top in ground_truth(data, queries)]
        rng = np.random.default_rng(7)
        selves = rng.choice(n, size=args.selves, replace=False)
        dsn = make_url(pg.get_uri()).set(database=f"bscale_{n}_vectors").render_as_string(hide_password=False)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.set_type_codec("vector", encoder=encode_vector, decoder=bytes, format="binary")
            tables = await conn.fetch(
                "SELECT c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid "
                "WHERE a.attname = 'embedding' AND c.relkind = 'r' AND c.relname <> $1", SCRATCH)
            if len(tables) != 1:
                raise SystemExit(f"expected one collection table, found {[t[0] for t in tables]}")
            source = tables[0][0]
            await conn.execute(f"DROP TABLE IF EXISTS {SCRATCH}")
            await conn.execute(
                f"CREATE TABLE {SCRATCH} AS SELECT CAST(id AS integer) AS id, embedding FROM {source}")
            await conn.execute(f"ALTER TABLE {SCRATCH} ADD PRIMARY KEY (id)")
            await conn.execute(f"VACUUM ANALYZE {SCRATCH}")
            count = await conn.fetchval(f"SELECT count(*) FROM {SCRATCH}")
            print(f"{source}: {count} points copied", flush=True)
            await conn.execute("SET max_parallel_maintenance_workers = 2")
            await conn.execute(f"SET maintenance_work_mem = '{args.build_memory_mb}MB'")
            results = []
            for spec in args.params.split(","):
                m, efc = (int(x) for x in spec.split(":"))
                await conn.execute(f"DROP INDEX IF EXISTS {SCRATCH}_hnsw")
                t0 = time.perf_counter()
                await conn.execute(
                    f"CREATE INDEX {SCRATCH}_hnsw ON {SCRATCH} USING hnsw (embedding vector_cosine_ops) "
                    f"WITH (m = {m}, ef_construction = {efc})")
                built = time.perf_counter() - t0
                size = await conn.fetchval(f"SELECT pg_relation_size('{SCRATCH}_hnsw')")
                # Read the graph into shared buffers once, as a serving database would have it.
                await conn.execute("SET hnsw.ef_search = 1000")
                for q in queries:
                    await conn.fetch(f"SELECT id FROM {SCRATCH} ORDER BY embedding <=> $1 LIMIT {K}", q)
                row = {"m": m, "ef_construction": efc, "build_s": round(built, 1),
                       "index_mb": round(size / 2**20), "ef": {}}
                for ef in [int(e) for e in args.ef.split(",")]:
                    await conn.execute(f"SET hnsw.ef_search = {ef}")
                    stmt = await conn.prepare(f"SELECT id FROM {SCRATCH} ORDER BY embedding <=> $1 LIMIT {K}")
                    lat, found = [], []
                    for _ in range(args.rounds):
                        for q in queries:
                            t = time.perf_counter()
                            ids = [r[0] for r in await stmt.fetch(q)]
                            lat.append(time.perf_counter() - t)
                            if len(found) < len(queries):
                                found.append(ids)
                    rec = recall(found, truth)
                    self_found = 0
                    for i in selves:
                        ids = [r[0] for r in await stmt.fetch(data[i])]
                        self_found += int(i) in ids
                    row["ef"][ef] = {"recall": round(rec, 4), "p50_ms": round(float(np.percentile(lat, 50)) * 1000, 2),
                                     "p99_ms": round(float(np.percentile(lat, 99)) * 1000, 2),
                                     "self": f"{self_found}/{len(selves)}"}
                print(json.dumps(row), flush=True)
                results.append(row)
            if not args.keep:
                await conn.execute(f"DROP TABLE IF EXISTS {SCRATCH}")
        finally:
            await conn.close()
    finally:
        pg.cleanup()
    efs = list(results[0]["ef"]) if results else []
    print("\n| m / ef_construction | build s | index MB | " + " | ".join(f"ef {e}: recall, p50 ms, self" for e in efs) + " |")
    print("|---|---|---|" + "---|" * len(efs))
    for r in results:
        cells = " | ".join(f"{c['recall']:.3f}, {c['p50_ms']:.2f}, {c['self']}" for c in r["ef"].values())
        print(f"| {r['m']} / {r['ef_construction']} | {r['build_s']:.0f} | {r['index_mb']} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="bench_vectors_scale.py's --workdir (its PostgreSQL)")
    parser.add_argument("--size", type=int, default=500000, help="the collection loaded at this size")
    parser.add_argument("--params", default="16:128,24:128,32:128,16:256", help="m:ef_construction, comma separated")
    parser.add_argument("--ef", default="40,64,100,160,224")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--selves", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--build-memory-mb", type=int, default=2048)
    parser.add_argument("--shared-buffers", default="6026MB")
    parser.add_argument("--keep", action="store_true", help="keep the scratch table (and its last index)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
