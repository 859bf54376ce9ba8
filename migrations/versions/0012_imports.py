"""Imports in progress: the target, the hidden namespace an archive loads into, and its state

Revision ID: 0012
Revises: 0011

An import loads into ``~imp.<job>`` and is published (renamed into the target) only once it is
whole (``app.portability.staging``); this row says which staging namespace belongs to which
target, so that a killed import is swept or its publish finished. Metadata database only.
"""

from alembic import op
import sqlalchemy as sa

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _name(length: int) -> sa.types.TypeEngine:
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade(engine_name: str) -> None:
    if engine_name != "metadata":
        return
    op.create_table(
        "namespace_imports",
        sa.Column("target", _name(128), nullable=False),
        sa.Column("job", sa.String(32), nullable=False),
        sa.Column("staging", _name(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False, comment="loading | publishing"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("target", name=op.f("pk_namespace_imports")),
    )


def downgrade(engine_name: str) -> None:
    if engine_name == "metadata":
        op.drop_table("namespace_imports")
