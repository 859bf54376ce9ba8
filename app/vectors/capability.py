"""The vectors capability: collections of points, filtered and hybrid search (pgvector or sqlite-vec)."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.capability import Capability, Change
from app.core.config import Database
from app.fairness.fairshare import HeavyWrites
from app.core.namespace_data import Deleted, NamespaceData, delete_rows, writer
from app.core.state import GatewayState
from app.quotas.tables import Kept
from app.vectors.backend import RegistryCache
from app.vectors.usage import recount
from app.vectors.models import vector_collections, vector_idempotency
from app.vectors.router import router
from app.vectors.samples import SAMPLES
from app.vectors.service import VectorService

log = logging.getLogger("app.vectors")


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[VectorService]:
    """The vectors service for the process: the backend chosen once from the vectors database's
    dialect, the registry cache and, on PostgreSQL, the background HNSW builder
    (``app.vectors.builder``), run for as long as the app runs."""
    databases = state.databases
    settings = state.settings
    heavy = HeavyWrites(
        databases.engine(Database.vectors), databases.write_queues.get(Database.vectors), settings.fairness, Database.vectors.value
    )
    if databases.dialect(Database.vectors) != "postgresql":
        from app.vectors.sqlite_vec import SqliteVecIndex

        yield VectorService(SqliteVecIndex(), settings, RegistryCache(), heavy=heavy)
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
        calibrated=settings.vectors.target_recall > 0,
    )
    from app.vectors.builder import IndexBuilder

    builder = IndexBuilder(engine, settings.vectors, index.forget)
    builder.start()
    try:
        yield VectorService(index, settings, RegistryCache(), builder, heavy)
    finally:
        await builder.stop()


class VectorsData(NamespaceData[VectorService]):
    """A namespace's collections, each with the tables and indexes of its points (dropped as a
    DELETE of the collection drops them, one collection a transaction), and its
    Idempotency-Key answers."""

    async def delete(
        self, service: VectorService, engine: AsyncEngine, namespace: str, batch: int
    ) -> AsyncGenerator[Deleted, None]:
        first = (
            select(vector_collections.c.collection)
            .where(vector_collections.c.namespace == namespace).order_by(vector_collections.c.collection).limit(1)
        )
        while True:
            async with writer(engine).begin() as conn:
                name = (await conn.execute(first)).scalar_one_or_none()
                info = await service.find(conn, namespace, name, lock=True) if name is not None else None
                points = await service.index.count(conn, info) if info is not None else 0
                if name is not None:
                    await service.drop(conn, namespace, name)
            if name is None:
                break
            yield {"collections": 1, "points": points}
        async for deleted in delete_rows(engine, vector_idempotency, namespace, batch):
            yield deleted


CAPABILITY = Capability(
    name="vectors",
    router=router,
    database=Database.vectors,
    lifecycle=lifecycle,
    # each collection's points live in a table of its own, named from its registry id, which
    # only a scoped vector_collections row hands out
    tables=(vector_collections, vector_idempotency),
    usage=(Kept(recount),),  # points and their bytes, kept by the service (no namespace column to trigger on)
    summary="Collections of vectors with JSON payloads: filtered, hybrid and batched search.",
    samples=SAMPLES,
    data=VectorsData(),
    changes=(
        Change("collection_create", ("PUT /{collection}",)),
        Change("collection_drop", ("DELETE /{collection}",)),
        Change("points_upsert", ("POST /{collection}/points", "PATCH /{collection}/points/{point_id}")),
        Change("points_delete", (
            "POST /{collection}/points/delete", "DELETE /{collection}/points/{point_id}", "POST /{collection}/reset",
        )),
    ),
)
