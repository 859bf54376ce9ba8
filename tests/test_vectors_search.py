"""Search quality on both backends through the client and a real server: recall@10 against exact
numpy ground truth on 20,000 clustered 384-d vectors, filtered searches that return exactly
``min(limit, matches)``, and filter semantics against a Python reference (property-based).

On PostgreSQL the HNSW index is built in the background once a collection is loaded; the recall
and filtered-search tests wait until it is ready, so that they measure the HNSW path (before
that, searches are exact)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_gateway_client import GatewayClient

from tests.conftest import VECTOR_BACKENDS, start_server, stop_server
from tests.test_vectors_index import pg_connect, plan_uses_index, table_of, wait_until_indexed

pytestmark = pytest.mark.backends(*VECTOR_BACKENDS)

N, DIM, QUERIES, K = 20_000, 384, 30, 10


def clustered(n: int, dim: int, seed: int, centers: int = 100, latent: int = 32) -> np.ndarray:
    """Clusters in a low-dimensional latent space projected to ``dim`` (as real embeddings are),
    with a little isotropic noise and varied norms (which matter for ip)."""
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centers, latent)) * 2.0
    labels = rng.integers(0, centers, size=n)
    points = c[labels] + rng.normal(size=(n, latent))
    projection = rng.normal(size=(latent, dim)) / np.sqrt(latent)
    scale = rng.uniform(0.5, 1.5, size=(n, 1))
    return ((points @ projection + 0.05 * rng.normal(size=(n, dim))) * scale).astype(np.float32)


@pytest.fixture(scope="module")
def dataset() -> tuple[np.ndarray, np.ndarray]:
    both = clustered(N + QUERIES, DIM, seed=42)
    return both[:N], both[N:]


def true_distances(data: np.ndarray, q: np.ndarray, distance: str) -> np.ndarray:
    d, q = data.astype(np.float64), q.astype(np.float64)
    if distance == "cosine":
        return 1 - d @ q / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))
    if distance == "ip":
        return -(d @ q)
    return np.linalg.norm(d - q, axis=1)


def recall_at_k(found: list[int], truth: np.ndarray, k: int = K, eps: float = 1e-5) -> float:
    """Share of the true top k found; a result tied with the k-th within ``eps`` counts as true."""
    order = np.argsort(truth)
    kth = truth[order[k - 1]]
    return sum(1 for i in found[:k] if truth[i] <= kth + eps) / k


@pytest.mark.slow
@pytest.mark.one_transport
@pytest.mark.parametrize("distance", ["cosine", "l2", "ip"])
async def test_recall_against_exact_ground_truth(
    gw: GatewayClient, server, namespace: str, dataset, distance: str
) -> None:
    data, queries = dataset
    await gw.vectors.setup_collection("r", DIM, distance)
    ids = await gw.vectors.upsert_points("r", data, ids=[str(i) for i in range(N)])
    assert len(ids) == N
    assert (await gw.vectors.describe_collection("r"))["count"] == N
    await wait_until_indexed(gw, server, "r")
    if server.backend.is_postgres:
        conn = await pg_connect(server.backend)
        try:
            assert await plan_uses_index(conn, await table_of(conn, namespace, "r"), DIM, distance)
        finally:
            await conn.close()
    recalls = []
    for q in queries:
        hits = await gw.vectors.search("r", q, K)
        assert len(hits) == K
        truth = true_distances(data, q, distance)
        found = [int(h["id"]) for h in hits]
        recalls.append(recall_at_k(found, truth))
        for h in hits[:3]:
            i = int(h["id"])
            expected = 1 - truth[i] if distance == "cosine" else -truth[i]
            # Both backends compute in float32: within 1e-4, relative to the score's magnitude.
            assert abs(h["score"] - expected) < 1e-4 * max(1.0, abs(expected))
    recall = float(np.mean(recalls))
    if server.backend.is_postgres:
        assert recall >= 0.95, recall
    else:
        assert recall == 1.0, recall


@pytest.mark.slow
@pytest.mark.parametrize("exact_threshold", ["default", pytest.param("0", marks=pytest.mark.postgres_only)])
@pytest.mark.parametrize("client_transport", ["http11"])  # its subject is the plan, not the transport
async def test_filtered_search_returns_min_limit_matches(
    gw: GatewayClient, server, namespace: str, api_key: str | None, dataset, exact_threshold: str, tmp_path
) -> None:
    """With the default ``exact_search_threshold`` the 50% and 30% filters go through the HNSW
    index and the 5% and 0.1% ones are searched exactly; with 0 (a second process) every filter
    goes through the index, and too few results fall back to an exact search."""
    data, queries = dataset
    n = 20_000
    data = data[:n]
    # bucket b: 0 for 50%, 1 for 30%, 2 for 5%, 3 for 0.1% (disjoint), the rest 4
    bucket = np.full(n, 4)
    rng = np.random.default_rng(3)
    perm = rng.permutation(n)
    bucket[perm[: n // 2]] = 0
    bucket[perm[n // 2 : n // 2 + int(n * 0.3)]] = 1
    bucket[perm[n // 2 + int(n * 0.3) : n // 2 + int(n * 0.35)]] = 2
    bucket[perm[n // 2 + int(n * 0.35) : n // 2 + int(n * 0.351)]] = 3
    payloads = [{"b": int(b), "even": i % 2 == 0} for i, b in enumerate(bucket)]
    await gw.vectors.setup_collection("f", DIM, "cosine")
    await gw.vectors.upsert_points("f", data, payloads, [str(i) for i in range(n)])
    await wait_until_indexed(gw, server, "f")
    other = None
    if exact_threshold == "0":
        other = start_server(server.backend, tmp_path / "other.log", GATEWAY_VECTORS__EXACT_SEARCH_THRESHOLD="0")
    try:
        async with GatewayClient(other.url if other else server.url, namespace, api_key) as searcher:
            await _check_filtered(searcher, data, queries, bucket, payloads)
    finally:
        if other is not None:
            stop_server(other)


async def _check_filtered(gw: GatewayClient, data, queries, bucket, payloads) -> None:
    cases = [(0, 10), (0, 100), (1, 400), (2, 10), (2, 100), (3, 10), (3, 50)]
    for b, limit in cases:
        matches = int((bucket == b).sum())
        for q in queries[:3]:
            hits = await gw.vectors.search("f", q, limit, filters={"b": b})
            assert len(hits) == min(limit, matches), (b, limit, matches, len(hits))
            assert all(h["payload"]["b"] == b for h in hits)
            truth = true_distances(data, q, "cosine")
            truth = np.where(bucket == b, truth, np.inf)
            found = [int(h["id"]) for h in hits]
            assert recall_at_k(found, truth, k=min(limit, matches)) >= (0.9 if limit < matches else 1.0)
    # A compound filter at ~0.05%: bucket 3 and even ids.
    flt = {"$and": [{"b": 3}, {"even": True}]}
    matches = sum(1 for p in payloads if p["b"] == 3 and p["even"])
    hits = await gw.vectors.search("f", queries[0], 50, filters=flt)
    assert len(hits) == min(50, matches)


# --- filter semantics against a Python reference ------------------------------------------------

KEYS = ["a", "b", "c"]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, 1.0, -2.25, 2.0]),
    st.sampled_from(["", "a", "b", "Z", "é", "1", "true", "ab"]),
)
NUM_OR_STR = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, -2.25]), st.sampled_from(["", "a", "b", "Z", "é"]))


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def ref_eq(p: dict, k: str, v: Any) -> bool:
    if k not in p:
        return False
    x = p[k]
    if v is None or isinstance(v, bool):
        return x is v
    if isinstance(v, str):
        return isinstance(x, str) and x == v
    return _is_num(x) and x == v


def ref_match(p: dict, flt: dict) -> bool:
    for k, cond in flt.items():
        if k == "$and":
            ok = all(ref_match(p, f) for f in cond)
        elif k == "$or":
            ok = any(ref_match(p, f) for f in cond)
        elif isinstance(cond, dict):
            ok = True
            for op, v in cond.items():
                if op == "$eq":
                    ok &= ref_eq(p, k, v)
                elif op == "$ne":
                    ok &= not ref_eq(p, k, v)
                elif op == "$in":
                    ok &= any(ref_eq(p, k, x) for x in v)
                elif op == "$nin":
                    ok &= not any(ref_eq(p, k, x) for x in v)
                elif op == "$exists":
                    ok &= (k in p) == v
                else:
                    x = p.get(k, None)
                    same = (isinstance(v, str) and isinstance(x, str)) or (_is_num(v) and _is_num(x))
                    if not (k in p and same):
                        ok = False
                    else:
                        ok &= {"$gt": x > v, "$gte": x >= v, "$lt": x < v, "$lte": x <= v}[op]
        else:
            ok = ref_eq(p, k, cond)
        if not ok:
            return False
    return True


def field_condition() -> st.SearchStrategy:
    ops = st.one_of(
        st.builds(lambda v: {"$eq": v}, SCALARS),
        st.builds(lambda v: {"$ne": v}, SCALARS),
        st.builds(lambda v: {"$in": v}, st.lists(SCALARS, max_size=3)),
        st.builds(lambda v: {"$nin": v}, st.lists(SCALARS, max_size=3)),
        st.builds(lambda v: {"$exists": v}, st.booleans()),
        st.builds(lambda op, v: {op: v}, st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), NUM_OR_STR),
    )
    return st.one_of(SCALARS, ops)


FILTERS = st.recursive(
    st.dictionaries(st.sampled_from(KEYS), field_condition(), min_size=1, max_size=2),
    lambda inner: st.one_of(
        st.builds(lambda fs: {"$and": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda fs: {"$or": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda a, b: {**a, **b}, inner, st.dictionaries(st.sampled_from(KEYS), field_condition(), max_size=1)),
    ),
    max_leaves=6,
)




def test_filters_match_python_reference(server, auth_headers: dict[str, str]) -> None:
    """Search and list with generated filters return exactly the points the reference accepts,
    on a collection without declared payload indexes and on one declaring every key (conditions
    on a declared field are compiled to its index's expression)."""
    ns = f"h{uuid.uuid4().hex[:10]}"
    rng = np.random.default_rng(11)
    values = [None, True, False, 0, 1, -3, 2, 0.5, 1.0, -2.25, "", "a", "b", "Z", "é", "1", "true", "ab"]
    payloads = []
    for _ in range(60):
        keys = [k for k in KEYS if rng.random() < 0.7]
        payloads.append({k: values[int(rng.integers(len(values)))] for k in keys})
    vectors = rng.normal(size=(60, 4)).astype(np.float32).tolist()
    declared = [{"field": "a", "kind": "keyword"}, {"field": "b", "kind": "integer"}, {"field": "c", "kind": "bool"}]
    bases = [f"/v1/{ns}/vectors/p", f"/v1/{ns}/vectors/declared"]
    with httpx.Client(base_url=server.url, headers=auth_headers, timeout=30) as http:
        for base, payload_indexes in zip(bases, (None, declared)):
            body = {"vector_size": 4, "distance": "l2"}
            if payload_indexes:
                body["payload_indexes"] = payload_indexes
            assert http.put(base, json=body).status_code == 201
            r = http.post(f"{base}/points", json={"vectors": vectors, "payloads": payloads, "ids": [f"{i:02d}" for i in range(60)]})
            assert r.status_code == 200, r.text

        @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
        @given(flt=FILTERS)
        def check(flt: dict) -> None:
            expected = {f"{i:02d}" for i, p in enumerate(payloads) if ref_match(p, flt)}
            for base in bases:
                r = http.post(f"{base}/search", json={"vector": [0, 0, 0, 0], "limit": 100, "filters": flt})
                assert r.status_code == 200, (flt, r.text)
                got = {h["id"] for h in r.json()["results"]}
                assert got == expected, (base, flt)
                r = http.post(f"{base}/points/list", json={"filters": flt, "limit": 100})
                assert {p["id"] for p in r.json()["items"]} == expected, (base, flt)

        check()
