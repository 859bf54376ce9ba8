"""Kv entries (metadata database)

Revision ID: 0002
Revises: 0001
"""

from alembic import op  # noqa: F401
import sqlalchemy as sa  # noqa: F401

revision = "0002"
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade(engine_name: str) -> None:
    globals()[f"upgrade_{engine_name}"]()


def downgrade(engine_name: str) -> None:
    globals()[f"downgrade_{engine_name}"]()


def _byte_ordered(length: int) -> sa.types.TypeEngine:
    """A string compared by UTF-8 bytes on both backends (``COLLATE "C"`` on PostgreSQL)."""
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade_metadata() -> None:
    op.create_table(
        "kv_entries",
        sa.Column("namespace", _byte_ordered(128), nullable=False),
        sa.Column("collection", _byte_ordered(128), nullable=False),
        sa.Column("key", _byte_ordered(1024), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("namespace", "collection", "key", name="pk_kv_entries"),
    )
    op.create_index("ix_kv_entries_expires_at", "kv_entries", ["expires_at"])


def downgrade_metadata() -> None:
    op.drop_index("ix_kv_entries_expires_at", table_name="kv_entries")
    op.drop_table("kv_entries")


def upgrade_vectors() -> None:
    pass


def downgrade_vectors() -> None:
    pass


def upgrade_checkpoints() -> None:
    pass


def downgrade_checkpoints() -> None:
    pass
