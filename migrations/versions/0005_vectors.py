"""Vector collections (vectors database)

Revision ID: 0005
Revises: 0004
"""

from alembic import op
import sqlalchemy as sa

revision = "0005"
down_revision = '0004'
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


def upgrade_vectors() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table(
        "vector_collections",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False, comment="Derives the data table names."),
        sa.Column("namespace", _name(128), nullable=False),
        sa.Column("collection", _name(128), nullable=False),
        sa.Column("vector_size", sa.Integer(), nullable=False),
        sa.Column("distance", sa.String(16), nullable=False, comment="cosine, l2 or ip."),
        sa.Column("index_options", sa.Text(), nullable=False, comment="JSON: index kind, m, ef_construction."),
        sa.Column("text_field", _name(1024), nullable=True, comment="Payload field indexed for hybrid search."),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_vector_collections")),
        sa.UniqueConstraint("namespace", "collection", name=op.f("uq_vector_collections_namespace")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "vector_idempotency",
        sa.Column("namespace", _name(128), nullable=False),
        sa.Column("collection", _name(128), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False, comment="sha256 of the request body."),
        sa.Column("response", sa.Text(), nullable=True, comment="The first answer, replayed on retries."),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "namespace", "collection", "idempotency_key", name=op.f("pk_vector_idempotency")
        ),
    )


def downgrade_vectors() -> None:
    # The per-collection tables were created at run time from the registry; drop them with it.
    bind = op.get_bind()
    ids = [row[0] for row in bind.execute(sa.text("SELECT id FROM vector_collections"))]
    for cid in ids:
        cid = int(cid)
        op.execute(f"DROP TABLE IF EXISTS fts_{cid}")
        op.execute(f"DROP TABLE IF EXISTS vec_{cid}")
    op.drop_table("vector_idempotency")
    op.drop_table("vector_collections")


def upgrade_checkpoints() -> None:
    pass


def downgrade_checkpoints() -> None:
    pass
