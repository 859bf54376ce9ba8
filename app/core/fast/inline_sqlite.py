"""SQLite statements of one-statement requests on the event loop's own thread, within a time budget.

Each SQLite file has an ``InlineStatements``: two sqlite3 connections (one ``query_only`` for
reads, one for writes) used only from the loop's thread, so a statement skips aiosqlite's hand-off
to its thread and back. A ``@fast(one_statement=...)`` route on SQLite is handed an
``InlineConnection``, and a file's version swap can run as one inline transaction
(``transaction_soon``: its write lock held for its few statements only, never across an await).

The rules that keep the loop free and the answers the pool's:

- a statement that runs past ``inline_budget_ms`` is interrupted (a progress handler every
  ``CHECK_EVERY`` steps) and its SQL skips this path for its next ``SKIP_AFTER_OVER_BUDGET`` runs;
- a statement never waits for a lock (``busy_timeout`` 0), and the writer never checkpoints the
  WAL on the loop's thread (``wal_autocheckpoint`` 0; every ``CHECKPOINT_EVERY`` writes or
  ``CHECKPOINT_EVERY_BYTES`` it asks the pool for a PASSIVE checkpoint);
- any of these, and any other error, sends the statement again through the pool, where it runs
  as every other statement: only a statement that succeeds inline is answered from here, and a
  write interrupted after its autocommit counts as committed (its own ``changes()``).

Each outcome is counted (``gateway_sqlite_inline_reads``, ``_writes``). What it buys:
``docs/benchmarks.md``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, TypeVar, cast

from prometheus_client import Counter
from sqlalchemy.pool import PoolProxiedConnection

from app.core.db.sqlite import SQLITE, WRITER_PRAGMAS
from app.core.ops import metrics

log = logging.getLogger("app.db")

CHECK_EVERY = 1000
"""SQLite virtual-machine steps between two looks at the clock (a point read takes a few hundred)."""

SKIP_AFTER_OVER_BUDGET = 32
"""A statement that ran past its budget goes straight to the pool for its next this many runs
(the same SQL with other values, such as a large page, tends to run long again)."""

CHECKPOINT_EVERY = 200
"""Inline writes between two WAL checkpoints asked of the pool (a kv or record write adds a few
pages to the WAL; SQLite's own automatic checkpoint comes every 1,000 pages)..."""

CHECKPOINT_EVERY_BYTES = 4 * 1024 * 1024
"""... or sooner, once the values written inline add up to this (1,000 pages of 4 KiB): a burst
of large values (a 1 MiB kv value is one statement) does not grow the WAL far past SQLite's own
cadence."""

LOCK_TRIES = 4
"""Tries of an inline transaction that finds the write lock held (``transaction_soon``)."""

Row = Sequence[Any]


class LockHeld(Exception):
    """An inline transaction found SQLite's write lock held elsewhere (nothing was written)."""


Execute = Callable[[str, Sequence[Any]], Any]
"""A transaction body's way to run a statement: (SQL, arguments) -> the sqlite3 cursor."""
_T = TypeVar("_T")


def _outcomes(counter: Counter, database: str) -> dict[str, Counter]:
    """``counter``'s child for each outcome of a statement tried inline, on ``database``."""
    return {o: counter.labels(database=database, outcome=o) for o in ("inline", "over_budget", "skipped", "busy", "error")}


class InlineStatements:
    """sqlite3 connections to ``path`` for one-statement reads and writes on the event loop's
    thread (see the module)."""

    def __init__(
        self, path: Path, database: str, budget_seconds: float,
        checkpoint: Callable[[], None] | None = None,
    ) -> None:
        self._path = path
        self._budget = budget_seconds
        self._conn: Any = None
        self._writer: Any = None
        self._checkpoint = checkpoint
        self._writes = 0  # inline writes since the last checkpoint was asked for
        self._written = 0  # bytes of their text and blob values
        self._thread: int | None = None  # the loop's thread: the only one that may use it
        self._deadline = 0.0
        self._skip: dict[str, int] = {}  # SQL that ran past its budget -> runs left to send to the pool
        self._outcomes = _outcomes(metrics.SQLITE_INLINE_READS, database)
        self._write_outcomes = _outcomes(metrics.SQLITE_INLINE_WRITES, database)

    def _open(self, *, writes: bool) -> Any:
        # mode=rw: never create the file (the pool's connections do that, in WAL mode).
        conn = SQLITE.connect(
            f"{self._path.resolve().as_uri()}?mode=rw", uri=True, timeout=0, isolation_level=None,
            check_same_thread=False, cached_statements=256,
        )
        if writes:
            for pragma in WRITER_PRAGMAS:  # as the pool's connections
                conn.execute(pragma)
            # Never a checkpoint here: it would copy pages and fsync on the loop's thread.
            # CHECKPOINT_EVERY writes ask for one through the pool instead.
            conn.execute("PRAGMA wal_autocheckpoint=0")
        else:
            conn.execute("PRAGMA query_only=ON")
        conn.set_progress_handler(self._over_budget, CHECK_EVERY)
        return conn

    def _writing(self) -> Any:
        """The writing connection, opened on first use."""
        self._writer = self._writer or self._open(writes=True)
        return self._writer

    def _over_budget(self) -> bool:
        return time.perf_counter() > self._deadline

    def _bound(self) -> bool:
        """Whether this is the loop's thread (the first one to use these connections)."""
        if self._thread != threading.get_ident():
            if self._thread is not None:
                return False
            self._thread = threading.get_ident()
        return True

    def _run(self, sql: str, args: Sequence[Any], *, writes: bool) -> Any:
        """The rows of a read, or the row count of a write, of ``sql`` run on the reading or the
        writing connection; or None: it must run through the pool instead (another thread,
        skipped, over budget, a lock, any error; a statement answered None changed nothing: a
        write is judged by its own ``changes()``, not by its error). Counts the outcome."""
        outcomes = self._write_outcomes if writes else self._outcomes
        if not self._bound():
            return None  # another thread than the one that first used it (never the loop's)
        if self._skip:
            left = self._skip.pop(sql, 0)
            if left:
                if left > 1:
                    self._skip[sql] = left - 1
                outcomes["skipped"].inc()
                return None
        conn = None
        changes = 0
        try:
            if writes:
                conn = self._writing()
                changes = conn.total_changes
            else:
                conn = self._conn = self._conn or self._open(writes=False)
            self._deadline = time.perf_counter() + self._budget
            cursor = conn.execute(sql, args)
            result = cursor.rowcount if writes else cursor.fetchall()
        except SQLITE.Error as exc:
            if writes and conn is not None and conn.total_changes != changes:
                # Committed after all? SQLite calls the progress handler once more after the last
                # step, its autocommit done ("interrupted" if the budget is spent by then). Not
                # total_changes (a trigger's rows, app.quotas, count there even when the statement
                # rolls back): changes(), its own rows, 0 once rolled back (an error, a RAISE).
                self._deadline = float("inf")
                if result := conn.execute("SELECT changes()").fetchone()[0]:
                    outcomes["inline"].inc()
                    return result
            outcome = self._outcome(exc)
            if outcome == "over_budget":
                self._skip[sql] = SKIP_AFTER_OVER_BUDGET
            outcomes[outcome].inc()
            return None
        outcomes["inline"].inc()
        return result

    @staticmethod
    def _outcome(exc: Exception) -> str:
        """What an error of a statement tried inline counts as."""
        if not isinstance(exc, SQLITE.OperationalError):
            return "error"
        return "over_budget" if str(exc) == "interrupted" else "busy" if "locked" in str(exc) else "error"

    def transaction(self, body: Callable[[Execute], _T]) -> _T | None:
        """``body(execute)`` between ``BEGIN IMMEDIATE`` and ``COMMIT`` on the writing connection,
        on the loop's thread: what it returns, committed; or None: the transaction must run
        through the pool instead (another thread, the budget spent, any SQLite error), and
        nothing was written; ``LockHeld`` (nothing written either) when SQLite's write lock is
        held elsewhere, for the caller to try again shortly or go through the pool. Any other
        error ``body`` raises (a failed precondition) rolls back and propagates.

        For a write of a few statements that decides from what it reads (a file's version swap):
        SQLite's write lock is held only while they run, never across an ``await``, where a
        busy loop would keep other writers, in this process and others, waiting on it. The
        budget covers every statement; ``COMMIT`` itself is never interrupted (SQLite calls the
        progress handler after a statement's last step too, when its work is done).
        """
        if self._checkpoint is None or not self._bound():
            return None
        outcomes = self._write_outcomes
        conn = None
        try:
            conn = self._writing()
            self._deadline = time.perf_counter() + self._budget
            conn.execute("BEGIN IMMEDIATE")
            result = body(conn.execute)
            self._deadline = float("inf")
            conn.execute("COMMIT")
        except SQLITE.Error as exc:
            self._roll_back(conn)
            outcome = self._outcome(exc)
            outcomes[outcome].inc()
            if outcome == "busy":
                raise LockHeld from None
            return None
        except BaseException:
            self._roll_back(conn)
            raise
        outcomes["inline"].inc()
        self._wrote(0)
        return result

    async def transaction_soon(self, body: Callable[[Execute], _T]) -> _T | None:
        """``transaction``, tried again a millisecond or so later (``LOCK_TRIES`` tries in all)
        while SQLite's write lock is held elsewhere; None: it must run through the pool.

        Other inline transactions hold the lock for a fraction of a millisecond, a transaction
        through the pool for several hand-offs to aiosqlite's thread: going to the pool at the
        first refusal would send most swaps of two busy workers there, each holding the lock
        longer (``docs/benchmarks.md``).
        """
        for attempt in range(LOCK_TRIES):
            try:
                return self.transaction(body)
            except LockHeld:
                if attempt + 1 < LOCK_TRIES:
                    await asyncio.sleep(0.001 * (attempt + 1))
        return None

    @staticmethod
    def _roll_back(conn: Any) -> None:
        if conn is not None and conn.in_transaction:
            conn.execute("ROLLBACK")

    def write(self, sql: str, args: Sequence[Any]) -> int | None:
        """The row count of a one-statement write (committed when this returns), or None: it
        must run through the pool instead (see ``_run``)."""
        if self._checkpoint is None:
            return None
        count: int | None = self._run(sql, args, writes=True)
        if count is not None:
            self._wrote(sum(len(a) for a in args if isinstance(a, (str, bytes))))
        return count

    def _wrote(self, value_bytes: int) -> None:
        """Count a committed inline write (and its values' bytes); every ``CHECKPOINT_EVERY``
        writes or ``CHECKPOINT_EVERY_BYTES``, ask the pool for a checkpoint."""
        self._writes += 1
        self._written += value_bytes
        if self._writes >= CHECKPOINT_EVERY or self._written >= CHECKPOINT_EVERY_BYTES:
            self._writes = self._written = 0
            assert self._checkpoint is not None  # (writes are refused without one)
            self._checkpoint()

    def read(self, sql: str, args: Sequence[Any]) -> list[Row] | None:
        """The rows of ``sql``, or None: it must run through the pool instead (see ``_run``)."""
        return cast("list[Row] | None", self._run(sql, args, writes=False))

    @property
    def in_transaction(self) -> bool:
        """Whether either connection is inside a transaction (never, between statements)."""
        return any(c is not None and c.in_transaction for c in (self._conn, self._writer))

    def close(self) -> None:
        for conn in (self._conn, self._writer):
            if conn is not None:
                conn.close()
        self._conn = self._writer = None


class InlineConnection:
    """What a one-statement request gets on SQLite: the database's ``InlineStatements``, and a
    pooled connection borrowed (once, then kept for the request) when its statement cannot run
    inline."""

    def __init__(
        self, reader: InlineStatements, borrow: Callable[[], Awaitable[PoolProxiedConnection]],
        wanting: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        self.reader = reader
        self._borrow = borrow
        self._pooled: PoolProxiedConnection | None = None
        self.wanting = wanting or nullcontext  # around a write sent to the pool (WriteQueue.wanting)

    async def pooled(self) -> PoolProxiedConnection:
        if self._pooled is None:
            self._pooled = await self._borrow()
        return self._pooled

    def pooled_if_borrowed(self) -> PoolProxiedConnection | None:
        """The pooled connection a statement borrowed, for the request's end to give back."""
        return self._pooled
