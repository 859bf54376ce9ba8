"""The seed's AsyncPersistStore, implemented on a kv collection of the gateway namespace."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import httpx

from ._exceptions import ClientClosed

if TYPE_CHECKING:
    from ._client import GatewayClient
    from ._kv import KeyValueAPI
    from ._transport import TransportChoice, Verify


@runtime_checkable
class AsyncPersistStore(Protocol):
    """Async key-value persistence (seed: soothe_sdk.protocols.persistence)."""

    async def save(self, key: str, data: Any) -> None: ...

    async def load(self, key: str) -> Any | None: ...

    async def delete(self, key: str) -> None: ...

    async def list_keys(self, namespace: str | None = None) -> list[str]: ...

    async def close(self) -> None: ...


class RemotePersistStore:
    """AsyncPersistStore over HTTP: ``namespace`` is a kv collection inside the gateway namespace.

    ``load`` of a missing key gives ``None``; ``delete`` of a missing key does nothing;
    ``list_keys(other)`` lists the kv collection ``other``. ``close()`` is safe to call twice and
    closes the ``GatewayClient`` only when this store created it (``create_persist_store``).
    """

    def __init__(self, kv: KeyValueAPI, namespace: str = "default", *, owner: GatewayClient | None = None) -> None:
        self._kv = kv
        self._namespace = namespace
        self._owner = owner  # a GatewayClient this store created and must close
        self._closed = False

    @property
    def namespace(self) -> str:
        return self._namespace

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("this persist store is closed")

    async def save(self, key: str, data: Any) -> None:
        """Persist JSON-serialisable ``data`` under ``key``."""
        self._check_open()
        await self._kv.set(self._namespace, key, data)

    async def load(self, key: str) -> Any | None:
        """The data saved under ``key``, or ``None``."""
        self._check_open()
        return await self._kv.get(self._namespace, key)

    async def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is a no-op."""
        self._check_open()
        await self._kv.delete(self._namespace, key)

    async def list_keys(self, namespace: str | None = None) -> list[str]:
        """Every key of this store's namespace (or of ``namespace``), in key order."""
        self._check_open()
        return await self._kv.keys(namespace if namespace is not None else self._namespace)

    async def close(self) -> None:
        """Release resources; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._owner is not None:
            await self._owner.close()

    async def __aenter__(self) -> RemotePersistStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def create_persist_store(
    *,
    base_url: str,
    gateway_namespace: str,
    namespace: str = "default",
    api_key: str | None = None,
    timeout: float | httpx.Timeout | None = None,
    retries: int = 4,
    transport: TransportChoice = None,
    verify: Verify = True,
) -> RemotePersistStore:
    """An AsyncPersistStore on the kv collection ``namespace`` of ``gateway_namespace`` at
    ``base_url``, with its own pooled client that ``close()`` releases (the seed's factory);
    ``transport`` and ``verify`` as ``GatewayClient`` takes them."""
    from ._client import DEFAULT_TIMEOUT, GatewayClient

    client = GatewayClient(
        base_url, namespace=gateway_namespace, api_key=api_key,
        timeout=timeout if timeout is not None else DEFAULT_TIMEOUT, retries=retries,
        transport=transport, verify=verify,
    )
    return RemotePersistStore(client.kv, namespace, owner=client)
