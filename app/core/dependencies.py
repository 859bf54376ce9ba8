"""Request dependencies shared by every capability: connections per database, names, pages.

A connection to the wrong database is a type error: each capability asks for the alias of the
database it lives in. Writes commit when the endpoint returns and roll back when it raises,
before the response is sent, so an acknowledged write is a committed write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.config import Database
from app.core.databases import SQLITE_BEGIN_OPTION, Databases
from app.core.errors import InvalidInput
from app.core.names import NAME_MAX_LENGTH, NAME_PATTERN, validate_key

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _connection_dependency(db: Database, *, single_statement_reads: bool, read_only: bool):
    """A connection to ``db`` for one request.

    Writes run in one transaction that commits when the endpoint returns (SQLite takes its
    write lock up front). Reads run in a transaction too, except where the capability says
    its reads are single statements (``single_statement_reads``): those skip BEGIN/COMMIT
    where the backend allows it. ``read_only`` marks POST routes that only read (search).
    """

    async def connection(request: Request) -> AsyncIterator[AsyncConnection]:
        databases: Databases = request.app.state.databases
        reading = read_only or request.method in _READ_METHODS
        async with databases.engine(db).connect() as conn:
            if reading and single_statement_reads:
                options = databases.single_statement_options(db)
                if options:
                    await conn.execution_options(**options)
                    yield conn
                    return
            elif not reading:
                await conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            async with conn.begin():
                yield conn

    connection.__name__ = f"{db.value}_connection"
    return connection


def _connection(db: Database, *, single_statement_reads: bool = False, read_only: bool = False) -> Any:
    dependency = _connection_dependency(db, single_statement_reads=single_statement_reads, read_only=read_only)
    return Depends(dependency, scope="function")


# kv and records read with one statement per request; vectors need a transaction for SET LOCAL.
MetadataConnection = Annotated[AsyncConnection, _connection(Database.metadata, single_statement_reads=True)]
CheckpointsConnection = Annotated[AsyncConnection, _connection(Database.checkpoints, single_statement_reads=True)]
VectorsConnection = Annotated[AsyncConnection, _connection(Database.vectors)]
VectorsReadConnection = Annotated[AsyncConnection, _connection(Database.vectors, read_only=True)]


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


async def _key_path(key: Annotated[str, Path(min_length=1, max_length=1024, description="Key (percent-encoded).", examples=["theme"])]) -> str:
    return validate_key("key", key)


async def _file_id_path(
    file_id: Annotated[str, Path(min_length=1, max_length=1024, description="File id (percent-encoded).", examples=["u1.png"])],
) -> str:
    return validate_key("file_id", file_id)


async def _point_id_path(
    point_id: Annotated[str, Path(min_length=1, max_length=1024, description="Point id (percent-encoded).", examples=["p1"])],
) -> str:
    return validate_key("point_id", point_id)


Key = Annotated[str, Depends(_key_path)]
FileId = Annotated[str, Depends(_file_id_path)]
PointId = Annotated[str, Depends(_point_id_path)]


# --- pages --------------------------------------------------------------------------------


async def _page_limit(
    request: Request,
    limit: Annotated[int | None, Query(ge=1, description="Most items to return.")] = None,
) -> int:
    limits = request.app.state.settings.limits
    if limit is None:
        return limits.default_page_size
    if limit > limits.max_page_size:
        raise InvalidInput("limit", f"must be at most {limits.max_page_size}")
    return limit


PageLimit = Annotated[int, Depends(_page_limit)]
