"""The kv capability: JSON values by key in collections, with ETags and optional expiry."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

from app.core.capability import Capability, Change, Periodic, expiry_sweep
from app.quotas.tables import Counted
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
    yield expiry_sweep(
        "kv-sweep", state.databases.engine(Database.metadata), service.sweep, service.settings.sweep_batch,
        service.settings.sweep_interval_seconds, log, "entries",
    )


CAPABILITY = Capability(
    name="kv",
    router=router,
    database=Database.metadata,
    lifecycle=lifecycle,
    periodic=periodic,
    tables=(kv_entries,),
    usage=(Counted(kv_entries, length_of="value"),),
    summary="JSON values by key in collections, with ETags, compare-and-set and optional expiry.",
    samples=SAMPLES,
    changes=(
        Change("set", ("PUT /{collection}/{key}", "POST /{collection}")),
        Change("delete", ("DELETE /{collection}/{key}", "POST /{collection}/delete")),
        Change("expire", job="kv-sweep"),
    ),
)
