"""Payload subgraphs (PostgreSQL): partial HNSW indexes of the common values of a declared keyword
field, built by the background builder from ``ANALYZE``'s statistics and searched with the
``hnsw_subgraph`` plan (``app.vectors.subgraphs``).

The thresholds are lowered so that a few thousand points suffice: a value holding 10% of 4,000
points (400) is above ``exact_search_threshold`` (200) and within ``subgraph_max_share`` (15%).
"""

from __future__ import annotations

import asyncio
import os
from array import array
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from storage_gateway_client import GatewayClient

from app.vectors.backend import CollectionInfo
from app.vectors.estimate import FieldStats
from app.vectors.filters import parse_filter
from app.vectors.nulescape import escape_text
from app.vectors.payload_index import PayloadIndex
from app.vectors.pgvector import PgVectorIndex, _Positional, compile_filter, decode_vector, encode_vector, subgraph_statement
from app.vectors import recall
from app.vectors.planner import EF_SEARCH_MAX, Subgraph, choose, ef_for
from app.vectors.subgraphs import index_name, is_subgraph_name, position_of, sql_literal, wanted
from tests.conftest import VECTOR_BACKENDS, Backend, start_server, stop_server
from tests.test_vectors_index import clustered, index_problems, own_backend, pg_connect, table_of  # noqa: F401

pytestmark = pytest.mark.backends(*VECTOR_BACKENDS)

N, DIM = 4000, 16
QUOTED = "o'q\"u\\x\\'; --"  # quotes, backslashes and SQL punctuation
VALUES = ("mid", QUOTED)  # 10% of the points each
DECLARED = [{"field": "team", "kind": "keyword"}, {"field": "n", "kind": "integer"},
            {"field": "grp", "kind": "integer"}]
GROUPS = 10  # grp: 10% of the points each, an integer field's subgraphs
SETTINGS = {
    "GATEWAY_VECTORS__EXACT_SEARCH_THRESHOLD": "200",
    "GATEWAY_VECTORS__SUBGRAPH_MAX_SHARE": "0.15",
    "GATEWAY_VECTORS__INDEX_QUIET_SECONDS": "0.2",
    "GATEWAY_VECTORS__INDEX_SWEEP_SECONDS": "1",
}


def payloads(n: int) -> list[dict]:
    # team: "mid" and QUOTED 10% each, the rest over 200 values of 0.4% (16 points) each.
    out = []
    for i in range(n):
        team = VALUES[i % 10] if i % 10 < 2 else f"t{i % 200}"
        out.append({"team": team, "n": i, "grp": (i // 10) % GROUPS})
    return out


def cosine(data: np.ndarray, q: np.ndarray) -> np.ndarray:
    d = data.astype(np.float64)
    return 1 - d @ q.astype(np.float64) / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))


async def wait_subgraphs(gw: GatewayClient, collection: str, built: int, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = await gw.vectors.describe_collection(collection)
        team = info["payload_indexes"][0]
        if (info["index"]["state"] == "ready" and team["state"] == "ready" and team["subgraphs"]
                and team["subgraphs"]["built"] == built and team["subgraphs"]["building"] == 0):
            return info
        assert time.monotonic() < deadline, info
        await asyncio.sleep(0.2)


async def subgraph_search(gw: GatewayClient, q: np.ndarray, flt: dict) -> dict:
    """A search's answer once it searches a subgraph (a search process caches which are valid
    for a second)."""
    deadline = time.monotonic() + 10
    while True:
        answer = await gw.vectors.search_explained("c", q, 10, filters=flt)
        if answer["plan"]["kind"] == "hnsw_subgraph":
            return answer
        assert time.monotonic() < deadline, answer["plan"]
        await asyncio.sleep(0.2)


@pytest.mark.postgres_only
async def test_subgraphs_are_built_used_and_dropped(own_backend: Backend, tmp_path: Path) -> None:  # noqa: F811
    data = clustered(N, DIM, seed=21)
    queries = clustered(8, DIM, seed=22)
    pl = payloads(N)
    ns = f"s{uuid.uuid4().hex[:10]}"
    server = start_server(own_backend, tmp_path / "gateway.log", **SETTINGS)
    conn = await pg_connect(own_backend)
    try:
        async with GatewayClient(server.url, ns, os.environ["GATEWAY_TEST_ADMIN_KEY"]) as gw:
            await gw.vectors.setup_collection("c", DIM, payload_indexes=DECLARED)
            for s in range(0, N, 1000):
                await gw.vectors.upsert_points("c", data[s:s + 1000], pl[s:s + 1000], [str(i) for i in range(s, s + 1000)])
            info = await wait_subgraphs(gw, "c", built=len(VALUES))
            # The integer field's values are all distinct: none common enough for a subgraph.
            assert info["payload_indexes"][1]["subgraphs"] == {"built": 0, "building": 0}
            # An integer field's common values get theirs (issue 49: a 2% filter on a declared
            # integer field searched the main graph at ef_search 1,000, 3-4x an unfiltered search).
            deadline = time.monotonic() + 120
            while (await gw.vectors.describe_collection("c"))["payload_indexes"][2]["subgraphs"] != {
                "built": GROUPS, "building": 0
            }:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            answer = await subgraph_search(gw, queries[2], {"grp": 3})
            assert len(answer["results"]) == 10 and all(h["payload"]["grp"] == 3 for h in answer["results"])
            mask = np.array([p["grp"] == 3 for p in pl])
            truth = set(np.argsort(np.where(mask, cosine(data, queries[2]), np.inf))[:10].tolist())
            assert len(truth & {int(h["id"]) for h in answer["results"]}) >= 9, answer["plan"]

            # One valid partial HNSW index per common value, named by a hash, the value a literal.
            table = await table_of(conn, ns, "c")
            team = PayloadIndex(0, "team", "keyword")
            names = {v: index_name(table, team, escape_text(v)) for v in VALUES}
            for value, name in names.items():
                row = await conn.fetchrow(
                    "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid), pg_get_expr(i.indpred, i.indrelid) "
                    "FROM pg_index i WHERE i.indexrelid = to_regclass($1)", name,
                )
                assert row is not None and row[0], (value, row)
                assert "USING hnsw" in row[1] and row[2] is not None
                # The predicate holds exactly this value: PostgreSQL counts its points.
                matched = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE {row[2]}")
                assert matched == N // 10, (value, row[2])

            # EXPLAIN of the gateway's statement: PostgreSQL searches the subgraph.
            coll = CollectionInfo(
                id=int(table.removeprefix("vec_")), namespace=ns, collection="c", vector_size=DIM, distance="cosine",
                index={"kind": "hnsw", "m": 16, "ef_construction": 128, "payload_indexes": DECLARED},
                text_field=None, created_at=None,  # type: ignore[arg-type]
            )
            await conn.set_type_codec("vector", schema="public", encoder=encode_vector, decoder=decode_vector,
                                      format="binary")
            for value, name in names.items():
                sql = _Positional(2)
                where = compile_filter(parse_filter({"team": value}), sql, {"team": "keyword", "n": "integer"})
                stmt = PgVectorIndex.budgeted_hits(subgraph_statement(coll, team, escape_text(value), where, 10, 10), 10**6)
                plan = "\n".join(r[0] for r in await conn.fetch(
                    f"EXPLAIN {stmt}", encode_vector(array("f", queries[0].tolist())), *sql.args
                ))
                assert name in plan and f"{table}_p0 " not in plan, plan

            # Searches take the subgraph: only matching points, min(k, matches), recall >= 0.95,
            # with the main graph's calibrated ef_search (measured before the subgraphs were built).
            await subgraph_search(gw, queries[0], {"team": "mid"})
            calibration = recall.parse(
                await conn.fetchval("SELECT obj_description(to_regclass($1), 'pg_class')", f"{table}_hnsw")
            )
            assert calibration is not None
            for value in VALUES:
                mask = np.array([p["team"] == value for p in pl])
                recalls = []
                for q in queries:
                    for limit in (10, 50):
                        answer = await gw.vectors.search_explained("c", q, limit, filters={"team": value})
                        hits, plan = answer["results"], answer["plan"]
                        assert plan["kind"] == "hnsw_subgraph" and not plan["fallback"], plan
                        assert plan["ef_search"] == ef_for(N // 10, limit, 100, calibration), plan
                        assert len(hits) == limit and all(h["payload"]["team"] == value for h in hits)
                        dist = np.where(mask, cosine(data, q), np.inf)
                        truth = set(np.argsort(dist)[:limit].tolist())
                        recalls.append(len(truth & {int(h["id"]) for h in hits}) / limit)
                assert np.mean(recalls) >= 0.95, (value, recalls)
            # With another condition: the subgraph's candidates, then the whole filter on them.
            flt = {"team": "mid", "n": {"$gte": 1000}}  # 300 points
            answer = await gw.vectors.search_explained("c", queries[1], 10, filters=flt)
            assert answer["plan"]["kind"] == "hnsw_subgraph" and answer["plan"]["ef_search"] >= 27, answer["plan"]
            assert len(answer["results"]) == 10
            assert all(h["payload"]["team"] == "mid" and h["payload"]["n"] >= 1000 for h in answer["results"])
            # Fewer matches than the subgraph is worth: all of them, compared exactly.
            flt = {"team": "mid", "n": {"$lt": 30}}  # 3 points
            answer = await gw.vectors.search_explained("c", queries[1], 10, filters=flt)
            assert sorted(int(h["id"]) for h in answer["results"]) == [0, 10, 20], answer["plan"]
            # A value without a subgraph (16 points) is compared exactly, as before.
            answer = await gw.vectors.search_explained("c", queries[1], 10, filters={"team": "t7"})
            assert answer["plan"]["kind"] == "filter_first" and len(answer["results"]) == 10
            plans = (await gw.vectors.describe_collection("c"))["index"]["plans"]
            assert plans.get("hnsw_subgraph", 0) >= 4 * len(queries), plans

            # The data changes: once ANALYZE sees a new common value, the sweep builds its subgraph.
            late = clustered(500, DIM, seed=23)
            await gw.vectors.upsert_points("c", late, [{"team": "late", "n": N + i} for i in range(500)],
                                           [str(N + i) for i in range(500)])
            await conn.execute(f"ANALYZE {table}")
            await wait_subgraphs(gw, "c", built=len(VALUES) + 1)
            assert await conn.fetchval("SELECT to_regclass($1)", index_name(table, team, "late")) is not None
            answer = await subgraph_search(gw, late[0], {"team": "late"})
            assert all(h["payload"]["team"] == "late" for h in answer["results"])

            # Reset drops them with the graph; drop takes the rest with the table.
            await gw.vectors.reset_collection("c")
            for name in names.values():
                assert await conn.fetchval("SELECT to_regclass($1)", name) is None
            info = await gw.vectors.describe_collection("c")
            assert info["payload_indexes"][0]["subgraphs"] == {"built": 0, "building": 0}
            await gw.vectors.upsert_points("c", data, pl, [str(i) for i in range(N)])
            await wait_subgraphs(gw, "c", built=len(VALUES))
            await gw.vectors.drop_collection("c")
            left = await conn.fetch("SELECT indexname FROM pg_indexes WHERE tablename = $1", table)
            assert left == []
            for name in names.values():
                assert await conn.fetchval("SELECT to_regclass($1)", name) is None
        assert not index_problems(server)
        assert "built the payload subgraph of 'team' = 'mid'" in server.log()
    finally:
        await conn.close()
        stop_server(server)


async def test_describe_reports_subgraphs_only_where_there_is_a_graph(gw: GatewayClient, server) -> None:
    await gw.vectors.setup_collection("sg", 4, payload_indexes=DECLARED)
    info = await gw.vectors.describe_collection("sg")
    # Every declared field's, whatever its kind (integer fields' too, since issue 49).
    for field in info["payload_indexes"]:
        if server.backend.is_postgres:
            assert field["subgraphs"] == {"built": 0, "building": 0}, field
        else:
            assert field["subgraphs"] is None  # SQLite has no graph: the json_extract index narrows


# --- pure decisions ------------------------------------------------------------------------------


def test_planner_searches_a_subgraph_between_exact_and_the_main_graph() -> None:
    common = dict(rows=500_000, limit=10, base_ef=100, exact_threshold=5000, iterative=False, narrowed=True,
                  filtered=True, index_ready=True)
    sub = Subgraph("vec_1_p0_gabc", 0.02)
    # 2% of 500,000: the main graph at ef_search 1000 without it, the subgraph's own ef with it.
    assert choose(selectivity=0.02, **common).ef_search == EF_SEARCH_MAX
    plan = choose(selectivity=0.02, subgraph=sub, **common)
    assert (plan.kind, plan.subgraph, plan.candidates) == ("hnsw_subgraph", sub.index, 0)
    assert plan.ef_search == ef_for(10_000, 10, 100) and plan.estimated_matches == 10_000
    assert "subgraph" not in plan.as_dict() and plan.as_dict()["candidates"] == 0
    # Another condition keeping a tenth of the subgraph: candidates enough for limit matches.
    anded = choose(selectivity=0.002, subgraph=sub, **{**common, "exact_threshold": 500})
    assert anded.kind == "hnsw_subgraph" and anded.candidates == anded.ef_search == 200
    # ... keeping too few of them for EF_SEARCH_MAX candidates: not the subgraph.
    assert choose(selectivity=0.00001, subgraph=sub, **{**common, "exact_threshold": 0}).kind != "hnsw_subgraph"
    # Few enough to compare exactly for less, or no ready graph: as without a subgraph.
    assert choose(selectivity=0.0002, subgraph=Subgraph("x", 0.0002), **common).kind == "filter_first"
    # 2,500 matches: the subgraph's walk costs less than comparing them (the cost model).
    assert choose(selectivity=0.005, subgraph=Subgraph("x", 0.005), **common).kind == "hnsw_subgraph"
    assert choose(selectivity=0.02, subgraph=sub, **{**common, "index_ready": False}).kind == "filter_first"
    # A requested ef_search is kept.
    assert choose(selectivity=0.02, subgraph=sub, fixed_ef=300, **common).ef_search == 300


def test_subgraphs_are_chosen_from_the_common_values() -> None:
    user = PayloadIndex(0, "user", "keyword")
    n = PayloadIndex(1, "n", "integer")
    kind = PayloadIndex(2, "kind", "keyword")
    stats = {
        0: FieldStats(0.0, 100, {"a": 0.3, "b": 0.02, "c": 0.015, "d": 0.005, "e\x01\x01": 0.02}),
        2: FieldStats(0.0, 60, {f"k{i}": 0.02 for i in range(60)}),
    }
    got = wanted("vec_9", [user, n, kind], stats, 500_000, min_points=5000, max_share=0.1, max_count=64)
    # "a" is too common (the main graph), "d" too rare (2,500 points: compared exactly).
    assert [w.value for w in got[:4]] == ["b", "e\x01\x01", "k0", "k1"]
    assert len(got) == 63 and got[-1].value == "c" and got[-1].points == 7500
    assert len(wanted("vec_9", [user, kind], stats, 500_000, min_points=5000, max_share=0.1, max_count=10)) == 10
    assert wanted("vec_9", [user], stats, 500_000, min_points=5000, max_share=0.1, max_count=0) == []
    # Names: the table, the position and a hash; never the value.
    name = index_name("vec_9", user, "x'; DROP TABLE t; --")
    assert name.startswith("vec_9_p0_g") and len(name) == len("vec_9_p0_g") + 12 and is_subgraph_name("vec_9", name)
    assert position_of("vec_9", index_name("vec_9", kind, "k1")) == 2
    assert not is_subgraph_name("vec_9", "vec_9_payload") and not is_subgraph_name("vec_9", "vec_9_p0")
    assert not is_subgraph_name("vec_9", "vec_91_p0_g0123456789ab")
    assert index_name("vec_9", user, "b") != index_name("vec_9", user, "c") != index_name("vec_9", kind, "c")
    # Literals: quotes and backslashes doubled in an E'' string; no NUL in PostgreSQL text.
    assert sql_literal("o'q\\x") == "E'o''q\\\\x'"
    with pytest.raises(ValueError):
        sql_literal("a\x00b")
