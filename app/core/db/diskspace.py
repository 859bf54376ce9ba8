"""A full disk: writes are 507, deletes still free space, ``/readyz`` says so.

Why deletes failed on a full disk (measured with SQLite 3.40 on a small tmpfs):

1. WAL wedges. Committed pages wait in the ``-wal`` file for a checkpoint that must grow the
   database file; with no byte left the checkpoint fails, the WAL cannot restart, and every later
   transaction, a DELETE included, fails with ``SQLITE_FULL``, as does ``PRAGMA wal_checkpoint``.
   No PRAGMA avoids that short of leaving WAL, so the gateway keeps room aside: a reserve file.
2. Debian builds SQLite with ``SQLITE_SECURE_DELETE``: every freed page is overwritten, so a
   DELETE writes as much WAL as it frees (deleting 12.5 MB wrote 15 MB). ``PRAGMA
   secure_delete=FAST`` (``app.core.db.databases``) stops that: the same delete then writes ~0.2 MB.
3. Freed pages stay inside the file (no auto-vacuum), so deleting never gave the filesystem
   space back. New databases are created with ``auto_vacuum=INCREMENTAL``; after a full disk the
   free pages are returned a megabyte at a time (``PRAGMA incremental_vacuum`` then a checkpoint,
   so the WAL never needs more than a step). Databases created before keep their free pages,
   which new rows reuse; the space counted below includes them.

What the gateway does:

- at start-up a reserve file of ``RESERVE_BYTES`` is written in each directory holding SQLite
  databases (``.storage-gateway-reserve``);
- the first disk-full error (SQLite's ``SQLITE_FULL``, PostgreSQL's SQLSTATE 53100, ``ENOSPC``) is
  answered 507 ``insufficient_storage`` and releases the reserves, so the pending checkpoint and
  deletes have room;
- while the disk is full, writes are answered 507 before they touch a database, except those that
  free space (``DELETE``, and the trims, prunes and resets in ``FREEING_ENDPOINTS``); reads are
  served (POSTs too: ``@accepts(read_only=True)``, a search); ``/readyz`` answers 503 with the reason;
- every ``CHECK_SECONDS`` free pages are given back; once the fullest directory has twice the
  reserve available (free filesystem space plus free pages inside its databases) writes are
  accepted again and the reserve is written again if the filesystem has room for it.

On PostgreSQL the gateway cannot see the server's disk: a 53100 is a 507 and ``/readyz`` reports
the disk full for ``POSTGRES_FULL_SECONDS`` after the last one; nothing is refused up front.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from app.core.capability import cancel_and_wait
from app.core.config import Database
from app.core.db.databases import Databases
from app.core.errors import InsufficientStorage
from app.core.state import GatewayState

log = logging.getLogger("app.databases")

RESERVE_NAME = ".storage-gateway-reserve"
RESERVE_BYTES = 16 * 1024 * 1024
CHECK_SECONDS = 1.0  # how often a full disk is looked at again
POSTGRES_FULL_SECONDS = 10.0
# POST routes that only delete (the method DELETE always may run on a full disk).
FREEING_ENDPOINTS = frozenset({"trim_records", "delete_points", "reset_collection", "delete_runs", "prune"})
VACUUM_STEP_PAGES = 256  # pages moved per incremental_vacuum step (1 MiB of 4 KiB pages)
MAX_VACUUM_STEPS = 64  # per database and check
_WRITE = 1024 * 1024


@dataclass
class DiskSpace:
    """The disk-full state of one gateway process and the reserves it keeps."""

    databases: Databases
    reserve_bytes: int = RESERVE_BYTES
    directories: dict[Path, list[Database]] = field(default_factory=dict)
    full_reason: str | None = None
    postgres_full_at: float | None = None
    _watcher: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        for db in Database:
            path = self.databases.sqlite_file(db)
            if path is not None:
                self.directories.setdefault(path.resolve().parent, []).append(db)

    @property
    def full(self) -> bool:
        return self.full_reason is not None

    def reason(self) -> str | None:
        """Why the gateway is not ready for writes, or None."""
        if self.full_reason is not None:
            return self.full_reason
        if self.postgres_full_at is not None and time.monotonic() - self.postgres_full_at < POSTGRES_FULL_SECONDS:
            return "a PostgreSQL database reported a full disk (SQLSTATE 53100)"
        return None

    # --- the reserve ---------------------------------------------------------------------------

    def claim(self) -> None:
        """Write the reserve files that are missing (best effort: a disk already full has none)."""
        for directory in self.directories:
            path = directory / RESERVE_NAME
            try:
                if path.exists() and path.stat().st_size >= self.reserve_bytes:
                    continue
                _write_zeros(path, self.reserve_bytes)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    path.unlink()
                log.warning("cannot keep %d bytes in reserve in %s: %s", self.reserve_bytes, directory, exc.strerror)

    def release(self) -> bool:
        """Remove the reserve files; whether any space came back."""
        freed = False
        for directory in self.directories:
            with contextlib.suppress(FileNotFoundError):
                (directory / RESERVE_NAME).unlink()
                freed = True
        return freed

    # --- the state -----------------------------------------------------------------------------

    def on_disk_full(self, sqlite: bool) -> None:
        """A statement failed for lack of space (called by the error handler)."""
        if not sqlite or not self.directories:
            self.postgres_full_at = time.monotonic()
            return
        if self.full:
            return
        freed = self.release()
        self.full_reason = "the disk of the SQLite databases is full: writes are refused, deletes free space"
        log.error("disk full: %s; reserve released: %s", self.full_reason, freed, extra={"code": "insufficient_storage"})
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="disk-space")

    async def available(self) -> int:
        """Bytes the fullest SQLite directory can still take: free filesystem space plus free pages."""
        least: int | None = None
        for directory, dbs in self.directories.items():
            stats = os.statvfs(directory)
            room = stats.f_bavail * stats.f_frsize
            for db in dbs:
                async with self.databases.engine(db).connect() as conn:
                    pages = (await conn.execute(text("PRAGMA freelist_count"))).scalar_one()
                    page_size = (await conn.execute(text("PRAGMA page_size"))).scalar_one()
                room += int(pages) * int(page_size)
            least = room if least is None else min(least, room)
        return least or 0

    async def compact(self, db: Database) -> None:
        """Give ``db``'s free pages back to the filesystem, ``VACUUM_STEP_PAGES`` at a time."""
        async with self.databases.engine(db).connect() as conn:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection  # aiosqlite: executescript steps a PRAGMA to the end
            for _ in range(MAX_VACUUM_STEPS):
                cursor = await driver.execute("PRAGMA freelist_count")
                row = await cursor.fetchone()
                if not row or not row[0]:
                    break
                await driver.executescript(f"PRAGMA incremental_vacuum({VACUUM_STEP_PAGES})")
                await driver.execute("PRAGMA wal_checkpoint(PASSIVE)")

    async def _watch(self) -> None:
        while self.full:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                for dbs in self.directories.values():
                    for db in dbs:
                        await self.compact(db)
            except (SQLAlchemyError, sqlite3.Error, OSError) as exc:  # no room for a step yet
                log.debug("giving free pages back failed: %s", exc)
            try:
                room = await self.available()
            except (SQLAlchemyError, sqlite3.Error, OSError) as exc:  # still wedged: look again later
                log.debug("disk space check failed: %s", exc)
                continue
            if room >= 2 * self.reserve_bytes:
                self.full_reason = None
                await asyncio.to_thread(self.claim)
                log.warning("disk space is available again (%d bytes): writes are accepted", room)

    def check_write(self, request: Request) -> None:
        """507 for a write that needs space while the disk is full (deletes pass)."""
        if self.full_reason is None or request.method == "DELETE":
            return
        endpoint = request.scope.get("endpoint")
        if getattr(endpoint, "__name__", None) in FREEING_ENDPOINTS:
            return
        raise InsufficientStorage(f"{self.full_reason}; delete data to make room, or free disk space")

    async def close(self) -> None:
        if self._watcher is not None:
            await cancel_and_wait(self._watcher)


def _write_zeros(path: Path, size: int) -> None:
    """A file of ``size`` bytes that really holds its blocks (allocated, not sparse)."""
    with open(path, "wb") as out:
        try:
            os.posix_fallocate(out.fileno(), 0, size)
            return
        except (AttributeError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise
        block = bytes(_WRITE)  # a filesystem without fallocate: write the zeros
        written = 0
        while written < size:
            written += out.write(block[: min(_WRITE, size - written)])
        out.flush()
        os.fsync(out.fileno())


@contextlib.asynccontextmanager
async def keep_disk_space(state: GatewayState, databases: Databases) -> AsyncIterator[DiskSpace]:
    """The lifespan's part: the reserves written at start-up, kept on the app's state."""
    space = DiskSpace(databases)
    await asyncio.to_thread(space.claim)
    state.disk_space = space
    try:
        yield space
    finally:
        state.disk_space = None
        await space.close()

