"""The files capability: streamed uploads and downloads with Range and ETags; bytes in the
metadata database (chunks), an S3 bucket or a local directory (``files.backend``)."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.capability import Capability, Change, Periodic
from app.quotas.tables import Counted
from app.core.config import Database
from app.core.http.conditions import WriteConditions
from app.core.namespace_data import Deleted, NamespaceData
from app.core.state import GatewayState
from app.files.backend import backend_for
from app.files.models import files
from app.files.router import router
from app.files.samples import SAMPLES
from app.files.s3 import S3Objects
from app.files.service import FilesService

log = logging.getLogger("app.files")


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[FilesService]:
    """The files service for the configured backend; the bucket's client while the app runs."""
    settings = state.settings
    databases = state.databases
    objects = await S3Objects.open(settings.files.s3) if settings.files.s3.bucket else None
    try:
        service = FilesService(
            databases.engine(Database.metadata), backend_for(databases.dialect(Database.metadata)), settings, objects,
            inline=lambda: databases.inline_connection(Database.metadata), queue=databases.write_queues.get(Database.metadata),
        )
        state.storage_checks["files"] = service.readiness
        yield service
    finally:
        if objects is not None:
            await objects.close()


def periodic(service: FilesService, state: GatewayState) -> Iterator[Periodic]:
    async def sweep() -> None:
        """Remove what abandoned uploads left (chunks, objects, multipart uploads)."""
        swept = await service.sweep()
        if swept:
            log.info("swept %d abandoned file uploads", swept)

    yield Periodic("files-sweeper", state.settings.files.sweep_interval_seconds, sweep, at_start=True)


class FilesData(NamespaceData[FilesService]):
    """A namespace's files: their rows and, wherever each version's bytes are (chunks, the
    bucket, the directory), their bytes, removed as a DELETE of each file removes them."""

    async def delete(
        self, service: FilesService, engine: AsyncEngine, namespace: str, batch: int
    ) -> AsyncGenerator[Deleted, None]:
        query = (
            select(files.c.collection, files.c.file_id, files.c.size)
            .where(files.c.namespace == namespace).order_by(files.c.collection, files.c.file_id).limit(batch)
        )
        while True:
            async with engine.connect() as conn:
                rows = (await conn.execute(query)).all()
            for row in rows:  # each in a write transaction of its own, its bytes dropped after it
                await service.delete(namespace, row.collection, row.file_id, WriteConditions())
            if rows:
                yield {"files": len(rows), "bytes": sum(row.size for row in rows)}
            if len(rows) < batch:
                return


CAPABILITY = Capability(
    name="files",
    router=router,
    database=Database.metadata,
    lifecycle=lifecycle,
    periodic=periodic,
    # file_chunks and file_uploads are keyed by ids that only a scoped files row hands out
    tables=(files,),
    usage=(Counted(files, size="size"),),
    summary="Streamed file uploads and downloads with Range, ETags and conditional requests.",
    samples=SAMPLES,
    data=FilesData(),
    changes=(
        Change("save", ("PUT /{collection}/{file_id}", "POST /{collection}")),
        Change("delete", ("DELETE /{collection}/{file_id}",)),
    ),
)
