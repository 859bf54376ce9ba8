"""Heavy writes in fair shares: one namespace's long write never holds SQLite's write lock for long.

SQLite has one write lock per database file. A request that writes a lot in one transaction (a
checkpoint thread copy: 240 MiB) held it for seconds, and every other namespace's write to that
database waited (issue 44: two clients copying back to back for 15 s let 5 writes of another
namespace through instead of about 230, the worst after 5.03 s, one a 503).

So a heavy operation writes in **turns** (``HeavyWrites.turn``): short transactions, each of at
most ``fairness.chunk_bytes`` of rows (or the one row larger than that), with the lock free between
them. A turn begins only once no single write waits for the lock, in this process or another
(``WriteQueue.heavy``: every pooled SQLite write transaction, and every one-statement write that
could not run inline, says it waits), and the heavy turns of a process take their turns one at a
time, in order. A single write of another namespace therefore waits for at most the turn in
progress (plus SQLite's own retry sleep, at most 25 ms after a turn of up to 100 ms), whatever
the number of heavy operations running. Where an operation must be all-or-nothing, its turns
write where no read looks (a copy's staging thread), and one short turn makes the result visible
(``app.checkpoints.heavy``); an operation that is atomic by contract and cannot be staged
cheaply (a records or vector batch, whose rows replace rows in place) is one transaction, bounded
by the request's own limits (``limits.max_body_bytes``, ``limits.max_batch_items``): a turn when
its body is larger than a turn, else a single write (``HeavyWrites.batch``).

On PostgreSQL writers of different rows do not wait for each other: a turn is a plain
transaction. A copy still goes in turns there (each reading the source at one exported snapshot),
so that its WAL is flushed a turn at a time rather than all at the commit another namespace's
commit would queue behind; deletes, prunes and sweeps keep the one transaction they had.

How many heavy operations (copies, batches larger than a turn) one namespace may run at once in a
process is ``admit``'s: ``fairness.heavy_per_namespace``, past which the request is refused at once
with 429 and ``Retry-After``.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext
from typing import Any

from prometheus_client import Counter, Histogram
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.fairness.settings import FairnessSettings
from app.core.db.databases import SQLITE_BEGIN_OPTION
from app.fairness.slots import Slot, Slots
from app.fairness.writequeue import HEAVY_OPTION, WriteQueue
from app.core.errors import TooManyRequests
from app.core.ops.metrics import REGISTRY

_SNAPSHOT_ID = re.compile(r"[0-9A-F]+-[0-9A-F]+(-[0-9]+)?")  # pg_export_snapshot()'s (interpolated: SET takes no parameter)

DELETE_WEIGHT = 8
"""A byte deleted weighs this much less than a byte written, in a turn's bytes: deleting frees
pages without writing them (``secure_delete=FAST``): 240 MiB of values went in 0.09-0.12 s, and
took 1.0-1.9 s to write (SQLite 3.40, the gateway's pragmas)."""

HEAVY_TURNS = Histogram(
    "gateway_heavy_turn_seconds",
    "How long one turn of a heavy write (a thread copy, prune, delete or sweep, a batch) held its "
    "transaction: on SQLite, what another namespace's single write may wait for (app.fairness.fairshare).",
    ("database",),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=REGISTRY,
)

HEAVY_REFUSED = Counter(
    "gateway_heavy_refused",
    "Heavy operations refused 429 because their namespace ran fairness.heavy_per_namespace already.",
    ("what",),
    registry=REGISTRY,
)


class HeavyWrites:
    """The turns of heavy writes on one database (its engine, and on SQLite its write queue)."""

    def __init__(self, engine: AsyncEngine, queue: WriteQueue | None, settings: FairnessSettings, database: str) -> None:
        self.engine = engine
        self.sqlite = engine.dialect.name == "sqlite"
        self.queue = queue if self.sqlite else None
        self.chunk_bytes = settings.chunk_bytes
        self.chunk_rows = settings.chunk_rows
        self.yield_seconds = settings.yield_seconds
        self._heavy = engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE", HEAVY_OPTION: True})
        self._single = engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        self._admitted = Slots("heavy operations", 1 << 30, settings.heavy_per_namespace, TooManyRequests)
        self._turns = HEAVY_TURNS.labels(database=database)

    def admit(self, namespace: str, what: str) -> Slot:
        """A place for one heavy operation of ``namespace`` (``what``, for the refusal), or 429
        with ``Retry-After`` when it runs ``fairness.heavy_per_namespace`` already."""
        try:
            return self._admitted.take(namespace, what)
        except TooManyRequests:
            HEAVY_REFUSED.labels(what=what).inc()
            raise

    @asynccontextmanager
    async def turn(self, snapshot: str | None = None) -> AsyncIterator[AsyncConnection]:
        """One turn of a heavy write: a transaction, committed when the block ends (rolled back on
        an error). On SQLite it begins after the single writes waiting, and should write at most
        ``chunk_bytes``. ``snapshot`` (PostgreSQL): it reads as of that exported snapshot
        (``snapshot_id``), where it writes as any transaction."""
        async with self.queue.heavy(self.yield_seconds) if self.queue is not None else nullcontext():
            started = time.perf_counter()
            if snapshot is None:
                async with self._heavy.begin() as conn:
                    yield conn
            else:
                if not _SNAPSHOT_ID.fullmatch(snapshot):
                    raise ValueError(f"not a snapshot id: {snapshot!r}")
                async with self.engine.connect() as conn:
                    await conn.execution_options(isolation_level="REPEATABLE READ")
                    async with conn.begin():
                        await conn.execute(text(f"SET TRANSACTION SNAPSHOT '{snapshot}'"))
                        yield conn
            self._turns.observe(time.perf_counter() - started)

    @asynccontextmanager
    async def batch(self, namespace: str, nbytes: int) -> AsyncIterator[AsyncConnection]:
        """The one transaction of an atomic batch of ``nbytes`` (its request body): a single write
        when it fits in a turn (a one-point upsert is not heavy), else a heavy operation of
        ``namespace`` (``admit``: 429 past ``fairness.heavy_per_namespace`` at once) in a heavy turn."""
        if nbytes <= self.chunk_bytes:
            async with self.single() as conn:
                yield conn
            return
        slot = self.admit(namespace, "large batches")
        try:
            async with self.turn() as conn:
                yield conn
        finally:
            slot.release()

    @asynccontextmanager
    async def single(self) -> AsyncIterator[AsyncConnection]:
        """A short write transaction of a heavy operation (marking what its turns wrote visible,
        or hiding what they will delete), in line with the single writes."""
        async with self._single.begin() as conn:
            yield conn

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[AsyncConnection]:
        """A read transaction: every read through it sees the database as of its first one (SQLite:
        a deferred transaction, whose snapshot holds back WAL checkpoints until it ends;
        PostgreSQL: REPEATABLE READ, whose snapshot turns can read at, ``snapshot_id``)."""
        async with self.engine.connect() as conn:
            if not self.sqlite:
                await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin() as transaction:
                yield conn
                await transaction.rollback()

    @staticmethod
    async def snapshot_id(conn: AsyncConnection) -> str:
        """The id of ``conn``'s snapshot (PostgreSQL, in a ``snapshot`` transaction), for ``turn``."""
        return str((await conn.execute(text("SELECT pg_export_snapshot()"))).scalar_one())


class Chunks:
    """Rows cut into turns: ``add`` a row's weight; ``full`` once the turn holds ``chunk_bytes``
    or ``chunk_rows`` (a row heavier than a turn is a turn of its own)."""

    __slots__ = ("bytes", "limit_bytes", "limit_rows", "rows")

    def __init__(self, heavy: HeavyWrites) -> None:
        self.limit_bytes = heavy.chunk_bytes
        self.limit_rows = heavy.chunk_rows
        self.rows: list[Any] = []
        self.bytes = 0

    def add(self, row: Any, weight: int) -> None:
        self.rows.append(row)
        self.bytes += weight

    @property
    def full(self) -> bool:
        return self.bytes >= self.limit_bytes or len(self.rows) >= self.limit_rows

    def take(self) -> list[Any]:
        rows, self.rows, self.bytes = self.rows, [], 0
        return rows
