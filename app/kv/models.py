"""Tables of the kv capability (metadata database)."""

from sqlalchemy import BigInteger, Column, Table

from app.core.db.tables import JsonText, KeyColumn, NameColumn, UtcDateTime, metadata_db

# value: compact JSON text returned verbatim; version: the ETag (random start, +1 per write).
kv_entries = Table(
    "kv_entries",
    metadata_db,
    Column("namespace", NameColumn, primary_key=True),
    Column("collection", NameColumn, primary_key=True),
    Column("key", KeyColumn, primary_key=True),
    Column("value", JsonText, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=True, index=True),
)
