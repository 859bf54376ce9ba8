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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.core.db.sqlite import WRITER_PRAGMAS
from app.fairness.writequeue import HEAVY_OPTION, WriteQueue
from app.core.fast.inline_sqlite import InlineConnection
from app.core.fast.one_statement import OneStatementConnections
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


def _install_sqlite_hooks(engine: AsyncEngine, db: Database, busy_timeout_ms: int, queue: WriteQueue | None) -> None:
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
        # No commit checkpoints the WAL (a request never pays for one): ``app.fairness.walcheckpoints``.
        cursor.execute("PRAGMA wal_autocheckpoint=0")
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
        options = conn.get_execution_options()
        mode = options.get(SQLITE_BEGIN_OPTION, "DEFERRED")
        if queue is None or mode != "IMMEDIATE" or options.get(HEAVY_OPTION):
            conn.exec_driver_sql(f"BEGIN {mode}")
        else:  # a single write: heavy turns give way to it (app.fairness.writequeue)
            queue.begin_single(lambda: conn.exec_driver_sql(f"BEGIN {mode}"))


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


def create_engine(settings: Settings, db: Database, queue: WriteQueue | None = None) -> AsyncEngine:
    """One engine for ``db`` with the pool and timeouts from settings (and SQLite ``queue``)."""
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
        _install_sqlite_hooks(engine, db, int(conf.connect_timeout * 1000), queue)
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


@dataclass
class Databases:
    """The engines of the three databases, owned by the app's lifespan."""

    settings: Settings
    engines: dict[Database, AsyncEngine] = field(default_factory=dict)
    write_queues: dict[Database, WriteQueue] = field(default_factory=dict)  # SQLite files' (app.fairness.writequeue)
    one_statement: OneStatementConnections | None = None  # fast_paths.one_statement (app.core.fast.one_statement)

    @classmethod
    def open(cls, settings: Settings) -> Databases:
        dbs = cls(settings)
        files: dict[Database, Path] = {}
        for db in Database:
            path = dbs.sqlite_file(db)
            if path is not None:
                files[db] = path
                dbs.write_queues[db] = WriteQueue(path, settings.databases.get(db).connect_timeout)
            engine = create_engine(settings, db, dbs.write_queues.get(db))
            _count_new_connections(engine, db)
            dbs.engines[db] = engine
        if settings.fast_paths.one_statement:
            dbs.one_statement = OneStatementConnections(dbs.engines, settings, files, dbs.write_queues)
        return dbs

    def engine(self, db: Database) -> AsyncEngine:
        return self.engines[db]

    def sqlite_file(self, db: Database) -> Path | None:
        """The file of ``db`` when it is a SQLite file (not in memory, not PostgreSQL)."""
        url = self.settings.database_url(db)
        return _sqlite_path(url) if url.startswith("sqlite") else None

    def dialect(self, db: Database) -> str:
        """``sqlite`` or ``postgresql``: what backend-specific modules are chosen by, once."""
        return self.engines[db].dialect.name

    async def check(self, db: Database, timeout: float | None = None) -> None:
        """Open a connection and run a trivial query, or raise."""
        conf = self.settings.databases.get(db)

        async def ping() -> None:
            async with self.engines[db].connect() as conn:
                await conn.execute(text("SELECT 1"))

        await asyncio.wait_for(ping(), timeout or conf.connect_timeout + conf.pool_timeout)

    def inline_connection(self, db: Database) -> InlineConnection | None:
        """``db``'s SQLite file's inline statements (``app.core.fast.inline_sqlite``), for a
        capability's own inline transaction; None on PostgreSQL, in memory, or when turned off."""
        return self.one_statement.inline_connection(db) if self.one_statement is not None else None

    async def close(self) -> None:
        if self.one_statement is not None:
            await self.one_statement.close()
        for queue in self.write_queues.values():
            queue.close()
        for engine in self.engines.values():
            await engine.dispose()
