"""Files and their chunks (metadata database)

Revision ID: 0004
Revises: 0003
"""

from alembic import op  # noqa: F401
import sqlalchemy as sa  # noqa: F401

revision = "0004"
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade(engine_name: str) -> None:
    globals()[f"upgrade_{engine_name}"]()


def downgrade(engine_name: str) -> None:
    globals()[f"downgrade_{engine_name}"]()


def upgrade_metadata() -> None:
    op.create_table(
        "files",
        sa.Column("namespace", _byte_ordered(128), nullable=False),
        sa.Column("collection", _byte_ordered(128), nullable=False),
        sa.Column("file_id", _byte_ordered(1024), nullable=False),
        sa.Column("blob_id", sa.String(32), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("chunk_bytes", sa.Integer(), nullable=False),
        sa.Column("content_type", sa.String(255), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "collection", "file_id", name=op.f("pk_files")),
        sa.UniqueConstraint("blob_id", name=op.f("uq_files_blob_id")),
    )
    op.create_table(
        "file_chunks",
        sa.Column("blob_id", sa.String(32), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("blob_id", "seq", name=op.f("pk_file_chunks")),
    )
    if op.get_bind().dialect.name == "postgresql":
        # Chunks are mostly incompressible: store them out of line without trying pglz.
        op.execute("ALTER TABLE file_chunks ALTER COLUMN data SET STORAGE EXTERNAL")
    op.create_table(
        "file_uploads",
        sa.Column("blob_id", sa.String(32), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("touched_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("blob_id", name=op.f("pk_file_uploads")),
    )
    op.create_index(op.f("ix_file_uploads_touched_at"), "file_uploads", ["touched_at"])


def downgrade_metadata() -> None:
    op.drop_index(op.f("ix_file_uploads_touched_at"), table_name="file_uploads")
    op.drop_table("file_uploads")
    op.drop_table("file_chunks")
    op.drop_table("files")


def _byte_ordered(length: int) -> sa.types.TypeEngine:
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade_vectors() -> None:
    pass


def downgrade_vectors() -> None:
    pass


def upgrade_checkpoints() -> None:
    pass


def downgrade_checkpoints() -> None:
    pass
