"""The store capability: LangGraph items and their vectors (vectors database)

Revision ID: 0010
Revises: 0009

Items and their vectors live in the vectors database, where sqlite-vec and pgvector are, so that
an item and its vectors are written in one transaction. The HNSW index of each embedding size in
use is made at run time (``app.store.indexes``), not here.
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade(engine_name: str) -> None:
    globals()[f"upgrade_{engine_name}"]()


def downgrade(engine_name: str) -> None:
    globals()[f"downgrade_{engine_name}"]()


def upgrade_metadata() -> None:
    pass


def downgrade_metadata() -> None:
    pass


def _name(length: int) -> sa.types.TypeEngine:
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


class _Vector(sa.types.UserDefinedType):
    """pgvector's ``vector`` without a dimension."""

    cache_ok = True

    def get_col_spec(self, **kw: object) -> str:
        return "vector"


def upgrade_vectors() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    item_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "store_items",
        sa.Column("id", item_id, autoincrement=True, nullable=False, comment="Keys the item's vectors."),
        sa.Column("namespace", _name(128), nullable=False),
        sa.Column("prefix", sa.Text().with_variant(sa.Text(collation="C"), "postgresql"), nullable=False, comment="The LangGraph namespace, labels joined by '.'."),
        sa.Column("key", _name(1024), nullable=False),
        sa.Column("depth", sa.SmallInteger(), nullable=False, comment="Number of labels."),
        sa.Column("labels", sa.Text(), nullable=False, comment="The labels as a JSON array."),
        sa.Column("value", sa.Text().with_variant(JSONB(), "postgresql"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "ttl_minutes", sa.Float(), nullable=True, comment="LangGraph's TTL; each refresh moves expires_at by it."
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_store_items")),
        sa.UniqueConstraint("namespace", "prefix", "key", name=op.f("uq_store_items_namespace")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_store_items_expires_at", "store_items", ["expires_at"])
    op.create_index("ix_store_items_updated", "store_items", ["namespace", "updated_at"])
    op.create_table(
        "store_vectors",
        sa.Column("item_id", item_id, nullable=False),
        sa.Column("field", sa.Text(), nullable=False, comment="The embedded field path (LangGraph's, `.i` per text)."),
        sa.Column("dims", sa.SmallInteger(), nullable=False),
        sa.Column("norm", sa.Float(), nullable=False, comment="Euclidean norm (SQLite's inner product)."),
        sa.Column("embedding", sa.LargeBinary().with_variant(_Vector(), "postgresql"), nullable=False),
        sa.ForeignKeyConstraint(
            ["item_id"], ["store_items.id"], name=op.f("fk_store_vectors_item_id_store_items"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("item_id", "field", name=op.f("pk_store_vectors")),
    )
    if op.get_bind().dialect.name == "postgresql":  # the index builder's (SQLite has none)
        op.create_index("ix_store_vectors_dims", "store_vectors", ["dims"])
    op.create_table(
        "store_dims",
        sa.Column("dims", sa.SmallInteger(), nullable=False, comment="An embedding size in use; gets its own HNSW index."),
        sa.PrimaryKeyConstraint("dims", name=op.f("pk_store_dims")),
    )


def downgrade_vectors() -> None:
    op.drop_table("store_dims")
    op.drop_table("store_vectors")  # with the HNSW indexes made at run time
    op.drop_table("store_items")


def upgrade_checkpoints() -> None:
    pass


def downgrade_checkpoints() -> None:
    pass
