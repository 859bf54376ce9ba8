"""Vectors through the client and a real server on both backends: collections, points, filters,
scores, hybrid search, validation, idempotency, isolation and the seed's VectorStoreProtocol."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import struct
import uuid

import httpx
import numpy as np
import pytest

from storage_gateway_client import (
    Conflict,
    GatewayClient,
    InvalidRequest,
    NotFound,
    RemoteVectorStore,
    VectorRecord,
    VectorStoreProtocol,
    create_vector_store,
)

from sqlalchemy.engine import make_url

from app.core.db.sqlite import SQLITE
from storage_gateway_client._vectors import pack_vector
from tests.conftest import VECTOR_BACKENDS, in_process_settings
from tests.test_vectors_index import pg_connect, table_of

pytestmark = pytest.mark.backends(*VECTOR_BACKENDS)


def rand_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)


def vpath(namespace: str, *parts: str) -> str:
    return "/v1/" + namespace + "/vectors" + "".join("/" + p for p in parts)


# --- collections ------------------------------------------------------------------------------


async def test_collection_lifecycle(gw: GatewayClient) -> None:
    created = await gw.vectors.setup_collection("mem", 8, "l2")
    assert created["vector_size"] == 8 and created["distance"] == "l2"
    again = await gw.vectors.setup_collection("mem", 8, "l2")
    assert again["collection"] == "mem"
    with pytest.raises(Conflict):
        await gw.vectors.setup_collection("mem", 16, "l2")
    with pytest.raises(Conflict):
        await gw.vectors.setup_collection("mem", 8, "cosine")
    ids = await gw.vectors.upsert_points("mem", rand_vectors(5, 8).tolist())
    assert len(ids) == 5 and len(set(ids)) == 5
    # A conflicting re-create never drops data.
    with pytest.raises(Conflict):
        await gw.vectors.setup_collection("mem", 4, "ip")
    info = await gw.vectors.describe_collection("mem")
    assert info["count"] == 5
    assert info["index"]["kind"] in ("hnsw", "exact")
    await gw.vectors.setup_collection("other", 3)
    page = await gw.vectors.list_collections(limit=1)
    assert [c["collection"] for c in page["items"]] == ["mem"]
    page2 = await gw.vectors.list_collections(limit=1, cursor=page["next_cursor"])
    assert [c["collection"] for c in page2["items"]] == ["other"] and page2["next_cursor"] is None
    await gw.vectors.reset_collection("mem")
    assert (await gw.vectors.describe_collection("mem"))["count"] == 0
    await gw.vectors.drop_collection("mem")
    await gw.vectors.drop_collection("mem")  # 204 either way
    with pytest.raises(NotFound):
        await gw.vectors.describe_collection("mem")
    # Re-created with other settings after a drop: a fresh, empty collection.
    assert (await gw.vectors.setup_collection("mem", 4, "ip"))["vector_size"] == 4
    assert (await gw.vectors.describe_collection("mem"))["count"] == 0


async def test_bad_collection_settings(http: httpx.AsyncClient, namespace: str) -> None:
    r = await http.put(vpath(namespace, "c"), json={"vector_size": 0})
    assert r.status_code == 422 and "vector_size" in r.json()["detail"]
    r = await http.put(vpath(namespace, "c"), json={"vector_size": 3, "distance": "dot"})
    assert r.status_code == 422 and "distance" in r.json()["detail"]
    r = await http.put(vpath(namespace, "c"), json={"vector_size": 10**6})
    assert r.status_code == 422 and "vector_size" in r.json()["detail"]
    r = await http.put(vpath(namespace, "bad name!"), json={"vector_size": 3})
    assert r.status_code == 422
    # A graph pgvector refuses to build (ef_construction below 2 m, here the default 128): the
    # same 422 on every backend, and nothing created (it was accepted, then never built).
    for index in ({"m": 100}, {"m": 8, "ef_construction": 15}):
        r = await http.put(vpath(namespace, "c"), json={"vector_size": 3, "index": index})
        assert r.status_code == 422 and "index.ef_construction" in r.json()["detail"], r.text
        assert r.headers["content-type"].startswith("application/problem+json")
    assert (await http.get(vpath(namespace, "c"))).status_code == 404
    r = await http.put(vpath(namespace, "c"), json={"vector_size": 3, "index": {"m": 8, "ef_construction": 16}})
    assert r.status_code == 201, r.text
    r = await http.post(vpath(namespace, "missing", "search"), json={"vector": [1, 2, 3]})
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem+json")


# --- points -----------------------------------------------------------------------------------


async def test_points_crud_and_update_semantics(gw: GatewayClient) -> None:
    await gw.vectors.setup_collection("c", 3, "cosine")
    ids = await gw.vectors.upsert_points(
        "c", [[1, 0, 0], [0, 1, 0]], [{"k": "a", "n": 1}, {"k": "b"}], ["p/1 x:y", None]
    )
    assert ids[0] == "p/1 x:y" and len(ids[1]) == 32
    p = await gw.vectors.get_point("c", "p/1 x:y")
    assert p is not None and p["payload"] == {"k": "a", "n": 1} and p["vector"] == [1.0, 0.0, 0.0]
    # vector only: payload kept
    await gw.vectors.update_point("c", "p/1 x:y", vector=[0, 0, 1])
    p = await gw.vectors.get_point("c", "p/1 x:y")
    assert p["payload"] == {"k": "a", "n": 1} and p["vector"] == [0.0, 0.0, 1.0]
    # payload only: replaced (not merged), vector kept
    await gw.vectors.update_point("c", "p/1 x:y", payload={"z": True})
    p = await gw.vectors.get_point("c", "p/1 x:y")
    assert p["payload"] == {"z": True} and p["vector"] == [0.0, 0.0, 1.0]
    with pytest.raises(NotFound):
        await gw.vectors.update_point("c", "nope", payload={})
    assert await gw.vectors.get_point("c", "nope") is None
    await gw.vectors.delete_point("c", "p/1 x:y")
    await gw.vectors.delete_point("c", "p/1 x:y")
    assert await gw.vectors.get_point("c", "p/1 x:y") is None
    # upsert replaces an existing id
    await gw.vectors.upsert_points("c", [[1, 1, 0]], [{"v": 2}], [ids[1]])
    p = await gw.vectors.get_point("c", ids[1])
    assert p["payload"] == {"v": 2}
    assert (await gw.vectors.describe_collection("c"))["count"] == 1


async def test_list_points_with_cursor_and_filters(gw: GatewayClient) -> None:
    await gw.vectors.setup_collection("c", 2, "l2")
    n = 23
    ids = [f"id{i:03d}" for i in range(n)]
    await gw.vectors.upsert_points("c", [[i, 1] for i in range(n)], [{"even": i % 2 == 0} for i in range(n)], ids)
    seen, cursor = [], None
    while True:
        page = await gw.vectors.list_points("c", limit=5, cursor=cursor, with_vectors=True)
        seen += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert [p["id"] for p in seen] == ids
    assert seen[3]["vector"] == [3.0, 1.0]
    evens = [p["id"] async for p in gw.vectors.iter_points("c", {"even": True}, page_size=4)]
    assert evens == ids[::2]
    assert await gw.vectors.delete_points("c", filters={"even": False}) == n // 2
    assert await gw.vectors.delete_points("c", ids=["id000", "id002", "missing"]) == 2
    assert await gw.vectors.delete_vectors("c", "even", True) == len(ids[::2]) - 2
    assert (await gw.vectors.describe_collection("c"))["count"] == 0


async def test_validation_names_the_offender(http: httpx.AsyncClient, gw: GatewayClient, namespace: str) -> None:
    await gw.vectors.setup_collection("c", 3, "cosine")
    url = vpath(namespace, "c", "points")
    good = {"vector": [1, 2, 3]}
    r = await http.post(url, json={"points": [good, good, good, {"vector": [1, 2]}]})
    assert r.status_code == 422 and "points.3.vector" in r.json()["detail"]
    r = await http.post(url, content=b'{"points": [{"vector": [1, 2, 3]}, {"vector": [1, NaN, 3]}]}',
                        headers={"content-type": "application/json"})
    assert r.status_code == 422 and "points.1" in r.json()["detail"]
    r = await http.post(url, json={"points": [{"vector": [1, "2", 3]}]})
    assert r.status_code == 422 and "points.0.vector" in r.json()["detail"]
    r = await http.post(url, json={"points": [{"vector": [1e39, 0, 0]}]})
    assert r.status_code == 422 and "points.0.vector" in r.json()["detail"]
    r = await http.post(url, json={"vectors": [[1, 2, 3], [1, 2, 3]], "payloads": [{}]})
    assert r.status_code == 422 and "payloads" in r.json()["detail"]
    r = await http.post(url, json={"vectors": [[1, 2, 3]], "ids": ["a", "b"]})
    assert r.status_code == 422 and "ids" in r.json()["detail"]
    r = await http.post(url, json={"points": [{"vector": [0, 0, 0]}]})
    assert r.status_code == 422 and "points.0.vector" in r.json()["detail"]
    r = await http.post(url, json={"points": [{"vector": [1, 2, 3], "id": "bad\u0001id"}]})
    assert r.status_code == 422 and "points.0.id" in r.json()["detail"]
    r = await http.post(url, json={"points": [{"vector_b64": "!!!"}]})
    assert r.status_code == 422 and "points.0.vector_b64" in r.json()["detail"]
    r = await http.post(url, json={"points": [{"vector": [1, 2, 3]}] * 1001})
    assert r.status_code == 422 and "points" in r.json()["detail"]
    # Found by attack: norms whose float32 distances overflow or vanish came back NULL, a 500 for
    # the search, or a point ranked first without a score in every search of its collection.
    r = await http.post(url, json={"points": [{"id": "big", "vector": [3e38, 3e38, 0]}]})
    assert r.status_code == 422 and "points.0.vector" in r.json()["detail"] and "norm" in r.json()["detail"], r.text
    r = await http.post(url, json={"points": [{"id": "tiny", "vector": [1e-45, 0, 0]}]})
    assert r.status_code == 422 and "points.0.vector" in r.json()["detail"], r.text
    r = await http.post(url, json={"points": [{"id": "edge", "vector": [1e18, 0, 0]}, {"id": "low", "vector": [1.1e-19, 0, 0]}]})
    assert r.status_code == 200, r.text
    for query in ({"vector": [3e38, -3e38, 0]}, {"vector_b64": pack_vector([3e38, 3e38, 0])}, {"vector": [1e-45, 0, 0]}):
        r = await http.post(vpath(namespace, "c", "search"), json=query)
        assert r.status_code == 422 and "vector" in r.json()["detail"], r.text
    hits = (await http.post(vpath(namespace, "c", "search"), json={"vector": [1, 0, 0]})).json()["results"]
    assert sorted(h["id"] for h in hits) == ["edge", "low"] and all(isinstance(h["score"], float) for h in hits)
    await gw.vectors.delete_points("c", ids=["edge", "low"])
    # a hybrid query's words are its first 32; its length is bounded too (found by attack: a 15 MB
    # query was split into every word, 330 MB and seconds of the event loop)
    r = await http.post(vpath(namespace, "c", "search"), json={"vector": [1, 0, 0], "query": "ab " * 3334})
    assert r.status_code == 422 and "query" in r.json()["detail"], r.text
    # a search answers the hits' vectors when asked (max marginal relevance needs them), bounded by the page
    r = await http.post(vpath(namespace, "c", "search"), json={"vector": [1, 2, 3], "with_vectors": True})
    assert r.status_code == 200 and all(len(h["vector"]) == 3 for h in r.json()["results"]), r.text
    r = await http.post(vpath(namespace, "c", "search"), json={"vector": [1, 2, 3], "with_vectors": "yes"})
    assert r.status_code == 422 and "with_vectors" in r.json()["detail"]
    # Through the client: wrong dimension, NaN, mismatched lengths.
    with pytest.raises(InvalidRequest) as exc:
        await gw.vectors.upsert_points("c", [[1, 2, 3], [1, 2]])
    assert "vectors_b64.1" in str(exc.value)
    with pytest.raises(InvalidRequest):
        await gw.vectors.upsert_points("c", [[1, float("nan"), 3]])
    with pytest.raises(InvalidRequest) as exc:
        await gw.vectors.upsert_points("c", [[1, 2, 3]], payloads=[{}, {}])
    assert "payloads" in str(exc.value)
    with pytest.raises(InvalidRequest):
        await gw.vectors.search("c", [1, 2], 3)
    with pytest.raises(InvalidRequest):
        await gw.vectors.search("c", [1, 2, 3], 3, filters={"$bogus": 1})
    # Nothing was stored by any of the rejected requests.
    assert (await gw.vectors.describe_collection("c"))["count"] == 0


async def test_filter_limits_and_shapes(http: httpx.AsyncClient, gw: GatewayClient, namespace: str) -> None:
    await gw.vectors.setup_collection("c", 2, "l2")
    url = vpath(namespace, "c", "search")
    deep: dict = {"a": 1}
    for _ in range(10):
        deep = {"$or": [deep, {"b": 2}]}
    r = await http.post(url, json={"vector": [0, 0], "filters": deep})
    assert r.status_code == 422 and "filters" in r.json()["detail"]
    r = await http.post(url, json={"vector": [0, 0], "filters": {"a": {"$in": list(range(500))}}})
    assert r.status_code == 422 and "filters.a.$in" in r.json()["detail"]
    for bad in ({"a": {"$gt": True}}, {"a": {"$in": 3}}, {"a": [1, 2]}, {"a": {"$exists": 1}}, {"a\"b": 1}):
        r = await http.post(url, json={"vector": [0, 0], "filters": bad})
        assert r.status_code == 422, bad
    r = await http.post(url, json={"vector": [0, 0], "limit": 5000})
    assert r.status_code == 422 and "limit" in r.json()["detail"]


# --- search -----------------------------------------------------------------------------------


@pytest.mark.parametrize("distance", ["cosine", "l2", "ip"])
async def test_scores_follow_the_formula(gw: GatewayClient, distance: str) -> None:
    dim = 16
    data = rand_vectors(200, dim, seed=1) * 2.0
    await gw.vectors.setup_collection("s", dim, distance)
    ids = await gw.vectors.upsert_points("s", data, [{"i": i} for i in range(len(data))])
    q = rand_vectors(1, dim, seed=2)[0]
    hits = await gw.vectors.search("s", q, 20)
    assert len(hits) == 20
    d64, q64 = data.astype(np.float64), q.astype(np.float64)
    if distance == "cosine":
        expected = d64 @ q64 / (np.linalg.norm(d64, axis=1) * np.linalg.norm(q64))
    elif distance == "ip":
        expected = d64 @ q64
    else:
        expected = -np.linalg.norm(d64 - q64, axis=1)
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)
    for h in hits:
        i = h["payload"]["i"]
        assert ids[i] == h["id"]
        assert abs(h["score"] - expected[i]) < 1e-4
        raw = 1 - h["score"] if distance == "cosine" else -h["score"]
        assert abs(h["distance"] - raw) < 1e-6
    top = set(np.argsort(-expected)[:20].tolist())
    assert {h["payload"]["i"] for h in hits} == top
    # score_threshold drops the worse results and keeps the order.
    cut = scores[5]
    kept = await gw.vectors.search("s", q, 20, score_threshold=cut)
    assert [h["id"] for h in kept] == [h["id"] for h in hits[:6]]


async def test_hybrid_ranks_exact_text_match_first(gw: GatewayClient) -> None:
    dim = 8
    await gw.vectors.setup_collection("h", dim, "cosine", text_field="text")
    rng = np.random.default_rng(5)
    q = rng.normal(size=dim).astype(np.float32)
    near = q + 0.01 * rng.normal(size=dim).astype(np.float32)   # very similar vector, unrelated text
    far = q + 0.6 * rng.normal(size=dim).astype(np.float32)     # less similar vector, the exact text
    others = rng.normal(size=(30, dim)).astype(np.float32)
    vectors = [near, far, *others]
    payloads = [
        {"text": "weather report for tomorrow"},
        {"text": "the quarterly budget spreadsheet"},
        *({"text": f"note number {i} about gardening"} for i in range(30)),
    ]
    ids = await gw.vectors.upsert_points("h", vectors, payloads, ["near", "far", *(f"o{i}" for i in range(30))])
    plain = await gw.vectors.search("h", q, 5)
    assert plain[0]["id"] == "near"
    hybrid = await gw.vectors.search("h", q, 5, query="quarterly budget spreadsheet")
    assert hybrid[0]["id"] == "far"
    assert [h["score"] for h in hybrid] == sorted((h["score"] for h in hybrid), reverse=True)
    # Filters still apply in hybrid mode.
    filtered = await gw.vectors.search("h", q, 5, query="quarterly budget", filters={"text": {"$ne": payloads[1]["text"]}})
    assert "far" not in [h["id"] for h in filtered]
    # Updating the payload re-indexes the text; deleting removes it.
    await gw.vectors.update_point("h", "near", payload={"text": "quarterly budget spreadsheet"})
    again = await gw.vectors.search("h", q, 5, query="quarterly budget spreadsheet")
    assert again[0]["id"] == "near"
    await gw.vectors.delete_point("h", "near")
    await gw.vectors.delete_points("h", filters={"text": payloads[1]["text"]})
    gone = await gw.vectors.search("h", q, 40, query="quarterly budget spreadsheet")
    assert {"near", "far"}.isdisjoint(h["id"] for h in gone) and len(gone) == 30
    # Without a text field, query is ignored.
    await gw.vectors.setup_collection("plain", dim, "cosine")
    await gw.vectors.upsert_points("plain", vectors, payloads, ids)
    ignored = await gw.vectors.search("plain", q, 3, query="quarterly budget spreadsheet")
    assert ignored[0]["id"] == "near"


async def test_true_never_matches_one(gw: GatewayClient) -> None:
    await gw.vectors.setup_collection("t", 2, "l2")
    payloads = [{"v": True}, {"v": 1}, {"v": 1.0}, {"v": "1"}, {"v": "true"}, {"v": None}, {}, {"v": False}, {"v": 0}]
    await gw.vectors.upsert_points("t", [[i, 0] for i in range(len(payloads))], payloads, [str(i) for i in range(len(payloads))])

    async def match(flt: dict) -> set[str]:
        return {h["id"] for h in await gw.vectors.search("t", [0, 0], 50, filters=flt)}

    assert await match({"v": True}) == {"0"}
    assert await match({"v": 1}) == {"1", "2"}
    assert await match({"v": "1"}) == {"3"}
    assert await match({"v": None}) == {"5"}
    assert await match({"v": False}) == {"7"}
    assert await match({"v": 0}) == {"8"}
    assert await match({"v": {"$in": [True, "true"]}}) == {"0", "4"}
    assert await match({"v": {"$ne": 1}}) == {"0", "3", "4", "5", "6", "7", "8"}
    assert await match({"v": {"$gte": 0}}) == {"1", "2", "8"}
    assert await match({"v": {"$exists": False}}) == {"6"}


def typed(value: object) -> str:
    """JSON text that tells an int from a float and 0.0 from -0.0 (json.dumps writes each as it is)."""
    return json.dumps(value, sort_keys=True)


async def test_payload_numbers_read_back_and_compare_alike_on_both_backends(
    gw: GatewayClient, http: httpx.AsyncClient, namespace: str
) -> None:
    """PostgreSQL keeps a payload as jsonb, whose numbers are the decimals written: 2.0**70, as
    Python writes it (``1.1805916207174113e+21``), read back there as the integer
    1180591620717411300000 (another number, and not a float) and compared as that, and ``-0.0``
    as ``0.0``; SQLite kept the text and compared floats. An integer beyond 64 bits compared as a
    float on SQLite and as a decimal on PostgreSQL. Now floats are stored as jsonb answers them
    back, on both backends, and a payload integer beyond 64 bits is refused as a filter's is."""
    await gw.vectors.setup_collection("n", 2, "l2")
    payloads = [
        {"v": 2.0**70}, {"v": 1e16}, {"v": -3.4e20}, {"v": -0.0}, {"v": 0}, {"v": 2**63 - 1},
        {"v": 9007199254740993}, {"v": 1e300}, {"v": 1e-300}, {"v": 5e-324}, {"v": 0.1},
        {"v": [1e20, {"w": -0.0, "x": 1.5e-7}]},
    ]
    ids = [str(i) for i in range(len(payloads))]
    await gw.vectors.upsert_points("n", [[i, 0] for i in range(len(payloads))], payloads, ids)
    expected = [{"v": 0.0} if p["v"] == -0.0 and isinstance(p["v"], float) else p for p in payloads]
    expected[-1] = {"v": [1e20, {"w": 0.0, "x": 1.5e-7}]}
    for pid, want in zip(ids, expected, strict=True):
        got = await gw.vectors.get_point("n", pid, with_vector=False)
        assert got is not None and typed(got["payload"]) == typed(want), (pid, got)
    listed = await gw.vectors.list_points("n", limit=50)
    assert typed([p["payload"] for p in sorted(listed["items"], key=lambda p: int(p["id"]))]) == typed(expected)

    async def match(flt: dict) -> list[str]:
        return sorted((h["id"] for h in await gw.vectors.search("n", [0, 0], 50, filters=flt)), key=int)

    assert await match({"v": 2.0**70}) == ["0"]  # was none on PostgreSQL
    assert await match({"v": 10**16}) == ["1"]
    assert await match({"v": -0.0}) == ["3", "4"]
    assert await match({"v": {"$gt": 9007199254740992.0}}) == ["0", "1", "5", "6", "7"]
    assert await match({"v": {"$gte": 2.0**63}}) == ["0", "7"]
    assert await match({"v": 9007199254740992.0}) == []
    assert await match({"v": {"$lt": 1e-299, "$gt": 0}}) == ["8", "9"]
    assert await match({"v": {"$in": [1e300, -3.4e20]}}) == ["2", "7"]
    # Floats SQLite's JSON parser reads one unit in the last place off (the payload's and a bound
    # operand's differed: $eq missed, $lt caught the point itself), declared or not.
    hard = [9e120, 1e-202, 2.0**413, 1e-300, 1.2459833914505327e-245, 1.0000000000000002e22, 3.3e-5]
    await gw.vectors.setup_collection("h", 2, "l2", payload_indexes=[{"field": "d", "kind": "float"}])
    await gw.vectors.upsert_points("h", [[i, 0] for i in range(len(hard))], [{"d": x, "u": x} for x in hard],
                                   [str(i) for i in range(len(hard))])
    for i, x in enumerate(hard):
        for field in ("d", "u"):
            found = sorted(h["id"] for h in await gw.vectors.search("h", [0, 0], 50, filters={field: x}))
            assert found == [str(i)], (field, x, found)
            below = {h["id"] for h in await gw.vectors.search("h", [0, 0], 50, filters={field: {"$lt": x}})}
            assert below == {str(j) for j, y in enumerate(hard) if y < x}, (field, x, below)
    # An integer beyond 64 bits, anywhere in a payload: 422 naming it, and nothing stored.
    url = vpath(namespace, "n", "points")
    wide = {"points": [{"id": "ok", "vector": [0, 1]}, {"id": "w", "vector": [0, 1], "payload": {"a": {"b": [1, 2**64]}}}]}
    r = await http.post(url, json=wide)
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", r.text
    assert r.json()["detail"].startswith("points.1.payload.a.b.1: integers must fit in 64 bits"), r.text
    r = await http.patch(vpath(namespace, "n", "points", "0"), json={"payload": {"v": -(2**63) - 1}})
    assert r.status_code == 422 and "payload.v" in r.json()["detail"], r.text
    assert (await gw.vectors.describe_collection("n"))["count"] == len(payloads)
    assert typed((await gw.vectors.get_point("n", "0"))["payload"]) == typed(expected[0])


async def test_namespaces_are_isolated(server, api_key: str | None, client_transport: str) -> None:
    a_ns, b_ns = f"a{uuid.uuid4().hex[:8]}", f"b{uuid.uuid4().hex[:8]}"
    async with (
        GatewayClient(server.url, a_ns, api_key, transport=client_transport) as a,
        GatewayClient(server.url, b_ns, api_key, transport=client_transport) as b,
    ):
        await a.vectors.setup_collection("shared", 2, "l2")
        await b.vectors.setup_collection("shared", 2, "l2")
        await a.vectors.upsert_points("shared", [[0, 0], [1, 1]], [{"who": "a"}] * 2, ["x", "y"])
        await b.vectors.upsert_points("shared", [[0, 0]], [{"who": "b"}], ["x"])
        assert {h["payload"]["who"] for h in await b.vectors.search("shared", [0, 0], 10)} == {"b"}
        assert len(await b.vectors.search("shared", [0, 0], 10, filters={"who": "a"})) == 0
        assert await b.vectors.delete_points("shared", filters={"who": "a"}) == 0
        assert await b.vectors.get_point("shared", "y") is None
        await b.vectors.reset_collection("shared")
        assert (await a.vectors.describe_collection("shared"))["count"] == 2
        await b.vectors.drop_collection("shared")
        assert len(await a.vectors.search("shared", [0, 0], 10)) == 2
        assert [c["collection"] for c in (await a.vectors.list_collections())["items"]] == ["shared"]
        assert (await b.vectors.list_collections())["items"] == []


async def test_search_follows_drops_and_recreates_by_another_process(
    server, namespace: str, api_key: str | None, tmp_path
) -> None:
    """A process that cached a collection's registry row still answers correctly after another
    process dropped it (404) or dropped and re-created it with other settings."""
    from tests.conftest import start_server, stop_server

    other = start_server(server.backend, tmp_path / "other.log")
    try:
        async with GatewayClient(server.url, namespace, api_key) as a, GatewayClient(other.url, namespace, api_key) as b:
            await a.vectors.setup_collection("c", 2, "l2")
            await a.vectors.upsert_points("c", [[0, 0], [1, 1]], ids=["x", "y"])
            assert [h["id"] for h in await a.vectors.search("c", [1, 1], 1)] == ["y"]  # cached in a
            await b.vectors.drop_collection("c")
            with pytest.raises(NotFound):
                await a.vectors.search("c", [1, 1], 1)
            await b.vectors.setup_collection("c", 3, "cosine")
            await b.vectors.upsert_points("c", [[0, 0, 1], [1, 0, 0]], ids=["z", "w"])
            with pytest.raises(InvalidRequest):
                await a.vectors.search("c", [1, 1], 1)  # the new collection's dimension applies
            assert [h["id"] for h in await a.vectors.search("c", [1, 0, 0.1], 1)] == ["w"]
            await b.vectors.drop_collection("c")
            await b.vectors.setup_collection("c", 3, "cosine")
            assert await a.vectors.search("c", [1, 0, 0.1], 1) == []
    finally:
        stop_server(other)


async def test_idempotency_key_replays(http: httpx.AsyncClient, gw: GatewayClient, namespace: str) -> None:
    await gw.vectors.setup_collection("c", 2, "l2")
    url = vpath(namespace, "c", "points")
    body = {"points": [{"vector": [1, 2]}, {"vector": [3, 4]}]}
    first = await http.post(url, json=body, headers={"Idempotency-Key": "k1"})
    second = await http.post(url, json=body, headers={"Idempotency-Key": "k1"})
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert (await gw.vectors.describe_collection("c"))["count"] == 2
    other = await http.post(url, json={"points": [{"vector": [5, 6]}]}, headers={"Idempotency-Key": "k1"})
    assert other.status_code == 409
    third = await http.post(url, json=body, headers={"Idempotency-Key": "k2"})
    assert third.json() != first.json()
    assert (await gw.vectors.describe_collection("c"))["count"] == 4


async def test_compact_wire_form_round_trips(http: httpx.AsyncClient, gw: GatewayClient, namespace: str) -> None:
    import base64

    await gw.vectors.setup_collection("c", 4, "l2")
    vec = np.array([0.1, -2.5, 3.25, 1e-8], dtype="<f4")
    r = await http.post(vpath(namespace, "c", "points"), json={"points": [{"id": "a", "vector_b64": base64.b64encode(vec.tobytes()).decode()}]})
    assert r.status_code == 200
    r = await http.get(vpath(namespace, "c", "points", "a"), params={"vector_format": "b64"})
    assert np.frombuffer(base64.b64decode(r.json()["vector_b64"]), dtype="<f4").tolist() == vec.tolist()
    r = await http.get(vpath(namespace, "c", "points", "a"))
    assert r.json()["vector"] == vec.tolist()


# --- the seed's VectorStoreProtocol -------------------------------------------------------------


async def test_vector_store_protocol(
    gw: GatewayClient, server, namespace: str, api_key: str | None, client_transport: str
) -> None:
    vs = gw.vector_store("memories")
    assert isinstance(vs, VectorStoreProtocol) and isinstance(vs, RemoteVectorStore)
    await vs.create_collection(4)
    await vs.create_collection(4, distance="cosine")
    await vs.insert([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], [{"t": "a"}, {"t": "b"}, {"t": "c"}], ["1", "2", "3"])
    await vs.insert([[0, 0, 0, 1]])
    res = await vs.search("", [1, 0.1, 0, 0], limit=2)
    assert all(isinstance(r, VectorRecord) for r in res)
    assert [r.id for r in res][0] == "1" and res[0].score is not None and abs(res[0].score - 1 / math.sqrt(1.01)) < 1e-4
    assert [r.id for r in await vs.search("q", [1, 0, 0, 0], 5, filters={"t": "b"})] == ["2"]
    got = await vs.get("2")
    assert got == VectorRecord(id="2", score=None, payload={"t": "b"})
    assert await vs.get("missing") is None
    await vs.update("2", payload=None, vector=[0, 0, 0.5, 0.5])
    assert (await vs.get("2")).payload == {"t": "b"}
    await vs.update("2", payload={"t": "B"})
    assert (await vs.get("2")).payload == {"t": "B"}
    await vs.delete("missing")
    await vs.delete("3")
    records = await vs.list_records()
    assert len(records) == 3 and all(r.score is None for r in records)
    assert [r.id for r in await vs.list_records(filters={"t": "B"})] == ["2"]
    assert len(await vs.list_records(limit=2)) == 2
    await vs.reset()
    assert await vs.list_records() == []
    await vs.delete_collection()
    await vs.close()
    await vs.close()
    # The factory owns its client; closing twice is safe.
    config = {"base_url": server.url, "namespace": namespace, "api_key": api_key, "transport": client_transport}
    store = create_vector_store("m2", config)
    assert isinstance(store, VectorStoreProtocol)
    await store.create_collection(2, "l2")
    await store.insert([[1, 2]], [{"x": 1}])
    assert (await store.list_records())[0].payload == {"x": 1}
    await store.close()
    await store.close()


async def test_rust_vector_store_surface(gw: GatewayClient) -> None:
    await gw.vectors.setup_collection("r", 3)
    ids = await gw.vectors.insert_vectors(
        "r",
        [
            {"id": "m1", "embedding": [1, 0, 0], "text": "hello", "user": "u1"},
            {"embedding": [0, 1, 0], "text": "world", "user": "u2"},
        ],
    )
    assert ids[0] == "m1"
    found = await gw.vectors.search_vectors("r", [1, 0.1, 0], 2)
    assert found[0]["id"] == "m1" and found[0]["text"] == "hello" and found[0]["user"] == "u1"
    assert found[0]["score"] >= found[1]["score"]
    assert await gw.vectors.delete_vectors("r", "user", "u1") == 1
    assert [f["id"] for f in await gw.vectors.search_vectors("r", [1, 0, 0], 5)] == [ids[1]]


async def test_a_stored_vector_without_a_distance_is_left_out(gw: GatewayClient, server, http: httpx.AsyncClient, namespace: str) -> None:
    """A vector stored before norms were bounded (the zero vector, written here straight into the
    table: the API refuses it) has no finite distance to a query: NULL on SQLite (a search was a 500), NaN on PostgreSQL (a hit
    with a null score). It is left out of the answer; the others come as before."""
    await gw.vectors.setup_collection("deg", 3, "cosine")
    await gw.vectors.upsert_points("deg", [[1, 0, 0], [0, 1, 0]], ids=["good", "bad"])
    url = make_url(server.backend.urls["vectors"])
    if server.backend.is_postgres:
        conn = await pg_connect(server.backend)
        try:
            table = await table_of(conn, namespace, "deg")
            await conn.execute(f"UPDATE {table} SET embedding = '[0,0,0]' WHERE id = 'bad'")
        finally:
            await conn.close()
    else:
        conn = SQLITE.connect(url.database)
        try:
            cid = conn.execute("SELECT id FROM vector_collections WHERE namespace = ? AND collection = 'deg'", (namespace,)).fetchone()[0]
            conn.execute(f"UPDATE vec_{cid} SET embedding = ?, norm = 0 WHERE id = 'bad'", (struct.pack("<3f", 0, 0, 0),))
            conn.commit()
        finally:
            conn.close()
    r = await http.post(vpath(namespace, "deg", "search"), json={"vector": [1, 0, 0], "limit": 10})
    assert r.status_code == 200, r.text
    assert [(h["id"], h["score"]) for h in r.json()["results"]] == [("good", 1.0)]


async def test_a_namespace_holds_at_most_its_share_of_collections(backend, server, tmp_path, namespace: str) -> None:  # noqa: ANN001
    """Found by attack: collections had no ceiling, and each is a table with its indexes (and a
    full-text table): on SQLite every connection reads the whole schema again after a change to
    it. Past ``vectors.max_collections_per_namespace`` a create is 409 and makes nothing."""
    from app.main import create_app

    app = create_app(in_process_settings(backend, tmp_path, vectors={"max_collections_per_namespace": 3}))
    body = {"vector_size": 2, "distance": "l2", "text_field": "text"}
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            for name in ("a", "b", "c"):
                assert (await http.put(vpath(namespace, name), json=body)).status_code == 201
            r = await http.put(vpath(namespace, "d"), json=body)
            assert r.status_code == 409 and r.json()["code"] == "too_many_collections", r.text
            assert r.headers["content-type"] == "application/problem+json"
            names = [c["collection"] for c in (await http.get(vpath(namespace))).json()["items"]]
            assert names == ["a", "b", "c"]
            assert (await http.put(vpath(namespace, "a"), json=body)).status_code == 200  # it exists: fine
            assert (await http.put(vpath(f"{namespace}x", "d"), json=body)).status_code == 201  # another namespace
            assert (await http.delete(vpath(namespace, "b"))).status_code == 204
            assert (await http.put(vpath(namespace, "d"), json=body)).status_code == 201
            # creates at the same moment cannot pass the ceiling together
            crowd = f"{namespace}y"
            answers = await asyncio.gather(*(http.put(vpath(crowd, f"c{i}"), json=body) for i in range(6)))
            assert sorted(r.status_code for r in answers) == [201] * 3 + [409] * 3, [r.text for r in answers]
            assert len((await http.get(vpath(crowd))).json()["items"]) == 3


async def test_a_search_answers_the_vectors_it_found_when_asked(http: httpx.AsyncClient, namespace: str) -> None:
    """``with_vectors`` (what maximal marginal relevance needs of its candidates): each hit with its
    stored vector, as JSON numbers or base64 float32, plain and hybrid; bounded by the answer's
    ``limits.max_page_bytes`` (16 MiB), past which it is a 422 naming it."""
    await http.put(vpath(namespace, "mmr"), json={"vector_size": 3, "distance": "cosine", "text_field": "text"})
    points = [{"id": f"p{i}", "vector": [1.0, i / 4, 0.5], "payload": {"text": f"tea {i}"}} for i in range(4)]
    r = await http.post(f"{vpath(namespace, 'mmr')}/points", json={"points": points}, headers={"Idempotency-Key": "m"})
    assert r.status_code == 200, r.text
    stored = {p["id"]: p["vector"] for p in points}
    for extra in ({}, {"query": "tea"}):
        r = await http.post(f"{vpath(namespace, 'mmr')}/search", json={"vector": [1, 0, 0.5], "limit": 3, "with_vectors": True, **extra})
        hits = r.json()["results"]
        assert len(hits) == 3 and all(h["vector"] == stored[h["id"]] for h in hits), r.text
        r = await http.post(f"{vpath(namespace, 'mmr')}/search",
                            json={"vector": [1, 0, 0.5], "limit": 3, "with_vectors": True, "vector_format": "b64", **extra})
        assert all(
            np.frombuffer(base64.b64decode(h["vector_b64"]), "<f4").tolist() == stored[h["id"]] for h in r.json()["results"]
        )
    r = await http.post(f"{vpath(namespace, 'mmr')}/search", json={"vector": [1, 0, 0.5], "limit": 3})
    assert all("vector" not in h and "vector_b64" not in h for h in r.json()["results"])  # only when asked
    await http.put(vpath(namespace, "wide"), json={"vector_size": 16000, "distance": "l2"})
    r = await http.post(f"{vpath(namespace, 'wide')}/search", json={"vector": [0.5] * 16000, "limit": 200, "with_vectors": True})
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", r.text
    assert r.json()["errors"][0]["loc"][-1] == "with_vectors" and "max_page_bytes" in r.text
