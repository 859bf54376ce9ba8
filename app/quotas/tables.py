"""The tables of quotas (``namespace_usage``, ``namespace_quotas``, in each database) and what a
capability counts (``Capability.usage``: ``Counted``); the rules are ``app.quotas.usage``'s."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, LargeBinary, String, Table
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.config import Database
from app.core.db.tables import METADATA, NameColumn, byte_ordered


def _tables(metadata: Any) -> tuple[Table, Table]:
    usage = Table(
        "namespace_usage", metadata,
        Column("namespace", NameColumn, primary_key=True),
        Column("capability", String(32), primary_key=True),
        Column("shard", Integer, primary_key=True, autoincrement=False),
        Column("items", BigInteger, nullable=False),
        Column("bytes", BigInteger, nullable=False),
    )
    quotas = Table(
        "namespace_quotas", metadata,
        Column("namespace", byte_ordered(128), primary_key=True, comment="'' holds the defaults of the settings."),
        Column("capability", String(32), primary_key=True),
        Column("max_bytes", BigInteger, nullable=True, comment="NULL: the default (none: unlimited)."),
        Column("max_items", BigInteger, nullable=True, comment="NULL: the default (none: unlimited)."),
    )
    return usage, quotas


RESERVED = frozenset({"usage"})
"""Path segments under ``/v1/{namespace}`` that are the gateway's own (``app.quotas.router``), not a capability's."""

TABLES: dict[Database, tuple[Table, Table]] = {db: _tables(METADATA[db]) for db in Database}
"""Each database's ``namespace_usage`` and ``namespace_quotas`` (a capability's usage lives in its database)."""


def _length(table: Table, row: str, column: str, dialect: str) -> str:
    """SQL of ``row.column``'s stored length in bytes: a blob's (read from its header), a text's
    UTF-8 (PostgreSQL ``jsonb``: of its text, which is what SQLite keeps, ``jsonb_text``)."""
    if isinstance(table.c[column].type, LargeBinary):
        return f"{'octet_length' if dialect == 'postgresql' else 'length'}({row}.{column})"
    return f"octet_length(CAST({row}.{column} AS text))" if dialect == "postgresql" else f"length(CAST({row}.{column} AS BLOB))"


@dataclass(frozen=True)
class Part:
    """Rows of another table that belong to a counted row (``key``: its primary key), such as a
    checkpoint thread's blobs: their ``length_of`` bytes count as that row's, in its namespace
    (added as they are written, moved and dropped with the row). A row and its parts are deleted
    in statements of their own, either first: one PostgreSQL statement deleting both would leave
    their bytes counted (each trigger finds the other gone) until the reconciliation."""

    table: Table
    key: str
    length_of: str

    def bytes_sql(self, row: str, dialect: str) -> str:
        return f"coalesce({_length(self.table, row, self.length_of, dialect)}, 0)"


@dataclass(frozen=True)
class Counted:
    """A table whose rows a capability counts: each row one item; its bytes the UTF-8/byte length
    of ``length_of`` or the integer ``size`` column (neither: items only), plus its ``parts``'."""

    table: Table
    length_of: str | None = None
    size: str | None = None
    parts: tuple[Part, ...] = ()

    def __post_init__(self) -> None:
        if "namespace" not in self.table.c:
            raise ValueError(f"counted table {self.table.name} has no namespace column")

    @property
    def pk(self) -> str:
        """The primary key column its parts' ``key`` refers to."""
        return str(next(iter(self.table.primary_key.columns)).name)

    @property
    def tables(self) -> list[Table]:
        return [self.table, *(p.table for p in self.parts)]

    def bytes_sql(self, row: str, dialect: str, *, parts: bool = False) -> str:
        """Its own bytes of ``row`` (and, with ``parts``, its parts' stored now)."""
        own = "0"
        if self.size is not None:
            own = f"coalesce({row}.{self.size}, 0)"
        elif self.length_of is not None:
            own = f"coalesce({_length(self.table, row, self.length_of, dialect)}, 0)"
        if not parts:
            return own
        return " + ".join([own] + [
            f"(SELECT coalesce(sum({p.bytes_sql('p', dialect)}), 0) FROM {p.table.name} p "
            f"WHERE p.{p.key} = {row}.{self.pk})" for p in self.parts
        ])


@dataclass(frozen=True)
class Kept:
    """Usage that no trigger can count (rows in tables without a namespace column, such as a vector
    collection's points): the capability adds each write's difference itself, in the write's own
    transaction (``app.quotas.usage.keep``, which refuses it at the quota as the triggers do);
    ``recount(conn, namespace)`` says its (items, bytes) now, for the reconciliation."""

    recount: Callable[[AsyncConnection, str], Awaitable[tuple[int, int]]]
