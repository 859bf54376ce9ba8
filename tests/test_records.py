"""Ordered records through the client and raw HTTP, against a real server on both backends."""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest

from storage_gateway_client import GatewayClient, InvalidRequest, SortOrder
from tests.conftest import Server

# Byte order of the UTF-8 key: digits before upper case before lower case; space < '/' < ':'.
ORDERED_KEYS = ["10", "9", "B", "a", "a b", "a/b", "a:b", "é"]


def rec_url(namespace: str, collection: str, key: str | None = None) -> str:
    base = f"/v1/{namespace}/records/{collection}"
    return base if key is None else f"{base}/{quote(key, safe='')}"


async def _fill(gw: GatewayClient, collection: str, keys: list[str]) -> None:
    for key in reversed(keys):  # insertion order must not matter
        await gw.records.upsert_record(collection, key, {"k": key})


async def test_upsert_get_delete(gw: GatewayClient) -> None:
    await gw.records.upsert_record("history", "00001", {"role": "user", "content": "hi"})
    assert await gw.records.get_record("history", "00001") == {"role": "user", "content": "hi"}
    await gw.records.upsert_record("history", "00001", {"role": "assistant"})
    assert await gw.records.get_record("history", "00001") == {"role": "assistant"}
    await gw.records.delete_record("history", "00001")
    assert await gw.records.get_record("history", "00001") is None
    await gw.records.delete_record("history", "00001")  # missing: no error
    await gw.records.delete_record("never-existed", "x")


async def test_get_one_over_http(gw: GatewayClient, http: httpx.AsyncClient) -> None:
    await gw.records.upsert_record("c", "a/b", [1, 2**70, None])
    r = await http.get(rec_url(gw.namespace, "c", "a/b"))
    assert r.status_code == 200
    assert r.text == '{"key":"a/b","value":[1,1180591620717411303424,null]}'
    missing = await http.get(rec_url(gw.namespace, "c", "nope"))
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"


async def test_ordered_by_key_bytes_not_insertion(gw: GatewayClient) -> None:
    await _fill(gw, "ord", ORDERED_KEYS)
    got = await gw.records.get_ordered_records("ord")
    assert [k for k, _ in got] == ORDERED_KEYS
    assert got[0] == ("10", {"k": "10"})
    desc = await gw.records.get_ordered_records("ord", order=SortOrder.DESCENDING)
    assert [k for k, _ in desc] == list(reversed(ORDERED_KEYS))


async def test_desc_with_limit_gives_the_largest_keys_largest_first(gw: GatewayClient) -> None:
    keys = [f"{i:020d}" for i in range(1, 31)]
    await gw.records.upsert_records("hist", [(k, {"n": int(k)}) for k in keys])
    last3 = await gw.records.get_ordered_records("hist", limit=3, order=SortOrder.DESCENDING)
    assert last3 == [(keys[-1], {"n": 30}), (keys[-2], {"n": 29}), (keys[-3], {"n": 28})]
    first3 = await gw.records.get_ordered_records("hist", limit=3)
    assert [k for k, _ in first3] == keys[:3]
    assert await gw.records.get_ordered_records("hist", limit=0) == []
    assert len(await gw.records.get_ordered_records("hist", limit=100)) == 30


async def test_pages_with_cursors_both_orders(gw: GatewayClient) -> None:
    keys = [f"k{i:03d}" for i in range(25)]
    await gw.records.upsert_records("p", {k: i for i, k in enumerate(keys)})
    for order, expected in ((SortOrder.ASCENDING, keys), (SortOrder.DESCENDING, keys[::-1])):
        seen, cursor = [], None
        while True:
            page, cursor = await gw.records.list("p", order=order, limit=7, cursor=cursor)
            assert len(page) <= 7
            seen += [k for k, _ in page]
            if cursor is None:
                break
        assert seen == expected
        assert [k async for k, _ in gw.records.iter_records("p", order=order, page_size=4)] == expected
    # get_ordered_records without a limit fetches every page
    assert [k for k, _ in await gw.records.get_ordered_records("p")] == keys


async def test_after_and_before_are_exclusive(gw: GatewayClient) -> None:
    keys = [f"k{i}" for i in range(10)]
    await gw.records.upsert_records("b", [(k, None) for k in keys])
    page, _ = await gw.records.list("b", after="k2", before="k6")
    assert [k for k, _ in page] == ["k3", "k4", "k5"]
    page, _ = await gw.records.list("b", after="k2", before="k6", order=SortOrder.DESCENDING)
    assert [k for k, _ in page] == ["k5", "k4", "k3"]
    page, _ = await gw.records.list("b", after="k25")  # a bound need not exist
    assert [k for k, _ in page] == ["k3", "k4", "k5", "k6", "k7", "k8", "k9"]
    # bounds and cursors together
    page, cursor = await gw.records.list("b", after="k1", before="k8", limit=2, order=SortOrder.DESCENDING)
    assert [k for k, _ in page] == ["k7", "k6"]
    page, cursor = await gw.records.list("b", after="k1", before="k8", limit=10, cursor=cursor,
                                         order=SortOrder.DESCENDING)
    assert [k for k, _ in page] == ["k5", "k4", "k3", "k2"] and cursor is None


async def test_stored_null_and_exotic_values(gw: GatewayClient) -> None:
    values = {"n": None, "big": -(2**80), "f": 0.1, "u": "üñí 🎉", "nested": {"a": [[], {}]}, "t": True}
    await gw.records.upsert_records("v", values)
    got = dict(await gw.records.get_ordered_records("v"))
    assert got == values
    assert type(got["t"]) is bool and type(got["big"]) is int
    assert await gw.records.get_record("v", "n") is None


async def test_batch_upsert_replaces_and_counts(gw: GatewayClient) -> None:
    assert await gw.records.upsert_records("c", {"a": 1, "b": 2}) == 2
    assert await gw.records.upsert_records("c", [("b", 20), ("c", 3)]) == 2
    assert await gw.records.get_ordered_records("c") == [("a", 1), ("b", 20), ("c", 3)]


async def test_trim_before_an_existing_key_keeps_it(gw: GatewayClient) -> None:
    keys = [f"{i:05d}" for i in range(10)]
    await gw.records.upsert_records("t", [(k, i) for i, k in enumerate(keys)])
    assert await gw.records.trim_records_before("t", "00004") == 4
    assert [k for k, _ in await gw.records.get_ordered_records("t")] == keys[4:]
    assert await gw.records.trim_records_before("t", "00004") == 0


async def test_trim_before_a_missing_key(gw: GatewayClient) -> None:
    keys = ["a", "c", "e", "g"]
    await gw.records.upsert_records("t", [(k, k) for k in keys])
    assert await gw.records.trim_records_before("t", "d") == 2
    assert [k for k, _ in await gw.records.get_ordered_records("t")] == ["e", "g"]
    assert await gw.records.trim_records_before("t", "0") == 0  # below everything
    assert await gw.records.trim_records_before("t", "zzz") == 2  # above everything
    assert await gw.records.get_ordered_records("t") == []
    assert await gw.records.trim_records_before("empty-collection", "x") == 0


async def test_trim_uses_byte_order(gw: GatewayClient) -> None:
    await _fill(gw, "t", ORDERED_KEYS)
    assert await gw.records.trim_records_before("t", "a") == 3  # "10", "9", "B"
    assert [k for k, _ in await gw.records.get_ordered_records("t")] == ORDERED_KEYS[3:]


async def test_trim_keep_last(gw: GatewayClient) -> None:
    keys = [f"{i:03d}" for i in range(12)]
    await gw.records.upsert_records("t", [(k, i) for i, k in enumerate(keys)])
    assert await gw.records.trim("t", keep_last=5) == 7
    assert [k for k, _ in await gw.records.get_ordered_records("t")] == keys[7:]
    assert await gw.records.trim("t", keep_last=5) == 0
    assert await gw.records.trim("t", keep_last=50) == 0
    # both: a record goes only when it is below `before` AND outside the last n
    assert await gw.records.trim("t", before="011", keep_last=3) == 2  # 007, 008 go; 009, 010 stay (last 3)
    assert [k for k, _ in await gw.records.get_ordered_records("t")] == ["009", "010", "011"]
    assert await gw.records.trim("t", keep_last=0) == 3
    assert await gw.records.get_ordered_records("t") == []


@pytest.mark.parametrize("keep_last", [2**31 + 2, 10**12, 2**63, 10**30])
async def test_trim_keeping_more_than_any_collection_holds_deletes_nothing(gw: GatewayClient, keep_last: int) -> None:
    await gw.records.upsert_records("big", {"a": 1, "b": 2})
    assert await gw.records.trim("big", keep_last=keep_last) == 0
    assert await gw.records.trim("big", before="b", keep_last=keep_last) == 0
    assert [k for k, _ in await gw.records.get_ordered_records("big")] == ["a", "b"]


async def test_trim_answer_shape(gw: GatewayClient, http: httpx.AsyncClient) -> None:
    await gw.records.upsert_records("t", {"a": 1, "b": 2})
    r = await http.post(rec_url(gw.namespace, "t") + "/trim", json={"before": "b"})
    assert r.status_code == 200 and r.json() == {"deleted": 1}


async def test_key_named_trim_is_an_ordinary_record(gw: GatewayClient) -> None:
    await gw.records.upsert_record("c", "trim", 1)
    assert await gw.records.get_record("c", "trim") == 1
    assert await gw.records.get_ordered_records("c") == [("trim", 1)]


@pytest.mark.parametrize("key", ["a/b", "a:b", "with space", "trailing/", "é🎉", "%2F", "a" * 1024])
async def test_odd_keys(gw: GatewayClient, key: str) -> None:
    await gw.records.upsert_record("odd", key, key)
    assert await gw.records.get_record("odd", key) == key
    assert await gw.records.get_ordered_records("odd") == [(key, key)]
    await gw.records.delete_record("odd", key)
    assert await gw.records.get_ordered_records("odd") == []


async def test_namespaces_are_isolated(
    gw: GatewayClient, server: Server, api_key: str | None, client_transport: str
) -> None:
    async with GatewayClient(server.url, gw.namespace + "-other", api_key, transport=client_transport) as other:
        await gw.records.upsert_records("shared", {"a": "mine", "b": "mine"})
        await other.records.upsert_records("shared", {"a": "theirs", "c": "theirs"})
        assert await gw.records.get_ordered_records("shared") == [("a", "mine"), ("b", "mine")]
        assert await other.records.trim_records_before("shared", "zzz") == 2
        assert await other.records.trim("shared", keep_last=0) == 0
        await other.records.delete_record("shared", "b")
        assert await gw.records.get_ordered_records("shared") == [("a", "mine"), ("b", "mine")]
        assert await other.records.get_record("shared", "a") is None


# --- bad input ----------------------------------------------------------------------------------


def _assert_problem(r: httpx.Response, status: int, field: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    named_in_errors = any(field in ".".join(str(x) for x in e["loc"]) for e in body.get("errors") or [])
    assert field in body["detail"] or (field == "body" and named_in_errors), body
    if "errors" in body:
        assert named_in_errors, body


async def _state(gw: GatewayClient) -> list:
    return await gw.records.get_ordered_records("c")


@pytest.mark.parametrize(
    ("method", "suffix", "kwargs", "status", "field"),
    [
        ("PUT", "/k2", {"content": b"{bad json"}, 422, "value"),
        ("PUT", "/k2", {"content": b"NaN"}, 422, "value"),
        ("PUT", "/k2", {"content": b'"' + b"x" * (1024 * 1024) + b'"'}, 413, "value"),
        ("PUT", "/" + quote("é" * 513, safe=""), {"content": b"1"}, 422, "key"),
        ("PUT", "/a%01b", {"content": b"1"}, 422, "key"),
        ("POST", "", {"json": {"records": [{"key": "k2", "value": 1}, {"key": "", "value": 2}]}}, 422, "records.1.key"),
        ("POST", "", {"json": {"records": [{"key": "k2", "value": 1}, {"key": "a\u0007", "value": 2}]}}, 422, "records.1.key"),
        ("POST", "", {"json": {"records": [{"key": "k2", "value": 1}, {"key": "x" * 1025, "value": 2}]}}, 422, "records.1.key"),
        ("POST", "", {"json": {"records": [{"key": "k2", "value": 1}, {"key": "k3"}]}}, 422, "records"),
        ("POST", "", {"content": b'{"records": [{"key": "k2", "value": 1}, {"key": "k3", "value": NaN}]}'}, 422, "records.1.value"),
        ("POST", "", {"json": {"records": []}}, 422, "records"),
        ("POST", "", {"json": {"rows": [{"key": "k2", "value": 1}]}}, 422, "records"),
        ("POST", "", {"content": b"not json"}, 422, "body"),
        # JSON is UTF-8 without a BOM: a batch with one fell back to parsed floats (1e400 stored as null)
        ("POST", "", {"content": b'\xef\xbb\xbf{"records": [{"key": "k2", "value": 1e400}]}'}, 422, "body"),
        ("POST", "", {"content": '{"records": [{"key": "k2", "value": 1.10}]}'.encode("utf-16")}, 422, "body"),
        ("PUT", "/k2", {"content": b'\xef\xbb\xbf{"a": 1}'}, 422, "value"),
        ("POST", "", {"json": {"records": [{"key": f"k{i}", "value": i} for i in range(1001)]}}, 413, "records"),
        ("POST", "", {"json": {"records": [{"key": "k2", "value": 1}, {"key": "k3", "value": "x" * (1024 * 1024)}]}}, 413, "records.1.value"),
        ("POST", "/trim", {"json": {}}, 422, "body"),
        ("POST", "/trim", {"json": {"keep_last": -1}}, 422, "keep_last"),
        ("POST", "/trim", {"json": {"before": ""}}, 422, "before"),
        ("POST", "/trim", {"json": {"before": 5}}, 422, "before"),
        ("POST", "/trim", {"json": {"after": "x"}}, 422, "after"),
    ],
)
async def test_bad_writes_are_problems_and_change_nothing(
    gw: GatewayClient, http: httpx.AsyncClient, method: str, suffix: str, kwargs: dict, status: int, field: str
) -> None:
    await gw.records.upsert_records("c", {"a": 1, "k1": 2})
    before = await _state(gw)
    headers = {"Content-Type": "application/json"} if "content" in kwargs else {}
    r = await http.request(method, rec_url(gw.namespace, "c") + suffix, headers=headers, **kwargs)
    _assert_problem(r, status, field)
    assert await _state(gw) == before


@pytest.mark.parametrize(
    ("path", "field"),
    [("/v1/bad%20ns/records/c", "namespace"), ("/v1/ns/records/c%21", "collection"),
     ("/v1/ns/records/" + "c" * 129, "collection")],
)
async def test_bad_names(http: httpx.AsyncClient, path: str, field: str) -> None:
    _assert_problem(await http.get(path), 422, field)
    _assert_problem(await http.put(path + "/k", content=b"1"), 422, field)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "99999999"}, "limit"),
        ({"order": "sideways"}, "order"),
        ({"cursor": "%%%"}, "cursor"),
        ({"cursor": "eyJ2IjoxLCJrIjo1LCJvIjoiYXNjIn0"}, "cursor"),  # {"v":1,"k":5,"o":"asc"}
        ({"after": "x" * 2000}, "after"),
    ],
)
async def test_bad_list_parameters(gw: GatewayClient, http: httpx.AsyncClient, params: dict, field: str) -> None:
    r = await http.get(rec_url(gw.namespace, "c"), params=params)
    _assert_problem(r, 422, field)


async def test_cursor_order_mismatch_is_refused(gw: GatewayClient) -> None:
    await gw.records.upsert_records("c", {"a": 1, "b": 2, "c": 3})
    _, cursor = await gw.records.list("c", limit=1)
    with pytest.raises(InvalidRequest) as info:
        await gw.records.list("c", cursor=cursor, order=SortOrder.DESCENDING)
    assert info.value.status_code == 422 and "cursor" in str(info.value)


async def test_openapi_documents_records(http: httpx.AsyncClient) -> None:
    paths = (await http.get("/openapi.json")).json()["paths"]
    assert {"get", "put", "delete"} <= set(paths["/v1/{namespace}/records/{collection}/{key}"])
    assert {"get", "post"} <= set(paths["/v1/{namespace}/records/{collection}"])
    trim = paths["/v1/{namespace}/records/{collection}/trim"]["post"]
    assert trim["summary"] and "requestBody" in trim


async def test_values_are_returned_verbatim_in_lists(gw: GatewayClient, http: httpx.AsyncClient) -> None:
    await http.put(rec_url(gw.namespace, "c", "k"), content=b'{"x" : 1.50, "y": [ ] }')
    r = await http.get(rec_url(gw.namespace, "c"))
    assert r.text == '{"items":[{"key":"k","value":{"x":1.50,"y":[]}}],"next_cursor":null}'  # numbers as written
    assert json.loads(r.text)["items"][0]["value"] == {"x": 1.5, "y": []}
