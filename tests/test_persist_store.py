"""The seed's AsyncPersistStore over the gateway, on both backends."""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

import httpx
import pytest

from storage_gateway_client import (
    AsyncPersistStore,
    ClientClosed,
    GatewayClient,
    RemotePersistStore,
    create_persist_store,
)
from tests.conftest import Server


@runtime_checkable
class SeedAsyncPersistStore(Protocol):
    """soothe_sdk.protocols.persistence.AsyncPersistStore, as the seed defines it."""

    async def save(self, key: str, data: Any) -> None: ...

    async def load(self, key: str) -> Any | None: ...

    async def delete(self, key: str) -> None: ...

    async def list_keys(self, namespace: str | None = None) -> list[str]: ...

    async def close(self) -> None: ...


METHODS = ("save", "load", "delete", "list_keys", "close")


def test_exported_protocol_matches_the_seed() -> None:
    for name in METHODS:
        ours = inspect.signature(getattr(AsyncPersistStore, name))
        seed = inspect.signature(getattr(SeedAsyncPersistStore, name))
        assert str(ours) == str(seed), name
        assert inspect.iscoroutinefunction(getattr(RemotePersistStore, name)), name
        impl = inspect.signature(getattr(RemotePersistStore, name))
        assert list(impl.parameters) == list(seed.parameters), name
        for param in seed.parameters.values():
            assert impl.parameters[param.name].default == param.default, (name, param.name)


async def test_isinstance_holds(gw: GatewayClient) -> None:
    store = gw.persist_store(namespace="durability")
    assert isinstance(store, AsyncPersistStore)
    assert isinstance(store, SeedAsyncPersistStore)


async def test_save_load_delete(gw: GatewayClient) -> None:
    store = gw.persist_store()
    thread = {"thread_id": "abc123", "status": "running", "tags": ["x"], "n": 2**65, "none": None}
    await store.save("thread:abc123", thread)
    assert await store.load("thread:abc123") == thread
    await store.save("thread:abc123", {"status": "done"})
    assert await store.load("thread:abc123") == {"status": "done"}
    assert await store.load("thread:missing") is None
    await store.delete("thread:abc123")
    assert await store.load("thread:abc123") is None
    await store.delete("thread:abc123")  # missing: a no-op


async def test_namespace_is_a_kv_collection(gw: GatewayClient) -> None:
    store = gw.persist_store(namespace="durability")
    await store.save("thread:1", {"a": 1})
    assert await gw.kv.get("durability", "thread:1") == {"a": 1}
    await gw.kv.set("durability", "thread:0", "written through kv")
    assert await store.load("thread:0") == "written through kv"


async def test_list_keys_own_and_other_namespace(gw: GatewayClient) -> None:
    store = gw.persist_store(namespace="durability")
    other = gw.persist_store(namespace="context")
    for key in ["thread:b", "thread:a", "context:x y", "10", "9"]:
        await store.save(key, key)
    await other.save("ctx:1", 1)
    assert await store.list_keys() == ["10", "9", "context:x y", "thread:a", "thread:b"]
    assert await store.list_keys(None) == await store.list_keys()
    assert await store.list_keys("context") == ["ctx:1"]
    assert await other.list_keys() == ["ctx:1"]
    assert await store.list_keys("empty") == []


async def test_list_keys_spans_pages(gw: GatewayClient) -> None:
    store = gw.persist_store(namespace="many")
    keys = [f"k{i:04d}" for i in range(1100)]
    import asyncio

    sem = asyncio.Semaphore(16)

    async def save(key: str) -> None:
        async with sem:
            await store.save(key, None)

    await asyncio.gather(*(save(k) for k in keys))
    assert await store.list_keys() == keys


async def test_default_namespace(gw: GatewayClient) -> None:
    store = gw.persist_store()
    await store.save("k", "v")
    assert await gw.kv.get("default", "k") == "v"


async def test_close_twice_and_use_after_close(gw: GatewayClient) -> None:
    store = gw.persist_store()
    await store.close()
    await store.close()
    with pytest.raises(ClientClosed):
        await store.load("k")
    # the shared client is still usable: the store did not own it
    await gw.kv.set("c", "k", 1)


async def test_create_persist_store_owns_its_client(
    server: Server, namespace: str, api_key: str | None, client_transport: str
) -> None:
    store = create_persist_store(base_url=server.url, namespace="durability", gateway_namespace=namespace,
                                 api_key=api_key, transport=client_transport)
    assert isinstance(store, AsyncPersistStore)
    async with store:
        await store.save("thread:1", {"ok": True})
        assert await store.load("thread:1") == {"ok": True}
        assert await store.list_keys() == ["thread:1"]
    await store.close()  # a second close is fine
    with pytest.raises(ClientClosed):
        await store.save("thread:2", {})
    async with GatewayClient(server.url, namespace=namespace, api_key=api_key, transport=client_transport) as gw:
        assert await gw.kv.get("durability", "thread:1") == {"ok": True}


async def test_isolated_between_gateway_namespaces(
    server: Server, namespace: str, api_key: str | None, client_transport: str
) -> None:
    options = {"base_url": server.url, "api_key": api_key, "transport": client_transport}
    a = create_persist_store(gateway_namespace=namespace, **options)
    b = create_persist_store(gateway_namespace=namespace + "b", **options)
    try:
        await a.save("k", "a")
        await b.save("k", "b")
        assert (await a.load("k"), await b.load("k")) == ("a", "b")
        await b.delete("k")
        assert await a.load("k") == "a" and await a.list_keys() == ["k"] and await b.list_keys() == []
    finally:
        await a.close()
        await b.close()


async def test_invalid_store_namespace_is_an_error(gw: GatewayClient) -> None:
    from storage_gateway_client import InvalidRequest

    store = gw.persist_store(namespace="not valid!")
    with pytest.raises(InvalidRequest) as info:
        await store.save("k", 1)
    assert info.value.status_code == 422 and "collection" in str(info.value)


async def test_idempotent_calls_retry_on_503_and_connection_errors() -> None:
    """The store's calls go through the client's retrying transport (no server needed)."""
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("refused", request=request)
        if calls["n"] == 2:
            return httpx.Response(503, headers={"Retry-After": "0"},
                                  json={"status": 503, "code": "database_unavailable", "title": "x"})
        return httpx.Response(200, content=b'{"v":1}', headers={"ETag": '"1"'})

    store = create_persist_store(base_url="http://gateway.test", gateway_namespace="ns",
                                 transport=httpx.MockTransport(handler))
    try:
        assert await store.load("k") == {"v": 1}
        assert calls["n"] == 3
    finally:
        await store.close()
