"""The kv capability: JSON values by key in collections, with ETags and optional expiry."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.capability import Capability, Change, Periodic, in_batches
from app.core.config import Database
from app.core.state import GatewayState
from app.core.fast.fixed_statements import fixed_statements
from app.core.db.upsert import insert_builder
from app.kv.models import kv_entries
from app.kv.repository import KvRepository
from app.kv.router import router
from app.kv.samples import SAMPLES
from app.kv.service import KvService

log = logging.getLogger("app.kv")


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[KvService]:
    """The kv service for the metadata database's backend."""
    dialect = state.databases.dialect(Database.metadata)
    repository = KvRepository(insert_builder(dialect), fixed_statements(dialect))
    yield KvService(repository, state.settings.limits, state.settings.kv)


def periodic(service: KvService, state: GatewayState) -> Iterator[Periodic]:
    engine = state.databases.engine(Database.metadata)

    async def step(conn: AsyncConnection) -> int:
        deleted = await service.sweep(conn)
        if deleted:
            log.info("kv sweep deleted %d expired entries", deleted)
        return deleted

    async def sweep() -> None:
        """Delete expired entries in bounded batches."""
        await in_batches(engine, step, service.settings.sweep_batch)

    yield Periodic("kv-sweep", service.settings.sweep_interval_seconds, sweep)


CAPABILITY = Capability(
    name="kv",
    router=router,
    database=Database.metadata,
    lifecycle=lifecycle,
    periodic=periodic,
    tables=(kv_entries,),
    summary="JSON values by key in collections, with ETags, compare-and-set and optional expiry.",
    samples=SAMPLES,
    changes=(
        Change("set", ("PUT /{collection}/{key}", "POST /{collection}")),
        Change("delete", ("DELETE /{collection}/{key}", "POST /{collection}/delete")),
        Change("expire", job="kv-sweep"),
    ),
)
