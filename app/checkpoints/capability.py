"""The checkpoints capability: LangGraph graph state (threads, checkpoints, blobs, pending writes)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

from app.checkpoints.backend import backend_for
from app.checkpoints.models import checkpoint_retention, checkpoint_threads
from app.checkpoints.reads import CheckpointReader
from app.checkpoints.repository import CheckpointsRepository
from app.checkpoints.router import router
from app.checkpoints.service import CheckpointsService
from app.checkpoints.writer import writer_for
from app.core.capability import Capability, Periodic, in_batches
from app.core.config import Database
from app.core.state import GatewayState
from app.core.db.statements import fixed_statements
from app.core.db.upsert import insert_builder


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[CheckpointsService]:
    """The checkpoints service for the checkpoints database's backend."""
    settings = state.settings
    dialect = state.databases.dialect(Database.checkpoints)
    backend = backend_for(dialect)
    fixed = fixed_statements(dialect)
    repository = CheckpointsRepository(backend, insert_builder(dialect))
    writer = writer_for(dialect, repository, backend, fixed)
    yield CheckpointsService(
        repository, CheckpointReader(backend, fixed), writer, settings.limits, settings.checkpoints
    )


def periodic(service: CheckpointsService, state: GatewayState) -> Iterator[Periodic]:
    engine = state.databases.engine(Database.checkpoints)

    async def sweep() -> None:
        """Apply retention in bounded batches."""
        await in_batches(engine, service.sweep, service.settings.sweep_batch)

    yield Periodic("checkpoints-sweep", service.settings.sweep_interval_seconds, sweep)


CAPABILITY = Capability(
    name="checkpoints",
    router=router,
    database=Database.checkpoints,
    lifecycle=lifecycle,
    periodic=periodic,
    # checkpoints, blobs, writes and metadata terms are keyed by a thread row's id, which only a
    # scoped checkpoint_threads row hands out
    tables=(checkpoint_threads, checkpoint_retention),
    summary="LangGraph graph state: threads, checkpoints, channel blobs and pending writes "
    "(the client's GatewayCheckpointSaver).",
)
