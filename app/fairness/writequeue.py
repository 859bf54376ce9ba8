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

Heavy writes take turns after the single writes (``heavy``, ``app.fairness.fairshare``): a single
write about to wait for SQLite's lock says so (``wanting``: a count in this process and a shared
``flock`` on ``<database>-writewant`` that every process on the machine can see), and a heavy
turn begins only when no single write wants the lock (or once it has given way for
``yield_seconds``), one heavy turn at a time in a process, in order, then in the queue as above.
A single write then waits for at most the heavy turn in progress.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
from sqlalchemy.util import await_only


HEAVY_OPTION = "gateway_heavy"
"""An execution option: this connection's transactions are turns of a heavy write
(``app.fairness.fairshare``), which do not say they want the lock as single writes do."""
POLL_SECONDS = 0.001  # how often a heavy turn looks again whether a single write still wants the lock


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


class WriteQueue:
    def __init__(self, database: Path, wait_seconds: float) -> None:
        self.path = database.with_name(database.name + "-writelock")
        self.want_path = database.with_name(database.name + "-writewant")
        self._wait = wait_seconds
        self._turn = asyncio.Lock()
        self._heavy_turn = asyncio.Lock()
        self._fd: int | None = None
        self._want_fd: int | None = None  # shared-locked while a single write of this process wants the lock
        self._probe_fd: int | None = None  # tried exclusively by a heavy turn: fails while any process wants it
        self._wanting = 0
        self._shared = False
        self._heavy_done = asyncio.Event()  # set while no heavy turn of this process holds the lock
        self._heavy_done.set()

    def _locked(self) -> int:
        if self._fd is None:
            self._fd = _open(self.path)
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

    # --- single writes say they wait; heavy turns give way to them ---------------------------

    @contextmanager
    def wanting(self) -> Iterator[None]:
        """Around a single write's wait for SQLite's lock (``BEGIN IMMEDIATE``, or a statement
        that takes it): heavy turns do not begin meanwhile, in any process. Event-loop thread
        only (a count and a non-blocking ``flock``: microseconds)."""
        self._wanting += 1
        if not self._shared:
            try:
                if self._want_fd is None:
                    self._want_fd = _open(self.want_path)
                fcntl.flock(self._want_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                self._shared = True
            except OSError:  # a heavy turn is looking this very moment (or no file): this process's count still holds
                pass
        try:
            yield
        finally:
            self._wanting -= 1
            if not self._wanting and self._shared:
                self._shared = False
                assert self._want_fd is not None
                fcntl.flock(self._want_fd, fcntl.LOCK_UN)

    def begin_single(self, begin: Callable[[], object]) -> None:
        """A single write's ``BEGIN IMMEDIATE`` (``begin``, in SQLAlchemy's greenlet: the engine's
        begin hook), ``wanting`` the lock meanwhile; while a heavy turn of this process holds it,
        after that turn (``after_heavy_turn``)."""
        with self.wanting():
            if self.heavy_turn_on:
                await_only(self.after_heavy_turn())
            begin()

    def others_want(self) -> bool:
        """Whether a single write, in this process or another, waits for the lock now."""
        if self._wanting:
            return True
        try:
            if self._probe_fd is None:
                self._probe_fd = _open(self.want_path)
            fcntl.flock(self._probe_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        fcntl.flock(self._probe_fd, fcntl.LOCK_UN)
        return False

    @asynccontextmanager
    async def heavy(self, yield_seconds: float) -> AsyncIterator[None]:
        """One turn of a heavy write: after the heavy turns before it in this process, once no
        single write wants the lock (looked at every ``POLL_SECONDS``; for at most
        ``yield_seconds``, so that heavy writes still advance when single writes never stop),
        then in the queue (``held``). ``TimeoutError`` past ``wait_seconds`` of waiting."""
        with anyio.fail_after(self._wait):
            await self._heavy_turn.acquire()
        try:
            give_way_until = time.monotonic() + yield_seconds
            while True:
                # polled: another process's single write is seen only through its flock
                while self.others_want() and time.monotonic() < give_way_until:  # noqa: ASYNC110
                    await asyncio.sleep(POLL_SECONDS)
                async with self.held():
                    # the queue may have taken a while (another process's turn): look again
                    if not self.others_want() or time.monotonic() >= give_way_until:
                        self._heavy_done.clear()
                        try:
                            yield
                        finally:
                            self._heavy_done.set()
                        return
        finally:
            self._heavy_turn.release()

    @property
    def heavy_turn_on(self) -> bool:
        """Whether a heavy turn of this process holds the lock now."""
        return not self._heavy_done.is_set()

    async def after_heavy_turn(self) -> None:
        """Once the heavy turn of this process in progress, if any, has ended: a single write
        about to wait for the lock waits for this instead (woken when the turn commits, where
        SQLite's busy handler sleeps up to 100 ms between tries). At most ``wait_seconds``."""
        if not self._heavy_done.is_set():
            with anyio.move_on_after(self._wait):
                await self._heavy_done.wait()

    def close(self) -> None:
        for fd in (self._fd, self._want_fd, self._probe_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._want_fd = self._probe_fd = None
        self._shared = False
