"""The files capability: streamed uploads and downloads with Range and ETags; bytes in the
metadata database (chunks), an S3 bucket or a local directory (``files.backend``)."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.capability import Capability, Change, Periodic
from app.quotas.tables import Counted
from app.core.config import Database
from app.core.http.conditions import WriteConditions
from app.core.names import NAME_MAX_LENGTH, key_problem
from app.core.namespace_data import Blob, Context, Deleted, NamespaceData, RefusedLine, Rows
from app.core.state import GatewayState
from app.files.backend import backend_for
from app.files.models import file_chunks, files
from app.files.ranges import whole
from app.files.repository import FileRow
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


_FILE_FIELDS = ("collection", "file_id", "size", "content_type", "sha256", "created_at", "updated_at")
_SHA256 = frozenset("0123456789abcdef")


class FilesData(NamespaceData[FilesService]):
    """A namespace's files: their rows and, wherever each version's bytes are (chunks, the
    bucket, the directory), their bytes, removed as a DELETE of each file removes them.

    Archive: part ``files`` (a line per file: no blob id, chunk size or object key, which are
    the storing gateway's), each batch followed by the blobs it names, once per content in the
    batch. On import a line waits for its blob, which is stored through the ordinary upload
    path (chunks, bucket or directory, as the importing gateway keeps files) under every file
    of the batch with that content; its times are then set to the archive's."""

    parts = ("files",)

    async def export(self, service: FilesService, conn: AsyncConnection, namespace: str, batch: int) -> AsyncIterator[Rows | Blob]:
        key = (files.c.collection, files.c.file_id)
        after: tuple[str, str] | None = None
        while True:
            query = select(files).where(files.c.namespace == namespace).order_by(*key).limit(batch)
            if after is not None:
                query = query.where(tuple_(*key) > tuple_(*after))
            rows = (await conn.execute(query)).all()
            if not rows:
                return
            yield Rows("files", tuple(
                {"collection": r.collection, "file_id": r.file_id, "size": r.size, "content_type": r.content_type,
                 "sha256": r.sha256, "created_at": r.created_at.isoformat(), "updated_at": r.updated_at.isoformat()}
                for r in rows
            ))
            seen: set[str] = set()
            for r in rows:
                if r.sha256 not in seen:
                    seen.add(r.sha256)
                    yield Blob(r.sha256, r.size, _opener(service, conn, namespace, r))
            if len(rows) < batch:
                return
            after = (rows[-1].collection, rows[-1].file_id)

    async def load(
        self, service: FilesService, conn: AsyncConnection, namespace: str, part: Rows, ctx: Context | None = None
    ) -> int:
        if part.table != "files" or ctx is None:
            raise RefusedLine(f"no part {part.table!r} here (parts: files)")
        pending: dict[str, list[dict[str, Any]]] = ctx.setdefault("pending", {})
        for row in part.rows:
            if set(row) != set(_FILE_FIELDS):
                raise RefusedLine(f"a files line has the fields {sorted(row)}, not {sorted(_FILE_FIELDS)}")
            collection, file_id, sha = row["collection"], row["file_id"], row["sha256"]
            if not isinstance(collection, str) or not (0 < len(collection) <= NAME_MAX_LENGTH) or not collection.isprintable():
                raise RefusedLine(f"collection {collection!r:.80} is not a collection name")
            if not isinstance(file_id, str) or key_problem(file_id):
                raise RefusedLine(f"file_id {file_id!r:.80}: {key_problem(file_id) if isinstance(file_id, str) else 'not a string'}")
            if not isinstance(sha, str) or len(sha) != 64 or not set(sha) <= _SHA256:
                raise RefusedLine(f"sha256 {sha!r:.80} is not a hex sha256")
            if not isinstance(row["size"], int) or not isinstance(row["content_type"], str):
                raise RefusedLine("size must be an integer and content_type a string")
            if len(row["content_type"]) > 255 or not row["content_type"].isprintable():
                raise RefusedLine(f"content_type {row['content_type']!r:.80} is not a media type")
            for name in ("created_at", "updated_at"):
                try:
                    row[name] = datetime.fromisoformat(row[name])
                except (TypeError, ValueError):
                    raise RefusedLine(f"{name} {row[name]!r:.80} is not an ISO 8601 time") from None
            pending.setdefault(sha, []).append(row)
        return len(part.rows)

    async def load_blob(
        self, service: FilesService, namespace: str, sha256: str, data: Callable[[], AsyncIterator[bytes]], ctx: Context
    ) -> None:
        rows = ctx.setdefault("pending", {}).pop(sha256, None)
        if not rows:
            raise RefusedLine(f"no file of the part before it has the content {sha256}")
        for row in rows:
            async with service.new_blob(namespace) as writer:
                async for piece in data():
                    await writer.write(piece)
                if writer.size != row["size"]:
                    raise RefusedLine(f"file {row['file_id']!r}: {writer.size} bytes, the line says {row['size']}")
                stored = await writer.commit(namespace, row["collection"], row["file_id"], row["content_type"], WriteConditions())
            if stored.row.sha256 != sha256:  # the caller checked the bytes; a second check costs nothing
                raise RefusedLine(f"file {row['file_id']!r}: the bytes do not match {sha256}")
            async with service.write() as conn:
                await conn.execute(
                    update(files)
                    .where(files.c.namespace == namespace, files.c.collection == row["collection"],
                           files.c.file_id == row["file_id"])
                    .values(created_at=row["created_at"], updated_at=row["updated_at"])
                )

    async def finish(self, service: FilesService, engine: AsyncEngine, namespace: str, ctx: Context) -> None:
        missing = sorted(ctx.get("pending") or {})
        if missing:
            raise RefusedLine(f"the blob files/blobs/{missing[0]} is missing ({len(missing)} missing)")

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


def _opener(service: FilesService, conn: AsyncConnection, namespace: str, r: Any) -> Callable[[], AsyncIterator[bytes]]:
    """Reads a file version's bytes: chunks through the export's snapshot ``conn``; an object
    (written once under its blob id, never changed) through the configured store."""

    async def chunks() -> AsyncIterator[bytes]:
        seq = -1
        while True:
            query = (
                select(file_chunks.c.seq, file_chunks.c.data)
                .where(file_chunks.c.blob_id == r.blob_id, file_chunks.c.seq > seq)
                .order_by(file_chunks.c.seq).limit(1)
            )
            found = (await conn.execute(query)).first()
            if found is None:
                return
            seq = found.seq
            yield bytes(found.data)

    async def outside() -> AsyncIterator[bytes]:
        if r.size == 0:
            return
        row = FileRow(r.file_id, r.blob_id, r.size, r.chunk_bytes, r.content_type, r.sha256, r.created_at,
                      r.updated_at, object_key=r.object_key)
        reader = service.blobs.reader(namespace, row)
        try:
            span = whole(r.size)
            await reader.start(span)
            async for piece in reader.iter_bytes(span):
                yield piece
        finally:
            await reader.close()

    return chunks if r.object_key is None else outside


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
