"""Request dependencies shared by every capability: connections per database, names, pages.

A connection to the wrong database is a type error: each capability asks for the alias of the
database it lives in. Writes commit when the answer is a success and roll back otherwise,
before the answer is sent, so an acknowledged write is a committed write (``app.core.db.transactions``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.db import statements
from app.core.config import Database
from app.core.db.databases import SQLITE_BEGIN_OPTION
from app.core.errors import InvalidInput
from app.core.names import KEY_MAX_BYTES, KEY_PATTERN, NAME_MAX_LENGTH, NAME_PATTERN, validate_key
from app.core.numbers import PageSize
from app.core.db.statements import StatementConnection
from app.core.db.transactions import request_connections
from app.core.state import gateway_state

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _connection_dependency(
    db: Database, *, single_statement: bool, on_sqlite: bool, read_only: bool, begin: bool = True
) -> Callable[[Request], Awaitable[StatementConnection]]:
    """A connection to ``db`` for one request, ended by ``TransactionMiddleware``.

    Writes run in one transaction that commits when the answer is a success, before it is sent
    (SQLite takes its write lock up front). A route whose every request runs exactly one
    statement (``single_statement``; on SQLite too only if ``on_sqlite``) gets a pooled driver
    connection for ``app.core.db.statements`` instead: no BEGIN/COMMIT, since one statement is
    atomic by itself and it is the last thing such a route does, so what it acknowledges is
    committed and what it refuses was never written. On SQLite such a route gets an
    ``InlineConnection`` (``app.core.db.inline``): its statement runs on the loop's thread when
    it can, and borrows a pooled connection only when it cannot (a write that finds the lock
    held). Reads run in a transaction too, unless single-statement. ``read_only`` marks POST
    routes that only read. ``begin=False`` (reads only): no transaction is begun for the
    request; SQLAlchemy begins one itself on the
    connection's first statement through it, if any, and it is rolled back when the connection
    closes, so a read whose statements all go to the driver sends no BEGIN and no COMMIT.
    """

    async def connection(request: Request) -> StatementConnection:
        databases = gateway_state(request.app).databases
        connections = request_connections(request.scope)
        reading = read_only or request.method in _READ_METHODS
        if single_statement and on_sqlite:
            inline = databases.inline_connection(db)
            if inline is not None:
                connections.add_inline(inline)
                if statements.STRICT:
                    statements.expect_one_statement(inline)
                return inline
        if single_statement:
            borrowed = await databases.borrow_driver_connection(db, sqlite=on_sqlite)
            if borrowed is not None:
                connections.add(borrowed)
                if statements.STRICT:
                    statements.expect_one_statement(borrowed)
                return borrowed
        conn = await databases.engine(db).connect()
        if not begin:
            connections.add(conn)
            return conn
        try:
            if not reading:
                await conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            transaction = await conn.begin()
        except BaseException:
            await conn.close()
            raise
        connections.add(conn, transaction)
        return conn

    connection.__name__ = f"{db.value}_connection"
    return connection


def _connection(
    db: Database, *, single_statement: bool = False, on_sqlite: bool = True, read_only: bool = False,
    begin: bool = True,
) -> Any:
    if not begin and not read_only:
        raise ValueError("only a read-only connection may go without a transaction")
    return Depends(_connection_dependency(
        db, single_statement=single_statement, on_sqlite=on_sqlite, read_only=read_only, begin=begin
    ))


# Every kv and records request but a batch is one statement on both backends:
# they run without BEGIN/COMMIT (two round trips fewer on PostgreSQL, eight thread hand-offs on
# SQLite). A batch keeps its transaction (records here; kv's in app.kv.dependencies). A checkpoint put
# or read is one statement on PostgreSQL and several on SQLite, where it keeps its transaction
# (the `PgStatement` dependencies). Vector reads keep one too: SQLAlchemy begins it lazily and
# searches run on the driver connection, so it sends nothing.
MetadataStatement = Annotated[StatementConnection, _connection(Database.metadata, single_statement=True)]
# A kv batch (get, set or delete many): its statements' shapes depend on how many keys it names
# (an expanding IN, an executemany), so it runs through SQLAlchemy in one transaction; so does a
# capability written as plain SQLAlchemy (tests/counters).
MetadataConnection = Annotated[AsyncConnection, _connection(Database.metadata)]
MetadataReadConnection = Annotated[AsyncConnection, _connection(Database.metadata, read_only=True)]
CheckpointsStatement = Annotated[StatementConnection, _connection(Database.checkpoints, single_statement=True)]
CheckpointsConnection = Annotated[AsyncConnection, _connection(Database.checkpoints)]
CheckpointsPgStatement = Annotated[
    StatementConnection, _connection(Database.checkpoints, single_statement=True, on_sqlite=False)
]
CheckpointsPgReadStatement = Annotated[
    StatementConnection, _connection(Database.checkpoints, single_statement=True, on_sqlite=False, read_only=True)
]
VectorsConnection = Annotated[AsyncConnection, _connection(Database.vectors)]
VectorsReadConnection = Annotated[AsyncConnection, _connection(Database.vectors, read_only=True)]
# A search: on PostgreSQL its statements go to the driver connection in autocommit (each is a
# read; the planner's estimates may come from another snapshot than the search, which only
# moves an estimate), so a transaction around it would be one SQLAlchemy begin and commit per
# request for nothing (about 100 us of CPU). A registry read on a cache miss, SQLite's search
# and a hybrid search's text half go through SQLAlchemy, which begins lazily there.
VectorsSearchConnection = Annotated[AsyncConnection, _connection(Database.vectors, read_only=True, begin=False)]


# --- names --------------------------------------------------------------------------------

NamespacePath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=NAME_MAX_LENGTH,
        pattern=NAME_PATTERN,
        description="The plugin or app whose data this is; isolated from every other namespace.",
        examples=["my_plugin"],
    ),
]
CollectionPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=NAME_MAX_LENGTH,
        pattern=NAME_PATTERN,
        description="A collection inside the namespace.",
        examples=["settings"],
    ),
]


async def _key_path(key: Annotated[str, Path(min_length=1, max_length=KEY_MAX_BYTES, json_schema_extra={"pattern": KEY_PATTERN}, description="Key (percent-encoded).", examples=["theme"])]) -> str:
    return validate_key("key", key)


async def _file_id_path(
    file_id: Annotated[str, Path(min_length=1, max_length=KEY_MAX_BYTES, json_schema_extra={"pattern": KEY_PATTERN}, description="File id (percent-encoded).", examples=["u1.png"])],
) -> str:
    return validate_key("file_id", file_id)


async def _point_id_path(
    point_id: Annotated[str, Path(min_length=1, max_length=KEY_MAX_BYTES, json_schema_extra={"pattern": KEY_PATTERN}, description="Point id (percent-encoded).", examples=["p1"])],
) -> str:
    return validate_key("point_id", point_id)


Key = Annotated[str, Depends(_key_path)]
FileId = Annotated[str, Depends(_file_id_path)]
PointId = Annotated[str, Depends(_point_id_path)]


# --- pages --------------------------------------------------------------------------------


async def _page_limit(
    request: Request,
    limit: Annotated[PageSize | None, Query(description="Most items to return.")] = None,
) -> int:
    limits = gateway_state(request.app).settings.limits
    if limit is None:
        return limits.default_page_size
    if limit > limits.max_page_size:
        raise InvalidInput("limit", f"must be at most {limits.max_page_size}")
    return limit


PageLimit = Annotated[int, Depends(_page_limit)]
