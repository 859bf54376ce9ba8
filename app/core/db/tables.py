"""The table metadata of each database, and the column types every capability shares.

Capabilities define their tables on the ``MetaData`` of the database they live in; Alembic's
``env.py`` compares each database against its own ``MetaData``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, DateTime, MetaData, String, Text, type_coerce
from sqlalchemy.types import TypeDecorator, TypeEngine

from app.core.config import Database

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata_db = MetaData(naming_convention=NAMING_CONVENTION)
vectors_db = MetaData(naming_convention=NAMING_CONVENTION)
checkpoints_db = MetaData(naming_convention=NAMING_CONVENTION)

METADATA: dict[Database, MetaData] = {
    Database.metadata: metadata_db,
    Database.vectors: vectors_db,
    Database.checkpoints: checkpoints_db,
}


def byte_ordered(length: int) -> TypeEngine[str]:
    """A string column that sorts by UTF-8 bytes on both backends (``COLLATE "C"`` on PostgreSQL;
    SQLite's default BINARY collation already compares bytes)."""
    return String(length).with_variant(String(length, collation="C"), "postgresql")


NameColumn = byte_ordered(128)
KeyColumn = byte_ordered(1024)
JsonText = Text  # JSON kept as its compact text: returned exactly as stored, no re-encoding.


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC when read back, on both backends.

    SQLite keeps no zone, so an aware value written there would come back naive; this stores
    UTC and re-attaches it, so answers always carry a zone (RFC 3339 ``date-time``).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


def driver_timestamp(column: ColumnElement[datetime]) -> ColumnElement[str]:
    """A ``UtcDateTime`` column selected as the driver returns it, for a fixed statement
    (``app.core.fast.fixed_statements``), which skips result processing; ``from_driver_timestamp``
    turns the value into what ``UtcDateTime`` would have read. No SQL changes (no CAST)."""
    return type_coerce(column, String())


def from_driver_timestamp(value: str | datetime) -> datetime:
    """What ``UtcDateTime`` reads from a ``driver_timestamp`` value: asyncpg gives an aware
    ``datetime``; SQLite the text SQLAlchemy stored (``YYYY-MM-DD HH:MM:SS.ffffff``, in UTC)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
