"""The seed's VectorStoreProtocol, implemented on one vector collection of the gateway."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field


class VectorRecord(BaseModel):
    """A stored vector's id, similarity score (None outside search) and payload."""

    id: str
    score: float | None = None
    payload: dict[str, Any] = Field(default_factory=dict)


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
    """VectorStoreProtocol over HTTP, bound to one collection of a gateway namespace.

    ``search`` passes ``query`` on, so a collection created with a text field gets hybrid
    ranking. ``get`` of a missing id returns None and ``delete`` of one does nothing, as in the
    seed; ``update`` of a missing id raises ``NotFound``. ``close()`` closes the client only when
    this store created it (``create_vector_store``), and is safe to call twice.
    """

    def __init__(self, vectors: Any, collection: str, *, owner: Any | None = None) -> None:
        self._vectors = vectors
        self._collection = collection
        self._owner = owner  # a GatewayClient this store created and must close

    @property
    def collection(self) -> str:
        return self._collection

    async def create_collection(self, vector_size: int, distance: str = "cosine") -> None:
        await self._vectors.create_collection(self._collection, vector_size, distance)

    async def insert(
        self,
        vectors: list[list[float]],
        payloads: list[dict[str, Any]] | None = None,
        ids: list[str] | None = None,
    ) -> None:
        await self._vectors.upsert_points(self._collection, vectors, payloads, ids)

    async def search(
        self,
        query: str,
        vector: list[float],
        limit: int = 5,
        filters: dict[str, Any] | None = None,
    ) -> list[VectorRecord]:
        hits = await self._vectors.search(
            self._collection, vector, limit, query=query or None, filters=filters or None
        )
        return [VectorRecord(id=h["id"], score=h["score"], payload=h["payload"]) for h in hits]

    async def delete(self, record_id: str) -> None:
        await self._vectors.delete_point(self._collection, record_id)

    async def update(
        self,
        record_id: str,
        vector: list[float] | None = None,
        payload: dict[str, Any] | None = None,
    ) -> None:
        await self._vectors.update_point(self._collection, record_id, vector, payload)

    async def get(self, record_id: str) -> VectorRecord | None:
        point = await self._vectors.get_point(self._collection, record_id, with_vector=False)
        if point is None:
            return None
        return VectorRecord(id=point["id"], score=None, payload=point.get("payload") or {})

    async def list_records(
        self,
        filters: dict[str, Any] | None = None,
        limit: int | None = None,
    ) -> list[VectorRecord]:
        out: list[VectorRecord] = []
        async for item in self._vectors.iter_points(
            self._collection, filters or None, page_size=min(limit, 1000) if limit else None
        ):
            out.append(VectorRecord(id=item["id"], score=None, payload=item.get("payload") or {}))
            if limit is not None and len(out) >= limit:
                break
        return out

    async def delete_collection(self) -> None:
        await self._vectors.drop_collection(self._collection)

    async def reset(self) -> None:
        await self._vectors.reset_collection(self._collection)

    async def close(self) -> None:
        if self._owner is not None:
            owner, self._owner = self._owner, None
            await owner.close()


def create_vector_store(collection: str, config: Mapping[str, Any] | None = None) -> RemoteVectorStore:
    """The seed's factory: a VectorStoreProtocol on ``collection`` of a gateway namespace.

    ``config``: ``base_url`` (or ``url``), ``namespace``, optional ``api_key``, ``timeout``,
    ``retries``, ``transport`` and ``verify`` (as ``GatewayClient`` takes them).
    The store owns the client it creates; ``close()`` releases it.
    """
    from ._client import GatewayClient

    config = dict(config or {})
    base_url = config.pop("base_url", None) or config.pop("url", None)
    namespace = config.pop("namespace", None)
    if not base_url or not namespace:
        raise ValueError("create_vector_store: config needs 'base_url' and 'namespace'")
    options: dict[str, Any] = {}
    for name in ("api_key", "timeout", "retries", "transport", "verify"):
        if name in config:
            options[name] = config.pop(name)
    if config:
        raise ValueError(f"create_vector_store: unknown config keys {sorted(config)}")
    client = GatewayClient(base_url, namespace=namespace, **options)
    return RemoteVectorStore(client.vectors, collection, owner=client)
