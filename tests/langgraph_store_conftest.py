"""The conftest that rebinds LangGraph's own store tests to a live gateway.

``tests/test_store_upstream.py`` copies this file as ``conftest.py`` next to the test files it
takes from the sdists of ``langgraph-checkpoint-sqlite``, ``langgraph-checkpoint`` and
``langgraph-sdk``, and runs them in a pytest of their own against the gateway named by
``GATEWAY_STORE_TEST_URL`` (key: ``GATEWAY_STORE_TEST_KEY``). The files are not edited: the store
classes they import are replaced here, before they are imported, by classes whose instances are
``GatewayStore``s, each in a fresh gateway namespace:

- ``InMemoryStore(index=..., ttl=...)`` and ``SqliteStore.from_conn_string(...)`` (sync, and used
  from any thread): a ``GatewayStore`` running on an event loop of its own in a thread, each call
  submitted to it (as LangGraph's own sync wrappers do). ``SqliteIndexConfig``'s ``text_fields``
  are the fields embedded, and a SQLite store's TTL config means what it means to SqliteStore:
  without ``refresh_on_read`` reads do not refresh TTLs (LangGraph documents ``True`` as the
  default, which GatewayStore, InMemoryStore and AsyncPostgresStore follow).
- ``AsyncSqliteStore.from_conn_string(...)``: a ``GatewayStore`` on the test's own event loop.
- the SDK's integration fixtures ``async_threads`` / ``sync_threads``: httpx clients on the
  gateway's LangGraph Platform API (``/v1/{namespace}/store/langgraph``), the key as ``x-api-key``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import pytest
from langgraph.store.base import BaseStore

from storage_gateway_client import GatewayClient, GatewayStore

URL = os.environ["GATEWAY_STORE_TEST_URL"]
KEY = os.environ["GATEWAY_STORE_TEST_KEY"]
PREFIX = os.environ.get("GATEWAY_STORE_TEST_NAMESPACE", "upstream")

LOOP = asyncio.new_event_loop()
threading.Thread(target=LOOP.run_forever, name="gateway-store-loop", daemon=True).start()
_CLIENTS: list[GatewayClient] = []


def _on_loop(coroutine: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coroutine, LOOP).result()


def _index(index: Any) -> Any:
    if index and "text_fields" in index and not index.get("fields"):
        return {**index, "fields": index["text_fields"]}
    return index


async def _new_store(index: Any, ttl: Any) -> GatewayStore:
    client = GatewayClient(URL, f"{PREFIX}-{uuid.uuid4().hex[:12]}", KEY)
    _CLIENTS.append(client)
    return client.store(index=_index(index), ttl=ttl)


class BridgedStore(BaseStore):
    """A ``GatewayStore`` on ``LOOP``, usable from any thread and any other event loop."""

    supports_ttl = True

    def __init__(self, *, index: Any = None, ttl: Any = None, **_: Any) -> None:
        self.inner: GatewayStore = _on_loop(_new_store(index, ttl))
        self.index_config = self.inner.index_config
        self.embeddings = self.inner.embeddings
        self.ttl_config = self.inner.ttl_config

    async def _bridge(self, coroutine: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, LOOP))

    def batch(self, ops: Any) -> Any:
        return self.inner.batch(ops)

    async def abatch(self, ops: Any) -> Any:
        return await self._bridge(self.inner.abatch(ops))

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.get(*args, **kwargs)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.put(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.delete(*args, **kwargs)

    def search(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.search(*args, **kwargs)

    def list_namespaces(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.list_namespaces(*args, **kwargs)

    async def aget(self, *args: Any, **kwargs: Any) -> Any:
        return await self._bridge(self.inner.aget(*args, **kwargs))

    async def aput(self, *args: Any, **kwargs: Any) -> Any:
        return await self._bridge(self.inner.aput(*args, **kwargs))

    async def adelete(self, *args: Any, **kwargs: Any) -> Any:
        return await self._bridge(self.inner.adelete(*args, **kwargs))

    async def asearch(self, *args: Any, **kwargs: Any) -> Any:
        return await self._bridge(self.inner.asearch(*args, **kwargs))

    async def alist_namespaces(self, *args: Any, **kwargs: Any) -> Any:
        return await self._bridge(self.inner.alist_namespaces(*args, **kwargs))

    def setup(self) -> None:
        pass

    def sweep_ttl(self) -> int:
        return int(_on_loop(self.inner.sweep_ttl()))

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> Any:
        return _on_loop(self.inner.start_ttl_sweeper(sweep_interval_minutes))

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        return bool(_on_loop(self.inner.stop_ttl_sweeper(timeout)))


class GatewayInMemoryStore(BridgedStore):
    """What the tests' ``InMemoryStore(...)`` makes."""


def _sqlite_ttl(ttl: Any) -> Any:
    return {"refresh_on_read": False, **ttl} if ttl else ttl


class GatewaySqliteStore(BridgedStore):
    """What the tests' ``SqliteStore.from_conn_string(...)`` yields."""

    @classmethod
    @contextmanager
    def from_conn_string(cls, conn_string: str, *, index: Any = None, ttl: Any = None, **_: Any) -> Iterator[GatewaySqliteStore]:
        yield cls(index=index, ttl=_sqlite_ttl(ttl))


class GatewayAsyncSqliteStore:
    """What the tests' ``AsyncSqliteStore.from_conn_string(...)`` yields: a ``GatewayStore`` on
    the test's event loop."""

    @staticmethod
    @asynccontextmanager
    async def from_conn_string(conn_string: str, *, index: Any = None, ttl: Any = None, **_: Any) -> AsyncIterator[GatewayStore]:
        async with GatewayClient(URL, f"{PREFIX}-{uuid.uuid4().hex[:12]}", KEY) as gw:
            yield gw.store(index=_index(index), ttl=_sqlite_ttl(ttl))


def _rebind() -> None:
    import langgraph.store.memory as memory
    import langgraph.store.sqlite as sqlite
    import langgraph.store.sqlite.aio as sqlite_aio

    memory.InMemoryStore = GatewayInMemoryStore  # type: ignore[misc,assignment]
    sqlite.SqliteStore = GatewaySqliteStore  # type: ignore[misc,assignment]
    sqlite.AsyncSqliteStore = GatewayAsyncSqliteStore  # type: ignore[misc,assignment]
    sqlite_aio.AsyncSqliteStore = GatewayAsyncSqliteStore  # type: ignore[misc,assignment]


_rebind()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "flaky(retries): upstream's mark (no plugin here: tests run once)")
    config.addinivalue_line("markers", "integration: the SDK's integration tests")


# SqliteStore's suites run most tests twice, on an in-memory database and on a file: on the
# gateway both are the same store, so the second run is left out.
_SQLITE_FILES = ("store", "conn_type", "conn_string")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        (drop if any(params.get(name) == "file" for name in _SQLITE_FILES) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_sessionfinish(session: pytest.Session) -> None:
    async def close() -> None:
        for client in _CLIENTS:
            await client.close()

    _on_loop(close())


def _platform(client_type: type[Any]) -> Any:
    return client_type(
        base_url=f"{URL}/v1/{PREFIX}-sdk-{uuid.uuid4().hex[:8]}/store/langgraph", headers={"x-api-key": KEY}, timeout=30.0
    )


@pytest.fixture
async def async_threads() -> AsyncIterator[tuple[object, httpx.AsyncClient]]:
    raw = _platform(httpx.AsyncClient)
    try:
        yield None, raw
    finally:
        await raw.aclose()


@pytest.fixture
def sync_threads() -> Iterator[tuple[object, httpx.Client]]:
    raw = _platform(httpx.Client)
    try:
        yield None, raw
    finally:
        raw.close()
