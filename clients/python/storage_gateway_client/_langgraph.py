"""Factories for a LangGraph server's ``langgraph.json``: keep its store and checkpoints in a gateway.

.. code-block:: json

    {"store": {"path": "./gateway.py:make_store"}, "checkpointer": {"path": "./gateway.py:make_checkpointer"}}

with ``gateway.py`` holding ``from storage_gateway_client import make_store, make_checkpointer``.
Each is an async context manager (it closes its client on exit). Settings come from the arguments
or the environment: ``STORAGE_GATEWAY_URL``, ``STORAGE_GATEWAY_NAMESPACE``,
``STORAGE_GATEWAY_API_KEY``; for the store's semantic search ``STORAGE_GATEWAY_STORE_EMBED`` (a
LangChain provider string, ``openai:text-embedding-3-small``), ``STORAGE_GATEWAY_STORE_DIMS`` and
``STORAGE_GATEWAY_STORE_FIELDS`` (comma-separated paths; default ``$``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from ._client import GatewayClient

if TYPE_CHECKING:
    from langgraph.store.base import IndexConfig, TTLConfig

    from ._checkpoints import GatewayCheckpointSaver
    from ._store import GatewayStore


def _client(url: str | None, namespace: str | None, api_key: str | None) -> GatewayClient:
    url = url or os.environ.get("STORAGE_GATEWAY_URL")
    namespace = namespace or os.environ.get("STORAGE_GATEWAY_NAMESPACE")
    if not url or not namespace:
        raise ValueError("give url and namespace, or set STORAGE_GATEWAY_URL and STORAGE_GATEWAY_NAMESPACE")
    return GatewayClient(url, namespace, api_key or os.environ.get("STORAGE_GATEWAY_API_KEY"))


def _index_from_env() -> IndexConfig | None:
    embed = os.environ.get("STORAGE_GATEWAY_STORE_EMBED")
    if not embed:
        return None
    index: dict[str, Any] = {"embed": embed, "dims": int(os.environ["STORAGE_GATEWAY_STORE_DIMS"])}
    fields = os.environ.get("STORAGE_GATEWAY_STORE_FIELDS")
    if fields:
        index["fields"] = [f.strip() for f in fields.split(",") if f.strip()]
    return index  # type: ignore[return-value]


@asynccontextmanager
async def make_store(
    url: str | None = None, namespace: str | None = None, api_key: str | None = None, *,
    index: IndexConfig | None = None, ttl: TTLConfig | None = None,
) -> AsyncIterator[GatewayStore]:
    """A ``GatewayStore`` for ``langgraph.json``'s ``store``."""
    async with _client(url, namespace, api_key) as gw:
        yield gw.store(index=index if index is not None else _index_from_env(), ttl=ttl)


@asynccontextmanager
async def make_checkpointer(
    url: str | None = None, namespace: str | None = None, api_key: str | None = None,
) -> AsyncIterator[GatewayCheckpointSaver]:
    """A ``GatewayCheckpointSaver`` for ``langgraph.json``'s ``checkpointer``."""
    async with _client(url, namespace, api_key) as gw:
        yield gw.checkpointer()
