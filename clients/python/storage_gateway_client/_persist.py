"""The seed's AsyncPersistStore, implemented on a kv collection of the gateway namespace."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


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

    Filled in by the records/kv work.
    """

    def __init__(self, kv: Any, namespace: str = "default", *, owner: Any | None = None) -> None:
        self._kv = kv
        self._namespace = namespace
        self._owner = owner  # a GatewayClient this store created and must close
