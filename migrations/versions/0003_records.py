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


def upgrade_checkpoints() -> None:
    pass


def downgrade_checkpoints() -> None:
    pass
