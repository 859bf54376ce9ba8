"""Request dependencies shared by every capability: sessions per database, names, pages.

A session for the wrong database is a type error: each capability asks for the alias of the
database it lives in. Sessions commit when the endpoint returns and roll back when it raises,
before the response is sent, so an acknowledged write is a committed write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Database, Settings
from app.core.databases import SQLITE_BEGIN_OPTION, Databases
from app.core.errors import InvalidInput
from app.core.names import NAME_MAX_LENGTH, NAME_PATTERN, validate_key

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def get_databases(request: Request) -> Databases:
    return request.app.state.databases


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


AppSettings = Annotated[Settings, Depends(get_settings_dep)]
AppDatabases = Annotated[Databases, Depends(get_databases)]


def _session_dependency(db: Database, *, read_only: bool = False):
    async def session(request: Request) -> AsyncIterator[AsyncSession]:
        databases: Databases = request.app.state.databases
        async with databases.sessionmakers[db]() as s:
            if not read_only and request.method not in _READ_METHODS:
                # SQLite: take the write lock up front (a no-op option on PostgreSQL).
                await s.connection(execution_options={SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            try:
                yield s
            except BaseException:
                await s.rollback()
                raise
            else:
                await s.commit()

    session.__name__ = f"{db.value}_{'read_' if read_only else ''}session"
    return session


MetadataSession = Annotated[AsyncSession, Depends(_session_dependency(Database.metadata), scope="function")]
VectorsSession = Annotated[AsyncSession, Depends(_session_dependency(Database.vectors), scope="function")]
VectorsReadSession = Annotated[
    AsyncSession, Depends(_session_dependency(Database.vectors, read_only=True), scope="function")
]
CheckpointsSession = Annotated[
    AsyncSession, Depends(_session_dependency(Database.checkpoints), scope="function")
]


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
