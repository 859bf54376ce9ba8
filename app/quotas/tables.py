"""The tables of quotas (``namespace_usage``, ``namespace_quotas``, in each database) and what a
capability counts (``Capability.usage``: ``Counted``); the rules are ``app.quotas.usage``'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, String, Table

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


@dataclass(frozen=True)
class Counted:
    """A table whose rows a capability counts: each row one item; its bytes the UTF-8/byte length
    of ``length_of`` or the integer ``size`` column (neither: items only)."""

    table: Table
    length_of: str | None = None
    size: str | None = None

    def __post_init__(self) -> None:
        if "namespace" not in self.table.c:
            raise ValueError(f"counted table {self.table.name} has no namespace column")

    def bytes_sql(self, row: str, dialect: str) -> str:
        if self.size is not None:
            return f"coalesce({row}.{self.size}, 0)"
        if self.length_of is not None:
            if dialect == "postgresql":
                return f"coalesce(octet_length({row}.{self.length_of}), 0)"
            return f"coalesce(length(CAST({row}.{self.length_of} AS BLOB)), 0)"
        return "0"
