"""What differs between SQLite and PostgreSQL for files, behind one small Protocol.

Chosen once by the lifespan from ``Databases.dialect``; nothing else in the package looks at the
dialect. The differences: how a write transaction takes its lock (SQLite: ``BEGIN IMMEDIATE``;
PostgreSQL: row locks with ``FOR UPDATE``), how a download reads one consistent snapshot (SQLite:
a read transaction in WAL mode; PostgreSQL: ``REPEATABLE READ``) and the ``ON CONFLICT``
builder. (A download's first read is a fixed statement: ``app.core.fast.fixed_statements``.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sqlalchemy import Select, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.db.databases import SQLITE_BEGIN_OPTION

_Select = TypeVar("_Select", bound="Select[*tuple[Any, ...]]")


class FilesBackend(Protocol):
    @property
    def name(self) -> str:
        """The dialect it serves (read-only: the backends are frozen dataclasses)."""

    def write_options(self) -> dict[str, Any]:
        """Execution options for a connection that is about to write."""

    def snapshot_options(self) -> dict[str, Any]:
        """Execution options for a connection whose transaction must see one snapshot throughout."""

    def locked(self, stmt: _Select) -> _Select:
        """``stmt`` locking the rows it reads until the transaction ends."""

    def insert(self, table: Table) -> Any:
        """An ``INSERT`` that supports ``on_conflict_do_nothing``."""

    async def prepare_chunk_write(self, conn: AsyncConnection) -> None:
        """Tune a transaction that only stores chunks of an upload still in progress."""


@dataclass(frozen=True)
class SqliteFiles:
    name: str = "sqlite"

    def write_options(self) -> dict[str, Any]:
        # The whole database is locked by the first writer; later writers wait on busy_timeout.
        return {SQLITE_BEGIN_OPTION: "IMMEDIATE"}

    def snapshot_options(self) -> dict[str, Any]:
        # In WAL mode a read transaction sees the database as of its first read until it ends.
        return {SQLITE_BEGIN_OPTION: "DEFERRED"}

    def locked(self, stmt: _Select) -> _Select:
        return stmt  # BEGIN IMMEDIATE already serialises writers.

    def insert(self, table: Table) -> Any:
        return sqlite.insert(table)

    async def prepare_chunk_write(self, conn: AsyncConnection) -> None:
        pass  # WAL with synchronous=NORMAL already commits without an fsync


@dataclass(frozen=True)
class PostgresFiles:
    name: str = "postgresql"

    def write_options(self) -> dict[str, Any]:
        return {}

    def snapshot_options(self) -> dict[str, Any]:
        return {"isolation_level": "REPEATABLE READ", "postgresql_readonly": True}

    def locked(self, stmt: _Select) -> _Select:
        return stmt.with_for_update()

    def insert(self, table: Table) -> Any:
        return postgresql.insert(table)

    async def prepare_chunk_write(self, conn: AsyncConnection) -> None:
        # Chunks of an unfinished upload need not survive a crash (the sweeper would drop them);
        # the final swap commits synchronously, which flushes every earlier WAL record with it.
        await conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")


def backend_for(dialect: str) -> FilesBackend:
    backends: dict[str, FilesBackend] = {"sqlite": SqliteFiles(), "postgresql": PostgresFiles()}
    try:
        return backends[dialect]
    except KeyError:
        raise ValueError(f"files: unsupported database dialect {dialect!r}") from None
