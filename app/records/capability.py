"""The records capability: JSON records per collection, ordered by key, paged with cursors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from app.core.capability import Capability, Change
from app.quotas.tables import Counted
from app.core.config import Database
from app.fairness.fairshare import HeavyWrites
from app.core.state import GatewayState
from app.core.fast.fixed_statements import fixed_statements
from app.core.db.upsert import insert_builder
from app.records.models import records
from app.records.repository import RecordsRepository
from app.records.router import router
from app.records.samples import SAMPLES
from app.records.service import RecordsService


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[RecordsService]:
    """The records service for the checkpoints database's backend."""
    databases = state.databases
    dialect = databases.dialect(Database.checkpoints)
    repository = RecordsRepository(insert_builder(dialect), fixed_statements(dialect))
    heavy = HeavyWrites(
        databases.engine(Database.checkpoints), databases.write_queues.get(Database.checkpoints), state.settings.fairness,
        Database.checkpoints.value,
    )
    yield RecordsService(repository, state.settings.limits, heavy)


CAPABILITY = Capability(
    name="records",
    router=router,
    database=Database.checkpoints,
    lifecycle=lifecycle,
    tables=(records,),
    usage=(Counted(records, length_of="value"),),
    summary="JSON records per collection, ordered by key: batches, ordered pages with cursors, trim.",
    samples=SAMPLES,
    changes=(
        Change("upsert", ("PUT /{collection}/{key}", "POST /{collection}")),
        Change("delete", ("DELETE /{collection}/{key}",)),
        Change("trim", ("POST /{collection}/trim",)),
    ),
)
