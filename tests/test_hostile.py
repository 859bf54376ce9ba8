"""Hostile input never hurts: every answer is a 4xx (or a literal, harmless success), never a 5xx,
and nothing already stored changes."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pytest

INJECTIONS = [
    "'; DROP TABLE kv_entries; --",
    "\" OR \"1\"=\"1",
    "1; SELECT pg_sleep(5)",
    "x' UNION SELECT secret_hash FROM api_keys --",
    "%' OR '%'='",
    "\\'; --",
    "$1",
    "?",
    "../../../../etc/passwd",
    "..\\..\\windows",
    "a/../../b",
    "🙂/∆/\u202e",
]
# ("a/b" is not here: a percent-encoded "/" is decoded before routing, so it names collection "a")
BAD_NAMES = ["a'b", "a;b", "a b", "../x", "a%00b", "-x", "x" * 129, "a\"b", "*", "a\\b"]


def enc(value: str) -> str:
    return quote(value, safe="")


async def seed(http: httpx.AsyncClient, ns: str) -> dict[str, Any]:
    await http.put(f"/v1/{ns}/kv/c/k", json={"keep": True})
    await http.put(f"/v1/{ns}/records/c/r1", json={"keep": True})
    await http.put(f"/v1/{ns}/files/c/f", content=b"keep")
    await http.put(f"/v1/{ns}/vectors/v", json={"vector_size": 2, "distance": "l2"})
    await http.post(f"/v1/{ns}/vectors/v/points", json={"points": [{"id": "p", "vector": [1, 2], "payload": {"keep": True}}]})
    return await state(http, ns)


def _stored(collection: dict[str, Any]) -> dict[str, Any]:
    """A collection as stored: without the worker's count of search plans (telemetry)."""
    index = collection.get("index")
    if isinstance(index, dict):
        collection = {**collection, "index": {k: v for k, v in index.items() if k != "plans"}}
    return collection


async def state(http: httpx.AsyncClient, ns: str) -> dict[str, Any]:
    return {
        "kv": (await http.get(f"/v1/{ns}/kv/c")).json()["items"],
        "records": (await http.get(f"/v1/{ns}/records/c")).json()["items"],
        "file": (await http.get(f"/v1/{ns}/files/c/f")).content,
        "vectors": (await http.post(f"/v1/{ns}/vectors/v/points/list", json={})).json()["items"],
        "collections": [_stored(c) for c in (await http.get(f"/v1/{ns}/vectors")).json()["items"]],
    }


def assert_client_error(r: httpx.Response) -> None:
    assert 400 <= r.status_code < 500, (r.request.method, r.request.url, r.status_code, r.text[:300])
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"]


async def test_injection_strings_in_keys_and_ids_are_plain_data(http: httpx.AsyncClient, namespace: str) -> None:
    before = await seed(http, namespace)
    for i, evil in enumerate(INJECTIONS):
        e = enc(evil)
        r = await http.put(f"/v1/{namespace}/kv/c2/{e}", json={"i": i})
        assert r.is_success, r.text
        assert (await http.get(f"/v1/{namespace}/kv/c2/{e}")).json() == {"i": i}
        assert (await http.put(f"/v1/{namespace}/records/c2/{e}", json=i)).is_success
        assert (await http.get(f"/v1/{namespace}/records/c2/{e}")).json()["value"] == i
        assert (await http.put(f"/v1/{namespace}/files/c2/{e}", content=evil.encode())).is_success
        assert (await http.get(f"/v1/{namespace}/files/c2/{e}")).content == evil.encode()
    listed = (await http.get(f"/v1/{namespace}/kv/c2", params={"limit": 100})).json()["items"]
    assert sorted(item["key"] for item in listed) == sorted(INJECTIONS)
    # a prefix with LIKE metacharacters matches literally
    assert (await http.get(f"/v1/{namespace}/kv/c2", params={"prefix": "%"})).json()["items"][0]["key"] == "%' OR '%'='"
    assert (await http.get(f"/v1/{namespace}/kv/c2", params={"prefix": "_"})).json()["items"] == []
    assert await state(http, namespace) == before


@pytest.mark.parametrize("bad", BAD_NAMES)
async def test_injection_in_names_is_422(http: httpx.AsyncClient, namespace: str, bad: str) -> None:
    before = await seed(http, namespace)
    e = enc(bad)
    for method, url, body in [
        ("GET", f"/v1/{e}/kv/c/k", None),
        ("PUT", f"/v1/{namespace}/kv/{e}/k", 1),
        ("PUT", f"/v1/{namespace}/records/{e}/k", 1),
        ("GET", f"/v1/{namespace}/files/{e}", None),
        ("PUT", f"/v1/{namespace}/vectors/{e}", {"vector_size": 2}),
        ("POST", f"/v1/{namespace}/vectors/{e}/search", {"vector": [1, 2]}),
    ]:
        r = await http.request(method, url, json=body)
        assert r.status_code in (404, 422), (method, url, r.status_code, r.text)
        assert r.headers["content-type"] == "application/problem+json"
    assert await state(http, namespace) == before


@pytest.mark.parametrize("key", ["a%00b", "%00", "a%0Ab", "a%7Fb", "%C2%85"])
async def test_control_characters_in_keys_and_file_ids_are_422(http: httpx.AsyncClient, namespace: str, key: str) -> None:
    before = await seed(http, namespace)
    for url in (f"/v1/{namespace}/kv/c/{key}", f"/v1/{namespace}/records/c/{key}"):
        assert_client_error(await http.put(url, json=1))
    assert_client_error(await http.put(f"/v1/{namespace}/files/c/{key}", content=b"x"))
    assert_client_error(await http.get(f"/v1/{namespace}/vectors/v/points/{key}"))
    assert await state(http, namespace) == before


@pytest.mark.parametrize("bound", ["a%00b", "%00", "a%0Ab", "%C2%85"])
async def test_control_characters_in_list_bounds_are_422(http: httpx.AsyncClient, namespace: str, bound: str) -> None:
    """A list's bounds and prefix follow the keys' rule: PostgreSQL's text cannot hold a NUL,
    which was a 500 there and a plain comparison on SQLite (schemathesis found it)."""
    before = await seed(http, namespace)
    for url in (
        f"/v1/{namespace}/records/c?after={bound}", f"/v1/{namespace}/records/c?before={bound}",
        f"/v1/{namespace}/records/c?order=desc&before={bound}", f"/v1/{namespace}/kv/c?prefix={bound}",
    ):
        r = await http.get(url)
        assert r.status_code == 422, (url, r.status_code, r.text)
        assert r.headers["content-type"] == "application/problem+json"
    assert await state(http, namespace) == before


@pytest.mark.parametrize(
    "filters",
    [
        {"keep' OR '1'='1": True},
        {"keep": {"$eq": "' OR 1=1 --"}},
        {"$or": [{"keep": True}, {"x') --": 1}]},
        {"keep": {"$in": ["1); DROP TABLE vector_collections; --"]}},
        {"keep": {"$where": "1=1"}},
        {"$and": "not a list"},
        {"keep": {"$gt": {"nested": "object"}}},
    ],
)
async def test_hostile_filters_match_literally_or_are_422(http: httpx.AsyncClient, namespace: str, filters: dict) -> None:
    before = await seed(http, namespace)
    for path, body in [
        ("search", {"vector": [1, 2], "limit": 5, "filters": filters}),
        ("points/list", {"filters": filters}),
        ("points/delete", {"filters": filters}),
    ]:
        r = await http.post(f"/v1/{namespace}/vectors/v/{path}", json=body)
        assert r.status_code < 500, r.text
        if r.is_success and path == "points/delete":
            assert r.json()["deleted"] == (1 if filters.get("$or") else 0) or r.json()["deleted"] == 0
    after = await state(http, namespace)
    if after != before:  # only the $or filter legitimately matches (and deletes) the seeded point
        assert "$or" in filters and after["vectors"] == []


@pytest.mark.parametrize(
    "raw",
    [b"NaN", b"Infinity", b"-Infinity", b"[1, NaN]", b'{"a": Infinity}', b"{", b"'single'", b"\xff\xfe", b""],
)
async def test_non_json_and_non_finite_values_are_4xx(http: httpx.AsyncClient, namespace: str, raw: bytes) -> None:
    before = await seed(http, namespace)
    headers = {"Content-Type": "application/json"}
    for url in (f"/v1/{namespace}/kv/c/k", f"/v1/{namespace}/records/c/r1"):
        assert_client_error(await http.put(url, content=raw, headers=headers))
    body = b'{"points": [{"vector": [' + raw + b", 1]}]}"
    assert_client_error(await http.post(f"/v1/{namespace}/vectors/v/points", content=body, headers=headers))
    assert await state(http, namespace) == before


async def test_deeply_nested_json_is_4xx_not_a_crash(http: httpx.AsyncClient, namespace: str) -> None:
    before = await seed(http, namespace)
    deep = b"[" * 100_000 + b"]" * 100_000
    headers = {"Content-Type": "application/json"}
    for url, method in [
        (f"/v1/{namespace}/kv/c/k", "PUT"),
        (f"/v1/{namespace}/records/c/r1", "PUT"),
        (f"/v1/{namespace}/vectors/v/search", "POST"),
        (f"/v1/{namespace}/records/c", "POST"),
    ]:
        r = await http.request(method, url, content=deep, headers=headers)
        assert_client_error(r)
    deep_filter = {"keep": True}
    for _ in range(50):
        deep_filter = {"$and": [deep_filter]}
    assert_client_error(await http.post(f"/v1/{namespace}/vectors/v/search", json={"vector": [1, 2], "filters": deep_filter}))
    assert await state(http, namespace) == before


async def test_oversized_chunked_bodies_are_413(http: httpx.AsyncClient, namespace: str) -> None:
    before = await seed(http, namespace)

    async def chunks():
        piece = b"[" + b"1," * 500_000 + b"1]"
        yield piece
        for _ in range(20):
            yield b" " * 1_000_000

    for method, url in [("PUT", f"/v1/{namespace}/kv/c/k"), ("POST", f"/v1/{namespace}/records/c"),
                        ("POST", f"/v1/{namespace}/vectors/v/points")]:
        r = await http.request(method, url, content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413, (url, r.status_code, r.text[:200])
        assert r.json()["code"] == "payload_too_large"
    assert await state(http, namespace) == before


async def test_huge_numbers_and_strings_round_trip_or_are_refused(http: httpx.AsyncClient, namespace: str) -> None:
    before = await seed(http, namespace)
    huge_int = "9" * 4000
    r = await http.put(f"/v1/{namespace}/kv/c/big", content=huge_int.encode(), headers={"Content-Type": "application/json"})
    if r.is_success:
        assert (await http.get(f"/v1/{namespace}/kv/c/big")).text == huge_int
    else:
        assert_client_error(r)
    r = await http.post(f"/v1/{namespace}/vectors/v/points", content=b'{"points": [{"vector": [1e999, 1]}]}',
                        headers={"Content-Type": "application/json"})
    assert_client_error(r)
    r = await http.post(f"/v1/{namespace}/vectors/v/search", json={"vector": [1, 2], "limit": 10**12})
    assert_client_error(r)
    after = await state(http, namespace)
    after["kv"] = [i for i in after["kv"] if i["key"] != "big"]
    assert after == before
