"""Connections of ``@fast(one_statement=...)`` routes: borrowed from the pool, in autocommit.

Such a route promises at most one statement per request. One statement is atomic by itself and
is the last thing the route does, so it needs no BEGIN/COMMIT: what the route acknowledges is
committed and what it refuses was never written. Its connection dependency is therefore handed a
connection borrowed from the database's SQLAlchemy pool with no ``Connection`` around it, which
its fixed statements (``app.core.fast.fixed_statements``) send with the driver; on a SQLite file,
an ``InlineConnection`` (``app.core.fast.inline_sqlite``) that borrows one only when its statement
cannot run on the loop's thread.

The rule: the request's end gives every borrowed connection back (``RequestConnections``), and
one from a request that stopped midway, possibly inside a statement, is discarded, not pooled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection

from app.core.config import Database, Settings
from app.fairness.writequeue import WriteQueue
from app.core.db.transactions import RequestConnections
from app.core.fast import OneStatement
from app.core.fast import fixed_statements
from app.core.fast.fixed_statements import StatementConnection
from app.core.fast.inline_sqlite import InlineConnection, InlineStatements
from app.core.fences.sqlalchemy_ import close_pooled
from app.core.ops import metrics

log = logging.getLogger("app.db")


async def borrow_driver_connection(engine: AsyncEngine) -> PoolProxiedConnection:
    """A connection from ``engine``'s pool for driver-level statements, its checkout the pool's
    own (events included: the idle ping); a failed connect raised as SQLAlchemy's ``Connection``
    raises it (a ``DBAPIError``, answered 503). Give it back with ``give_back``."""
    dialect = engine.sync_engine.dialect
    try:
        return await engine.raw_connection()
    except dialect.loaded_dbapi.Error as exc:
        raise sa_exc.DBAPIError.instance(
            None, None, exc, dialect.loaded_dbapi.Error, dialect=dialect,
            connection_invalidated=bool(dialect.is_disconnect(exc, None, None)),
        ) from exc


async def give_back(conn: PoolProxiedConnection, clean: bool = True) -> None:
    """Return a borrowed connection to its pool; one that may be inside a statement (not
    ``clean``) is closed instead."""
    if not clean:
        conn.invalidate()
    await close_pooled(conn)


async def checkpoint_wal(engine: AsyncEngine, db: Database) -> None:
    """A PASSIVE checkpoint of ``db``'s WAL on a pooled connection (aiosqlite's thread)."""
    raw = await borrow_driver_connection(engine)
    try:
        driver: Any = raw.driver_connection  # aiosqlite; its row read (an unfinished statement stays active)
        await driver.execute_fetchall("PRAGMA wal_checkpoint(PASSIVE)")
        metrics.SQLITE_CHECKPOINTS.labels(database=db.value).inc()
    finally:
        await close_pooled(raw)


class OneStatementConnections:
    """The one-statement connections of the three databases (and their SQLite files' inline
    statements, unless ``fast_paths.inline_sqlite`` is off), owned by ``Databases``."""

    def __init__(self, engines: Mapping[Database, AsyncEngine], settings: Settings, sqlite_files: Mapping[Database, Path],
            write_queues: Mapping[Database, WriteQueue]) -> None:
        self._engines = engines
        self._wanting = {db: queue.wanting for db, queue in write_queues.items()}  # app.fairness.writequeue
        self.inline: dict[Database, InlineStatements] = {}
        self._checkpoints: dict[Database, asyncio.Task[None]] = {}  # in flight (inline writes')
        for db, path in sqlite_files.items():
            budget = settings.databases.get(db).inline_budget_ms / 1000
            if settings.fast_paths.inline_sqlite and budget > 0:
                self.inline[db] = InlineStatements(path, db.value, budget, self._checkpointer(db))

    async def connection(
        self, db: Database, promise: OneStatement, connections: RequestConnections
    ) -> StatementConnection | None:
        """What a route promising one statement on ``db`` runs it on (registered with the
        request's ``connections``), or None when it runs several on this backend."""
        engine = self._engines[db]
        if promise is not True and engine.dialect.name != promise:
            return None
        inline = self.inline_connection(db)
        if inline is not None:
            connections.add_release(lambda clean: _give_back_borrowed(inline, clean))
            if fixed_statements.STRICT:
                fixed_statements.expect_one_statement(inline)
            return inline
        borrowed = await borrow_driver_connection(engine)
        connections.add_release(lambda clean: give_back(borrowed, clean))
        if fixed_statements.STRICT:
            fixed_statements.expect_one_statement(borrowed)
        return borrowed

    def inline_connection(self, db: Database) -> InlineConnection | None:
        """``db``'s SQLite file's inline statements for one request; None on PostgreSQL, in
        memory, or when turned off."""
        reader = self.inline.get(db)
        if reader is None:
            return None
        return InlineConnection(reader, lambda: borrow_driver_connection(self._engines[db]), self._wanting.get(db))

    def _checkpointer(self, db: Database) -> Callable[[], None]:
        """What an inline writer calls every ``CHECKPOINT_EVERY`` writes: a checkpoint of ``db``'s
        WAL (``checkpoint_wal``), one at a time, never awaited by a request (inline writes
        never checkpoint on the loop's thread)."""

        def done(task: asyncio.Task[None]) -> None:
            del self._checkpoints[db]
            if not task.cancelled() and task.exception() is not None:
                log.warning("WAL checkpoint of %s failed: %s", db.value, task.exception())

        def ask() -> None:
            if db not in self._checkpoints:
                task = self._checkpoints[db] = asyncio.get_running_loop().create_task(checkpoint_wal(self._engines[db], db))
                task.add_done_callback(done)

        return ask

    async def close(self) -> None:
        """Wait for the checkpoints in flight, then close the inline connections."""
        if self._checkpoints:
            await asyncio.gather(*self._checkpoints.values(), return_exceptions=True)
        for reader in self.inline.values():
            reader.close()


async def _give_back_borrowed(inline: InlineConnection, clean: bool) -> None:
    pooled = inline.pooled_if_borrowed()
    if pooled is not None:
        await give_back(pooled, clean)
