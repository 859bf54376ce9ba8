"""Batches of kv keys (get, set and delete many in one request) through the client and raw HTTP,
against a real server on both backends: bounded in count and bytes, atomic, scoped like the
one-key routes (a get is a ``kv:read``), refused as problem+json with nothing stored."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.core.config import Settings
from app.main import create_app
from storage_gateway_client import GatewayClient, InvalidRequest
from tests.conftest import Backend, Server
from tests.test_isolation import make_key

VALUES = {"a": {"n": [1, 2.5, None]}, "b": None, "é/x y": "s 🎉", "big": 2**70, "f": False}


def url(namespace: str, *parts: str) -> str:
    return "/".join([f"/v1/{namespace}/kv/c", *parts])


async def test_many_keys_in_one_request_each(gw: GatewayClient, http: httpx.AsyncClient, namespace: str) -> None:
    etags = await gw.kv.set_many("c", VALUES)
    assert set(etags) == set(VALUES)
    found = await gw.kv.get_many("c", ["a", "missing", "b", "é/x y", "big", "f", "a"])
    assert {k: e.value for k, e in found.items()} == VALUES
    assert found["a"].etag == etags["a"] == (await gw.kv.get_entry("c", "a")).etag  # type: ignore[union-attr]
    # the answer: entries in the order asked, each key once; what is missing, named
    r = await http.post(url(namespace, "get"), json={"keys": ["b", "nope", "a", "b"]})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "items": [{"key": "b", "value": None, "etag": etags["b"]}, {"key": "a", "value": VALUES["a"], "etag": etags["a"]}],
        "missing": ["nope"], "unread": [],
    }
    # numbers as written, as a one-key PUT keeps them
    r = await http.post(url(namespace), content=b'{"items": [{"key": "n", "value": [1.10, 1e-400, -0]}]}',
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert (await http.get(url(namespace, "n"))).content == b"[1.10,1e-400,-0]"
    await gw.kv.delete_many("c", ["a", "b", "never", "a"])
    assert set(await gw.kv.get_many("c", list(VALUES))) == {"é/x y", "big", "f"}
    assert (await http.post(url(namespace, "delete"), json={"keys": ["f"]})).status_code == 204
    # a ttl for the whole batch: set, and refused when it is no duration
    await gw.kv.set_many("c", {"t": 1}, ttl_seconds=3600)
    r = await http.post(url(namespace), json={"items": [{"key": "u", "value": 1}], "ttl_seconds": -1})
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"


async def test_a_batch_write_stores_all_or_nothing(http: httpx.AsyncClient, namespace: str) -> None:
    await http.put(url(namespace, "keep"), json="old")
    bad_batches = {
        "items.2.value": '{"items": [{"key": "keep", "value": "new"}, {"key": "x", "value": 1}, {"key": "y", "value": "\\ud800"}]}',
        "items.1.key": '{"items": [{"key": "keep", "value": "new"}, {"key": "keep", "value": 2}]}',
        "items.1": '{"items": [{"key": "keep", "value": "new"}, {"key": "x"}]}',
    }
    for field, body in bad_batches.items():
        r = await http.post(url(namespace), content=body.encode(), headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (field, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        assert field in r.text, (field, r.text)
    r = await http.post(url(namespace, "get"), json={"keys": ["keep", "x", "y"]})
    assert [(i["key"], i["value"]) for i in r.json()["items"]] == [("keep", "old")]


async def test_batches_are_bounded(gw: GatewayClient, http: httpx.AsyncClient, namespace: str) -> None:
    keys = [f"k{i}" for i in range(1001)]  # limits.max_batch_items is 1000
    for path, body in (("get", {"keys": keys}), ("delete", {"keys": keys}),
                       ("", {"items": [{"key": k, "value": 1} for k in keys]})):
        r = await http.post(url(namespace, path) if path else url(namespace), json=body)
        assert r.status_code == 413, (path, r.text)
        assert r.headers["content-type"] == "application/problem+json" and "at most 1000" in r.text
    for body in ({"keys": []}, {"keys": ["a"], "extra": 1}, {"keys": ["a\u0001"]}, {"keys": ["x" * 1025]}):
        r = await http.post(url(namespace, "get"), json=body)
        assert r.status_code == 422, (body, r.text)
    assert (await gw.kv.get_many("c", [])) == {}
    assert await gw.kv.list("c") == ([], None)  # nothing was written by any of them
    # the client reads 1,000 keys a request
    await gw.kv.set_many("c", {k: i for i, k in enumerate(keys[:1000])})
    await gw.kv.set("c", keys[1000], 1000)
    assert {k: e.value for k, e in (await gw.kv.get_many("c", keys)).items()} == {k: i for i, k in enumerate(keys)}
    with pytest.raises(InvalidRequest):
        await gw.kv.set_many("c", {k: 0 for k in keys})  # 1001 entries: one request, refused whole
    assert (await gw.kv.get("c", "k0")) == 0


async def test_a_get_is_a_read_and_the_writes_are_writes(server: Server, http: httpx.AsyncClient, namespace: str) -> None:
    reader = await make_key(http, namespace, "kv:read")
    await http.post(url(namespace), json={"items": [{"key": "a", "value": 1}]})
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {reader}"}) as as_reader:
        assert (await as_reader.post(url(namespace, "get"), json={"keys": ["a"]})).status_code == 200
        for path, body in (("", {"items": [{"key": "a", "value": 2}]}), ("delete", {"keys": ["a"]})):
            r = await as_reader.post(url(namespace, path) if path else url(namespace), json=body)
            assert r.status_code == 403, r.text
        other = (await as_reader.post(f"/v1/other{namespace}/kv/c/get", json={"keys": ["a"]})).status_code
        assert other == 403
    assert (await http.get(url(namespace, "a"))).json() == 1
    ops = (await http.get("/openapi.json")).json()["paths"]
    assert ops["/v1/{namespace}/kv/{collection}/get"]["post"]["x-required-scope"] == "kv:read"
    assert ops["/v1/{namespace}/kv/{collection}"]["post"]["x-required-scope"] == "kv:write"
    assert ops["/v1/{namespace}/kv/{collection}/delete"]["post"]["x-required-scope"] == "kv:write"


@contextlib.asynccontextmanager
async def small_pages(backend: Backend, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in this process on ``backend``'s databases, answering 10,000 bytes of values a page."""
    settings = Settings(
        databases={db: {"url": u} for db, u in backend.urls.items()}, data_dir=tmp_path,
        auth={"mode": "disabled"}, auto_migrate=False, limits={"max_value_bytes": 12_000, "max_page_bytes": 10_000},
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            yield http


async def test_a_get_answers_its_byte_budget_and_the_client_asks_for_the_rest(
    backend: Backend, server: Server, namespace: str, tmp_path: Path
) -> None:
    values = {f"k{i}": "x" * (size - 2) for i, size in enumerate([3000, 4000, 4000, 12_000, 10])}  # JSON text sizes
    async with small_pages(backend, tmp_path) as http:
        gw = GatewayClient("http://gw", namespace, http_client=http)
        await gw.kv.set_many("c", values)
        # in key order: 3+4 (KB) | a third would pass 10: unread; the first is always answered
        r = await http.post(url(namespace, "get"), json={"keys": ["k4", "k3", "nope", "k0", "k2", "k1"]})
        assert r.json()["unread"] == ["k4", "k3", "nope", "k2"] and r.json()["missing"] == []
        assert [i["key"] for i in r.json()["items"]] == ["k0", "k1"]
        r = await http.post(url(namespace, "get"), json={"keys": ["k3", "k4"]})  # 12 KB alone: answered
        assert [i["key"] for i in r.json()["items"]] == ["k3"] and r.json()["unread"] == ["k4"]
        assert {k: e.value for k, e in (await gw.kv.get_many("c", [*values, "nope"])).items()} == values
