"""Recall calibration (``app.vectors.recall``): once a collection's HNSW graph is built, the
builder measures which ``ef_search`` reaches ``vectors.target_recall`` on the collection's own
points, keeps it as the index's comment, and searches use it; a collection that doubles or halves
is measured again. SQLite has no graph: nothing to calibrate, searches are exact.
"""

from __future__ import annotations

from collections.abc import Callable

import asyncio
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from storage_gateway_client import GatewayClient

from app.vectors import recall
from app.vectors.planner import EF_SEARCH_MAX, Subgraph, choose, ef_for
from app.vectors.recall import LADDER, Calibration
from tests.conftest import VECTOR_BACKENDS, Backend, Server, start_server, stop_server
from tests.test_vectors_index import (  # noqa: F401
    clustered,
    insert,
    log_lines,
    own_backend,
    pg_connect,
    start_eager_builder,
    table_of,
    wait_until_indexed,
)

pytestmark = pytest.mark.backends(*VECTOR_BACKENDS)

DIM = 32
CALIBRATED = "calibrated the HNSW index of"


def held_out(n: int, queries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points to store and ``queries`` more from the same clusters, not stored."""
    points = clustered(n + queries, DIM, seed=seed)
    return points[:n], points[n:]


def recall_of(hits: list[dict], data: np.ndarray, q: np.ndarray, k: int) -> float:
    d = data.astype(np.float64)
    dist = 1 - d @ q.astype(np.float64) / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))
    kth = np.sort(dist)[k - 1]
    return sum(1 for h in hits[:k] if dist[int(h["id"])] <= kth + 1e-6) / k


async def calibrated(gw: GatewayClient, collection: str, *, points_at_least: int = 0, timeout: float = 120.0) -> dict:
    """Describe, once the collection's graph has a calibration of at least ``points_at_least`` that
    is not due again (a build between two insert batches on a slow machine measures a smaller
    collection first, and measures again once it has doubled)."""
    deadline = time.monotonic() + timeout
    while True:
        info = await gw.vectors.describe_collection(collection)
        cal = info["index"]["calibration"]
        if cal is not None and cal["points"] >= points_at_least and cal["points"] * recall.REGROW > info["count"]:
            return info
        assert time.monotonic() < deadline, info
        await asyncio.sleep(0.1)


async def plan_ef(
    gw: GatewayClient, collection: str, q: np.ndarray, limit: int, wanted: int | Callable[[int], int]
) -> dict:
    """The plan of an unfiltered search once its ef_search is ``wanted`` (a search process reads
    the index's comment with its statistics, cached for a second), or ``wanted(rows)`` of the
    rows the planner estimated."""
    deadline = time.monotonic() + 15
    while True:
        plan = (await gw.vectors.search_explained(collection, q, limit))["plan"]
        if plan["ef_search"] == (wanted(plan["rows"]) if callable(wanted) else wanted):
            return plan
        assert time.monotonic() < deadline, (plan, wanted)
        await asyncio.sleep(0.1)


async def index_comment(backend: Backend, namespace: str, collection: str) -> str | None:
    conn = await pg_connect(backend)
    try:
        table = await table_of(conn, namespace, collection)
        comment: str | None = await conn.fetchval("SELECT obj_description(to_regclass($1), 'pg_class')", f"{table}_hnsw")
        return comment
    finally:
        await conn.close()


async def comment_index(backend: Backend, namespace: str, collection: str, comment: str) -> None:
    """``COMMENT ON INDEX`` the collection's HNSW index, as an operator could."""
    conn = await pg_connect(backend)
    try:
        table = await table_of(conn, namespace, collection)
        await conn.execute(f"COMMENT ON INDEX {table}_hnsw IS '{comment.replace(chr(39), chr(39) * 2)}'")
    finally:
        await conn.close()


# --- through the gateway ------------------------------------------------------------------------


async def test_searches_use_the_ef_search_measured_on_the_collection(
    gw: GatewayClient, server: Server, namespace: str
) -> None:
    data, queries = held_out(3000, 20, seed=31)
    await gw.vectors.setup_collection("r", DIM)
    await insert(gw, "r", data)
    await wait_until_indexed(gw, server, "r")
    if not server.backend.is_postgres:
        info = await gw.vectors.describe_collection("r")
        assert info["index"]["calibration"] is None and info["index"]["ef_search"] is None
        assert (await gw.vectors.search_explained("r", queries[0], 10))["plan"]["kind"] == "exact_scan"
        return
    info = await calibrated(gw, "r")
    cal = info["index"]["calibration"]
    assert cal["ef_search"] in LADDER and cal["target_recall"] == 0.98 and cal["queries"] == 50 and cal["k"] == 10
    # ``points`` is the rows counted (PostgreSQL's estimate ran past the 3,000 stored: 5,500 once).
    assert 1500 < cal["points"] <= 3000 and cal["seconds"] >= 0
    # Kept as the index's comment, and logged with what each ef_search measured; the target
    # reached, or the graph's best (twice the ef_search recalled no more).
    kept = recall.parse(await index_comment(server.backend, namespace, "r"))
    assert kept is not None and kept.ef_search == cal["ef_search"] == recall.pick(kept.ladder, 0.98)
    # Describe: the ef_search a search of 10 gets, the size rule's (100) unless the graph needs more.
    assert info["index"]["ef_search"] == ef_for(3000, 10, 100, kept) >= 100, info
    assert list(kept.ladder) == list(LADDER[: len(kept.ladder)])
    assert cal["recall"] >= 0.98 or recall.settled(kept.ladder), kept
    lines = log_lines([server], f"{CALIBRATED} {namespace}/r:")
    assert lines and f"ef_search {cal['ef_search']}," in lines[-1], lines
    # Searches take it where it is above the size rule: as measured for 10 results, x5 for 50.
    assert (await plan_ef(gw, "r", queries[0], 10, lambda rows: ef_for(rows, 10, 100, kept)))["kind"] == "hnsw"
    assert ef_for(3000, 50, 100, kept) > 100  # 5 x at least 40
    await plan_ef(gw, "r", queries[0], 50, lambda rows: ef_for(rows, 50, 100, kept))
    # And it holds on queries that are not stored points.
    recalls = [recall_of(await gw.vectors.search("r", q, 10), data, q, 10) for q in queries]
    assert np.mean(recalls) >= 0.95, recalls
    # A reset drops the graph and its calibration with it.
    await gw.vectors.reset_collection("r")
    info = await gw.vectors.describe_collection("r")
    assert info["index"]["calibration"] is None and info["index"]["state"] == "pending"
    assert await index_comment(server.backend, namespace, "r") is None


@pytest.mark.postgres_only
async def test_a_graph_that_recalls_poorly_gets_the_ef_search_it_needs(
    gw: GatewayClient, server: Server, namespace: str
) -> None:
    """Independent noise in 24 dimensions through a sparse graph (m 4, ef_construction 16): the
    ladder climbs past pgvector's default until the sampled points' recall reaches the target."""
    rng = np.random.default_rng(61)
    data = rng.normal(size=(3000, 24)).astype(np.float32)
    await gw.vectors.setup_collection("hard", 24, index={"m": 4, "ef_construction": 16})
    await insert(gw, "hard", data)
    cal = (await calibrated(gw, "hard"))["index"]["calibration"]
    kept = recall.parse(await index_comment(server.backend, namespace, "hard"))
    assert kept is not None and cal["ef_search"] > LADDER[0], kept
    assert list(kept.ladder) == list(LADDER[: len(kept.ladder)])
    assert cal["ef_search"] == recall.pick(kept.ladder, 0.98)
    assert all(r < 0.98 for ef, r in kept.ladder.items() if ef < cal["ef_search"]), kept.ladder
    assert cal["recall"] >= 0.98 or recall.settled(kept.ladder), cal
    # Searches take it where it is above the size rule's 100.
    assert (await gw.vectors.describe_collection("hard"))["index"]["ef_search"] == ef_for(3000, 10, 100, kept)
    await plan_ef(gw, "hard", data[0], 11, lambda rows: ef_for(rows, 11, 100, kept))
    picks = rng.choice(len(data), 60, replace=False)
    async def mean_recall(ef: int | None) -> float:
        out = []
        for i in picks:
            hits = await gw.vectors.search("hard", data[i], 11, ef_search=ef)
            truth = np.argsort(-(data @ data[i]) / np.linalg.norm(data, axis=1))[:11].tolist()
            out.append(recall.recall_at_k(truth, [int(h["id"]) for h in hits], int(i)))
        return float(np.mean(out))
    # Other stored points (60: one recall@10 varies much from point to point on this data):
    # well above what pgvector's default 40 recalls, and about what the calibration measured.
    default, at_40 = await mean_recall(None), await mean_recall(LADDER[0])
    if server.backend.name == "pgvector08":
        # pgvector 0.8 costs a graph walk by ef_search and the pages it reads: PostgreSQL walks
        # these 3,000 points at some ef_search and sorts them (exact) at others (0.963 / 0.758
        # in one run, 1.0 / 1.0 in another); the plans above are the check there.
        assert default >= 0.9 and default >= at_40, (default, at_40, kept)
    else:
        assert default >= 0.9 and default >= at_40 + 0.08 and at_40 < 0.98, (default, at_40, kept)


@pytest.mark.postgres_only
async def test_a_collection_is_measured_again_when_it_doubles_or_loses_its_calibration(
    own_backend: Backend, tmp_path: Path  # noqa: F811
) -> None:
    data, queries = held_out(3200, 1, seed=41)
    ns = f"r{uuid.uuid4().hex[:10]}"
    # Built at 1,500 points, not after the first batch of 1,000.
    server = start_eager_builder(own_backend, tmp_path / "gateway.log")
    try:
        async with GatewayClient(server.url, ns, os.environ["GATEWAY_TEST_ADMIN_KEY"]) as gw:
            await gw.vectors.setup_collection("c", DIM)
            await insert(gw, "c", data[:1500])
            first = (await calibrated(gw, "c"))["index"]["calibration"]
            # ``points`` is the rows counted when it was measured (PostgreSQL's estimate ran past
            # them: 3,400 for 3,200), so the 3,000 rows below double it exactly.
            assert first["points"] == 1500, first
            kept = recall.parse(await index_comment(own_backend, ns, "c"))
            assert kept is not None and kept.points == first["points"]
            # Grown by a third: not measured again; the planner grows the calibrated ef_search by
            # sqrt(2000 / points) (seen at 50 results, where it is above the size rule's 100).
            await insert(gw, "c", data[1500:2000], start=1500)
            grown = math.ceil(kept.ef_search * math.sqrt(2000 / kept.points) * 5)
            assert grown > 100 and ef_for(2000, 50, 100, kept) == min(EF_SEARCH_MAX, grown)
            # The search's rows are PostgreSQL's estimate, which ran past the 2,000 here (2,500):
            # an ANALYZE counts rows whose writer has not yet flushed its statistics, which then
            # count them again. The growth is checked on the rows the planner saw.
            plan = await plan_ef(gw, "c", queries[0], 50, lambda rows: ef_for(rows, 50, 100, kept) if rows >= 2000 else -1)
            assert plan["ef_search"] >= min(EF_SEARCH_MAX, grown), plan
            await asyncio.sleep(1.5)  # the check after the writes has run
            assert (await gw.vectors.describe_collection("c"))["index"]["calibration"] == first
            # Doubled: measured again.
            await insert(gw, "c", data[2000:], start=2000)
            second = (await calibrated(gw, "c", points_at_least=2900))["index"]["calibration"]
            assert 3000 <= second["points"] <= 3200, second  # doubled, counted (the last batch may land after)
            # An index that lost its comment (an operator's COMMENT ON INDEX) is found by the sweep.
            await comment_index(own_backend, ns, "c", "an operator's note")
            before = len(log_lines([server], f"{CALIBRATED} {ns}/c:"))
            info = await calibrated(gw, "c", timeout=30)
            assert info["index"]["calibration"]["points"] >= 2900
            assert len(log_lines([server], f"{CALIBRATED} {ns}/c:")) == before + 1
    finally:
        stop_server(server)


@pytest.mark.postgres_only
async def test_calibration_off_keeps_the_configured_ef_search(own_backend: Backend, tmp_path: Path) -> None:  # noqa: F811
    data, queries = held_out(1500, 1, seed=51)
    ns = f"r{uuid.uuid4().hex[:10]}"
    server = start_server(
        own_backend, tmp_path / "gateway.log",
        GATEWAY_VECTORS__INDEX_QUIET_SECONDS="0.2", GATEWAY_VECTORS__TARGET_RECALL="0", GATEWAY_VECTORS__EF_SEARCH="70",
    )
    try:
        async with GatewayClient(server.url, ns, os.environ["GATEWAY_TEST_ADMIN_KEY"]) as gw:
            await gw.vectors.setup_collection("c", DIM)
            await insert(gw, "c", data)
            await wait_until_indexed(gw, server, "c")
            await asyncio.sleep(1.0)
            info = await gw.vectors.describe_collection("c")
            assert info["index"]["calibration"] is None and info["index"]["ef_search"] == 70
            assert (await gw.vectors.search_explained("c", queries[0], 10))["plan"]["ef_search"] == 70
            assert not log_lines([server], CALIBRATED)
            assert await index_comment(own_backend, ns, "c") is None
            # A calibration kept from a run with it on is not used either.
            await comment_index(own_backend, ns, "c", _cal(ef_search=300, points=1500).comment())
            await asyncio.sleep(1.5)  # the search path's cached statistics
            assert (await gw.vectors.search_explained("c", queries[0], 10))["plan"]["ef_search"] == 70
            assert (await gw.vectors.describe_collection("c"))["index"]["calibration"] is None
    finally:
        stop_server(server)


# --- the decisions (pure) --------------------------------------------------------------------------


def _cal(**kw: Any) -> Calibration:
    base: dict[str, Any] = dict(ef_search=64, recall=0.985, target=0.98, points=100_000, queries=50, seconds=1.0,
                                ladder={40: 0.96, 48: 0.975, 64: 0.985})
    return Calibration(**{**base, **kw})


def test_the_smallest_ef_search_that_reaches_the_target_is_picked() -> None:
    assert recall.pick({40: 0.96, 48: 0.975, 64: 0.985}, 0.98) == 64
    assert recall.pick({40: 0.99}, 0.98) == 40
    # None reaches it: the smallest that recalled the best (a larger one only costs).
    assert recall.pick({40: 0.5, 1000: 0.9}, 0.98) == 1000
    plateau = {40: 0.974, 48: 0.976, 64: 0.976, 80: 0.976, 100: 0.978, 128: 0.978, 160: 0.978, 200: 0.978}
    assert recall.pick(plateau, 0.98) == 100
    # Measuring stops once twice an ef_search recalled no more (measured at 500,000 points).
    steps = dict(list(plateau.items())[:4])
    assert not recall.settled(steps)  # 80 recalled more than 40
    for n in range(5, 8):
        assert not recall.settled(dict(list(plateau.items())[:n]))
    assert recall.settled(plateau)  # 200 recalled what 100 did
    assert recall.settled({40: 0.9, 48: 0.95, 64: 0.95, 80: 0.9})  # no gain (noise) from 40 to 80
    assert not recall.settled({40: 0.9})
    # A query's own id is left out of both answers; ties beyond K are not asked for.
    assert recall.recall_at_k(["q", *map(str, range(11))], ["q", *map(str, range(9)), "x"], "q") == 0.9
    assert recall.recall_at_k(["q"], ["q"], "q") == 1.0


def test_a_calibration_is_due_when_missing_stale_or_for_another_target() -> None:
    cal = _cal()
    assert recall.due(None, 5000, 0.98) and not recall.due(None, 5000, 0.0)
    assert not recall.due(None, 10, 0.98) and not recall.due(cal, 0, 0.98)  # emptied: nothing to measure
    assert not recall.due(cal, 150_000, 0.98) and not recall.due(cal, 60_000, 0.98)
    assert recall.due(cal, 200_000, 0.98) and recall.due(cal, 50_000, 0.98)
    assert recall.due(cal, 100_000, 0.95)


def test_the_comment_round_trips_and_foreign_comments_are_ignored() -> None:
    cal = _cal()
    assert recall.parse(cal.comment()) == cal
    for foreign in (None, "", "an operator's note", "[1, 2]", '{"ef_search": 40}', '{"mark": "x"}',
                    cal.comment().replace('"points":100000', '"points":"many"')):
        assert recall.parse(foreign) is None, foreign


def test_the_planner_raises_ef_search_to_the_calibration_grown_with_the_collection_and_the_limit() -> None:
    easy, hard = _cal(), _cal(ef_search=160, recall=0.981, ladder={40: 0.9, 160: 0.981})
    # An easy graph keeps the size rule: sampled points are easier queries than new ones.
    assert ef_for(100_000, 10, 100, easy) == 100 and ef_for(400_000, 10, 100, easy) == 200
    # A graph that measured a need above it gets it,
    assert ef_for(100_000, 10, 100, hard) == 160
    assert ef_for(50_000, 10, 100, hard) == 160  # fewer points: at least as good
    assert ef_for(400_000, 10, 100, hard) == 320  # grown by sqrt(4) until measured again
    assert ef_for(100_000, 50, 100, hard) == 800  # the measured ef_search per result
    assert ef_for(100_000, 50, 100, easy) == 320
    assert ef_for(100_000, 5, 100, hard) == 160
    assert ef_for(10**8, 100, 100, hard) == EF_SEARCH_MAX
    common: dict[str, Any] = dict(rows=100_000, limit=10, base_ef=100, index_ready=True, narrowed=False,
                                  exact_threshold=5000, iterative=False)
    assert choose(filtered=False, selectivity=None, calibration=hard, **common).ef_search == 160
    assert choose(filtered=False, selectivity=None, calibration=easy, **common).ef_search == 100
    assert choose(filtered=False, selectivity=None, **common).ef_search == 100
    assert choose(filtered=False, selectivity=None, calibration=hard, fixed_ef=30, **common).ef_search == 30
    # A filter still widens it for its matches; a subgraph searches with the calibrated one.
    assert choose(filtered=True, selectivity=0.05, calibration=hard, **common).ef_search == 400
    sub = choose(filtered=True, selectivity=0.02, calibration=hard, subgraph=Subgraph("g", 0.02), **common)
    assert sub.kind == "hnsw_subgraph" and sub.ef_search == 160
