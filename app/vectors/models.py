"""Tables of the vectors capability (vectors database).

``vector_collections`` is the registry: one row per (namespace, collection) with the settings the
collection was created with. Each collection's points live in tables the gateway creates at run
time, named only from the registry's integer ``id`` (``vec_<id>``, ``fts_<id>``: the text half's
FTS5 table on SQLite, its term statistics on PostgreSQL), so no user text
ever reaches SQL as an identifier. ``vector_idempotency`` remembers the answer to point inserts
sent with an ``Idempotency-Key`` so that a retry replays it instead of inserting twice.
"""

from sqlalchemy import (
    Column,
    Integer,
    String,
    Table,
    UniqueConstraint,
)

from app.core.db.tables import JsonText, KeyColumn, NameColumn, UtcDateTime, vectors_db

vector_collections = Table(
    "vector_collections",
    vectors_db,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Derives the data table names."),
    Column("namespace", NameColumn, nullable=False),
    Column("collection", NameColumn, nullable=False),
    Column("vector_size", Integer, nullable=False),
    Column("distance", String(16), nullable=False, comment="cosine, l2 or ip."),
    Column("index_options", JsonText, nullable=False, comment="JSON: index kind, m, ef_construction."),
    Column("text_field", KeyColumn, nullable=True, comment="Payload field indexed for hybrid search."),
    Column("text_language", String(32), nullable=True, comment="Stemmer of the text field's terms (app.vectors.text)."),
    Column("created_at", UtcDateTime, nullable=False),
    UniqueConstraint("namespace", "collection"),
    sqlite_autoincrement=True,
)

vector_idempotency = Table(
    "vector_idempotency",
    vectors_db,
    Column("namespace", NameColumn, primary_key=True),
    Column("collection", NameColumn, primary_key=True),
    Column("idempotency_key", String(255), primary_key=True),
    Column("request_hash", String(64), nullable=False, comment="sha256 of the request body."),
    Column("response", JsonText, nullable=True, comment="The first answer, replayed on retries."),
    Column("created_at", UtcDateTime, nullable=False),
)
