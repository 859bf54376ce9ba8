"""The rules of the files capability: streamed writes, atomic swaps, consistent reads.

Where the bytes go (database chunks, an S3 object or a file in a local directory) is
``app.files.storage``'s business; the rules here are the same for all three. With S3, "chunk"
below reads "multipart part", the new blob is a new object key, and the old object is deleted
right after the swap commits; a local file is the same, with a file name for the key.

Upload: bytes are hashed and counted as they arrive and stored in chunks under a NEW blob id,
each chunk in its own short transaction (a SQLite writer never holds the database for a whole
upload). Only when the body is complete does one transaction point the file at the new blob
(checking ``If-Match`` / ``If-None-Match`` against the version it replaces) and drop the old
blob's chunks. Any failure drops the new blob's chunks; a crash leaves them listed in
``file_uploads``, from where the sweeper removes them once their heartbeat is stale.
A body that fits in one chunk skips all that and is written in a single transaction.

Download: the file row and all its chunks are read inside one snapshot transaction, so a
download that overlaps a replace or delete sends the old version whole, never a mix; one still
running after ``files.download_snapshot_seconds`` lets the snapshot go and reads each further
chunk on its own, and is cut off short if its version lost them meanwhile (``ChunkReader``). An S3
object never changes once written: its download reads the row, lets the connection go and
streams a ranged GET; a local file is never changed either, and is read from a descriptor that
stays valid if the file is removed meanwhile.
"""

from __future__ import annotations

import asyncio
import builtins
import email.utils
import hashlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol, TypeVar

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.http.conditions import WriteConditions, parse_etags, quote_etag
from app.core.config import Settings
from app.core.errors import InvalidInput, NotFound, PayloadTooLarge, ServiceUnavailable
from app.core.ops.health import StorageStatus
from app.core.names import validate_key
from app.core.http.pagination import decode_cursor, encode_cursor
from app.core.fast.inline_sqlite import Execute, InlineConnection
from app.fairness.writequeue import WriteQueue
from app.fairness.slots import Slots
from app.core.fast.fixed_statements import fixed_statements
from app.core.fast.one_statement import borrow_driver_connection, give_back
from app.files.backend import FilesBackend
from app.files.local import LocalFiles
from app.files.ranges import ByteRange, parse_range, whole
from app.files.repository import FileRow, FilesRepository
from app.files.s3 import ObjectMissing, ObjectStoreUnavailable, S3Objects
from app.files.storage import (
    BlobReader,
    BlobSink,
    BlobStore,
    BytesReader,
    ChunkReader,
    UploadAbandoned,
    VersionGone,
    utcnow,
)

log = logging.getLogger("app.files")

DEFAULT_CONTENT_TYPE = "application/octet-stream"


def new_blob_id() -> str:
    return uuid.uuid4().hex


def new_file_id() -> str:
    return uuid.uuid4().hex


SMALL_PIECE = 64 * 1024  # received pieces smaller than this are gathered before they are queued


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"file exceeds the limit of {limit} bytes", headers={"Connection": "close"})


@dataclass(frozen=True)
class StoredFile:
    row: FileRow
    created: bool


class BlobWriter:
    """Receives an upload's bytes, hashes and counts them, and hands full pieces to its sink."""

    def __init__(self, service: FilesService, namespace: str) -> None:
        self._service = service
        self._repo = service.repo
        self.blob_id = new_blob_id()
        self._sink: BlobSink = service.blobs.sink(namespace, self.blob_id)
        self.piece_bytes = self._sink.chunk_bytes
        self.max_bytes = service.max_file_bytes
        self.size = 0
        self._hash = hashlib.sha256()
        # Received pieces not yet stored, joined once when a piece is taken: a bytearray that
        # grows by appends and is copied out cost 1.1-1.2 ms per MiB, the list and join 29 us.
        # Pieces under SMALL_PIECE are gathered into one bytearray of at most about that size:
        # a client that sends a body in tiny TCP segments gets tiny pieces from the server, and
        # a piece of 1 MiB was 262,144 entries of 4 bytes, taken one by one from a list's front.
        self._pending_pieces: deque[bytes | bytearray] = deque()
        self._buffered = 0
        self._stored = 0  # pieces already stored
        self._pending: asyncio.Task[None] | None = None
        self.finished = False
        # A body may arrive at limits.min_body_rate_bytes, slower than a piece per stale age:
        # between pieces the heartbeat is touched a few times per stale age.
        self._beat_every = service.stale_after.total_seconds() / 4
        self._last_beat = time.monotonic()

    async def write(self, data: bytes) -> None:
        if not data:
            return
        self.size += len(data)
        if self.size > self.max_bytes:
            raise too_large(self.max_bytes)
        self._hash.update(data)
        pieces = self._pending_pieces
        if len(data) >= SMALL_PIECE:
            pieces.append(bytes(data))  # (a no-op for bytes, which the server gives)
        elif pieces and isinstance(pieces[-1], bytearray) and len(pieces[-1]) < SMALL_PIECE:
            pieces[-1] += data
        else:
            pieces.append(bytearray(data))
        self._buffered += len(data)
        # Keep one full piece back: a body of exactly one piece is then stored in one step.
        while self._buffered > self.piece_bytes:
            piece = self._take(self.piece_bytes)
            # One piece is stored while the next one arrives: at most two pieces in memory.
            await self._settle()
            self._pending = asyncio.create_task(self._sink.store(self._stored, piece))
            self._stored += 1
            self._last_beat = time.monotonic()
        if time.monotonic() - self._last_beat > self._beat_every:
            self._last_beat = time.monotonic()
            await self._settle()  # (a store in flight beats too; and two writes of a row at once wait)
            await self._sink.keep_alive()

    def _take(self, n: int) -> bytes:
        """The first ``n`` buffered bytes (copied once), the rest kept."""
        pieces, taken, size = self._pending_pieces, [], 0
        while size < n:
            head = pieces.popleft()
            if size + len(head) > n:
                cut = n - size
                pieces.appendleft(head[cut:])
                head = head[:cut]
            taken.append(head)
            size += len(head)
        self._buffered -= n
        return b"".join(taken)

    def _tail(self) -> bytes:
        """Every buffered byte, and the buffer emptied."""
        tail = b"".join(self._pending_pieces)
        self._pending_pieces, self._buffered = deque(), 0
        return tail

    async def _settle(self) -> None:
        """Wait for the piece being stored (re-raising its error)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            await pending

    async def commit(
        self, namespace: str, collection: str, file_id: str, content_type: str, conditions: WriteConditions
    ) -> StoredFile:
        """Store the tail and point ``file_id`` at this blob, replacing (and dropping) the old one."""
        repo = self._repo
        sha256 = self._hash.hexdigest()
        await self._settle()
        tail = self._tail()
        await self._sink.finish(tail, self._stored)  # S3: the object is complete before the swap
        now = utcnow()
        new = FileRow(file_id, self.blob_id, self.size, self._sink.chunk_bytes, content_type, sha256, now, now,
                      object_key=self._sink.object_key)

        def decide(current: FileRow | None) -> FileRow:
            """The row to store over ``current`` (412 unless the conditions hold)."""
            conditions.check(current.sha256 if current else None)
            return new if current is None else replace(new, created_at=current.created_at)

        def swap_inline(execute: Execute) -> tuple[FileRow, FileRow | None]:
            if self._sink.heartbeat.started and not repo.end_upload_inline(execute, self.blob_id):
                raise UploadAbandoned("the upload stalled and was discarded; send it again")
            return repo.swap_inline(execute, namespace, collection, new, decide)

        # Bytes outside the database (nothing to write in the transaction but rows): on SQLite
        # the swap is one inline transaction, its write lock held for its few statements only.
        swapped = await self._service.inline_transaction(swap_inline) if self._sink.object_key is not None else None
        if swapped is None:
            async with self._service.write() as conn:
                await self._sink.finish_in(conn, tail, self._stored)
                if self._sink.heartbeat.started and not await repo.end_upload(conn, self.blob_id):
                    raise UploadAbandoned("the upload stalled and was discarded; send it again")
                while True:
                    current = await repo.get_for_update(conn, namespace, collection, file_id)
                    chosen = decide(current)
                    if current is not None:
                        await repo.replace(conn, namespace, collection, chosen)
                        await repo.drop_chunks_of(conn, current)
                        break
                    if await repo.insert_if_absent(conn, namespace, collection, chosen):
                        break
                    # Another upload created it between our read and our insert: lock it and retry.
            swapped = (chosen, current)
        stored, old = swapped
        self.finished = True
        if old is not None:
            await self._service.blobs.drop_object(old)  # after the commit: readers switched already
        return StoredFile(stored, created=old is None)

    async def commit_move(self, namespace: str, collection: str, source: FileRow) -> bool:
        """Point the file at this copy of ``source`` (same version: sha256, type and timestamps
        kept), unless it changed meanwhile; the source's bytes are dropped after the commit."""
        await self._settle()
        if self._hash.hexdigest() != source.sha256 or self.size != source.size:
            raise RuntimeError(f"file {source.file_id!r}: the copy does not match the stored sha256")
        tail = self._tail()
        await self._sink.finish(tail, self._stored)
        async with self._service.write() as conn:
            await self._sink.finish_in(conn, tail, self._stored)
            if self._sink.heartbeat.started and not await self._repo.end_upload(conn, self.blob_id):
                raise UploadAbandoned("the copy stalled and was discarded")
            current = await self._repo.get_for_update(conn, namespace, collection, source.file_id)
            if current is None or current.blob_id != source.blob_id:
                return False  # replaced or deleted meanwhile: this copy is dropped (abort)
            moved = replace(source, blob_id=self.blob_id, chunk_bytes=self._sink.chunk_bytes,
                            object_key=self._sink.object_key)
            await self._repo.replace(conn, namespace, collection, moved)
            await self._repo.drop_chunks_of(conn, source)
        self.finished = True
        await self._service.blobs.drop_object(source)
        return True

    async def abort(self) -> None:
        """Drop whatever this upload stored (shielded: runs even while the request is cancelled)."""
        if self.finished:
            return
        with anyio.CancelScope(shield=True):
            if self._pending is not None:
                try:
                    await self._settle()
                except BaseException:  # noqa: BLE001 - whatever settling raised, the abort below still runs
                    pass
            try:
                await self._sink.abort()
            except Exception:
                log.warning("could not drop what failed upload %s stored; the sweeper will", self.blob_id,
                            exc_info=True)


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
    tags = parse_etags(if_none_match, "If-None-Match")
    if tags is not None and ("*" in tags or row.sha256 in tags):
        return DownloadPlan(304, whole(row.size))
    if range_header is not None and if_range is not None and if_range.strip() != quote_etag(row.sha256):
        # Only the ETag: Last-Modified is to the second, so two versions written in one second
        # share it, and a range of the new one would be spliced onto the old one's bytes
        # (RFC 9110 section 13.1.5: a date is a weak validator here). A date gets the whole file.
        range_header = None
    byte_range = parse_range(range_header, row.size)
    if byte_range is None:
        return DownloadPlan(200, whole(row.size))
    return DownloadPlan(206, byte_range)


@dataclass(frozen=True)
class FileListPage:
    rows: list[FileRow]
    next_cursor: str | None


class _HasBlob(Protocol):
    @property
    def blob_id(self) -> str: ...


_Stored = TypeVar("_Stored", bound=_HasBlob)
_T = TypeVar("_T")


class FilesService:
    """Files of every namespace, in the metadata database."""

    def __init__(
        self, engine: AsyncEngine, backend: FilesBackend, settings: Settings, objects: S3Objects | None = None,
        inline: Callable[[], InlineConnection | None] = lambda: None, queue: WriteQueue | None = None,
    ) -> None:
        self.repo = FilesRepository(backend, fixed_statements(engine.dialect.name))
        self._backend = backend
        self._engine = engine
        self._inline_statements = inline  # the metadata database's (SQLite), if any
        self._driver_reads = settings.fast_paths.one_statement  # a download's first read on the driver path
        self._queue = queue  # the metadata database's write queue (SQLite), if any
        self._write_engine = engine.execution_options(**backend.write_options())
        self._snapshot_engine = engine.execution_options(**backend.snapshot_options())
        self.chunk_bytes = settings.limits.file_chunk_bytes
        self.max_file_bytes = settings.limits.max_file_bytes
        self.stale_after = timedelta(seconds=settings.files.upload_stale_seconds)
        pool = settings.databases.metadata
        total = settings.files.max_downloads or (pool.pool_size + pool.max_overflow) // 2
        self.downloads = Slots("downloads", total, settings.files.max_downloads_per_namespace or total // 2)
        self.send_timeout = settings.limits.send_idle_timeout_seconds
        self.download_snapshot_seconds = settings.files.download_snapshot_seconds
        self.splice_downloads = settings.files.s3.splice_downloads
        self._inline = frozenset(t.strip().lower() for t in settings.files.inline_types)
        self._inline_by_namespace = {
            ns: self._inline | {t.strip().lower() for t in types}
            for ns, types in settings.files.inline_types_by_namespace.items()
        }
        local = LocalFiles(settings.files_directory(), fsync=settings.files.directory.fsync)
        s3_pool = settings.files.s3.max_connections  # the download pool's connections
        bucket_downloads = Slots("downloads from the bucket", s3_pool, settings.files.max_downloads_per_namespace or s3_pool // 2)
        self.blobs = BlobStore(
            self.repo, self.write, self.chunk_bytes, objects, settings.files_backend(), local, bucket_downloads
        )
        self.presign_seconds = settings.files.s3.presign_seconds if settings.files.s3.presign_downloads else 0

    def inline_types(self, namespace: str) -> frozenset[str]:
        """What ``namespace`` serves inline besides the safe types (``files.inline_types*``)."""
        return self._inline_by_namespace.get(namespace, self._inline)

    async def inline_transaction(self, body: Callable[[Execute], _T]) -> _T | None:
        """``body`` as one transaction on the loop's thread (SQLite:
        ``InlineStatements.transaction_soon``), or None: it must run through ``write``."""
        inline = self._inline_statements()
        return await inline.reader.transaction_soon(body) if inline is not None else None

    @asynccontextmanager
    async def write(self, *, chunks: bool = False) -> AsyncIterator[AsyncConnection]:
        """One short write transaction (``chunks``: one that only stores chunks of an upload), on
        SQLite in its turn of the database's write queue (``app.fairness.writequeue``)."""
        async with self._queue.held() if self._queue is not None else nullcontext():
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
    async def new_blob(self, namespace: str) -> AsyncIterator[BlobWriter]:
        """A writer whose pieces are dropped unless it commits."""
        writer = BlobWriter(self, namespace)
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
        async with self.new_blob(namespace) as writer:
            async for piece in body:
                await writer.write(piece)
            return await writer.commit(namespace, collection, file_id, content_type, conditions)

    async def move(self, namespace: str, collection: str, source: FileRow) -> bool:
        """Copy one file version to the configured backend and swap it in; False if the file
        changed or vanished meanwhile (reads of it go on from the source until the swap; one of
        database chunks still running ``files.download_snapshot_seconds`` after it began is
        then cut off, as when the file is replaced)."""
        try:
            reader = await self.open(namespace, collection, source.file_id)
        except NotFound:
            return False
        try:
            if reader.row.blob_id != source.blob_id:
                return False
            span = whole(source.size)
            try:
                await reader.start(span)
            except ObjectMissing:  # replaced meanwhile; its old object is gone
                return False
            async with self.new_blob(namespace) as writer:
                writer.max_bytes = max(writer.max_bytes, source.size)  # stored under an older limit
                try:
                    async for piece in reader.iter_bytes(span):
                        await writer.write(piece)
                except VersionGone:  # a copy that outlasted its snapshot; the file changed meanwhile
                    return False
                await reader.close()
                return await writer.commit_move(namespace, collection, source)
        finally:
            await reader.close()

    # --- reads -------------------------------------------------------------------------

    async def get(self, namespace: str, collection: str, file_id: str) -> FileRow | None:
        async with self._engine.connect() as conn:
            return await self.repo.get(conn, namespace, collection, file_id)

    async def open(self, namespace: str, collection: str, file_id: str) -> BlobReader:
        """A reader of ``file_id`` as it is now; the caller must ``close()`` it. 404 if missing.

        The row is read in one fixed statement, with the bytes when they are one chunk in the
        database (most files, at the default 1 MiB), with ``fast_paths.one_statement`` sent with
        the driver outside any transaction (``app.core.fast.fixed_statements``): such a file, and
        an object in S3 (immutable), need no connection once it is read. A file of several chunks is read again, with its
        chunks, from a snapshot transaction kept open until ``close``. When new files go to a
        local directory, the row alone is read, on SQLite on the loop's thread
        (``app.core.fast.inline_sqlite``), since most files then have no chunk to read.
        """
        inline = self._inline_statements() if self.blobs.backend == "directory" else None
        if inline is not None:  # SQLite, files outside the database: the row alone, on the loop's thread
            try:
                found = await self.repo.get_without_chunk(inline, namespace, collection, file_id)
            finally:
                if (borrowed := inline.pooled_if_borrowed()) is not None:
                    with anyio.CancelScope(shield=True):
                        await give_back(borrowed)
        elif self._driver_reads:
            raw = await borrow_driver_connection(self._engine)
            try:
                found = await self.repo.get_with_only_chunk(raw, namespace, collection, file_id)
            finally:
                with anyio.CancelScope(shield=True):
                    await give_back(raw)
        else:
            async with self._engine.connect() as conn:
                found = await self.repo.get_with_only_chunk(conn, namespace, collection, file_id)
        if found is None:
            raise NotFound(f"file {file_id!r} does not exist in collection {collection!r}")
        row, only_chunk = found
        if row.object_key is not None:
            return self.blobs.reader(namespace, row)
        if only_chunk is not None or row.size == 0:
            return BytesReader(row, only_chunk or b"")
        conn = await self._snapshot_engine.connect()
        try:
            await conn.begin()
            # Read again in the snapshot the chunks come from: it may have changed meanwhile.
            found = await self.repo.get_with_only_chunk(conn, namespace, collection, file_id)
            if found is None:
                raise NotFound(f"file {file_id!r} does not exist in collection {collection!r}")
            row, only_chunk = found
            if row.object_key is None and (only_chunk is not None or row.size == 0):
                with anyio.CancelScope(shield=True):
                    await conn.close()
                return BytesReader(row, only_chunk or b"")
            if row.object_key is None:
                # It holds this connection while its client reads: only a bounded share of the pool.
                return ChunkReader(conn, self.repo, row, self.downloads.take(namespace), self._engine.connect,
                                   self.download_snapshot_seconds)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await conn.close()
            raise
        with anyio.CancelScope(shield=True):
            await conn.close()
        return self.blobs.reader(namespace, row)

    async def open_range(
        self, namespace: str, collection: str, file_id: str, plan: Callable[[FileRow], DownloadPlan],
        *, splice: bool = False,
    ) -> tuple[BlobReader, DownloadPlan]:
        """``open`` and start reading the range ``plan`` picks, before any header is sent.

        ``splice``: the response can splice a body from a socket (``files.s3.splice_downloads``
        permitting, an S3 reader may then leave a large range on one: ``ObjectReader``).

        An object deleted between reading its row and the GET belongs to a version replaced
        meanwhile: the row is read again (the new version is sent, or 404 once deleted).
        """
        for _attempt in range(3):
            reader = await self.open(namespace, collection, file_id)
            try:
                chosen = plan(reader.row)
                if chosen.status != 304 and not self.presigns(reader.row):
                    await reader.start(chosen.byte_range, splice=splice and self.splice_downloads)
                return reader, chosen
            except ObjectMissing:
                await reader.close()
            except BaseException:
                await reader.close()
                raise
        # Either replaced three times over meanwhile, or its object (or local file) is missing.
        log.warning("file %r in %s/%s: its bytes were missing in every attempt to read them", file_id, namespace, collection)
        raise ServiceUnavailable("the file changed during every attempt to read it; retry")

    async def readiness(self) -> StorageStatus:
        """Where new file bytes go, and whether the bucket answers (s3) or the directory is
        writable (directory). ``location`` and ``error`` name the bucket or a path; ``public_error``
        names neither (``/readyz`` shows only that to a caller without the admin key)."""
        objects = self.blobs.objects
        if self.blobs.backend == "directory":
            local = self.blobs.local
            error = await anyio.to_thread.run_sync(local.writable)
            return StorageStatus(backend="directory", reachable=error is None, location=str(local.root), error=error,
                                 public_error=None if error is None else "the files directory is not writable")
        if self.blobs.backend != "s3" or objects is None:
            return StorageStatus(backend="database", reachable=True)
        try:
            await asyncio.wait_for(objects.check(), objects.settings.connect_timeout)
        except Exception as exc:  # noqa: BLE001 - report, never raise
            if isinstance(exc, ObjectStoreUnavailable):
                error, public = exc.detail, exc.reason
            else:  # the check's timeout, or an error the client did not translate
                error, public = exc.__class__.__name__, "the object store is unreachable"
            return StorageStatus(backend="s3", reachable=False, location=objects.bucket, error=error,
                                 public_error=public)
        return StorageStatus(backend="s3", reachable=True, location=objects.bucket)

    def presigns(self, row: FileRow) -> bool:
        return bool(self.presign_seconds) and self.blobs.in_bucket(row)

    async def presigned_url(self, row: FileRow) -> str | None:
        """A short-lived direct URL to the object, when presigned downloads are on."""
        if not self.presigns(row) or row.object_key is None:
            return None
        return await self.blobs.require_objects().presign(row.object_key, self.presign_seconds, row.content_type)

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
                await self.repo.drop_chunks_of(conn, current)
        if current is not None:
            await self.blobs.drop_object(current)

    async def sweep(self) -> int:
        """Everything abandoned uploads left behind, in the database and the bucket; how many."""
        swept = await self._sweep_uploads()
        if self.blobs.objects is not None:
            swept += await self._sweep_objects(self.blobs.objects)
        swept += await self._sweep_local(self.blobs.local)
        return swept

    async def _sweep_local(self, local: LocalFiles) -> int:
        """Remove local files (whole or ``.part``) that no row and no upload in progress holds,
        once older than ``stale_after``; the directory is listed in a worker thread, a page at a time."""
        cutoff = utcnow() - self.stale_after
        swept = 0
        pages = local.listed()
        while (page := await anyio.to_thread.run_sync(next, pages, None)) is not None:
            for listed in await self._stale_unknown(page, cutoff, lambda f: f.modified):
                await anyio.to_thread.run_sync(local.remove, listed.path)
                swept += 1
        return swept

    async def _sweep_objects(self, objects: S3Objects) -> int:
        """Abort multipart uploads and delete objects that no row and no upload in progress
        holds, once older than ``stale_after`` (so an upload about to commit is never touched)."""
        cutoff = utcnow() - self.stale_after
        swept = 0
        async for uploads in objects.uploads():
            for upload in await self._stale_unknown(uploads, cutoff, lambda u: u.initiated):
                await objects.abort_upload(upload.key, upload.upload_id)
                swept += 1
        async for listed in objects.objects():
            for obj in await self._stale_unknown(listed, cutoff, lambda o: o.modified):
                await objects.delete(obj.key)
                swept += 1
        return swept

    async def _stale_unknown(
        self, page: Sequence[_Stored], cutoff: datetime, when: Callable[[_Stored], datetime]
    ) -> builtins.list[_Stored]:
        """Those of ``page`` (objects, multipart uploads, local files) older than ``cutoff`` by
        ``when`` that no file row and no upload in progress holds."""
        old = [item for item in page if when(item) < cutoff]
        known = await self._known([item.blob_id for item in old])
        return [item for item in old if item.blob_id not in known]

    async def _known(self, blob_ids: builtins.list[str]) -> set[str]:
        if not blob_ids:
            return set()
        async with self._engine.connect() as conn:
            return await self.repo.known_blobs(conn, blob_ids)

    async def _sweep_uploads(self) -> int:
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

