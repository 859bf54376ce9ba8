"""Tables of the store capability (vectors database: an item and its vectors commit together).

``store_items``: one row per (gateway namespace, LangGraph namespace, key). The LangGraph
namespace is kept as ``prefix``, its labels joined by ``.`` (a label never holds one, so a
namespace prefix is a byte range), as ``labels`` (a JSON array, for per-label matches on SQLite)
and as ``depth``. ``value`` is the JSON object as ``app.core.jsonvalue.jsonb_text`` writes it (jsonb
on PostgreSQL, text on SQLite). ``ttl_minutes`` is LangGraph's TTL; ``expires_at`` moves with it.

``store_vectors``: one row per embedded field path of an item, keyed by the item's id (which only a
scoped ``store_items`` row hands out), deleted with it. On PostgreSQL ``embedding`` is a
``vector`` of any dimension; each dimension in use gets a partial HNSW index of its own, built at
run time (``store_dims`` lists them). On SQLite it is float32 bytes, compared exactly by sqlite-vec.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import UserDefinedType

from app.core.db.tables import JsonText, KeyColumn, NameColumn, UtcDateTime, vectors_db

PrefixColumn = Text().with_variant(Text(collation="C"), "postgresql")
"""A LangGraph namespace as text: ordered by UTF-8 bytes on both backends, as keys are."""

ItemId = BigInteger().with_variant(Integer, "sqlite")  # SQLite's rowid alias must be INTEGER


class PgVector(UserDefinedType[Any]):
    """pgvector's ``vector`` without a dimension: items of every embedding size share the table."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "vector"


store_items = Table(
    "store_items",
    vectors_db,
    Column("id", ItemId, primary_key=True, autoincrement=True, comment="Keys the item's vectors."),
    Column("namespace", NameColumn, nullable=False),
    Column("prefix", PrefixColumn, nullable=False, comment="The LangGraph namespace, labels joined by '.'."),
    Column("key", KeyColumn, nullable=False),
    Column("depth", SmallInteger, nullable=False, comment="Number of labels."),
    Column("labels", JsonText, nullable=False, comment="The labels as a JSON array."),
    Column("value", JsonText().with_variant(JSONB(), "postgresql"), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=True),
    Column("ttl_minutes", Float, nullable=True, comment="LangGraph's TTL; each refresh moves expires_at by it."),
    UniqueConstraint("namespace", "prefix", "key"),
    Index("ix_store_items_expires_at", "expires_at"),
    Index("ix_store_items_updated", "namespace", "updated_at"),
    sqlite_autoincrement=True,
)

store_vectors = Table(
    "store_vectors",
    vectors_db,
    Column("item_id", ItemId, ForeignKey("store_items.id", ondelete="CASCADE"), primary_key=True),
    Column("field", Text, primary_key=True, comment="The embedded field path (LangGraph's, `.i` per text)."),
    Column("dims", SmallInteger, nullable=False),
    Column("norm", Float, nullable=False, comment="Euclidean norm (SQLite's inner product)."),
    Column("embedding", LargeBinary().with_variant(PgVector(), "postgresql"), nullable=False),
    # the index builder counts a size's vectors with it (PostgreSQL only: SQLite's planner took it
    # for an item's vectors instead of the primary key, and compared every vector per item)
    Index("ix_store_vectors_dims", "dims").ddl_if(dialect="postgresql"),
)

store_dims = Table(
    "store_dims",
    vectors_db,
    Column("dims", SmallInteger, primary_key=True, comment="An embedding size in use; gets its own HNSW index."),
)
