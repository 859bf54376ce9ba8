"""Request dependencies shared by every capability: one connection per database, names, pages.

``MetadataConnection``, ``VectorsConnection`` and ``CheckpointsConnection`` give a route a
connection to the database its capability lives in, in the request's transaction, which
``TransactionMiddleware`` ends before the answer is sent: commit on success, roll back otherwise
(``app.core.db.transactions``). A writing route's transaction begins at once, on SQLite with
``BEGIN IMMEDIATE`` (the write lock up front, so concurrent writers queue on the busy timeout);
a reading route's (GET, HEAD, or a POST declared ``@accepts(read_only=True)``) begins when its
first statement runs. The rule: a route asks for one connection per database it uses, and gets
the same connection type on every path; a ``@fast(one_statement=...)`` route is handed, under
that type, what its fixed statements run on (``app.core.fast.one_statement``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.config import Database
from app.core.db.databases import SQLITE_BEGIN_OPTION
from app.core.db.transactions import request_connections
from app.core.errors import InvalidInput
from app.core.fast.fixed_statements import StatementConnection
from app.core.http.routing import READ_METHODS, route_policy_of
from app.core.names import KEY_MAX_BYTES, KEY_PATTERN, NAME_MAX_LENGTH, NAME_PATTERN, validate_key
from app.core.numbers import PageSize
from app.core.state import gateway_state

_IMMEDIATE = {SQLITE_BEGIN_OPTION: "IMMEDIATE"}


def _connection_to(db: Database) -> Callable[[Request], Awaitable[StatementConnection]]:
    """The connection dependency of ``db`` (see the module)."""

    async def connection(request: Request) -> StatementConnection:
        scope = request.scope
        databases = gateway_state(request.app).databases
        connections = request_connections(scope)
        policy = route_policy_of(scope)
        if policy is None:  # a route outside the capabilities' gates
            reads = request.method in READ_METHODS
        else:
            reads = policy.reads
            if policy.one_statement and databases.one_statement is not None:
                fast = await databases.one_statement.connection(db, policy.one_statement, connections)
                if fast is not None:
                    return fast
        conn = await databases.engine(db).connect()
        connections.add(conn)
        if not reads:
            await conn.execution_options(**_IMMEDIATE)
            await conn.begin()
        return conn

    connection.__name__ = f"{db.value}_connection"
    return connection


MetadataConnection = Annotated[AsyncConnection, Depends(_connection_to(Database.metadata))]
VectorsConnection = Annotated[AsyncConnection, Depends(_connection_to(Database.vectors))]
CheckpointsConnection = Annotated[AsyncConnection, Depends(_connection_to(Database.checkpoints))]


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


Key = Annotated[str, Depends(_key_path)]


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
