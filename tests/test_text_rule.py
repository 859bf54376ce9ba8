"""One rule for text and numbers, the same on both backends (issue 19).

Every JSON string that is valid Unicode is accepted (U+0000 included) and comes back exactly,
in kv values, record values, vector payload keys and values, filters and hybrid queries; a lone
surrogate is a 422 naming where it is, and nothing stored changes. NaN/Infinity are refused in
every numeric field, a bool is never an integer, numbers stored as JSON text come back as
written, and a cursor the gateway did not issue is a 422 ``invalid_cursor``.

Property tests run through the client and over raw HTTP against the real server of each backend
(``backend`` is a session parameter); what one backend answers is kept in ``ANSWERS`` and the
last test checks that SQLite and PostgreSQL answered every shared input the same.
"""

from __future__ import annotations

import base64
import json
import math
import uuid
from decimal import Decimal
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage_gateway_client import GatewayClient, InvalidRequest
from tests.conftest import Backend, Server

PROPERTY = settings(
    max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)

# --- strategies: JSON values whose strings reach every plane, U+0000, and lone surrogates ------

_PLANES = st.sampled_from([0, 1, 2, 3, 14, 15, 16])
_any_plane = _PLANES.flatmap(lambda p: st.integers(p * 0x10000, p * 0x10000 + 0xFFFF)).filter(
    lambda c: not 0xD800 <= c <= 0xDFFF
).map(chr)
_chars = st.one_of(
    st.sampled_from(["\x00", "\x01", "\x02", "\\", '"', "\n", "\u2028", "\ufeff", "\uffff", "é", "🎉", "u"]),
    _any_plane,
    st.characters(codec="utf-8"),
)
valid_text = st.text(_chars, max_size=12)
lone_surrogate = st.integers(0xD800, 0xDFFF).map(chr)
invalid_text = st.builds(lambda a, s, b: a + s + b, valid_text, lone_surrogate, valid_text)

edge_ints = st.one_of(
    st.sampled_from([0, -1, 2**53 + 1, 2**63 - 1, -(2**63), 2**64, -(2**100), 10**300]),
    st.integers(),
)
# Number literals as a client may write them: kept exactly as written where stored as text.
edge_literals = st.sampled_from(
    ["1e-400", "1E+400", "-0", "-0.0", "0.10", "1.0", "1e5", "2.5E-3", "123456789012345678901234567890.123456789",
     "4.9406564584124654e-324", "1.7976931348623157e308", "9007199254740993", "-12345678901234567890123456789"]
)
edge_floats = st.floats(allow_nan=False, allow_infinity=False)
scalars = st.one_of(st.none(), st.booleans(), edge_ints, edge_floats, valid_text)
# A vector payload's integers fit in 64 bits, as a filter's do (``test_numbers_in_payloads``).
payload_ints = st.one_of(st.sampled_from([0, -1, 2**53 + 1, 2**63 - 1, -(2**63)]), st.integers(-(2**63), 2**63 - 1))
payload_scalars = st.one_of(st.none(), st.booleans(), payload_ints, edge_floats, valid_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(valid_text, inner, max_size=4)),
    max_leaves=12,
)


J = {"Content-Type": "application/json"}


def raw(value: Any) -> bytes:
    """JSON as a hostile client may send it: lone surrogates escaped, NaN as a bare word."""
    return json.dumps(value, ensure_ascii=True, allow_nan=True).encode("ascii")


def cursor_of(position: dict[str, Any]) -> str:
    text = json.dumps({"v": 1, **position}, ensure_ascii=True)
    return base64.urlsafe_b64encode(text.encode("ascii")).decode("ascii").rstrip("=")


def assert_422(response: httpx.Response, field: str | None = None, code: str = "invalid_input") -> dict[str, Any]:
    assert response.status_code == 422, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == code, body
    if field is not None:
        assert body["detail"].startswith(field + ":") or field in body["detail"], body
        assert any(".".join(e["loc"]).endswith(field) or ".".join(e["loc"]) == field for e in body["errors"]), body
    return body


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def same_json(a: Any, b: Any, *, exact: bool = True) -> bool:
    """Equal as JSON values. ``exact``: a float stays a float with its sign (values stored as JSON
    text); otherwise numbers are equal by decimal value (JSON has one number type; PostgreSQL's
    JSONB numeric writes ``1e+22`` as ``10000000000000000000000`` and has no -0)."""
    if _number(a) and _number(b):
        if exact:
            return type(a) is type(b) and a == b and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))
        return Decimal(repr(a) if isinstance(a, float) else a) == Decimal(repr(b) if isinstance(b, float) else b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k], exact=exact) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y, exact=exact) for x, y in zip(a, b))
    return bool(a == b)


def no_negative_zero(value: Any) -> Any:
    """``value`` with every -0.0 made 0.0 (PostgreSQL's jsonb has no negative zero, so a vector
    payload stores none on either backend)."""
    if isinstance(value, float) and value == 0:
        return 0.0
    if isinstance(value, dict):
        return {k: no_negative_zero(v) for k, v in value.items()}
    if isinstance(value, list):
        return [no_negative_zero(v) for v in value]
    return value


# What each backend answered, by input: the closing test compares them.
ANSWERS: dict[str, dict[str, Any]] = {}


def record(backend: Backend, key: str, answer: Any) -> None:
    ANSWERS.setdefault(key, {})[backend.name] = answer


def kv(ns: str, c: str, key: str = "") -> str:
    return f"/v1/{ns}/kv/{c}" + (f"/{key}" if key else "")


def rec(ns: str, c: str, key: str = "") -> str:
    return f"/v1/{ns}/records/{c}" + (f"/{key}" if key else "")


def vec(ns: str, *parts: str) -> str:
    return f"/v1/{ns}/vectors" + "".join("/" + p for p in parts)


async def _collection(http: httpx.AsyncClient, ns: str, name: str = "c", **extra: Any) -> None:
    r = await http.put(vec(ns, name), json={"vector_size": 2, "distance": "l2", **extra})
    assert r.status_code in (200, 201), r.text


# --- properties -----------------------------------------------------------------------------


@PROPERTY
@given(value=json_values)
async def test_kv_value_round_trips_through_the_client(gw: GatewayClient, backend: Backend, value: Any) -> None:
    key = uuid.uuid4().hex
    await gw.kv.set("p", key, value)
    back = await gw.kv.get("p", key)
    assert same_json(back, value), (value, back)


@PROPERTY
@given(value=json_values, bad=invalid_text, where=st.sampled_from(["value", "key"]))
async def test_a_lone_surrogate_anywhere_in_a_kv_value_is_refused_naming_it(
    gw: GatewayClient, http: httpx.AsyncClient, namespace: str, backend: Backend, value: Any, bad: str, where: str
) -> None:
    await gw.kv.set("p", "k", {"kept": True})
    body = {"ok": value, bad: 1} if where == "key" else {"ok": value, "bad": [bad]}
    with pytest.raises(InvalidRequest):
        await gw.kv.set("p", "k", body)
    r = await http.put(kv(namespace, "p", "k"), content=raw(body))
    problem = assert_422(r)
    assert problem["detail"].startswith("value." + ("" if where == "key" else "bad.0")), problem
    assert await gw.kv.get("p", "k") == {"kept": True}  # nothing stored changed


@PROPERTY
@given(literal=edge_literals, wrap=st.sampled_from(["{}", "[{}]", '{{"a":[1,{}]}}']))
async def test_numbers_stored_as_text_come_back_as_written(
    http: httpx.AsyncClient, namespace: str, backend: Backend, literal: str, wrap: str
) -> None:
    text = wrap.format(literal)
    assert (await http.put(kv(namespace, "n", "k"), content=text)).status_code == 204
    assert (await http.get(kv(namespace, "n", "k"))).text == text
    assert (await http.put(rec(namespace, "n", "k"), content=text)).status_code in (200, 204)
    assert (await http.get(rec(namespace, "n", "k"))).text == '{"key":"k","value":' + text + "}"
    batch = '{"records":[{"key":"b","value":' + text + "}]}"
    r = await http.post(rec(namespace, "n"), content=batch, headers=J)
    assert r.status_code == 200, r.text
    assert (await http.get(rec(namespace, "n", "b"))).text == '{"key":"b","value":' + text + "}"
    record(backend, f"literal {text}", (await http.get(kv(namespace, "n", "k"))).text)


@PROPERTY
@given(values=st.lists(json_values, min_size=1, max_size=5), bad=invalid_text, data=st.data())
async def test_a_record_batch_with_one_bad_value_is_refused_whole_naming_its_index(
    gw: GatewayClient, http: httpx.AsyncClient, namespace: str, backend: Backend, values: list[Any], bad: str,
    data: st.DataObject,
) -> None:
    await gw.records.upsert_record("b", "0", "before")
    i = data.draw(st.integers(0, len(values)), label="index")
    batch = [{"key": str(n), "value": v} for n, v in enumerate(values)]
    batch.insert(i, {"key": "bad", "value": {"text": bad}})
    r = await http.post(rec(namespace, "b"), content=raw({"records": batch}), headers=J)
    assert_422(r, f"records.{i}.value.text")
    assert await gw.records.get_record("b", "0") == "before" and await gw.records.get_record("b", "bad") is None
    good = [item for item in batch if item["key"] != "bad"]
    assert (await http.post(rec(namespace, "b"), content=raw({"records": good}), headers=J)).status_code == 200
    for item in good:
        assert same_json(await gw.records.get_record("b", item["key"]), item["value"])


@PROPERTY
@given(payload=st.dictionaries(valid_text, payload_scalars, max_size=4), text=valid_text)
async def test_vector_payloads_round_trip_and_filter_on_every_string(
    http: httpx.AsyncClient, namespace: str, backend: Backend, payload: dict[str, Any], text: str
) -> None:
    await _collection(http, namespace, text_field="t")
    payload = {**payload, "t": text}
    r = await http.post(vec(namespace, "c", "points"), content=raw({"points": [{"id": "p", "vector": [1, 0], "payload": payload}]}), headers=J)
    assert r.status_code == 200, r.text
    got = (await http.get(vec(namespace, "c", "points", "p"))).json()
    # The same numbers, a float as a float (PostgreSQL answered 1e16 as an integer), but -0.0 as 0.0.
    assert same_json(got["payload"], no_negative_zero(payload)), (payload, got["payload"])
    matches: dict[str, Any] = {}
    for name, flt in {
        "eq": {"t": text},
        "in": {"t": {"$in": [text, "zz"]}},
        "gte": {"t": {"$gte": text}},
        "gt": {"t": {"$gt": text}},
        "lt_longer": {"t": {"$lt": text + "\x00"}},
        "ne": {"t": {"$ne": text}},
    }.items():
        r = await http.post(vec(namespace, "c", "points", "list"), content=raw({"filters": flt}), headers=J)
        assert r.status_code == 200, (name, r.text)
        matches[name] = [p["id"] for p in r.json()["items"]]
    assert matches == {"eq": ["p"], "in": ["p"], "gte": ["p"], "gt": [], "lt_longer": ["p"], "ne": []}, matches
    r = await http.post(vec(namespace, "c", "search"), content=raw({"vector": [1, 0], "query": text + " x", "filters": {"t": text}}), headers=J)
    assert r.status_code == 200 and [h["id"] for h in r.json()["results"]] == ["p"], r.text
    record(backend, f"payload {payload!r}", got["payload"])


@PROPERTY
@given(
    payloads=st.lists(st.dictionaries(valid_text, payload_scalars, max_size=3), min_size=1, max_size=4),
    bad=invalid_text,
    in_key=st.booleans(),
    data=st.data(),
)
async def test_a_point_batch_with_one_bad_payload_is_refused_whole_naming_it(
    http: httpx.AsyncClient, namespace: str, backend: Backend, payloads: list[dict[str, Any]], bad: str,
    in_key: bool, data: st.DataObject,
) -> None:
    await _collection(http, namespace)
    points = [{"id": f"p{n}", "vector": [1, n], "payload": p} for n, p in enumerate(payloads)]
    i = data.draw(st.integers(0, len(points) - 1), label="index")
    points[i]["payload"] = {**points[i]["payload"], **({bad: 1} if in_key else {"name": bad})}
    r = await http.post(vec(namespace, "c", "points"), content=raw({"points": points}), headers=J)
    problem = assert_422(r)
    assert problem["detail"].startswith(f"points.{i}.payload." + ("" if in_key else "name:")), problem
    listed = (await http.post(vec(namespace, "c", "points", "list"), json={})).json()["items"]
    assert listed == []  # nothing stored


@PROPERTY
@given(bad=invalid_text, where=st.sampled_from(["key", "value", "in", "gt", "query"]))
async def test_a_lone_surrogate_in_a_filter_or_query_is_refused_naming_it(
    http: httpx.AsyncClient, namespace: str, backend: Backend, bad: str, where: str
) -> None:
    await _collection(http, namespace, text_field="t")
    await http.post(vec(namespace, "c", "points"), json={"points": [{"id": "p", "vector": [1, 0]}]})
    filters, field = {
        "key": ({bad: 1}, "filters."),
        "value": ({"k": bad}, "filters.k:"),
        "in": ({"k": {"$in": ["a", bad]}}, "filters.k.$in.1:"),
        "gt": ({"k": {"$gt": bad}}, "filters.k.$gt:"),
        "query": (None, "query:"),
    }[where]
    search: dict[str, Any] = {"vector": [1, 0], "filters": filters} if filters else {"vector": [1, 0], "query": bad}
    assert assert_422(await http.post(vec(namespace, "c", "search"), content=raw(search), headers=J))["detail"].startswith(field)
    if filters:
        for path in ("list", "delete"):
            r = await http.post(vec(namespace, "c", "points", path), content=raw({"filters": filters}), headers=J)
            assert assert_422(r)["detail"].startswith(field)
    assert (await http.get(vec(namespace, "c", "points", "p"))).status_code == 200  # nothing deleted


# --- regressions, one per finding of issue 19 in this part ------------------------------------


async def test_nul_in_a_payload_is_stored_returned_and_filtered(http: httpx.AsyncClient, namespace: str) -> None:
    await _collection(http, namespace, text_field="t",
                      payload_indexes=[{"field": "kw", "kind": "keyword"}])
    payload = {"t": "a\x00b doc", "kw": "x\x00\x01y", "k\x00ey": ["\x00"], "n": 1}
    r = await http.post(vec(namespace, "c", "points"), json={"points": [{"id": "p", "vector": [1, 0], "payload": payload}]})
    assert r.status_code == 200, r.text
    assert (await http.get(vec(namespace, "c", "points", "p"))).json()["payload"] == payload
    for flt in ({"t": "a\x00b doc"}, {"kw": "x\x00\x01y"}, {"kw": {"$gt": "x\x00"}}, {"kw": {"$lt": "x\x01"}}):
        r = await http.post(vec(namespace, "c", "search"), json={"vector": [1, 0], "filters": flt, "query": "doc"})
        assert r.status_code == 200, r.text
        assert [(h["id"], h["payload"]) for h in r.json()["results"]] == [("p", payload)], flt


async def test_nul_in_a_filter_value_matches_nothing_else(http: httpx.AsyncClient, namespace: str) -> None:
    await _collection(http, namespace)
    await http.post(vec(namespace, "c", "points"), json={"points": [{"id": "p", "vector": [1, 0], "payload": {"k": "\x01"}}]})
    for flt in ({"k": "\x00"}, {"k": {"$in": ["\x00", "\x01\x00"]}}, {"k": {"$lt": "\x00"}}):
        r = await http.post(vec(namespace, "c", "points", "list"), json={"filters": flt})
        assert r.status_code == 200 and r.json()["items"] == [], (flt, r.text)
    r = await http.post(vec(namespace, "c", "points", "list"), json={"filters": {"k": {"$gt": "\x00"}}})
    assert [p["id"] for p in r.json()["items"]] == ["p"]


async def test_lone_surrogate_in_a_kv_value_is_a_422(http: httpx.AsyncClient, namespace: str) -> None:
    assert_422(await http.put(kv(namespace, "c", "k"), content=b'{"a":"\\ud800"}'), "value.a")
    assert (await http.get(kv(namespace, "c", "k"))).status_code == 404


async def test_lone_surrogate_in_a_record_batch_value_is_a_422_naming_the_index(
    http: httpx.AsyncClient, namespace: str
) -> None:
    records = [{"key": str(i), "value": i} for i in range(5)]
    records[3]["value"] = "\udc00"
    assert_422(await http.post(rec(namespace, "c"), content=raw({"records": records}), headers=J), "records.3.value")
    assert (await http.get(rec(namespace, "c"))).json()["items"] == []


async def test_lone_surrogate_in_a_payload_key_or_value_is_a_422_naming_the_point(
    http: httpx.AsyncClient, namespace: str
) -> None:
    await _collection(http, namespace)
    points = [{"id": f"p{i}", "vector": [1, i], "payload": {"name": "ok"}} for i in range(9)]
    points[7]["payload"] = {"name": "\ud83d"}
    assert_422(await http.post(vec(namespace, "c", "points"), content=raw({"points": points}), headers=J), "points.7.payload.name")
    points[7]["payload"] = {"\udfff": 1}
    problem = assert_422(await http.post(vec(namespace, "c", "points"), content=raw({"points": points}), headers=J))
    assert problem["detail"].startswith("points.7.payload."), problem
    assert (await http.post(vec(namespace, "c", "points", "list"), json={})).json()["items"] == []


async def test_lone_surrogate_in_a_filter_key_or_value_is_a_422(http: httpx.AsyncClient, namespace: str) -> None:
    await _collection(http, namespace)
    assert_422(await http.post(vec(namespace, "c", "search"), content=raw({"vector": [1, 0], "filters": {"k": "\ud800"}}), headers=J), "filters.k")
    r = await http.post(vec(namespace, "c", "points", "list"), content=raw({"filters": {"\ud800": 1}}), headers=J)
    assert assert_422(r)["detail"].startswith("filters."), r.text


@pytest.mark.parametrize(
    "position",
    [{"after": "\ud800"}, {"after": "a\x00b"}, {"after": True}, {"after": 2**70}, {"after": 1.5},
     {"after": {"x": 1}}, {"after": ["x"]}, {"after": None}, {}],
    ids=["surrogate", "nul", "bool", "bigint", "float", "dict", "list", "null", "missing"],
)
async def test_a_cursor_of_any_other_shape_is_invalid_cursor(
    http: httpx.AsyncClient, namespace: str, position: dict[str, Any]
) -> None:
    await _collection(http, namespace)
    cursor = cursor_of(position)
    kv_cursor = cursor_of({"k": position.get("after"), "p": None}) if position else cursor
    rec_cursor = cursor_of({"k": position.get("after"), "o": "asc"}) if position else cursor
    answers = [
        await http.get("/v1/admin/keys", params={"cursor": cursor}),
        await http.get(vec(namespace), params={"cursor": cursor}),
        await http.post(vec(namespace, "c", "points", "list"), content=raw({"cursor": cursor}), headers=J),
        await http.get(kv(namespace, "c"), params={"cursor": kv_cursor}),
        await http.get(rec(namespace, "c"), params={"cursor": rec_cursor}),
        await http.post(f"/v1/{namespace}/checkpoints/search", json={"cursor": cursor_of({"c": position.get("after"), "p": 1, "n": ""})})
        if position else await http.post(f"/v1/{namespace}/checkpoints/search", json={"cursor": cursor}),
    ]
    for r in answers:
        assert_422(r, "cursor", code="invalid_cursor")


async def test_a_checkpoint_cursor_with_a_bool_position_is_invalid_cursor(http: httpx.AsyncClient, namespace: str) -> None:
    r = await http.post(f"/v1/{namespace}/checkpoints/search", json={"cursor": cursor_of({"c": "x", "p": True, "n": ""})})
    assert_422(r, "cursor", code="invalid_cursor")


@pytest.mark.parametrize("keep_last", [False, True, "0", 1.5, "1"])
async def test_keep_last_must_be_an_integer(http: httpx.AsyncClient, namespace: str, keep_last: Any) -> None:
    for i in range(3):
        await http.put(rec(namespace, "c", f"k{i}"), json=i)
    assert_422(await http.post(rec(namespace, "c", "trim"), json={"keep_last": keep_last}), "keep_last")
    assert len((await http.get(rec(namespace, "c"))).json()["items"]) == 3


async def test_an_integral_json_number_is_an_integer(http: httpx.AsyncClient, namespace: str) -> None:
    """JSON has one number type and JSON Schema's "integer" includes ``2.0`` (as the OpenAPI
    document says): it is the integer 2. A bool never is (above)."""
    for i in range(3):
        await http.put(rec(namespace, "c", f"k{i}"), json=i)
    assert (await http.post(rec(namespace, "c", "trim"), json={"keep_last": 2.0})).is_success
    assert [i["key"] for i in (await http.get(rec(namespace, "c"))).json()["items"]] == ["k1", "k2"]


@pytest.mark.parametrize("field", ["score_threshold", "limit", "ef_search"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
async def test_nan_and_infinity_are_refused_in_numeric_fields(
    http: httpx.AsyncClient, namespace: str, field: str, value: str
) -> None:
    await _collection(http, namespace)
    r = await http.post(vec(namespace, "c", "search"), content=f'{{"vector":[1,0],"{field}":{value}}}', headers=J)
    assert_422(r, field)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("search", {"vector": [1, 0], "limit": True}, "limit"),
        ("search", {"vector": [1, 0], "limit": "3"}, "limit"),
        ("search", {"vector": [1, 0], "limit": 3.5}, "limit"),
        ("search", {"vector": [1, 0], "ef_search": False}, "ef_search"),
        ("search", {"vector": [1, 0], "score_threshold": True}, "score_threshold"),
        ("search", {"vector": [1, 0], "explain": 1}, "explain"),
        ("search", {"vector": [True, 0]}, "vector.0"),
        ("points/list", {"limit": True}, "limit"),
    ],
)
async def test_booleans_are_not_integers(http: httpx.AsyncClient, namespace: str, path: str, body: dict, field: str) -> None:
    await _collection(http, namespace)
    assert_422(await http.post(vec(namespace, "c", *path.split("/")), json=body), field)


async def test_booleans_are_not_integers_when_creating_a_collection(http: httpx.AsyncClient, namespace: str) -> None:
    assert_422(await http.put(vec(namespace, "c"), json={"vector_size": True}), "vector_size")
    assert_422(await http.put(vec(namespace, "c"), json={"vector_size": 2, "index": {"m": 16.5}}), "index.m")
    assert (await http.get(vec(namespace, "c"))).status_code == 404


@pytest.mark.parametrize("limit", ["1.0", " 1", "1_0", "+1", "true", "0x1"])
async def test_integer_query_parameters_are_decimal_digits(http: httpx.AsyncClient, namespace: str, limit: str) -> None:
    for url in (kv(namespace, "c"), rec(namespace, "c"), vec(namespace), "/v1/admin/keys"):
        assert_422(await http.get(url, params={"limit": limit}), "limit")


async def test_1e_minus_400_is_kept(http: httpx.AsyncClient, namespace: str) -> None:
    assert (await http.put(kv(namespace, "c", "k"), content=b"1e-400")).status_code == 204
    assert (await http.get(kv(namespace, "c", "k"))).text == "1e-400"
    assert (await http.post(rec(namespace, "c"), content=b'{"records":[{"key":"r","value":[1e-400,1.10]}]}', headers=J)).status_code == 200
    assert (await http.get(rec(namespace, "c", "r"))).json() == {"key": "r", "value": [0.0, 1.1]}
    assert (await http.get(rec(namespace, "c", "r"))).text == '{"key":"r","value":[1e-400,1.10]}'


async def test_numbers_in_payloads(http: httpx.AsyncClient, namespace: str, backend: Backend) -> None:
    """Payloads are JSON values (JSONB on PostgreSQL): numbers come back as the same numbers,
    not as written (``1E2`` is ``100.0``), a float as a float on both backends (``1e300`` was a
    301-digit integer from PostgreSQL) and ``-0.0`` as ``0.0``. An integer beyond 64 bits is
    refused, as in filters: SQLite compared it as a float, PostgreSQL as a decimal."""
    await _collection(http, namespace)
    body = b'{"points":[{"id":"p","vector":[1,0],"payload":{"big":123456789012345678901234567890,"f":0.5}}]}'
    assert_422(await http.post(vec(namespace, "c", "points"), content=body, headers=J), "points.0.payload.big")
    assert (await http.get(vec(namespace, "c", "points", "p"))).status_code == 404
    body = b'{"points":[{"id":"p","vector":[1,0],"payload":{"big":9223372036854775807,"f":0.5,"e":1E2,"h":1e300,"z":-0.0}}]}'
    assert (await http.post(vec(namespace, "c", "points"), content=body, headers=J)).status_code == 200
    payload = (await http.get(vec(namespace, "c", "points", "p"))).json()["payload"]
    want = {"big": 2**63 - 1, "f": 0.5, "e": 100.0, "h": 1e300, "z": 0.0}
    assert json.dumps(payload, sort_keys=True) == json.dumps(want, sort_keys=True)  # jsonb orders keys its own way
    record(backend, "payload numbers", payload)


# --- both backends gave the same answers ------------------------------------------------------


def test_both_backends_answer_the_same(server: Server, backend: Backend) -> None:
    """Runs after the others on each backend; on the second, compares every shared answer."""
    shared = {k: v for k, v in ANSWERS.items() if len(v) == 2}
    if {name for v in ANSWERS.values() for name in v} == {"sqlite", "postgres"}:
        assert shared, "the same inputs ran on both backends (derandomized examples)"
    for key, by_backend in shared.items():
        # JSON values; payload numbers equal by value (JSONB numerics, see test_numbers_in_payloads)
        assert same_json(by_backend["sqlite"], by_backend["postgres"], exact=False), key


async def test_a_trim_bound_follows_the_key_rule(http: httpx.AsyncClient, namespace: str) -> None:
    """A NUL in ``before`` was a 500 on PostgreSQL (schemathesis): a bound is a key, refused alike."""
    await http.put(rec(namespace, "c", "k1"), json=1)
    assert_422(await http.post(rec(namespace, "c", "trim"), json={"before": "k\u0000"}), "before")
    assert len((await http.get(rec(namespace, "c"))).json()["items"]) == 1


async def test_checkpoint_metadata_keeps_integers_beyond_64_bits(http: httpx.AsyncClient, namespace: str) -> None:
    """orjson cannot write them; they are JSON all the same (schemathesis found the 422)."""
    big = 408086939299357471562889428992
    body = {
        "thread_id": "t", "checkpoint_id": "c1", "checkpoint": {"type": "bytes", "data": "AA=="},
        "metadata": {"n": big, "step": 1},
    }
    r = await http.post(f"/v1/{namespace}/checkpoints/put", json=body)
    assert r.is_success, r.text
    got = (await http.get(f"/v1/{namespace}/checkpoints/tuple", params={"thread_id": "t"})).json()
    assert got["metadata"]["n"] == big


@given(st.text())
def test_json_string_writes_what_json_dumps_writes(key: str) -> None:
    """Keys in kv and records pages are written with ``json_string``; it must write exactly what
    ``json.dumps(key, ensure_ascii=False)`` writes for every string (quotes, controls, U+0000,
    astral characters, lone surrogates)."""
    from app.core.jsonvalue import json_string

    assert json_string(key) == json.dumps(key, ensure_ascii=False)
