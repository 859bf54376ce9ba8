"""Where a file version's bytes go and come from: database chunks, an S3 object or a local file.

The one place the three files backends differ. ``BlobStore`` makes sinks for new versions and
readers for stored ones; the service keeps the rules (hashing, limits, conditions, the swap).

A sink receives an upload in pieces of ``chunk_bytes`` (a chunk, or a multipart part), each
stored as it comes with a heartbeat in ``file_uploads`` so the sweeper knows the upload is alive:

- ``store(seq, piece)``: one full piece, while the next one arrives;
- ``finish(tail)``: before the swap transaction (S3: the last part, then complete the object;
  a local file: the last piece, flushed and renamed);
- ``finish_in(conn, tail)``: inside it (database: the last chunk commits with the swap);
- ``abort()``: drop whatever was stored (shielded by the caller).

A reader is opened from a committed row; ``start(range)`` happens before any header is sent (so
an unreachable bucket is still a 503), ``iter_bytes`` streams, ``close`` always runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Protocol

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.errors import Conflict
from app.fairness.slots import Slot, Slots
from app.files.local import LocalFiles, is_local_key
from app.files.ranges import ByteRange
from app.files.repository import FileRow, FilesRepository
from app.files.s3 import ObjectBody, ObjectMissing, S3Objects, SocketBody

log = logging.getLogger("app.files")

# A smaller range is copied through aiohttp: its GET reuses a pooled connection, where a spliced
# one opens its own, and it is over before splicing would pay (docs/benchmarks.md).
SPLICE_MIN_BYTES = 4 * 1024 * 1024

WriteTxn = Callable[..., AbstractAsyncContextManager[AsyncConnection]]


class UploadAbandoned(Conflict):
    """The sweeper discarded this upload because it stalled for too long."""

    code = "upload_abandoned"


def utcnow() -> datetime:
    return datetime.now(UTC)


class Heartbeat:
    """The ``file_uploads`` row of one upload: created with its first stored piece, then touched."""

    def __init__(self, repo: FilesRepository, blob_id: str) -> None:
        self._repo = repo
        self.blob_id = blob_id
        self.started = False

    async def beat(self, conn: AsyncConnection) -> None:
        now = utcnow()
        if not self.started:
            self.started = True  # set first: if the insert commits, abort() must see it
            await self._repo.start_upload(conn, self.blob_id, now)
        elif not await self._repo.touch_upload(conn, self.blob_id, now):
            raise UploadAbandoned("the upload stalled and was discarded; send it again")


class BlobSink(Protocol):
    blob_id: str
    object_key: str | None
    chunk_bytes: int
    heartbeat: Heartbeat

    async def store(self, seq: int, piece: bytes) -> None: ...

    async def keep_alive(self) -> None: ...

    async def finish(self, tail: bytes, pieces: int) -> None: ...

    async def finish_in(self, conn: AsyncConnection, tail: bytes, pieces: int) -> None: ...

    async def abort(self) -> None: ...


class BlobReader(Protocol):
    row: FileRow
    in_memory: bool  # every byte is already read and nothing is held (no connection, slot, GET)
    # ``start(splice=True)`` may leave the range on a socket instead, for the response to splice
    socket_body: SocketBody | None

    async def start(self, byte_range: ByteRange, *, splice: bool = False) -> None: ...

    def iter_bytes(self, byte_range: ByteRange) -> AsyncIterator[bytes]: ...

    async def close(self) -> None: ...


# --- chunks in the metadata database --------------------------------------------------------


class _Sink:
    """What every sink keeps: its blob, where its bytes go (``object_key``: a bucket's key or a
    local file's; None: chunks in the database), the piece size and the upload's heartbeat."""

    def __init__(
        self, repo: FilesRepository, write: WriteTxn, blob_id: str, chunk_bytes: int, key: str | None = None
    ) -> None:
        self._repo = repo
        self._write = write
        self.blob_id = blob_id
        self.object_key = key
        self.chunk_bytes = chunk_bytes
        self.heartbeat = Heartbeat(repo, blob_id)

    async def _beat(self) -> None:
        async with self._write() as conn:
            await self.heartbeat.beat(conn)

    async def keep_alive(self) -> None:
        """Touch the heartbeat of an upload that has stored a piece: its body is still arriving,
        slower than a piece per ``files.upload_stale_seconds`` but within the body's rate."""
        if self.heartbeat.started:
            await self._beat()


class ChunkSink(_Sink):

    async def store(self, seq: int, piece: bytes) -> None:
        async with self._write(chunks=True) as conn:
            await self.heartbeat.beat(conn)
            await self._repo.add_chunk(conn, self.blob_id, seq, piece)

    async def finish(self, tail: bytes, pieces: int) -> None:
        pass  # the tail commits with the swap

    async def finish_in(self, conn: AsyncConnection, tail: bytes, pieces: int) -> None:
        if tail:
            await self._repo.add_chunk(conn, self.blob_id, pieces, tail)

    async def abort(self) -> None:
        if not self.heartbeat.started:
            return
        async with self._write() as conn:
            await self._repo.drop_blob(conn, self.blob_id)
            await self._repo.end_upload(conn, self.blob_id)


class BytesReader:
    """A file whose bytes are already read (one chunk, or none): no connection, no slot."""

    in_memory = True
    socket_body: SocketBody | None = None

    def __init__(self, row: FileRow, data: bytes) -> None:
        self.row = row
        self._data = data

    async def start(self, byte_range: ByteRange, *, splice: bool = False) -> None:
        pass

    async def iter_bytes(self, byte_range: ByteRange) -> AsyncIterator[bytes]:
        if byte_range.length <= 0:
            return
        if len(self._data) != self.row.size:  # never let a short chunk pass as the whole file
            raise RuntimeError(f"blob {self.row.blob_id} holds {len(self._data)} of {self.row.size} bytes")
        whole = byte_range.start == 0 and byte_range.end == len(self._data) - 1
        yield self._data if whole else self._data[byte_range.start:byte_range.end + 1]

    async def close(self) -> None:
        pass


class VersionGone(Exception):
    """The version a download was sending lost its bytes (replaced or deleted) after the download
    let its snapshot go: the response is cut off short, never finished with another version's."""


class ChunkReader:
    """A file row and its chunks, holding a download slot (``app.fairness.slots``) until closed.

    The chunks are read in one snapshot transaction, on a connection of its own, for at most
    ``snapshot_seconds``: a replace or delete meanwhile does not change what is sent. A download
    still running then lets the snapshot (and its connection) go, on time even while its client
    is slow to take a chunk already read, and reads each further chunk in a short read of its
    own: a version's chunks never change under its blob id, so such a read returns the same
    bytes, or none once the version was replaced or deleted (the download is then cut off:
    ``VersionGone``). A slow client so holds back neither PostgreSQL's VACUUM nor SQLite's WAL
    checkpoints for longer than that, nor a pooled connection while it reads. The snapshot also
    goes as soon as the range's last chunk is read, before that chunk is sent.
    """

    in_memory = False
    socket_body: SocketBody | None = None

    def __init__(
        self, conn: AsyncConnection, repo: FilesRepository, row: FileRow, slot: Slot,
        reads: Callable[[], AbstractAsyncContextManager[AsyncConnection]], snapshot_seconds: float,
    ) -> None:
        self._conn: AsyncConnection | None = conn
        self._repo = repo
        self.row = row
        self._slot = slot
        self._reads = reads
        self._expired = False  # the snapshot's time is up (``_on_time``)
        self._reading = False
        # On time even while the client is slow to take a chunk already read (the next check
        # would come only when the next chunk is read: up to a whole chunk's send time later).
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(snapshot_seconds, self._on_time)
        self._letting_go: asyncio.Task[None] | None = None

    async def start(self, byte_range: ByteRange, *, splice: bool = False) -> None:
        pass

    async def iter_bytes(self, byte_range: ByteRange) -> AsyncIterator[bytes]:
        """The bytes of ``byte_range``, one chunk fetched at a time."""
        if byte_range.length <= 0:
            return
        size = self.row.chunk_bytes
        first, last = byte_range.start // size, byte_range.end // size
        for seq in range(first, last + 1):
            data = await self._chunk(seq)
            if seq == last:  # all read: the snapshot and its connection are not needed while it is sent
                await self._let_snapshot_go()
            lo = byte_range.start - seq * size if seq == first else 0
            hi = byte_range.end - seq * size + 1 if seq == last else len(data)
            yield data if lo == 0 and hi == len(data) else data[lo:hi]

    async def _chunk(self, seq: int) -> bytes:
        if self._expired:
            await self._let_snapshot_go()
        if self._conn is not None:
            self._reading = True
            try:
                data = await self._repo.chunk(self._conn, self.row.blob_id, seq)
            finally:
                self._reading = False
            if data is None:  # impossible inside the snapshot; never send a mix
                raise RuntimeError(f"blob {self.row.blob_id} lacks chunk {seq}")
            return data
        async with self._reads() as conn:
            data = await self._repo.chunk(conn, self.row.blob_id, seq)
        if data is None:
            raise VersionGone(f"blob {self.row.blob_id} lost chunk {seq} during a download")
        return data

    def _on_time(self) -> None:
        """The snapshot's time is up: let it go now unless a chunk is being read from it (that
        read's caller lets it go before the next one)."""
        self._expired = True
        if self._conn is not None and not self._reading:
            self._letting_go = asyncio.get_running_loop().create_task(self._let_snapshot_go())

    async def _let_snapshot_go(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()

    async def close(self) -> None:
        self._timer.cancel()
        self._slot.release()
        await self._let_snapshot_go()
        if self._letting_go is not None:
            with anyio.CancelScope(shield=True):
                await self._letting_go


# --- objects in an S3 bucket ------------------------------------------------------------------


class _SinkOutside(_Sink):
    """What the sinks of bytes outside the database share: the key of the version's bytes, and the
    ``file_uploads`` heartbeat kept in short transactions of its own (no connection held during I/O)."""

    @property
    def key(self) -> str:
        assert self.object_key is not None
        return self.object_key

    async def _forget_upload(self) -> None:
        if self.heartbeat.started:
            async with self._write() as conn:
                await self._repo.end_upload(conn, self.blob_id)


class ObjectSink(_SinkOutside):
    """A multipart upload, started with the first full part; a small file is one PutObject.

    The ``file_uploads`` heartbeat row exists before the multipart upload does, so the sweep
    never aborts an upload in progress.
    """

    def __init__(
        self, objects: S3Objects, repo: FilesRepository, write: WriteTxn, namespace: str, blob_id: str
    ) -> None:
        super().__init__(repo, write, blob_id, objects.settings.part_bytes, objects.key_for(namespace, blob_id))
        self._objects = objects
        self._upload_id: str | None = None
        self._etags: list[str] = []
        self._completed = False

    async def store(self, seq: int, piece: bytes) -> None:
        await self._beat()
        try:
            if self._upload_id is None:
                self._upload_id = await self._objects.create_upload(self.key)
            self._etags.append(await self._objects.upload_part(self.key, self._upload_id, seq + 1, piece))
        except ObjectMissing:
            raise UploadAbandoned("the upload stalled and was discarded; send it again") from None

    async def finish(self, tail: bytes, pieces: int) -> None:
        try:
            if self._upload_id is None:
                await self._objects.put(self.key, tail)
            else:
                if tail:
                    self._etags.append(
                        await self._objects.upload_part(self.key, self._upload_id, pieces + 1, tail)
                    )
                await self._objects.complete_upload(self.key, self._upload_id, self._etags)
        except ObjectMissing:  # the sweep aborted a multipart upload that stalled
            raise UploadAbandoned("the upload stalled and was discarded; send it again") from None
        self._completed = True

    async def finish_in(self, conn: AsyncConnection, tail: bytes, pieces: int) -> None:
        pass

    async def abort(self) -> None:
        try:
            if self._upload_id is not None and not self._completed:
                await self._objects.abort_upload(self.key, self._upload_id)
            if self._completed:
                await self._objects.delete(self.key)
        finally:
            await self._forget_upload()


class ObjectReader:
    """A committed row and a ranged GET of its object; no database connection is held.

    With ``start(splice=True)`` a range of ``SPLICE_MIN_BYTES`` or more is fetched on a socket of
    its own (``socket_body``), for the response to splice to the client (``app.core.http.splice``);
    when that GET cannot be made so, it is made as usual.
    """

    in_memory = False

    def __init__(self, objects: S3Objects, row: FileRow, slot: Slot) -> None:
        self._objects = objects
        self.row = row
        self._slot = slot  # one of the download pool's connections (``BlobStore.bucket_downloads``)
        self._body: ObjectBody | None = None
        self.socket_body: SocketBody | None = None

    async def start(self, byte_range: ByteRange, *, splice: bool = False) -> None:
        if byte_range.length > 0:
            key = self.row.object_key
            assert key is not None
            if splice and byte_range.length >= SPLICE_MIN_BYTES:
                self.socket_body = await self._objects.get_socket(key, byte_range.start, byte_range.end)
                if self.socket_body is not None:
                    return
            self._body = await self._objects.get(key, byte_range.start, byte_range.end)

    async def iter_bytes(self, byte_range: ByteRange) -> AsyncIterator[bytes]:
        """The GET's bytes as they arrive.

        No task or queue of its own reads ahead: aiohttp does, in its protocol callbacks, while
        the response waits for the client's socket to drain (``ObjectBody``: bounded to
        ``2 * READ_BUFFER_BYTES`` unread, then the S3 socket is paused).
        """
        if self._body is None:
            return
        sent = 0
        async for piece in self._body.chunks():
            sent += len(piece)
            yield piece
        if sent != byte_range.length:  # never let a short object pass as the whole range
            raise RuntimeError(f"object {self.row.object_key} ended after {sent} of {byte_range.length} bytes")

    async def close(self) -> None:
        try:
            if self._body is not None:
                self._body.close()
                self._body = None
            if self.socket_body is not None:
                self.socket_body.close()
                self.socket_body = None
        finally:
            self._slot.release()


# --- files in a local directory ---------------------------------------------------------------


class FileSink(_SinkOutside):
    """A ``.part`` file written piece by piece, flushed and renamed when whole (``app.files.local``).

    As for S3, the ``file_uploads`` heartbeat row exists before the first piece is written, so the
    sweep never removes an upload in progress; a file of one piece is written by ``finish`` in one
    thread hop, and swept, if its row never commits, once older than the stale age.
    """

    def __init__(
        self, local: LocalFiles, repo: FilesRepository, write: WriteTxn, namespace: str, blob_id: str,
        chunk_bytes: int,
    ) -> None:
        super().__init__(repo, write, blob_id, chunk_bytes, local.key_for(namespace, blob_id))
        self._local = local
        self._fd: int | None = None
        self._written = False  # a .part or the file may exist

    async def store(self, seq: int, piece: bytes) -> None:
        await self._beat()
        self._written = True
        if self._fd is None:
            self._fd = await anyio.to_thread.run_sync(self._local.open_part, self.key)
        await anyio.to_thread.run_sync(self._local.append, self._fd, piece)

    async def finish(self, tail: bytes, pieces: int) -> None:
        self._written = True
        fd, self._fd = self._fd, None
        await anyio.to_thread.run_sync(self._local.finish, self.key, tail, fd)

    async def finish_in(self, conn: AsyncConnection, tail: bytes, pieces: int) -> None:
        pass

    async def abort(self) -> None:
        try:
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)
            if self._written:
                await anyio.to_thread.run_sync(self._local.discard, self.key)
        finally:
            await self._forget_upload()


class FileReader:
    """A committed row and its local file; no database connection is held.

    A range of at most ``SMALL_READ_BYTES`` is read whole when the download starts (one thread
    hop: open, read, close), and then sent as it is (``in_memory``); a larger one keeps the file
    open and reads a piece at a time. A file removed after its row was read (its version was
    replaced) is ``ObjectMissing``, which makes the service read the row again.
    """

    SMALL_READ_BYTES = 1024 * 1024

    def __init__(self, local: LocalFiles, row: FileRow) -> None:
        self._local = local
        self.row = row
        self.in_memory = False
        self.socket_body: SocketBody | None = None
        self._data: bytes | None = None
        self._fd: int | None = None

    @property
    def key(self) -> str:
        assert self.row.object_key is not None
        return self.row.object_key

    async def start(self, byte_range: ByteRange, *, splice: bool = False) -> None:
        if byte_range.length <= 0:
            return
        if byte_range.length <= self.SMALL_READ_BYTES:
            self._data = await anyio.to_thread.run_sync(
                self._local.read_range, self.key, byte_range.start, byte_range.length
            )
            self.in_memory = True
        else:
            self._fd = await anyio.to_thread.run_sync(self._local.open_read, self.key)

    async def iter_bytes(self, byte_range: ByteRange) -> AsyncIterator[bytes]:
        if self._data is not None:
            yield self._data
            return
        if self._fd is None:
            return
        offset, end = byte_range.start, byte_range.end + 1
        while offset < end:
            length = min(self.SMALL_READ_BYTES, end - offset)
            yield await anyio.to_thread.run_sync(self._local.read, self._fd, offset, length)
            offset += length

    async def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class BlobStore:
    """Makes sinks for new versions (on the configured backend) and readers for stored ones."""

    def __init__(
        self, repo: FilesRepository, write: WriteTxn, chunk_bytes: int, objects: S3Objects | None,
        backend: str, local: LocalFiles, bucket_downloads: Slots,
    ) -> None:
        self.bucket_downloads = bucket_downloads
        self._repo = repo
        self._write = write
        self._chunk_bytes = chunk_bytes
        self.objects = objects
        self.backend = backend
        self.local = local

    def sink(self, namespace: str, blob_id: str) -> BlobSink:
        if self.backend == "s3":
            return ObjectSink(self.require_objects(), self._repo, self._write, namespace, blob_id)
        if self.backend == "directory":
            return FileSink(self.local, self._repo, self._write, namespace, blob_id, self._chunk_bytes)
        return ChunkSink(self._repo, self._write, blob_id, self._chunk_bytes)

    def reader(self, namespace: str, row: FileRow) -> BlobReader:
        """The reader of a row whose bytes are outside the database (``object_key`` set). A GET
        from the bucket holds one of the download pool's connections for as long as its client
        reads (a slow one: a piece each ``send_idle_timeout_seconds``), so it takes a slot of
        ``bucket_downloads`` (503 past it): otherwise slow readers of one namespace filled the
        pool, and every other download waited for a connection without a deadline."""
        if is_local_key(row.object_key):
            return FileReader(self.local, row)
        return ObjectReader(self.require_objects(), row, self.bucket_downloads.take(namespace))

    @staticmethod
    def in_bucket(row: FileRow) -> bool:
        return row.object_key is not None and not is_local_key(row.object_key)

    def require_objects(self) -> S3Objects:
        if self.objects is None:
            from app.files.s3 import ObjectStoreUnavailable

            raise ObjectStoreUnavailable("this file's bytes are in S3 but files.s3 is not configured")
        return self.objects

    async def drop_object(self, row: FileRow) -> None:
        """Delete the object (or local file) of a version no row points at any more (best effort:
        the sweep retries)."""
        if is_local_key(row.object_key):
            assert row.object_key is not None
            try:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self.local.discard, row.object_key)
            except OSError:
                log.warning("could not delete file %s; the sweep will", row.object_key, exc_info=True)
            return
        if row.object_key is None or self.objects is None:
            return
        try:
            with anyio.CancelScope(shield=True):
                await self.objects.delete(row.object_key)
        except Exception:
            log.warning("could not delete object %s; the sweep will", row.object_key, exc_info=True)
