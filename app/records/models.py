"""Tables of the records capability (checkpoints database)."""

from sqlalchemy import Column, Table

from app.core.db.tables import JsonText, KeyColumn, NameColumn, UtcDateTime, checkpoints_db

# key: ordered by UTF-8 bytes on both backends; value: compact JSON text returned verbatim.
records = Table(
    "records",
    checkpoints_db,
    Column("namespace", NameColumn, primary_key=True),
    Column("collection", NameColumn, primary_key=True),
    Column("key", KeyColumn, primary_key=True),
    Column("value", JsonText, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)
