"""The store capability: LangGraph long-term memory (``BaseStore``) in the vectors database.

Why the vectors database: an item and its vectors are written in one transaction, so they must
live in one database, and the vector search (sqlite-vec, pgvector) is there.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.capability import Capability, Periodic, in_batches
from app.core.config import Database
from app.core.state import GatewayState
from app.store.models import store_items
from app.store.platform import router as platform_router
from app.store.repository import StoreSql
from app.store.router import router
from app.store.samples import SAMPLES

router.include_router(platform_router)  # LangGraph Platform's API under /v1/{namespace}/store/langgraph
from app.store.service import StoreService

log = logging.getLogger("app.store")


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[StoreService]:
    """The store service for the vectors database's backend. On PostgreSQL vectors travel in
    pgvector's binary form, through the codec the vectors capability installs on the engine."""
    settings = state.settings
    sql: StoreSql
    if state.databases.dialect(Database.vectors) == "postgresql":
        from app.store.postgres import PostgresStoreSql

        sql = PostgresStoreSql(settings.store.ef_search)
    else:
        from app.store.sqlite import SqliteStoreSql

        sql = SqliteStoreSql()
    yield StoreService(sql, settings.limits, settings.store, state.databases.engine(Database.vectors))


def periodic(service: StoreService, state: GatewayState) -> Iterator[Periodic]:
    engine = state.databases.engine(Database.vectors)

    async def step(conn: AsyncConnection) -> int:
        deleted = await service.sweep(conn)
        if deleted:
            log.info("store sweep deleted %d expired items", deleted)
        return deleted

    async def sweep() -> None:
        """Delete expired items in bounded batches."""
        await in_batches(engine, step, service.settings.sweep_batch)

    yield Periodic("store-sweep", service.settings.sweep_interval_seconds, sweep)
    from app.store.postgres import PostgresStoreSql

    if isinstance(service.sql, PostgresStoreSql):
        from app.store.indexes import IndexBuilder

        builder = IndexBuilder(engine, service.sql, service.settings)
        yield Periodic("store-indexes", service.settings.index_sweep_seconds, builder.round, at_start=True)


CAPABILITY = Capability(
    name="store",
    router=router,
    database=Database.vectors,
    lifecycle=lifecycle,
    periodic=periodic,
    # store_vectors rows are keyed by an item's id, which only a scoped store_items row hands out
    tables=(store_items,),
    samples=SAMPLES,
    summary="LangGraph long-term memory: items under tuple namespaces with semantic search and TTL "
    "(the client's GatewayStore); LangGraph Platform's /store API under /v1/{namespace}/store/langgraph.",
)
