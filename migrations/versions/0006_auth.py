"""Api keys (metadata database)

Revision ID: 0006
Revises: 0005
"""

from alembic import op  # noqa: F401
import sqlalchemy as sa  # noqa: F401

revision = "0006"
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade(engine_name: str) -> None:
    globals()[f"upgrade_{engine_name}"]()


def downgrade(engine_name: str) -> None:
    globals()[f"downgrade_{engine_name}"]()


def upgrade_metadata() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(32), nullable=False, comment="Public part of the key, shown in listings."),
        sa.Column("secret_hash", sa.String(64), nullable=False, comment="sha256 hex of the whole key."),
        sa.Column("namespace_pattern", sa.String(129), nullable=False,
                  comment="Exact namespace, `prefix*`, or `*`."),
        sa.Column("scopes", sa.Text(), nullable=False, comment="JSON list of CAP:ACTION."),
        sa.Column("description", sa.Text(), nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_api_keys")),
    )


def downgrade_metadata() -> None:
    op.drop_table("api_keys")


def upgrade_vectors() -> None:
    pass


def downgrade_vectors() -> None:
    pass


def upgrade_checkpoints() -> None:
    pass


def downgrade_checkpoints() -> None:
    pass
