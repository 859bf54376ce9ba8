"""A queue for SQLite write transactions that wakes the next writer instead of letting it sleep.

SQLite has one write lock per database file. A connection that finds it held waits in SQLite's
busy handler, which sleeps 1, 2, 5, 10, 15, 20, 25... ms between tries and does not wake when the
lock is freed: with two worker processes each swapping in 1 MiB uploads (a transaction of a few
short statements), most of the time went to those sleeps, and each process used about half a
core (``docs/benchmarks.md``, bench_peers upload at concurrency 16: 123 uploads/s).

``WriteQueue.held()`` orders the transactions that use it: first an ``asyncio.Lock`` (this
process's tasks, woken in turn by the event loop), then an exclusive ``flock`` on
``<database>-writelock`` (every process on the machine; taken in a worker thread, and woken by
the kernel the moment the holder lets go). Only then does the transaction begin. SQLite's own lock
stays the guard of the data: a writer that does not use the queue (another capability, another
program) still waits for it as before, so this changes only how long the queue's users wait.
Same run with the queue: 227 uploads/s.

Waiting for this process's turn is bounded by ``wait_seconds`` (then ``TimeoutError``, a 503 like
a busy SQLite); the ``flock`` is held by another process only for one short transaction.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio


class WriteQueue:
    def __init__(self, database: Path, wait_seconds: float) -> None:
        self.path = database.with_name(database.name + "-writelock")
        self._wait = wait_seconds
        self._turn = asyncio.Lock()
        self._fd: int | None = None

    def _locked(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self._fd

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        with anyio.fail_after(self._wait):
            await self._turn.acquire()
        try:
            # Not cancellable once asked (a worker thread): a cancelled request waits for the
            # lock, then lets it go at once.
            fd = await anyio.to_thread.run_sync(self._locked)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._turn.release()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
