"""The vectors capability: collections of points, filtered and hybrid search (pgvector or sqlite-vec)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.core.capability import Capability
from app.core.config import Database
from app.core.state import GatewayState
from app.vectors.backend import RegistryCache, VectorIndex
from app.vectors.models import vector_collections, vector_idempotency
from app.vectors.router import router

if TYPE_CHECKING:
    from app.vectors.builder import IndexBuilder

log = logging.getLogger("app.vectors")


@dataclass(eq=False)
class Vectors:
    """What the vectors requests of one process share: the backend chosen from the vectors
    database's dialect, the collection registry cache, and (PostgreSQL) the HNSW builder.
    A request's ``VectorService`` binds these to its connection and namespace."""

    index: VectorIndex
    registry: RegistryCache
    builder: IndexBuilder | None


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[Vectors]:
    """Choose the vector backend once; on PostgreSQL, run the background HNSW builder
    (``app.vectors.builder``) for as long as the app runs."""
    databases = state.databases
    settings = state.settings
    if databases.dialect(Database.vectors) != "postgresql":
        from app.vectors.sqlite_vec import SqliteVecIndex

        yield Vectors(SqliteVecIndex(), RegistryCache(), None)
        return
    from app.vectors.pgvector import PgVectorIndex, detect_version, install_vector_codec

    engine = databases.engine(Database.vectors)
    async with engine.connect() as conn:
        version = await detect_version(conn)
    if version is None:
        log.warning("vectors database: the pgvector extension is not installed yet (run the migrations)")
    else:
        install_vector_codec(engine, settings.vectors.ef_search)
        await engine.dispose()  # connections opened before the codec existed are replaced
    index = PgVectorIndex(
        version or "0",
        exact_threshold=settings.vectors.exact_search_threshold,
        ef_search=settings.vectors.ef_search,
    )
    from app.vectors.builder import IndexBuilder

    builder = IndexBuilder(engine, settings.vectors)
    builder.start()
    try:
        yield Vectors(index, RegistryCache(), builder)
    finally:
        await builder.stop()


CAPABILITY = Capability(
    name="vectors",
    router=router,
    database=Database.vectors,
    lifecycle=lifecycle,
    # each collection's points live in a table of its own, named from its registry id, which
    # only a scoped vector_collections row hands out
    tables=(vector_collections, vector_idempotency),
    summary="Collections of vectors with JSON payloads: filtered, hybrid and batched search.",
)
