"""LangGraph checkpoints (checkpoints database)

Revision ID: 0007
Revises: 0006
"""

from alembic import op  # noqa: F401
import sqlalchemy as sa  # noqa: F401
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
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


_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.Text().with_variant(postgresql.JSONB(), "postgresql")


def upgrade_checkpoints() -> None:
    op.create_table(
        "checkpoint_threads",
        sa.Column("pk", _PK, autoincrement=True, nullable=False),
        sa.Column("namespace", _byte_ordered(128), nullable=False),
        sa.Column("thread_id", _byte_ordered(1024), nullable=False),
        sa.Column("touched_at", sa.Float(), nullable=False, comment="Unix time of the last write (idle TTL)."),
        sa.Column("pruned_at", sa.Float(), nullable=True, comment="Unix time keep-latest retention last ran."),
        sa.Column("keep_latest", sa.Integer(), nullable=True,
                  comment="Own retention: checkpoints kept per checkpoint_ns (0: none)."),
        sa.Column("idle_ttl_seconds", sa.Float(), nullable=True,
                  comment="Own retention: deleted after this long idle (0: never)."),
        sa.PrimaryKeyConstraint("pk", name=op.f("pk_checkpoint_threads")),
        sa.UniqueConstraint("namespace", "thread_id", name=op.f("uq_checkpoint_threads_namespace")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_checkpoint_threads_touched_at", "checkpoint_threads", ["touched_at"])
    op.create_table(
        "checkpoint_retention",
        sa.Column("namespace", _byte_ordered(128), nullable=False),
        sa.Column("keep_latest", sa.Integer(), nullable=True, comment="Checkpoints kept per thread and checkpoint_ns."),
        sa.Column("idle_ttl_seconds", sa.Float(), nullable=True, comment="Threads idle longer than this are deleted."),
        sa.PrimaryKeyConstraint("namespace", name=op.f("pk_checkpoint_retention")),
    )
    op.create_table(
        "checkpoints",
        sa.Column("thread_pk", _PK, nullable=False),
        sa.Column("checkpoint_ns", _byte_ordered(1024), nullable=False),
        sa.Column("checkpoint_id", _byte_ordered(128), nullable=False),
        sa.Column("parent_checkpoint_id", _byte_ordered(128), nullable=True),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("checkpoint", sa.LargeBinary(), nullable=False, comment="Typed bytes, never read by the gateway."),
        sa.Column("channel_versions", _JSON, nullable=False),
        sa.Column("metadata", _JSON, nullable=False),
        sa.PrimaryKeyConstraint("thread_pk", "checkpoint_ns", "checkpoint_id", name=op.f("pk_checkpoints")),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.create_index(
            "ix_checkpoints_metadata", "checkpoints", ["metadata"],
            postgresql_using="gin", postgresql_ops={"metadata": "jsonb_path_ops"},
        )
    op.create_table(
        "checkpoint_blobs",
        sa.Column("thread_pk", _PK, nullable=False),
        sa.Column("checkpoint_ns", _byte_ordered(1024), nullable=False),
        sa.Column("channel", _byte_ordered(1024), nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("thread_pk", "checkpoint_ns", "channel", "version", name=op.f("pk_checkpoint_blobs")),
    )
    op.create_table(
        "checkpoint_writes",
        sa.Column("thread_pk", _PK, nullable=False),
        sa.Column("checkpoint_ns", _byte_ordered(1024), nullable=False),
        sa.Column("checkpoint_id", _byte_ordered(128), nullable=False),
        sa.Column("task_id", _byte_ordered(1024), nullable=False),
        sa.Column("idx", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("task_path", sa.Text(), nullable=False),
        sa.Column("channel", _byte_ordered(1024), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint(
            "thread_pk", "checkpoint_ns", "checkpoint_id", "task_id", "idx", name=op.f("pk_checkpoint_writes")
        ),
    )
    op.create_table(
        "checkpoint_metadata_terms",
        sa.Column("thread_pk", _PK, nullable=False),
        sa.Column("checkpoint_ns", _byte_ordered(1024), nullable=False),
        sa.Column("checkpoint_id", _byte_ordered(128), nullable=False),
        sa.Column("key", _byte_ordered(1024), nullable=False),
        sa.Column("value", sa.Text(), nullable=False, comment="The value's canonical JSON text."),
        sa.PrimaryKeyConstraint(
            "thread_pk", "checkpoint_ns", "checkpoint_id", "key", name=op.f("pk_checkpoint_metadata_terms")
        ),
    )
    op.create_index("ix_checkpoint_metadata_terms_key", "checkpoint_metadata_terms", ["key", "value"])


def downgrade_checkpoints() -> None:
    op.drop_table("checkpoint_metadata_terms")
    op.drop_table("checkpoint_writes")
    op.drop_table("checkpoint_blobs")
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_checkpoints_metadata", table_name="checkpoints")
    op.drop_table("checkpoints")
    op.drop_table("checkpoint_retention")
    op.drop_index("ix_checkpoint_threads_touched_at", table_name="checkpoint_threads")
    op.drop_table("checkpoint_threads")
