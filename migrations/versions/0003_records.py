"""Ordered records (checkpoints database)

Revision ID: 0003
Revises: 0002
"""

from alembic import op  # noqa: F401
import sqlalchemy as sa  # noqa: F401

revision = "0003"
down_revision = '0002'
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


def upgrade_vectors() -> None:
    pass


def downgrade_vectors() -> None:
    pass


def _byte_ordered(length: int) -> sa.types.TypeEngine:
    """A string compared by UTF-8 bytes on both backends (``COLLATE "C"`` on PostgreSQL)."""
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade_checkpoints() -> None:
    op.create_table(
        "records",
        sa.Column("namespace", _byte_ordered(128), nullable=False),
        sa.Column("collection", _byte_ordered(128), nullable=False),
        sa.Column("key", _byte_ordered(1024), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "collection", "key", name="pk_records"),
    )


def downgrade_checkpoints() -> None:
    op.drop_table("records")
