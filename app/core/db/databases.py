"""The three engines (the seed's StorageRegistry: one pool per database, shared by every request).

``Databases.open`` is called once by the lifespan and ``close`` at shutdown; nothing here
connects at import time. SQLite connections get WAL, a busy timeout, foreign keys and the
settings that let deletes run on a full disk (``app.core.db.diskspace``); the vectors
database also loads sqlite-vec on every new connection. SQLite write transactions start with
``BEGIN IMMEDIATE`` so that concurrent writers queue on the busy timeout instead of failing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import PoolProxiedConnection

from app.core.db.inline import InlineConnection, InlineStatements
from app.core.db.sqlite import WRITER_PRAGMAS
from app.core.db.writequeue import WriteQueue
from app.core.fences.sqlalchemy_ import close_pooled
from app.core.ops import metrics
from app.core.config import Database, Settings

log = logging.getLogger("app.databases")

SQLITE_BEGIN_OPTION = "sqlite_begin"


class DatabaseSetupError(RuntimeError):
    """A database cannot be opened as configured; the message names it."""


def _sqlite_path(url: str) -> Path | None:
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _load_sqlite_vec(dbapi_connection: Any) -> None:
    import sqlite_vec

    async def load(conn: Any) -> None:
        await conn.enable_load_extension(True)
        await conn.load_extension(sqlite_vec.loadable_path())  # type: ignore[no-untyped-call]  # sqlite-vec is unannotated
        await conn.enable_load_extension(False)

    dbapi_connection.run_async(load)


def _install_sqlite_hooks(engine: AsyncEngine, db: Database, busy_timeout_ms: int) -> None:
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # A new database keeps its free pages apart, so that after a full disk they can be given
        # back (app.core.db.diskspace runs `PRAGMA incremental_vacuum`); no effect on an existing one.
        cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        for pragma in WRITER_PRAGMAS:
            cursor.execute(pragma)
        cursor.close()
        if db is Database.vectors:
            _load_sqlite_vec(dbapi_connection)

    @event.listens_for(sync_engine, "reset")
    def on_reset(dbapi_connection: Any, record: Any, state: Any) -> None:
        # The pool's reset on return (pool_reset_on_return=None): a connection still inside a
        # transaction (a request that stopped midway) is rolled back, any other needs nothing.
        if state.asyncio_safe and not state.transaction_was_reset and record.driver_connection.in_transaction:
            dbapi_connection.rollback()

    @event.listens_for(sync_engine, "begin")
    def on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


# A pooled connection unused for longer than this is pinged before it is handed out.
PING_AFTER_IDLE_SECONDS = 10.0


def _install_idle_ping(engine: AsyncEngine) -> None:
    """Ping connections that sat idle in the pool, not every checkout.

    ``pool_pre_ping`` costs three round trips (BEGIN, a query, ROLLBACK on asyncpg) on every
    checkout, which was the largest single cost of a kv read. A connection in steady use has
    just proven itself; one that sat idle may have been cut (server restart, failover), so
    only those are pinged. A connection broken mid-use still surfaces as a disconnect, which
    makes SQLAlchemy recycle the whole pool, and the request answers 503.
    """
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "checkin")
    def on_checkin(dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(sync_engine, "checkout")
    def on_checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_SECONDS:
            return
        try:
            sync_engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise sa_exc.DisconnectionError(f"idle connection failed its ping: {exc}") from exc


def create_engine(settings: Settings, db: Database) -> AsyncEngine:
    """One engine for ``db`` with the pool and timeouts from settings."""
    url = settings.database_url(db)
    conf = settings.databases.get(db)
    if url.startswith("sqlite"):
        path = _sqlite_path(url)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DatabaseSetupError(
                    f"{db.value} database: cannot create directory {path.parent}: {exc.strerror}"
                ) from None
        engine = create_async_engine(
            url,
            pool_size=conf.pool_size,
            max_overflow=conf.max_overflow,
            pool_timeout=conf.pool_timeout,
            connect_args={"timeout": conf.connect_timeout},
            # Rolled back on return only when a transaction is open (the "reset" hook below):
            # SQLAlchemy's own ROLLBACK would be one more hand-off to aiosqlite's thread for
            # every driver-path request, which runs in autocommit.
            pool_reset_on_return=None,
        )
        _install_sqlite_hooks(engine, db, int(conf.connect_timeout * 1000))
        return engine
    engine = create_async_engine(
        url,
        pool_size=conf.pool_size,
        max_overflow=conf.max_overflow,
        pool_timeout=conf.pool_timeout,
        connect_args={
            "timeout": conf.connect_timeout,
            "command_timeout": conf.statement_timeout,
            "server_settings": {
                "statement_timeout": str(int(conf.statement_timeout * 1000)),
                "application_name": "storage-gateway",
            },
        },
    )
    _install_idle_ping(engine)
    return engine


def _count_new_connections(engine: AsyncEngine, db: Database) -> None:
    opened = metrics.DB_CONNECTIONS_OPENED.labels(database=db.value)

    @event.listens_for(engine.sync_engine, "connect")
    def on_connect(_dbapi_connection: Any, _record: Any) -> None:
        opened.inc()


async def borrow_raw_connection(engine: AsyncEngine) -> PoolProxiedConnection:
    """A connection from ``engine``'s pool for driver-level statements (``app.core.db.statements``),
    its checkout the pool's own (events included); a failed connect raised as SQLAlchemy's
    ``Connection`` raises it (a ``DBAPIError``, answered 503). Give it back with
    ``app.core.fences.sqlalchemy_.close_pooled``."""
    dialect = engine.sync_engine.dialect
    try:
        return await engine.raw_connection()
    except dialect.loaded_dbapi.Error as exc:
        raise sa_exc.DBAPIError.instance(
            None, None, exc, dialect.loaded_dbapi.Error, dialect=dialect,
            connection_invalidated=bool(dialect.is_disconnect(exc, None, None)),
        ) from exc


@dataclass
class Databases:
    """The engines of the three databases, owned by the app's lifespan."""

    settings: Settings
    engines: dict[Database, AsyncEngine] = field(default_factory=dict)
    inline_statements: dict[Database, InlineStatements] = field(default_factory=dict)
    checkpoints: dict[Database, asyncio.Task[None]] = field(default_factory=dict)  # in flight (inline writes')
    write_queues: dict[Database, WriteQueue] = field(default_factory=dict)  # SQLite files' (app.core.db.writequeue)

    @classmethod
    def open(cls, settings: Settings) -> Databases:
        dbs = cls(settings)
        for db in Database:
            engine = create_engine(settings, db)
            _count_new_connections(engine, db)
            dbs.engines[db] = engine
            path = dbs.sqlite_file(db)
            budget = settings.databases.get(db).inline_budget_ms / 1000
            if path is not None and budget > 0:
                dbs.inline_statements[db] = InlineStatements(path, db.value, budget, dbs.checkpointer(db))
            if path is not None:
                dbs.write_queues[db] = WriteQueue(path, settings.databases.get(db).connect_timeout)
        return dbs

    def checkpointer(self, db: Database) -> Callable[[], None]:
        """What an inline writer calls every ``CHECKPOINT_EVERY`` writes: a PASSIVE checkpoint of
        ``db``'s WAL on a pooled connection (aiosqlite's thread), one at a time, never awaited by
        a request (inline writes never checkpoint on the loop's thread)."""
        counter = metrics.SQLITE_CHECKPOINTS.labels(database=db.value)

        async def checkpoint() -> None:
            raw = await borrow_raw_connection(self.engines[db])
            try:
                driver: Any = raw.driver_connection  # aiosqlite
                await driver.execute("PRAGMA wal_checkpoint(PASSIVE)")
                counter.inc()
            finally:
                await close_pooled(raw)

        def done(task: asyncio.Task[None]) -> None:
            del self.checkpoints[db]
            if not task.cancelled() and task.exception() is not None:
                log.warning("WAL checkpoint of %s failed: %s", db.value, task.exception())

        def ask() -> None:
            if db not in self.checkpoints:
                task = self.checkpoints[db] = asyncio.get_running_loop().create_task(checkpoint())
                task.add_done_callback(done)

        return ask

    def engine(self, db: Database) -> AsyncEngine:
        return self.engines[db]

    def sqlite_file(self, db: Database) -> Path | None:
        """The file of ``db`` when it is a SQLite file (not in memory, not PostgreSQL)."""
        url = self.settings.database_url(db)
        return _sqlite_path(url) if url.startswith("sqlite") else None

    def dialect(self, db: Database) -> str:
        """``sqlite`` or ``postgresql``: what backend-specific modules are chosen by, once."""
        return self.engines[db].dialect.name

    async def borrow_driver_connection(self, db: Database, *, sqlite: bool = True) -> PoolProxiedConnection | None:
        """A connection from ``db``'s pool for driver-level statements (None on SQLite unless
        ``sqlite``: a route that runs several statements there).

        For requests that run one statement (``app.core.db.statements``): they skip SQLAlchemy's
        ``Connection`` and BEGIN/COMMIT (autocommit), saving on PostgreSQL two round trips and
        ~60 us of CPU, on SQLite eight hand-offs to aiosqlite's thread. The checkout is the
        pool's own, events included (the idle ping). Give it back with
        ``app.core.fences.sqlalchemy_.close_pooled`` (``RequestConnections.end`` does).
        """
        if self.dialect(db) != "postgresql" and not sqlite:
            return None
        return await borrow_raw_connection(self.engines[db])

    async def check(self, db: Database, timeout: float | None = None) -> None:
        """Open a connection and run a trivial query, or raise."""
        conf = self.settings.databases.get(db)

        async def ping() -> None:
            async with self.engines[db].connect() as conn:
                await conn.execute(text("SELECT 1"))

        await asyncio.wait_for(ping(), timeout or conf.connect_timeout + conf.pool_timeout)

    def write_queue(self, db: Database) -> WriteQueue | None:
        """The queue of ``db``'s write transactions when it is a SQLite file (``app.core.db.writequeue``)."""
        return self.write_queues.get(db)

    def inline_connection(self, db: Database) -> InlineConnection | None:
        """For a request that runs one statement on ``db``: its SQLite file's inline
        statements (``app.core.db.inline``); None on PostgreSQL, in memory, or when turned off."""
        reader = self.inline_statements.get(db)
        if reader is None:
            return None
        return InlineConnection(reader, lambda: borrow_raw_connection(self.engines[db]))

    async def close(self) -> None:
        if self.checkpoints:
            await asyncio.gather(*self.checkpoints.values(), return_exceptions=True)
        for reader in self.inline_statements.values():
            reader.close()
        for queue in self.write_queues.values():
            queue.close()
        for engine in self.engines.values():
            await engine.dispose()
