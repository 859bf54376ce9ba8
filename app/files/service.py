"""The rules of the files capability: streamed chunked writes, atomic swaps, snapshot reads.

Upload: bytes are hashed and counted as they arrive and stored in chunks under a NEW blob id,
each chunk in its own short transaction (a SQLite writer never holds the database for a whole
upload). Only when the body is complete does one transaction point the file at the new blob
(checking ``If-Match`` / ``If-None-Match`` against the version it replaces) and drop the old
blob's chunks. Any failure drops the new blob's chunks; a crash leaves them listed in
``file_uploads``, from where the sweeper removes them once their heartbeat is stale.
A body that fits in one chunk skips all that and is written in a single transaction.

Download: the file row and all its chunks are read inside one snapshot transaction, so a
download that overlaps a replace or delete sends the old version whole, never a mix.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.conditions import WriteConditions, parse_etags, quote_etag
from app.core.config import Settings
from app.core.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge
from app.core.names import validate_key
from app.core.pagination import decode_cursor, encode_cursor
from app.core.slots import Slots
from app.files.backend import FilesBackend
from app.files.ranges import ByteRange, parse_range, whole
from app.files.repository import FileRow, FilesRepository

log = logging.getLogger("app.files")

DEFAULT_CONTENT_TYPE = "application/octet-stream"


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_blob_id() -> str:
    return uuid.uuid4().hex


def new_file_id() -> str:
    return uuid.uuid4().hex


class UploadAbandoned(Conflict):
    """The sweeper discarded this upload because it stalled for too long."""

    code = "upload_abandoned"


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"file exceeds the limit of {limit} bytes", headers={"Connection": "close"})


@dataclass(frozen=True)
class StoredFile:
    row: FileRow
    created: bool


class BlobWriter:
    """Receives an upload's bytes and stores them as chunks of a new blob."""

    def __init__(self, service: "FilesService") -> None:
        self._service = service
        self._repo = service.repo
        self.blob_id = new_blob_id()
        self.chunk_bytes = service.chunk_bytes
        self.max_bytes = service.max_file_bytes
        self.size = 0
        self._hash = hashlib.sha256()
        self._buffer = bytearray()
        self._stored = 0  # chunks already committed
        self._started = False  # the file_uploads row exists (or is being inserted)
        self._pending: asyncio.Task[None] | None = None
        self.finished = False

    async def write(self, data: bytes) -> None:
        if not data:
            return
        self.size += len(data)
        if self.size > self.max_bytes:
            raise too_large(self.max_bytes)
        self._hash.update(data)
        self._buffer += data
        # Keep one full chunk back: a body of exactly one chunk is then stored in one transaction.
        while len(self._buffer) > self.chunk_bytes:
            chunk = bytes(self._buffer[: self.chunk_bytes])
            del self._buffer[: self.chunk_bytes]
            # One chunk is written while the next one arrives: at most two chunks in memory.
            await self._settle()
            self._pending = asyncio.create_task(self._store(chunk))

    async def _settle(self) -> None:
        """Wait for the chunk being written (re-raising its error)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            await pending

    async def _store(self, chunk: bytes) -> None:
        now = utcnow()
        async with self._service.write(chunks=True) as conn:
            if not self._started:
                self._started = True  # set first: if the insert commits, abort() must see it
                await self._repo.start_upload(conn, self.blob_id, now)
            elif not await self._repo.touch_upload(conn, self.blob_id, now):
                raise UploadAbandoned("the upload stalled and was discarded; send it again")
            await self._repo.add_chunk(conn, self.blob_id, self._stored, chunk)
        self._stored += 1

    async def commit(
        self, namespace: str, collection: str, file_id: str, content_type: str, conditions: WriteConditions
    ) -> StoredFile:
        """Store the tail and point ``file_id`` at this blob, replacing (and dropping) the old one."""
        repo = self._repo
        now = utcnow()
        sha256 = self._hash.hexdigest()
        await self._settle()
        async with self._service.write() as conn:
            if self._buffer:
                await repo.add_chunk(conn, self.blob_id, self._stored, bytes(self._buffer))
            if self._started and not await repo.end_upload(conn, self.blob_id):
                raise UploadAbandoned("the upload stalled and was discarded; send it again")
            new = FileRow(file_id, self.blob_id, self.size, self.chunk_bytes, content_type, sha256, now, now)
            while True:
                current = await repo.get_for_update(conn, namespace, collection, file_id)
                conditions.check(current.sha256 if current else None)
                if current is not None:
                    new = replace(new, created_at=current.created_at)
                    await repo.replace(conn, namespace, collection, new)
                    await repo.drop_blob(conn, current.blob_id)
                    stored = StoredFile(new, created=False)
                    break
                if await repo.insert_if_absent(conn, namespace, collection, new):
                    stored = StoredFile(new, created=True)
                    break
                # Another upload created it between our read and our insert: lock it and retry.
        self.finished = True
        self._buffer = bytearray()
        return stored

    async def abort(self) -> None:
        """Drop whatever this upload stored (shielded: runs even while the request is cancelled)."""
        if self.finished:
            return
        with anyio.CancelScope(shield=True):
            if self._pending is not None:
                try:
                    await self._settle()
                except BaseException:
                    pass
            if not self._started:
                return
            try:
                async with self._service.write() as conn:
                    await self._repo.drop_blob(conn, self.blob_id)
                    await self._repo.end_upload(conn, self.blob_id)
            except Exception:
                log.warning("could not drop the chunks of failed upload %s; the sweeper will", self.blob_id,
                            exc_info=True)


class BlobReader:
    """A file row and its chunks, read in one snapshot transaction on a connection of its own."""

    def __init__(self, conn: AsyncConnection, repo: FilesRepository, row: FileRow) -> None:
        self._conn = conn
        self._repo = repo
        self.row = row

    async def iter_bytes(self, byte_range: ByteRange) -> AsyncIterator[bytes]:
        """The bytes of ``byte_range``, one chunk fetched at a time."""
        if byte_range.length <= 0:
            return
        size = self.row.chunk_bytes
        first, last = byte_range.start // size, byte_range.end // size
        for seq in range(first, last + 1):
            data = await self._repo.chunk(self._conn, self.row.blob_id, seq)
            if data is None:  # impossible inside the snapshot; never send a mix
                raise RuntimeError(f"blob {self.row.blob_id} lacks chunk {seq}")
            lo = byte_range.start - seq * size if seq == first else 0
            hi = byte_range.end - seq * size + 1 if seq == last else len(data)
            yield data if lo == 0 and hi == len(data) else data[lo:hi]

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._conn.close()


@dataclass(frozen=True)
class DownloadPlan:
    """What a GET answers: 200 (whole), 206 (``byte_range``) or 304."""

    status: int
    byte_range: ByteRange


def file_headers(row: FileRow) -> dict[str, str]:
    return {
        "ETag": quote_etag(row.sha256),
        "Last-Modified": email.utils.format_datetime(row.updated_at.astimezone(UTC), usegmt=True),
        "Accept-Ranges": "bytes",
    }


def plan_download(
    row: FileRow, range_header: str | None, if_none_match: str | None, if_range: str | None
) -> DownloadPlan:
    """RFC 9110: ``If-None-Match`` first (304), then ``If-Range``, then ``Range`` (206 or 416)."""
    tags = parse_etags(if_none_match)
    if tags is not None and ("*" in tags or row.sha256 in tags):
        return DownloadPlan(304, whole(row.size))
    if range_header is not None and if_range is not None:
        validators = {quote_etag(row.sha256), file_headers(row)["Last-Modified"]}
        if if_range.strip() not in validators:
            range_header = None
    byte_range = parse_range(range_header, row.size)
    if byte_range is None:
        return DownloadPlan(200, whole(row.size))
    return DownloadPlan(206, byte_range)


@dataclass(frozen=True)
class FileListPage:
    rows: list[FileRow]
    next_cursor: str | None


class FilesService:
    """Files of every namespace, in the metadata database."""

    def __init__(self, engine: AsyncEngine, backend: FilesBackend, settings: Settings) -> None:
        self.repo = FilesRepository(backend)
        self._backend = backend
        self._engine = engine
        self._write_engine = engine.execution_options(**backend.write_options())
        self._snapshot_engine = engine.execution_options(**backend.snapshot_options())
        self.chunk_bytes = settings.limits.file_chunk_bytes
        self.max_file_bytes = settings.limits.max_file_bytes
        self.stale_after = timedelta(seconds=settings.files.upload_stale_seconds)
        pool = settings.databases.metadata
        total = settings.files.max_downloads or (pool.pool_size + pool.max_overflow) // 2
        self.downloads = Slots("downloads", total, settings.files.max_downloads_per_namespace or total // 2)
        self.send_timeout = settings.limits.send_idle_timeout_seconds

    @asynccontextmanager
    async def write(self, *, chunks: bool = False) -> AsyncIterator[AsyncConnection]:
        """One short write transaction (``chunks``: one that only stores chunks of an upload)."""
        async with self._write_engine.begin() as conn:
            if chunks:
                await self._backend.prepare_chunk_write(conn)
            yield conn

    # --- uploads -----------------------------------------------------------------------

    def check_declared_size(self, content_length: str | None, overhead: int = 0) -> None:
        """413 at once when ``Content-Length`` already says the body is too large."""
        if content_length is not None and content_length.strip().isdigit():
            if int(content_length) > self.max_file_bytes + overhead:
                raise too_large(self.max_file_bytes)

    async def precheck(self, namespace: str, collection: str, file_id: str, conditions: WriteConditions) -> None:
        """Fail a conditional upload before its body is read (checked again when it commits)."""
        if conditions.any:
            current = await self.get(namespace, collection, file_id)
            conditions.check(current.sha256 if current else None)

    @asynccontextmanager
    async def new_blob(self) -> AsyncIterator[BlobWriter]:
        """A writer whose chunks are dropped unless it commits."""
        writer = BlobWriter(self)
        try:
            yield writer
        except BaseException:
            await writer.abort()
            raise
        if not writer.finished:
            await writer.abort()

    async def store(
        self,
        namespace: str,
        collection: str,
        file_id: str,
        body: AsyncIterator[bytes],
        content_type: str,
        conditions: WriteConditions,
    ) -> StoredFile:
        """Stream ``body`` into a new version of ``file_id``."""
        await self.precheck(namespace, collection, file_id, conditions)
        async with self.new_blob() as writer:
            async for piece in body:
                await writer.write(piece)
            return await writer.commit(namespace, collection, file_id, content_type, conditions)

    # --- reads -------------------------------------------------------------------------

    async def get(self, namespace: str, collection: str, file_id: str) -> FileRow | None:
        async with self._engine.connect() as conn:
            return await self.repo.get(conn, namespace, collection, file_id)

    async def open(self, namespace: str, collection: str, file_id: str) -> BlobReader:
        """A reader holding a snapshot of ``file_id``; the caller must ``close()`` it. 404 if missing."""
        conn = await self._snapshot_engine.connect()
        try:
            await conn.begin()
            row = await self.repo.get(conn, namespace, collection, file_id)
            if row is None:
                raise NotFound(f"file {file_id!r} does not exist in collection {collection!r}")
            return BlobReader(conn, self.repo, row)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await conn.close()
            raise

    async def list(
        self, namespace: str, collection: str, *, prefix: str | None, cursor: str | None, limit: int
    ) -> FileListPage:
        after = None
        if cursor is not None:
            after = decode_cursor(cursor, "after")["after"]
            if not isinstance(after, str):
                raise InvalidInput("cursor", "is not a cursor returned by this list")
        if prefix is not None and prefix != "":
            validate_key("prefix", prefix)
        async with self._engine.connect() as conn:
            rows = await self.repo.list(conn, namespace, collection, prefix=prefix, after=after, limit=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        return FileListPage(rows, encode_cursor({"after": rows[-1].file_id}) if more else None)

    async def usage(self, namespace: str) -> tuple[int, int]:
        async with self._engine.connect() as conn:
            return await self.repo.usage(conn, namespace)

    # --- deletes and housekeeping ------------------------------------------------------

    async def delete(self, namespace: str, collection: str, file_id: str, conditions: WriteConditions) -> None:
        async with self.write() as conn:
            current = await self.repo.get_for_update(conn, namespace, collection, file_id)
            conditions.check(current.sha256 if current else None)
            if current is not None:
                await self.repo.delete(conn, namespace, collection, file_id)
                await self.repo.drop_blob(conn, current.blob_id)

    async def sweep(self) -> int:
        """Drop the chunks of uploads whose heartbeat is older than ``stale_after``; how many."""
        cutoff = utcnow() - self.stale_after
        swept = 0
        while True:
            async with self._engine.connect() as conn:
                stale = await self.repo.stale_uploads(conn, cutoff)
            for blob_id in stale:
                async with self.write() as conn:
                    # Re-checked under the write lock: a chunk stored meanwhile keeps it alive.
                    if await self.repo.end_upload(conn, blob_id, touched_before=cutoff):
                        await self.repo.drop_blob(conn, blob_id)
                        swept += 1
            if len(stale) < 100:
                return swept

