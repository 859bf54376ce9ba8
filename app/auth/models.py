"""Tables of the auth capability: API keys (metadata database). Only a hash of each secret is kept."""

from sqlalchemy import Column, String, Table, Text

from app.core.db.tables import UtcDateTime, metadata_db

api_keys = Table(
    "api_keys",
    metadata_db,
    Column("key_id", String(32), primary_key=True, comment="Public part of the key, shown in listings."),
    Column("secret_hash", String(64), nullable=False, comment="sha256 hex of the whole key."),
    Column("namespace_pattern", String(129), nullable=False, comment="Exact namespace, `prefix*`, or `*`."),
    Column("scopes", Text, nullable=False, comment="JSON list of CAP:ACTION."),
    Column("description", Text, nullable=False, server_default=""),
    Column("created_at", UtcDateTime, nullable=False),
    Column("revoked_at", UtcDateTime, nullable=True),
)
