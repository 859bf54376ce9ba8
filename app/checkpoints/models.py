"""Tables of the checkpoints capability (checkpoints database).

``checkpoint_threads`` is the registry: one row per (namespace, thread_id), with the thread's own
retention settings and when it was last written. Checkpoints, channel blobs, pending writes and
metadata terms are keyed by the registry's integer ``pk``, which only a namespace-scoped lookup of
the registry hands out, so every row of a thread goes with its namespace without repeating it.

Layout follows LangGraph's PostgreSQL saver: a checkpoint row names its channels' versions
(``channel_versions``, JSON) and each (thread, checkpoint_ns, channel, version) value is stored
once in ``checkpoint_blobs``; pending writes are keyed (thread, ns, checkpoint_id, task_id, idx).
Values, writes and the checkpoint itself are typed bytes (``type`` + ``data``) the gateway stores
and returns without reading them. ``metadata`` is JSON: JSONB with a GIN index on PostgreSQL, and
on SQLite JSON text whose top-level scalar entries are also rows of ``checkpoint_metadata_terms``
(indexed), which serve list filters there.
"""

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import postgresql

from app.core.db.tables import KeyColumn, NameColumn, byte_ordered, checkpoints_db

ThreadPk = BigInteger().with_variant(Integer(), "sqlite")  # SQLite: the rowid alias
JsonDocument = Text().with_variant(postgresql.JSONB(), "postgresql")
CheckpointIdColumn = byte_ordered(128)  # ordered by bytes: newest first is checkpoint_id DESC
NsColumn = byte_ordered(1024)
TypeColumn = String(64)

checkpoint_threads = Table(
    "checkpoint_threads",
    checkpoints_db,
    Column("pk", ThreadPk, primary_key=True, autoincrement=True),
    Column("namespace", NameColumn, nullable=False),
    Column("thread_id", KeyColumn, nullable=False),
    Column("touched_at", Float, nullable=False, comment="Unix time of the last write (idle TTL)."),
    Column("pruned_at", Float, nullable=True, comment="Unix time keep-latest retention last ran."),
    Column("keep_latest", Integer, nullable=True, comment="Own retention: checkpoints kept per checkpoint_ns (0: none)."),
    Column("idle_ttl_seconds", Float, nullable=True, comment="Own retention: deleted after this long idle (0: never)."),
    UniqueConstraint("namespace", "thread_id"),
    Index("ix_checkpoint_threads_touched_at", "touched_at"),
    sqlite_autoincrement=True,
)

checkpoint_retention = Table(
    "checkpoint_retention",
    checkpoints_db,
    Column("namespace", NameColumn, primary_key=True),
    Column("keep_latest", Integer, nullable=True, comment="Checkpoints kept per thread and checkpoint_ns."),
    Column("idle_ttl_seconds", Float, nullable=True, comment="Threads idle longer than this are deleted."),
)

checkpoints = Table(
    "checkpoints",
    checkpoints_db,
    Column("thread_pk", ThreadPk, primary_key=True),
    Column("checkpoint_ns", NsColumn, primary_key=True),
    Column("checkpoint_id", CheckpointIdColumn, primary_key=True),
    Column("parent_checkpoint_id", CheckpointIdColumn, nullable=True),
    Column("type", TypeColumn, nullable=False),
    Column("checkpoint", LargeBinary, nullable=False, comment="Typed bytes, never read by the gateway."),
    Column("channel_versions", JsonDocument, nullable=False),
    Column("metadata", JsonDocument, nullable=False),
    Index(
        "ix_checkpoints_metadata", "metadata", postgresql_using="gin", postgresql_ops={"metadata": "jsonb_path_ops"}
    ).ddl_if(dialect="postgresql"),
)

checkpoint_blobs = Table(
    "checkpoint_blobs",
    checkpoints_db,
    Column("thread_pk", ThreadPk, primary_key=True),
    Column("checkpoint_ns", NsColumn, primary_key=True),
    Column("channel", KeyColumn, primary_key=True),
    Column("version", String(128), primary_key=True),
    Column("type", TypeColumn, nullable=False),
    Column("blob", LargeBinary, nullable=False),
)

checkpoint_writes = Table(
    "checkpoint_writes",
    checkpoints_db,
    Column("thread_pk", ThreadPk, primary_key=True),
    Column("checkpoint_ns", NsColumn, primary_key=True),
    Column("checkpoint_id", CheckpointIdColumn, primary_key=True),
    Column("task_id", KeyColumn, primary_key=True),
    Column("idx", Integer, primary_key=True, autoincrement=False),
    Column("task_path", Text, nullable=False),
    Column("channel", KeyColumn, nullable=False),
    Column("type", TypeColumn, nullable=False),
    Column("blob", LargeBinary, nullable=False),
)

checkpoint_metadata_terms = Table(
    "checkpoint_metadata_terms",
    checkpoints_db,
    Column("thread_pk", ThreadPk, primary_key=True),
    Column("checkpoint_ns", NsColumn, primary_key=True),
    Column("checkpoint_id", CheckpointIdColumn, primary_key=True),
    Column("key", KeyColumn, primary_key=True),
    Column("value", Text, nullable=False, comment="The value's canonical JSON text."),
    Index("ix_checkpoint_metadata_terms_key", "key", "value"),
)
