"""WAL checkpoints of the SQLite files in the background, so that no commit runs one.

The pool's connections never checkpoint when they commit (``wal_autocheckpoint=0``, set by
``app.core.db.databases``). SQLite's default made the commit that crossed 1,000 pages copy the
WAL into the database and fsync it before it returned: after a thread copy that held a read
snapshot for seconds, a small write of another namespace paid for the 240 MiB that had waited
(9 s, issue 44). Instead, while the app runs, every ``CHECKPOINT_SECONDS`` each SQLite file whose
WAL was written to since the last look gets a PASSIVE checkpoint on a pooled connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from app.core.capability import cancel_and_wait, stop_if_cancelled
from app.core.config import Database
from app.core.db.databases import Databases
from app.core.fast.one_statement import checkpoint_wal

log = logging.getLogger("app.databases")

CHECKPOINT_SECONDS = 0.1
"""How often the WAL of each SQLite file is looked at, and checkpointed when it was written to."""


@asynccontextmanager
async def checkpointing(databases: Databases) -> AsyncIterator[None]:
    """While the block runs: the WAL of each of ``databases``' SQLite files kept checkpointed."""
    tasks = [
        asyncio.get_running_loop().create_task(_keep_checkpointed(databases, db, path), name=f"checkpoints-{db.value}")
        for db in Database if (path := databases.sqlite_file(db)) is not None
    ]
    try:
        yield
    finally:
        await cancel_and_wait(*tasks)


async def _keep_checkpointed(databases: Databases, db: Database, path: Path) -> None:
    wal = path.with_name(path.name + "-wal")
    seen: tuple[int, int] | None = None
    while True:
        await asyncio.sleep(CHECKPOINT_SECONDS)
        try:
            stat = os.stat(wal)
        except FileNotFoundError:
            continue
        if (stat.st_mtime_ns, stat.st_size) == seen:
            continue
        seen = (stat.st_mtime_ns, stat.st_size)
        try:
            await checkpoint_wal(databases.engine(db), db)
        except Exception as exc:  # noqa: BLE001 (a full disk, a busy pool: the next look tries again)
            stop_if_cancelled()
            log.warning("WAL checkpoint of %s failed: %s", db.value, exc)
