"""``GatewayClient``: one lazily opened, pooled HTTP connection set per gateway and namespace."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from types import TracebackType
from urllib.parse import quote
from typing import TYPE_CHECKING, Any

import httpx

from . import _namespaces
from ._files import FilesAPI, UploadSource
from ._kv import KeyValueAPI
from ._persist import RemotePersistStore
from ._records import RecordsAPI
from ._transport import RetryPolicy, Transport, TransportChoice, Verify
from ._vector_store import RemoteVectorStore
from ._vectors import VectorsAPI

if TYPE_CHECKING:
    from langgraph.store.base import IndexConfig, TTLConfig

    from ._checkpoints import GatewayCheckpointSaver
    from ._store import GatewayStore

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


class GatewayClient:
    """Async client for one namespace of a storage-gateway.

    ``records``, ``kv``, ``files`` and ``vectors`` follow the seed's RecordStore, KeyValueStore,
    FileStore and VectorStore; ``persist_store()`` and ``vector_store()`` give the seed's
    AsyncPersistStore and VectorStoreProtocol. Connections open on first use; ``close()`` (or
    leaving ``async with``) releases them and is safe to call twice.

    ``transport``: ``None`` (the default) picks the client's lean HTTP/1.1 transport for a plain
    ``http://`` gateway and httpx's default transport for ``https://`` or when the environment
    names an HTTP proxy; ``"http11"`` forces the former (``http://`` only), ``"httpx"`` the latter;
    an ``httpx.AsyncBaseTransport`` instance is used as given. ``verify``: how an ``https://``
    gateway's certificate is checked: ``True`` (the system's CA certificates), the path of a CA
    bundle (PEM), an ``ssl.SSLContext``, or ``False`` (no check); not with ``http_client`` or a
    transport instance (they bring their own).
    """

    def __init__(
        self,
        base_url: str,
        namespace: str,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retries: int = 4,
        http_client: httpx.AsyncClient | None = None,
        transport: TransportChoice = None,
        verify: Verify = True,
    ) -> None:
        headers = {"User-Agent": "storage-gateway-client/0.1"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.base_url = base_url
        self.namespace = namespace
        # What a sibling client for another event loop is made with (``sibling``).
        self._options: dict[str, Any] = {
            "api_key": api_key, "timeout": timeout, "retries": retries, "verify": verify,
            "transport": transport if isinstance(transport, str) else None,
        }
        self._transport = Transport(
            base_url,
            headers=headers,
            timeout=timeout,
            retry=RetryPolicy(attempts=retries),
            http_client=http_client,
            transport=transport,
            verify=verify,
        )
        self.records = RecordsAPI(self._transport, namespace)
        self.kv = KeyValueAPI(self._transport, namespace)
        self.files = FilesAPI(self._transport, namespace)
        self.vectors = VectorsAPI(self._transport, namespace)

    def sibling(self) -> GatewayClient:
        """A new client for the same gateway and namespace with the same key, timeout, retries,
        transport choice and ``verify``, with connections of its own: for use on another event
        loop, since connections belong to the loop that opened them. (A ``http_client`` or
        transport instance given to this client is not shared: the sibling makes its own.)"""
        return GatewayClient(self.base_url, self.namespace, **self._options)

    def persist_store(self, namespace: str = "default") -> RemotePersistStore:
        """The seed's AsyncPersistStore on the kv collection ``namespace`` of this gateway namespace."""
        return RemotePersistStore(self.kv, namespace)

    def vector_store(self, collection: str) -> RemoteVectorStore:
        """The seed's VectorStoreProtocol bound to one vector collection."""
        return RemoteVectorStore(self.vectors, collection)

    def checkpointer(self, *, serde: Any = None) -> GatewayCheckpointSaver:
        """A LangGraph checkpointer (``BaseCheckpointSaver``) storing graph state in this namespace
        (needs the ``langgraph`` extra); ``serde`` defaults to LangGraph's own serializer."""
        from ._checkpoints import GatewayCheckpointSaver

        return GatewayCheckpointSaver(self, serde=serde)

    def store(self, *, index: IndexConfig | None = None, ttl: TTLConfig | None = None) -> GatewayStore:
        """LangGraph's long-term memory (a ``BaseStore``) in this namespace (needs the ``langgraph``
        extra): ``index`` is LangGraph's ``IndexConfig`` (embeddings are computed here), ``ttl``
        its ``TTLConfig``."""
        from ._store import GatewayStore

        return GatewayStore(self, index=index, ttl=ttl)

    async def close(self) -> None:
        """Release pooled connections; calling it again does nothing."""
        await self._transport.close()

    aclose = close

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def usage(self) -> dict[str, Any]:
        """``GET /v1/{namespace}/usage``: by capability, the items and bytes this namespace stores
        and its quotas (``max_items``, ``max_bytes``; None: none). Any key of the namespace may."""
        response = await self._transport.request("GET", f"/v1/{quote(self.namespace, safe='')}/usage")
        usage: dict[str, Any] = response.json()["capabilities"]
        return usage
    # --- the namespace as a whole (admin key or namespace:admin) ------------------------

    async def export_namespace(
        self, destination: str | os.PathLike[str], *, namespace: str | None = None
    ) -> int:
        """Write the namespace's archive (``GET /v1/{namespace}/export``) to ``destination``,
        streamed and atomically; the bytes written."""
        return await _namespaces.export_to(self._transport, namespace or self.namespace, destination)

    def iter_export(self, *, namespace: str | None = None) -> AsyncIterator[bytes]:
        """The namespace's archive in pieces, as the gateway streams it."""
        return _namespaces.iter_export(self._transport, namespace or self.namespace)

    async def import_namespace(self, source: UploadSource, *, namespace: str | None = None) -> dict[str, Any]:
        """Load an archive (bytes, a path or an async iterator of bytes, streamed) into the
        namespace, which must be empty (409 otherwise); what was loaded, by capability."""
        return await _namespaces.import_from(self._transport, namespace or self.namespace, source)

    async def delete_namespace(self, *, namespace: str | None = None, wait: float = 10) -> dict[str, Any]:
        """Delete every capability's data of the namespace (``DELETE /v1/{namespace}``, in
        bounded batches, again until done); what was deleted, by capability and table."""
        return await _namespaces.delete(self._transport, namespace or self.namespace, wait)

    async def health(self) -> dict[str, Any]:
        """``/readyz`` as a dict (does not raise on 503)."""
        response = await self._transport.request("GET", "/readyz", ok=(503,))
        readiness: dict[str, Any] = response.json()
        return readiness
