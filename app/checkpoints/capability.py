"""The checkpoints capability: LangGraph graph state (threads, checkpoints, blobs, pending writes)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.checkpoints.backend import backend_for
from app.checkpoints.models import checkpoint_blobs, checkpoint_retention, checkpoint_threads, checkpoint_writes
from app.checkpoints.models import checkpoints as checkpoint_rows
from app.checkpoints.reads import CheckpointReader
from app.checkpoints.repository import CheckpointsRepository
from app.checkpoints.router import router
from app.checkpoints.samples import SAMPLES
from app.checkpoints.service import CheckpointsService
from app.checkpoints.writer import writer_for
from app.core.capability import Capability, Change, Periodic
from app.quotas.tables import Counted, Part
from app.fairness.fairshare import HeavyWrites
from app.core.config import Database
from app.core.namespace_data import Deleted, NamespaceData, delete_rows, writer
from app.core.state import GatewayState
from app.core.fast.fixed_statements import fixed_statements
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
    databases = state.databases
    heavy = HeavyWrites(
        databases.engine(Database.checkpoints), databases.write_queues.get(Database.checkpoints), settings.fairness,
        Database.checkpoints.value,
    )
    yield CheckpointsService(
        repository, CheckpointReader(backend, fixed), writer, settings.limits, settings.checkpoints, heavy
    )


def periodic(service: CheckpointsService, state: GatewayState) -> Iterator[Periodic]:
    yield Periodic("checkpoints-sweep", service.settings.sweep_interval_seconds, service.sweep_round)


class CheckpointsData(NamespaceData[CheckpointsService]):
    """A namespace's threads, each with its checkpoints, channel values, pending writes and
    metadata terms (keyed by the thread's ``pk``), ``batch`` threads a transaction; and its
    retention settings."""

    async def delete(
        self, service: CheckpointsService, engine: AsyncEngine, namespace: str, batch: int
    ) -> AsyncGenerator[Deleted, None]:
        query = (
            select(checkpoint_threads.c.pk)
            .where(checkpoint_threads.c.namespace == namespace).order_by(checkpoint_threads.c.pk).limit(batch)
        )
        while True:
            async with writer(engine).begin() as conn:
                pks = list((await conn.execute(query)).scalars())
                checkpoints = await service.repo.delete_threads(conn, pks, namespace)
            if pks:
                yield {"threads": len(pks), "checkpoints": checkpoints}
            if len(pks) < batch:
                break
        async for deleted in delete_rows(engine, checkpoint_retention, namespace, batch):
            yield deleted


CAPABILITY = Capability(
    name="checkpoints",
    router=router,
    database=Database.checkpoints,
    lifecycle=lifecycle,
    periodic=periodic,
    # checkpoints, blobs, writes and metadata terms are keyed by a thread row's id, which only a
    # scoped checkpoint_threads row hands out
    tables=(checkpoint_threads, checkpoint_retention),
    # items: threads (a retention row is one); bytes: their checkpoints', blobs' and pending writes'
    usage=(Counted(checkpoint_threads, parts=(
        Part(checkpoint_rows, "thread_pk", "checkpoint"), Part(checkpoint_blobs, "thread_pk", "blob"),
        Part(checkpoint_writes, "thread_pk", "blob"),
    )),),
    summary="LangGraph graph state: threads, checkpoints, channel blobs and pending writes "
    "(the client's GatewayCheckpointSaver).",
    samples=SAMPLES,
    data=CheckpointsData(),
    changes=(
        Change("put", ("POST /put",)),
        Change("writes", ("POST /writes",)),
        Change("thread_delete", ("DELETE /threads",)),
        Change("runs_delete", ("POST /runs/delete",)),
        Change("thread_copy", ("POST /threads/copy",)),
        Change("prune", ("POST /prune",), job="checkpoints-sweep"),
        Change("retention", ("PUT /retention",)),
    ),
)
