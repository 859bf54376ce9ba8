"""The seed's VectorStoreProtocol, implemented on one vector collection of the gateway."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel


class VectorRecord(BaseModel):
    """A stored vector's id, similarity score (None outside search) and payload."""

    id: str
    score: float | None = None
    payload: dict[str, Any] = {}


@runtime_checkable
class VectorStoreProtocol(Protocol):
    """Async vector database abstraction (seed: soothe_sdk.protocols.vector_store)."""

    async def create_collection(self, vector_size: int, distance: str = "cosine") -> None: ...

    async def insert(
        self,
        vectors: list[list[float]],
        payloads: list[dict[str, Any]] | None = None,
        ids: list[str] | None = None,
    ) -> None: ...

    async def search(
        self,
        query: str,
        vector: list[float],
        limit: int = 5,
        filters: dict[str, Any] | None = None,
    ) -> list[VectorRecord]: ...

    async def delete(self, record_id: str) -> None: ...

    async def update(
        self,
        record_id: str,
        vector: list[float] | None = None,
        payload: dict[str, Any] | None = None,
    ) -> None: ...

    async def get(self, record_id: str) -> VectorRecord | None: ...

    async def list_records(
        self,
        filters: dict[str, Any] | None = None,
        limit: int | None = None,
    ) -> list[VectorRecord]: ...

    async def delete_collection(self) -> None: ...

    async def reset(self) -> None: ...

    async def close(self) -> None: ...


class RemoteVectorStore:
    """VectorStoreProtocol over HTTP, bound to one collection. Filled in by the vectors work."""

    def __init__(self, vectors: Any, collection: str, *, owner: Any | None = None) -> None:
        self._vectors = vectors
        self._collection = collection
        self._owner = owner  # a GatewayClient this store created and must close
