"""Declared payload indexes and the search planner on both backends.

A collection declares payload fields to index (``payload_indexes``); PostgreSQL builds B-tree
expression indexes on them in the background (with the HNSW index), SQLite makes them on
``json_extract`` with the table. Describe reports them with their state; the database uses them
for a selective filter (``EXPLAIN``); they go with the collection. Filters on declared and
undeclared fields return exactly the ``min(limit, matches)`` nearest matches, and a search asked
to ``explain`` says which plan ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
import uuid
from pathlib import Path

import asyncpg
import httpx
import numpy as np
import pytest
from sqlalchemy.engine import make_url
from storage_gateway_client import Conflict, GatewayClient, InvalidRequest, PayloadIndex

from app.vectors.estimate import FieldStats, distinct_count, estimate
from app.vectors.filters import parse_filter
from app.vectors.nulescape import escape_text, unescape_text
from app.vectors.payload_index import MAX_DECLARED_VALUE_BYTES
from app.vectors.pgvector import PayloadFailure, _Positional, compile_filter as pg_compile, parse_payload_failures, payload_failures_sql
from app.vectors.planner import EF_REFERENCE_ROWS, EF_SEARCH_MAX, ITERATIVE_SCAN_MAX, choose, ef_for
from app.vectors.sqlite_vec import compile_filter as sqlite_compile
from app.vectors.filters import SqlBuilder
from tests.test_vectors_index import (  # noqa: F401
    clustered, index_problems, own_backend, pg_connect, start_eager_builder, table_of,
)
from tests.conftest import VECTOR_BACKENDS, Backend, start_server, stop_server

pytestmark = pytest.mark.backends(*VECTOR_BACKENDS)

N, DIM = 4000, 16
DECLARED = [{"field": "user", "kind": "keyword"}, {"field": "n", "kind": "integer"}]


def payloads(n: int) -> list[dict]:
    # user: 400 values (0.25% each); group: 5 values (20%), undeclared; n: 0..n-1
    return [{"user": f"u{i % 400}", "group": f"g{i % 5}", "n": i, "even": i % 2 == 0} for i in range(n)]


async def wait_ready(gw: GatewayClient, server, collection: str, timeout: float = 120.0) -> dict:
    """Until the HNSW and payload indexes are ready (PostgreSQL); SQLite's are at once."""
    deadline = time.monotonic() + timeout
    while True:
        info = await gw.vectors.describe_collection(collection)
        ready = all(p["state"] == "ready" for p in info["payload_indexes"])
        if ready and info["index"]["state"] in ("ready", "exact"):
            return info
        assert time.monotonic() < deadline, info
        await asyncio.sleep(0.1)


async def wait_plan(gw: GatewayClient, collection: str, q, wanted: set[str], **kw) -> dict:
    """A search's answer once its plan is one of ``wanted`` (a search process caches the index
    state for a second)."""
    deadline = time.monotonic() + 10
    while True:
        answer = await gw.vectors.search_explained(collection, q, **kw)
        if answer["plan"]["kind"] in wanted:
            return answer
        assert time.monotonic() < deadline, answer["plan"]
        await asyncio.sleep(0.2)


def cosine(data: np.ndarray, q: np.ndarray) -> np.ndarray:
    d = data.astype(np.float64)
    return 1 - d @ q.astype(np.float64) / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))


def sqlite_path(server) -> str:
    return make_url(server.backend.urls["vectors"]).database


async def test_declarations_are_validated_and_part_of_the_settings(gw: GatewayClient, http: httpx.AsyncClient, namespace: str) -> None:
    base = f"/v1/{namespace}/vectors"
    bad = [
        [{"field": "a b", "kind": "keyword"}],
        [{"field": "a", "kind": "date"}],
        [{"field": "a", "kind": "keyword"}, {"field": "a", "kind": "integer"}],
        [{"field": f"f{i}", "kind": "bool"} for i in range(17)],
    ]
    for declared in bad:
        r = await http.put(f"{base}/bad", json={"vector_size": 4, "payload_indexes": declared})
        assert r.status_code == 422, (declared, r.text)
        assert "payload_indexes" in r.text
    with pytest.raises(InvalidRequest):
        await gw.vectors.setup_collection("bad", 4, payload_indexes=[{"field": "x", "kind": "nope"}])
    created = await gw.vectors.setup_collection("c", 4, payload_indexes=[PayloadIndex(field="user", kind="keyword")])
    assert [(p["field"], p["kind"]) for p in created["payload_indexes"]] == [("user", "keyword")]
    assert created["payload_indexes"][0]["state"] in ("pending", "ready")
    # The same declaration (or none) ensures; another one is a conflict.
    await gw.vectors.setup_collection("c", 4, payload_indexes=[{"field": "user", "kind": "keyword"}])
    await gw.vectors.setup_collection("c", 4)
    with pytest.raises(Conflict):
        await gw.vectors.setup_collection("c", 4, payload_indexes=[{"field": "user", "kind": "integer"}])
    listed = await gw.vectors.list_collections()
    assert [p["field"] for p in listed["items"][0]["payload_indexes"]] == ["user"]


async def test_searches_before_the_index_is_ready_say_they_scanned_exactly(gw: GatewayClient) -> None:
    data = clustered(200, DIM, seed=5)
    await gw.vectors.setup_collection("small", DIM, payload_indexes=DECLARED)
    await gw.vectors.upsert_points("small", data, payloads(200), [str(i) for i in range(200)])
    for flt in (None, {"user": "u3"}, {"group": "g1"}):
        answer = await gw.vectors.search_explained("small", data[0], 10, filters=flt)
        assert answer["plan"]["kind"] in ("exact_scan", "filter_first"), answer["plan"]
        assert answer["plan"]["fallback"] is False
        expected = 10 if flt is None or "group" in flt else 1
        assert len(answer["results"]) == expected
    info = await gw.vectors.describe_collection("small")
    assert sum(info["index"]["plans"].values()) >= 3


@pytest.mark.slow
async def test_declared_indexes_are_built_used_and_dropped(gw: GatewayClient, server, namespace: str) -> None:
    data = clustered(N, DIM, seed=7)
    await gw.vectors.setup_collection("d", DIM, payload_indexes=DECLARED)
    await gw.vectors.upsert_points("d", data, payloads(N), [str(i) for i in range(N)])
    info = await wait_ready(gw, server, "d")
    assert [(p["field"], p["kind"], p["state"]) for p in info["payload_indexes"]] == [
        ("user", "keyword", "ready"), ("n", "integer", "ready")
    ]
    selective = [{"user": "u7"}, {"n": {"$gte": 10, "$lt": 20}}]
    if server.backend.is_postgres:
        conn = await pg_connect(server.backend)
        try:
            table = await table_of(conn, namespace, "d")
            # The builder analyzed the table after the B-trees: their expressions have statistics.
            analyzed = {r[0] for r in await conn.fetch(
                "SELECT tablename FROM pg_stats WHERE tablename = ANY($1::text[]) AND attname = 'expr'",
                [f"{table}_p0", f"{table}_p1"],
            )}
            assert analyzed == {f"{table}_p0", f"{table}_p1"}
            names = {r[0] for r in await conn.fetch("SELECT indexname FROM pg_indexes WHERE tablename = $1", table)}
            assert {f"{table}_p0", f"{table}_p1"} <= names
            declared = {"user": "keyword", "n": "integer"}
            for flt, index in zip(selective, (f"{table}_p0", f"{table}_p1")):
                sql = _Positional(1)
                where = pg_compile(parse_filter(flt), sql, declared)
                plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN SELECT id FROM {table} WHERE {where}", *sql.args))
                assert index in plan, plan
                # Only the declared index: no containment for the GIN index to AND in beside it.
                assert "@>" not in where and f"{table}_payload" not in plan, plan
            # Undeclared equalities and $in are plain containment, which the payload GIN index can
            # serve (on a table this small the planner prefers a scan unless told otherwise; a
            # COALESCE-wrapped condition could not use the index at all).
            await conn.execute("SET enable_seqscan = off")
            for flt in ({"user": "u7", "group": "g2"}, {"group": {"$in": ["g1", "g2"]}}):
                sql = _Positional(1)
                where = pg_compile(parse_filter(flt), sql, {})
                plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN SELECT id FROM {table} WHERE {where}", *sql.args))
                assert f"{table}_payload" in plan, plan
            await conn.execute("RESET enable_seqscan")
        finally:
            await conn.close()
        # A declared keyword equality is estimated from those statistics: each user is 10 of the
        # 4,000 points, and so is a value they have not seen (an average value's share, as
        # PostgreSQL's own planner estimates it), where a block sample finding none says 1.
        await wait_plan(gw, "d", data[0], {"hnsw", "hnsw_iterative"}, limit=5)
        for user in ("u7", "u123", "nobody"):
            answer = await gw.vectors.search_explained("d", data[0], 5, filters={"user": user})
            # each user's share is 1/400; the table's row count is PostgreSQL's own estimate
            # (reltuples: seen 4,500 and 6,000 for these 4,000 rows on a loaded machine)
            plan = answer["plan"]
            # (an unseen value's share is the sampled statistics' average: seen 12 for 5,500 / 400)
            assert abs(plan["estimated_matches"] - plan["rows"] / 400) <= max(1, plan["rows"] / 400 * 0.25), (user, plan)
            assert plan["rows"] >= N, (user, plan)
        await gw.vectors.drop_collection("d")
        conn = await pg_connect(server.backend)
        try:
            for suffix in ("", "_p0", "_p1", "_hnsw", "_payload"):
                assert await conn.fetchval("SELECT to_regclass($1)", f"{table}{suffix}") is None
        finally:
            await conn.close()
        assert not index_problems(server)  # the builder's checks and sweeps ran without a warning
        assert "built the keyword payload index on 'user' of" in server.log()
    else:
        db = sqlite3.connect(f"file:{sqlite_path(server)}?mode=ro", uri=True)
        try:
            cid = db.execute(
                "SELECT id FROM vector_collections WHERE namespace = ? AND collection = 'd'", (namespace,)
            ).fetchone()[0]
            table = f"vec_{cid}"
            names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?", (table,))}
            assert {f"{table}_p0", f"{table}_p1"} <= names
            declared = {"user": "keyword", "n": "integer"}
            for flt, index in zip(selective, (f"{table}_p0", f"{table}_p1")):
                sql = SqlBuilder()
                where = sqlite_compile(parse_filter(flt), sql, declared)
                plan = " ".join(str(r) for r in db.execute(f"EXPLAIN QUERY PLAN SELECT id FROM {table} WHERE {where}", sql.params))
                assert index in plan, plan
        finally:
            db.close()
        await gw.vectors.drop_collection("d")
        db = sqlite3.connect(f"file:{sqlite_path(server)}?mode=ro", uri=True)
        try:
            left = db.execute("SELECT name FROM sqlite_master WHERE tbl_name = ?", (table,)).fetchall()
            assert left == []
        finally:
            db.close()


@pytest.mark.slow
async def test_filters_return_the_exact_nearest_matches(gw: GatewayClient, server) -> None:
    """Declared and undeclared fields at 0.25%, 2% (a declared range), 20% and 50%: always
    ``min(limit, matches)`` results, the exact ones when the plan is exact, and the plan named."""
    data = clustered(N, DIM, seed=9)
    queries = clustered(5, DIM, seed=10)
    pl = payloads(N)
    await gw.vectors.setup_collection("f", DIM, payload_indexes=DECLARED)
    await gw.vectors.upsert_points("f", data, pl, [str(i) for i in range(N)])
    await wait_ready(gw, server, "f")
    if server.backend.is_postgres:
        await wait_plan(gw, "f", queries[0], {"hnsw", "hnsw_iterative"}, limit=10)
    cases = [
        ({"user": "u7"}, lambda p: p["user"] == "u7"),  # declared, 0.25%
        ({"group": "g3"}, lambda p: p["group"] == "g3"),  # undeclared, 20%
        ({"group": {"$in": ["g1", "g2"]}, "even": True}, lambda p: p["group"] in ("g1", "g2") and p["even"]),
        ({"n": {"$gte": 100, "$lt": 180}}, lambda p: 100 <= p["n"] < 180),  # declared range, 2%
        ({"n": {"$gte": 1000}, "user": {"$ne": "u1"}}, lambda p: p["n"] >= 1000 and p["user"] != "u1"),
        ({"even": False}, lambda p: not p["even"]),  # undeclared, 50%
    ]
    for flt, keep in cases:
        mask = np.array([keep(p) for p in pl])
        matches = int(mask.sum())
        for q in queries:
            for limit in (10, 60):
                answer = await gw.vectors.search_explained("f", q, limit, filters=flt)
                hits, plan = answer["results"], answer["plan"]
                assert len(hits) == min(limit, matches), (flt, plan)
                assert all(keep(h["payload"]) for h in hits)
                dist = np.where(mask, cosine(data, q), np.inf)
                truth = set(np.argsort(dist)[: min(limit, matches)].tolist())
                found = {int(h["id"]) for h in hits}
                if plan["kind"] in ("exact_scan", "filter_first") or plan["fallback"]:
                    kth = np.sort(dist)[min(limit, matches) - 1]
                    assert all(dist[i] <= kth + 1e-5 for i in found), (flt, plan)
                else:
                    assert len(found & truth) / len(truth) >= 0.8, (flt, plan)
    if server.backend.is_postgres:
        plans = (await gw.vectors.describe_collection("f"))["index"]["plans"]
        assert plans.get("filter_first", 0) > 0 and plans.get("hnsw", 0) + plans.get("hnsw_iterative", 0) > 0, plans


# --- the planner's decisions (pure) -------------------------------------------------------------


def test_ef_search_grows_with_the_collection_and_the_limit() -> None:
    assert ef_for(10_000, 10, 100) == 100
    assert ef_for(EF_REFERENCE_ROWS, 10, 100) == 100
    assert ef_for(4 * EF_REFERENCE_ROWS, 10, 100) == 200
    assert ef_for(10_000, 300, 100) == 300
    assert ef_for(10**9, 10, 100) == EF_SEARCH_MAX


def test_planner_chooses_by_the_estimated_matches() -> None:
    common = dict(rows=500_000, limit=10, base_ef=100, exact_threshold=5000, iterative=False)
    assert choose(index_ready=False, filtered=True, narrowed=False, selectivity=0.5, **common).kind == "exact_scan"
    assert choose(index_ready=False, filtered=True, narrowed=True, selectivity=0.5, **common).kind == "filter_first"
    assert choose(index_ready=True, filtered=False, narrowed=False, selectivity=None, **common).kind == "hnsw"
    few = choose(index_ready=True, filtered=True, narrowed=True, selectivity=0.001, **common)
    assert few.kind == "filter_first" and few.estimated_matches == 500
    many = choose(index_ready=True, filtered=True, narrowed=True, selectivity=0.2, **common)
    assert many.kind == "hnsw" and many.ef_search >= 100
    some = choose(index_ready=True, filtered=True, narrowed=False, selectivity=0.05, **common)
    assert some.kind == "hnsw" and some.ef_search >= 400
    # Too many matches to compare (2% of 500,000), too rare for the margin at the largest
    # ef_search, but not for MIN_FILTER_MARGIN: the graph at its largest ef_search.
    two = choose(index_ready=True, filtered=True, narrowed=True, selectivity=0.019, **common)
    assert two.kind == "hnsw" and two.ef_search == EF_SEARCH_MAX
    # Too rare for the graph: narrowed by an index, or compared one by one.
    assert choose(index_ready=True, filtered=True, narrowed=True, selectivity=0.012, **common).kind == "filter_first"
    assert choose(index_ready=True, filtered=True, narrowed=False, selectivity=0.001, **common).kind == "exact_scan"
    # pgvector 0.8: the walk goes on until limit points pass the filter, when that takes at most
    # hnsw.max_scan_tuples points and at most half the collection; a rarer one is compared exactly.
    iterative = {**common, "iterative": True}
    assert choose(index_ready=True, filtered=True, narrowed=False, selectivity=0.001, **iterative).kind == "hnsw_iterative"
    assert choose(index_ready=True, filtered=True, narrowed=False, selectivity=0.02, **iterative).kind == "hnsw_iterative"
    rare = 2 * 10 / (ITERATIVE_SCAN_MAX + 1)
    assert choose(index_ready=True, filtered=True, narrowed=False, selectivity=rare, **iterative).kind == "exact_scan"
    assert choose(index_ready=True, filtered=True, narrowed=True, selectivity=rare, **iterative).kind == "filter_first"
    small = {**iterative, "rows": 4000}
    # A small table: filtering its 4,000 points costs less than walking 2,000 of them (issue 49's
    # cost model), where the same walk costs less than filtering 100,000.
    assert choose(index_ready=True, filtered=True, narrowed=False, selectivity=0.01, **small).kind == "exact_scan"
    assert choose(index_ready=True, filtered=True, narrowed=False, selectivity=0.01,
                  **{**small, "rows": 100_000}).kind == "hnsw_iterative"
    assert choose(index_ready=True, filtered=True, narrowed=False, selectivity=0.009, **small).kind == "exact_scan"
    assert choose(index_ready=True, filtered=True, narrowed=False, selectivity=0.0, **iterative).kind == "exact_scan"


def test_keyword_statistics_estimate_equalities_as_postgres_does() -> None:
    stats = {
        "user": FieldStats(null_frac=0.1, distinct=distinct_count(-0.5, 1000), common={"a": 0.3, "b": 0.1}),
        "kind": FieldStats(null_frac=0.0, distinct=4, common={}),
    }
    assert distinct_count(-0.5, 1000) == 500 and distinct_count(7, 1000) == 7
    assert estimate(parse_filter({"user": "a"}), stats) == 0.3
    # Not a common value: the rest (1 - 0.1 - 0.4) over the other 498 values.
    assert estimate(parse_filter({"user": "z"}), stats) == pytest.approx(0.5 / 498)
    assert estimate(parse_filter({"user": "a", "kind": "k1"}), stats) == pytest.approx(0.3 * 0.25)
    assert estimate(parse_filter({"user": {"$in": ["a", "b"]}}), stats) == pytest.approx(0.4)
    assert estimate(parse_filter({"$or": [{"kind": "k1"}] * 5}), stats) == 1.0
    # Anything else is sampled instead: another field, a number, a range, a negation.
    for flt in ({"other": "a"}, {"user": 7}, {"user": {"$gt": "a"}}, {"user": {"$ne": "a"}}, {"user": "a", "n": 1}):
        assert estimate(parse_filter(flt), stats) is None, flt
    assert unescape_text(escape_text("a\x00b\x01c")) == "a\x00b\x01c"


async def test_a_declared_fields_value_fits_its_index_on_both_backends(gw: GatewayClient, server) -> None:
    """A declared field's value is a B-tree key: PostgreSQL answered 500 for a 10,000-character
    keyword once the index was built ("index row requires 10016 bytes"), and one such point
    stored before the build failed every build after. Now the same 422 on both backends, nothing
    stored, and a value at the bound (incompressible) is indexed and found."""
    rng = np.random.default_rng(3)
    data = clustered(1100, DIM, seed=9)  # past vectors.index_min_rows: PostgreSQL builds the indexes
    await gw.vectors.setup_collection("fit", DIM, payload_indexes=DECLARED)
    await gw.vectors.upsert_points("fit", data, payloads(1100), [str(i) for i in range(1100)])
    await wait_ready(gw, server, "fit")

    def letters(n: int) -> str:
        return "".join(chr(c) for c in rng.integers(ord("a"), ord("z") + 1, n))

    long = letters(MAX_DECLARED_VALUE_BYTES)  # 1,026 bytes as JSON with its quotes
    for payload, field in (({"user": long}, "user"), ({"n": long}, "n"), ({"n": {"a": 1}}, "n"), ({"user": [1]}, "user")):
        with pytest.raises(InvalidRequest) as refused:
            await gw.vectors.upsert_points("fit", [data[0]], [payload], ["new"])
        assert refused.value.problem["errors"][0]["loc"] == ["points", "0", "payload", field], refused.value.problem
        with pytest.raises(InvalidRequest) as refused:
            await gw.vectors.update_point("fit", "1", payload=payload)
        assert refused.value.problem["errors"][0]["loc"] == ["payload", field], refused.value.problem
    assert await gw.vectors.get_point("fit", "new") is None
    assert (await gw.vectors.get_point("fit", "1"))["payload"] == payloads(2)[1]
    # At the bound: stored, indexed, found through the declared index.
    fits = letters(MAX_DECLARED_VALUE_BYTES - 2)
    await gw.vectors.upsert_points("fit", [data[1]], [{"user": fits, "n": None}], ["edge"])
    await gw.vectors.update_point("fit", "2", payload={"user": letters(MAX_DECLARED_VALUE_BYTES - 2), "n": 2**63 - 1})
    found = await gw.vectors.search_explained("fit", data[1], 5, filters={"user": fits})
    assert [h["id"] for h in found["results"]] == ["edge"]
    assert (await gw.vectors.describe_collection("fit"))["count"] == 1101


@pytest.mark.postgres_only
async def test_a_stored_value_too_large_for_its_index_fails_that_index_only(
    own_backend: Backend, tmp_path: Path  # noqa: F811
) -> None:
    """A point stored before writes checked declared values (here written straight to the
    table) with a keyword too large for a B-tree key: PostgreSQL refuses that payload index's
    build. Before, the refusal ended every check of the collection, so its HNSW index was never
    built either (searches scanned exactly for good) and each sweep tried again. Now that index
    alone is ``failed``, with the point to fix named in describe; the graph and the other index
    are built; filtered searches stay exact; the build is tried again after five sweeps' time,
    and succeeds once the point is deleted."""
    ns = f"f{uuid.uuid4().hex[:10]}"
    server = start_eager_builder(own_backend, tmp_path / "gateway.log")
    try:
        async with GatewayClient(server.url, ns, os.environ["GATEWAY_TEST_ADMIN_KEY"]) as gw:
            data = clustered(1300, DIM, seed=5)
            await gw.vectors.setup_collection("big", DIM, payload_indexes=DECLARED)
            await gw.vectors.upsert_points("big", data[:1100], payloads(1100), [str(i) for i in range(1100)])
            # Random letters, which compress to ~2,900 bytes: past a B-tree key's 2,704, whose
            # refusal names the index (PostgreSQL compresses a key before it measures it).
            letters = "".join(chr(c) for c in np.random.default_rng(5).integers(ord("a"), ord("z") + 1, 4_000))
            conn = await pg_connect(own_backend)
            try:
                table = await table_of(conn, ns, "big")
                # The table's comment is an operator's to keep: the failure is kept elsewhere.
                await conn.execute(f"COMMENT ON TABLE {table} IS 'an operator''s note'")
                await conn.execute(
                    f"INSERT INTO {table} (id, embedding, payload) VALUES ('legacy', $1::text::vector, $2::jsonb)",
                    "[" + ",".join(str(float(x)) for x in data[1100]) + "]", json.dumps({"user": letters, "n": 1}),
                )
            finally:
                await conn.close()
            # Past index_min_rows: the builder builds the indexes once writes are quiet.
            await gw.vectors.upsert_points("big", data[1101:], payloads(1300)[1101:], [str(i) for i in range(1101, 1300)])
            deadline = time.monotonic() + 120
            while True:
                info = await gw.vectors.describe_collection("big")
                states = [p["state"] for p in info["payload_indexes"]]
                if info["index"]["state"] == "ready" and states == ["failed", "ready"]:
                    break
                assert time.monotonic() < deadline, info
                await asyncio.sleep(0.2)
            failed_seen = time.monotonic()
            error = info["payload_indexes"][0]["error"]
            assert "'legacy'" in error and "exceeds btree" in error and info["payload_indexes"][1]["error"] is None, error
            assert table not in error, error  # the gateway's SQL names are not the caller's
            # The failure is every process's to see: a second gateway on the same databases says so.
            other = start_server(own_backend, tmp_path / "other.log")
            try:
                async with GatewayClient(other.url, ns, os.environ["GATEWAY_TEST_ADMIN_KEY"]) as gw2:
                    seen = (await gw2.vectors.describe_collection("big"))["payload_indexes"][0]
                    assert seen["state"] == "failed" and seen["error"] == error, seen
            finally:
                stop_server(other)
            # Filters on the field without its index: exact, and the legacy point is found by its value.
            q = data[7]
            matches = [i for i in range(1300) if i != 1100 and i % 400 == 7]
            found = await gw.vectors.search_explained("big", q, 3, filters={"user": "u7"})
            d = cosine(data[matches], q)
            assert [h["id"] for h in found["results"]] == [str(matches[j]) for j in np.argsort(d, kind="stable")[:3]]
            legacy = await gw.vectors.search_explained("big", q, 3, filters={"user": letters})
            assert [h["id"] for h in legacy["results"]] == ["legacy"]
            # The point deleted, the next try (five one-second sweeps after the failure) builds it.
            await gw.vectors.delete_point("big", "legacy")
            # one try every 5 s until the point is gone (a loaded machine may take longer than 5 s here)
            tries = 1 + int((time.monotonic() - failed_seen + 1) // 5)
            deadline = time.monotonic() + 60
            while (info := await gw.vectors.describe_collection("big"))["payload_indexes"][0]["state"] != "ready":
                assert time.monotonic() < deadline, info
                await asyncio.sleep(0.2)
            assert info["payload_indexes"][0]["error"] is None
        log = server.log()
        # Tried once, then waited: not once a sweep (the old code failed every check).
        assert 1 <= log.count("failed: PostgreSQL refused to build the index") <= tries, (tries, log)
        assert log.count("refused before, is built") == 1, log
        conn = await pg_connect(own_backend)
        try:
            comment = "SELECT obj_description(to_regclass($1), 'pg_class')"
            assert await conn.fetchval(comment, f"{table}_payload") is None
            assert await conn.fetchval(comment, table) == "an operator's note"
        finally:
            await conn.close()
    finally:
        stop_server(server)


def test_a_payload_failure_record_is_read_whatever_wrote_it() -> None:
    """The record is a comment anyone with the database's rights can write: what is not the
    gateway's record, or holds what no failure has (found by attack: a 400-digit time was an
    OverflowError, a 500 on describe and every check of the builder), is no failure."""
    good = payload_failures_sql("vec_1", {0: PayloadFailure("it's too large", 1.5)})
    kept = good.split(" IS '", 1)[1][:-1].replace("''", "'")
    assert parse_payload_failures(kept) == {0: PayloadFailure("it's too large", 1.5)}
    mark = '"mark": "storage-gateway payload index failures"'
    for comment in (None, "", "an operator's note", "[1]", "{}", '{"mark": "x", "failed": {"0": {"error": "e", "at": 1}}}',
                    '{' + mark + ', "failed": {"0": {"error": "e", "at": ' + "9" * 400 + '}}}',
                    '{' + mark + ', "failed": {"0": {"error": "e", "at": 1e400}}}',
                    '{' + mark + ', "failed": {"x": {"error": "e", "at": 1}, "1": {"at": 1}, "2": 7}}',
                    '{' + mark + ', "failed": [1]}'):
        assert parse_payload_failures(comment) == {}, comment
