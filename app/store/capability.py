"""The store capability: LangGraph long-term memory (``BaseStore``) in the vectors database.

Why the vectors database: an item and its vectors are written in one transaction, so they must
live in one database, and the vector search (sqlite-vec, pgvector) is there.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.capability import Capability, Change, Periodic, expiry_sweep
from app.core.config import Database
from app.core.namespace_data import Deleted, NamespaceData, writer
from app.core.state import GatewayState
from app.quotas.tables import Counted
from app.store.models import store_items, store_vectors
from app.store import platform  # noqa: F401 - LangGraph Platform's routes, on the store router
from app.store.repository import StoreSql
from app.store.router import router
from app.store.samples import SAMPLES
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
    yield expiry_sweep(
        "store-sweep", engine, service.sweep, service.settings.sweep_batch,
        service.settings.sweep_interval_seconds, log, "items",
    )
    from app.store.postgres import PostgresStoreSql

    if isinstance(service.sql, PostgresStoreSql):
        from app.store.indexes import IndexBuilder

        builder = IndexBuilder(engine, service.sql, service.settings, state.settings.vectors)
        yield Periodic("store-indexes", service.settings.index_sweep_seconds, builder.round, at_start=True)


class StoreData(NamespaceData[StoreService]):
    """A namespace's items and their vectors (``store_vectors``, keyed by the items' ids): deleted
    ``batch`` items a transaction, their vectors with them. Export and import are #47's."""

    async def delete(
        self, service: StoreService, engine: AsyncEngine, namespace: str, batch: int
    ) -> AsyncGenerator[Deleted, None]:
        while True:
            async with writer(engine).begin() as conn:
                chosen = select(store_items.c.id).where(store_items.c.namespace == namespace).limit(batch)
                ids = list((await conn.execute(chosen)).scalars())
                vectors = 0
                if ids:  # their vectors first: not left to SQLite's foreign_keys pragma
                    vectors = (await conn.execute(delete(store_vectors).where(store_vectors.c.item_id.in_(ids)))).rowcount
                    await conn.execute(
                        delete(store_items).where(store_items.c.namespace == namespace, store_items.c.id.in_(ids))
                    )
            if not ids:
                return
            yield {"items": len(ids), "vectors": vectors or 0}
            if len(ids) < batch:
                return


CAPABILITY = Capability(
    name="store",
    router=router,
    database=Database.vectors,
    lifecycle=lifecycle,
    periodic=periodic,
    # store_vectors rows are keyed by an item's id, which only a scoped store_items row hands out
    tables=(store_items,),
    samples=SAMPLES,
    data=StoreData(),
    usage=(Counted(store_items, length_of="value"),),  # items and their values' bytes (not their vectors)
    changes=(
        # a batch's puts with a value write items, those without one delete them
        Change("items_write", ("POST /batch", "PUT /langgraph/store/items", "DELETE /langgraph/store/items")),
        Change("subtree_delete", ("POST /namespaces/delete",)),
        Change("expire", ("POST /sweep",), job="store-sweep"),
    ),
    # no errors of its own: every limit is checked before a statement runs (values, namespaces,
    # vectors, dimensions within pgvector's 16,000), integers past 64 bits are the gateway's rule
    summary="LangGraph long-term memory: items under tuple namespaces with semantic search and TTL "
    "(the client's GatewayStore); LangGraph Platform's /store API under /v1/{namespace}/store/langgraph.",
)
