"""Path segments whose percent-escapes are not UTF-8 are a 422, not a U+FFFD (issue 19).

Before, ``x%FFy``, ``x%FEy`` and ``x\ufffdy`` were the same kv key and ``f%C0`` and ``f%C1`` the
same file: the server decoded escapes with replacement. Now the invalid ones are refused whole,
naming the parameter, nothing is stored, and a real U+FFFD (``%EF%BF%BD``) is an ordinary key.
"""

from __future__ import annotations

import httpx
import pytest

INVALID = ["x%FFy", "x%FEy", "%C0", "f%C1", "%E2%82", "%ED%A0%80", "ok/%F8%88%80%80%80", "%80"]
FFFD = "x%EF%BF%BDy"


def _assert_refused(r: httpx.Response, field: str) -> None:
    assert r.status_code == 422, (r.request.method, r.request.url, r.status_code, r.text)
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["code"] == "invalid_input"
    assert body["errors"][0]["loc"] == [field], body
    assert "UTF-8" in body["detail"]


async def test_kv_keys_that_are_not_utf8_are_422(http: httpx.AsyncClient, namespace: str) -> None:
    base = f"/v1/{namespace}/kv/c"
    r = await http.put(f"{base}/{FFFD}", json="the replacement character itself")
    assert r.is_success, r.text
    for key in INVALID:
        _assert_refused(await http.put(f"{base}/{key}", json="planted"), "key")
        _assert_refused(await http.get(f"{base}/{key}"), "key")
        _assert_refused(await http.delete(f"{base}/{key}"), "key")
    items = (await http.get(base)).json()["items"]
    assert [(i["key"], i["value"]) for i in items] == [("x\ufffdy", "the replacement character itself")]
    assert (await http.get(f"{base}/{FFFD}")).json() == "the replacement character itself"


async def test_files_and_records_ids_that_are_not_utf8_are_422(http: httpx.AsyncClient, namespace: str) -> None:
    files = f"/v1/{namespace}/files/c"
    records = f"/v1/{namespace}/records/c"
    for file_id in ("f%C0", "f%C1"):
        _assert_refused(await http.put(f"{files}/{file_id}", content=b"bytes"), "file_id")
        _assert_refused(await http.get(f"{files}/{file_id}"), "file_id")
        _assert_refused(await http.delete(f"{files}/{file_id}"), "file_id")
        _assert_refused(await http.put(f"{records}/{file_id}", json=1), "key")
    assert (await http.get(files)).json()["items"] == []
    assert (await http.get(records)).json()["items"] == []
    r = await http.head(f"{files}/f%C0")
    assert r.status_code == 422


@pytest.mark.parametrize("path", ["/v1/%FF/kv/c/k", "/v1/ns/kv/%FF/k"])
async def test_names_that_are_not_utf8_are_refused(http: httpx.AsyncClient, path: str) -> None:
    r = await http.put(path, json=1)
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", r.text


async def test_vector_ids_that_are_not_utf8_are_422(http: httpx.AsyncClient, namespace: str) -> None:
    base = f"/v1/{namespace}/vectors/c"
    assert (await http.put(base, json={"vector_size": 2, "distance": "cosine"})).is_success
    r = await http.post(f"{base}/points", json={"points": [{"id": "p\ufffd", "vector": [1.0, 0.0]}]})
    assert r.is_success, r.text
    _assert_refused(await http.get(f"{base}/points/p%FF"), "point_id")
    _assert_refused(await http.delete(f"{base}/points/p%FF"), "point_id")
    assert (await http.get(f"{base}/points/p%EF%BF%BD")).json()["id"] == "p\ufffd"
