"""What the service needs from a vector backend, and the values passed across that line.

``VectorIndex`` has one PostgreSQL/pgvector and one SQLite/sqlite-vec implementation; the
capability's lifespan picks one from the vectors database's dialect, once. Every method takes the
request's session and the collection's registry row; data tables are named from the row's
integer id only (``vec_<id>``, ``fts_<id>``).
"""

from __future__ import annotations

import builtins
from array import array
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from app.vectors.filters import Node
from app.vectors.planner import Plan
from app.vectors.payload_index import PayloadIndex, PayloadKind, declared_kinds, from_options

Distance = Literal["cosine", "l2", "ip"]
IndexKind = Literal["hnsw", "hnsw_halfvec", "exact"]
IndexState = Literal["pending", "building", "ready", "exact"]


@dataclass(frozen=True)
class CollectionInfo:
    """A collection's registry row."""

    id: int
    namespace: str
    collection: str
    vector_size: int
    distance: Distance
    index: dict[str, Any]
    text_field: str | None
    created_at: datetime

    @property
    def data_table(self) -> str:
        return f"vec_{int(self.id)}"

    @property
    def text_table(self) -> str:
        return f"fts_{int(self.id)}"

    @property
    def payload_indexes(self) -> tuple[PayloadIndex, ...]:
        return from_options(self.index)

    @property
    def declared(self) -> dict[str, PayloadKind]:
        """Declared payload fields by name, with their kind."""
        return declared_kinds(self.payload_indexes)


@dataclass
class PointIn:
    """A checked point to store: float32 vector, payload as compact JSON, and its hybrid text."""

    id: str
    vector: array[float]
    payload_json: str
    text: str | None = None
    norm: float = 0.0


@dataclass
class PointOut:
    id: str
    payload_json: str
    vector: array[float] | None = None


@dataclass
class Hit:
    """A search candidate: raw distance (lower is nearer; ``-ip`` for inner product)."""

    id: str
    distance: float
    payload_json: str
    extra: dict[str, Any] = field(default_factory=dict)


class MissingTable(Exception):
    """A collection's data table is gone: the registry row this process cached is stale (the
    collection was dropped, or dropped and re-created, by another process)."""


class RegistryCache:
    """Registry rows by (namespace, collection), per process, for the search hot path.

    A row never changes while its collection exists (settings are fixed at creation; a new
    collection gets a new id and new tables), so a cached row is valid exactly as long as its
    data table exists: a backend raises ``MissingTable`` when it is gone, and the service then
    forgets the row and reads the registry again.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self.max_entries = max_entries
        self._rows: dict[tuple[str, str], CollectionInfo] = {}

    def get(self, namespace: str, collection: str) -> CollectionInfo | None:
        return self._rows.get((namespace, collection))

    def put(self, info: CollectionInfo) -> None:
        if len(self._rows) >= self.max_entries:
            self._rows.clear()
        self._rows[(info.namespace, info.collection)] = info

    def forget(self, namespace: str, collection: str) -> None:
        self._rows.pop((namespace, collection), None)


class VectorIndex(Protocol):
    """Storage and search of one backend."""

    name: str

    def index_kind(self, vector_size: int, requested: str) -> IndexKind:
        """The index a collection of this size gets here (``requested`` is ``hnsw`` or ``exact``)."""
        ...

    async def create(self, session: AsyncConnection, coll: CollectionInfo) -> None: ...

    async def drop(self, session: AsyncConnection, coll: CollectionInfo) -> None: ...

    async def reset(self, session: AsyncConnection, coll: CollectionInfo) -> None: ...

    async def index_states(self, session: AsyncConnection, colls: list[CollectionInfo]) -> dict[int, IndexState]:
        """Each collection's index state by id: ``exact`` (no ANN index by design), or for HNSW
        kinds ``pending`` (not built yet), ``building`` or ``ready``."""
        ...

    async def payload_index_states(
        self, session: AsyncConnection, colls: list[CollectionInfo]
    ) -> dict[int, list[IndexState]]:
        """By collection id, the state of each declared payload index in declaration order
        (``pending``, ``building`` or ``ready``)."""
        ...

    async def build_progress(self, session: AsyncConnection, coll: CollectionInfo) -> dict[str, Any] | None:
        """The running index build on the collection (phase, tuples and blocks done/total), or None."""
        ...

    async def count(self, session: AsyncConnection, coll: CollectionInfo, flt: Node | None = None) -> int: ...

    async def upsert(self, session: AsyncConnection, coll: CollectionInfo, points: list[PointIn]) -> None: ...

    async def get(
        self, session: AsyncConnection, coll: CollectionInfo, point_id: str, with_vector: bool
    ) -> PointOut | None: ...

    async def update(
        self,
        session: AsyncConnection,
        coll: CollectionInfo,
        point_id: str,
        vector: PointIn | None,
        payload_json: str | None,
        text: str | None,
    ) -> bool:
        """Replace the vector and/or payload of an existing point; False when it does not exist."""
        ...

    async def delete(
        self, session: AsyncConnection, coll: CollectionInfo, ids: list[str] | None, flt: Node | None
    ) -> int: ...

    async def list(
        self,
        session: AsyncConnection,
        coll: CollectionInfo,
        flt: Node | None,
        after: str | None,
        limit: int,
        with_vectors: bool,
    ) -> list[PointOut]: ...

    async def search(
        self,
        session: AsyncConnection,
        coll: CollectionInfo,
        vector: array[float],
        limit: int,
        flt: Node | None,
        ef_search: int | None,
    ) -> tuple[builtins.list[Hit], Plan]:
        """The ``min(limit, matches)`` nearest points that match ``flt``, nearest first, and the
        plan that found them (``ef_search`` None: chosen by the planner); ``MissingTable`` when
        the collection's table no longer exists."""
        ...

    async def text_search(
        self, session: AsyncConnection, coll: CollectionInfo, words: builtins.list[str], limit: int, flt: Node | None
    ) -> builtins.list[str]:
        """Ids of the best full-text matches of ``words`` (any of them), best first."""
        ...

    async def distances(
        self, session: AsyncConnection, coll: CollectionInfo, vector: array[float], ids: builtins.list[str]
    ) -> builtins.list[Hit]:
        """The distance of each stored point in ``ids`` to ``vector``."""
        ...
