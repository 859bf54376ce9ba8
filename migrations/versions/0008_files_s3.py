"""Files whose bytes live in an S3 bucket: the object key on the file row

Revision ID: 0008
Revises: 0007

A row with ``object_key`` NULL keeps its bytes as chunks in ``file_chunks`` (as before); a row
with a key keeps them in the configured bucket under that key. Both kinds coexist, so files can
be moved between backends one at a time while reads keep working.
"""

from alembic import op  # noqa: F401
import sqlalchemy as sa  # noqa: F401

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade(engine_name: str) -> None:
    globals()[f"upgrade_{engine_name}"]()


def downgrade(engine_name: str) -> None:
    globals()[f"downgrade_{engine_name}"]()


def upgrade_metadata() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("object_key", sa.String(1024), nullable=True))


def downgrade_metadata() -> None:
    with op.batch_alter_table("files") as batch:
        batch.drop_column("object_key")


def upgrade_vectors() -> None:
    pass


def downgrade_vectors() -> None:
    pass


def upgrade_checkpoints() -> None:
    pass


def downgrade_checkpoints() -> None:
    pass
