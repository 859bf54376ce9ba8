"""Storing a checkpoint and storing pending writes: one statement each on PostgreSQL.

Each write also registers (or touches) the thread. On PostgreSQL that is one statement with
CTEs (the thread upsert, the values or writes from ``unnest`` of arrays, the checkpoint), which
is atomic by itself and so runs without BEGIN/COMMIT on a pooled driver connection
(``app.core.fast.fixed_statements``): one round trip, as ``AsyncPostgresSaver``'s pipeline. On SQLite the
same steps are separate statements in the request's (in-process) transaction.

Each write is weighed, so that what a read answers stays bounded (``app.checkpoints.reads``): a
checkpoint with its metadata, versions and the values they reference, or the pending writes of a
checkpoint, as they would be stored. Both writers answer that weight, and a write heavier than its
``max_bytes`` has stored nothing once the caller refuses it: on PostgreSQL every CTE of the
statement is gated on the weight, computed first from what is stored and what the request brings;
on SQLite the weight of what was just written is read back in the request's transaction, which
the refusal rolls back. Writes to one checkpoint at the same moment on PostgreSQL each see what
was stored before them, so together they may pass the limit; a read refuses a checkpoint heavier
than it answers (``TooHeavy``), which bounds memory whatever is stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import orjson

from sqlalchemy import BigInteger, Integer, LargeBinary, Text, bindparam, func, literal_column, select, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.elements import BindParameter

from app.checkpoints.backend import CheckpointsBackend
from app.checkpoints.models import checkpoints as cp
from app.checkpoints.reads import ROW_BYTES, checkpoint_bytes, pending_bytes, value_weight, write_weight
from app.checkpoints.repository import CheckpointsRepository
from app.core.fast.fixed_statements import ASYNCPG_DIALECT, FixedStatement, StatementConnection

NewValue = tuple[str, str, str, bytes]  # channel, version, type, bytes
NewWrite = tuple[int, str, str, bytes]  # idx, channel, type, bytes


class CheckpointWriter(Protocol):
    async def put(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        parent: str | None, type_: str, data: bytes, versions_json: str, metadata_json: str,
        metadata: Mapping[str, Any], values: Sequence[NewValue], max_bytes: int,
    ) -> int:
        """Store the checkpoint unless it would weigh more than ``max_bytes``; its weight."""

    async def put_writes(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        task_id: str, task_path: str, rows: Sequence[NewWrite], *, replace: bool, max_bytes: int,
    ) -> int:
        """Store the writes unless the checkpoint's pending writes would weigh more than
        ``max_bytes``; that weight."""


def _weight_sql(weight: Any, alias: str, *columns: str) -> str:
    """``weight`` (``value_weight`` or ``write_weight``) of the stored row ``alias``, as this
    module's text SQL: the one definition of what a row weighs, spelled for PostgreSQL."""
    expr = weight(*(func.octet_length(literal_column(f"{alias}.{c}")) for c in columns))
    return str(expr.compile(dialect=ASYNCPG_DIALECT, compile_kwargs={"literal_binds": True}))


_STORED_VALUE = _weight_sql(value_weight, "b", "channel", "type", "blob")
_STORED_WRITE = _weight_sql(write_weight, "o", "task_id", "channel", "type", "blob", "task_path")

# The thread's pk if it has one (what is stored is looked up by it); every CTE after ``w`` (the
# weight) is gated on the weight.
_THREAD = """
tp AS (SELECT pk FROM checkpoint_threads WHERE namespace = :ns AND thread_id = :tid),"""

_TOUCH = """
t AS (
    INSERT INTO checkpoint_threads (namespace, thread_id, touched_at) SELECT :ns, :tid, :now FROM w WHERE w.weight <= :max
    ON CONFLICT (namespace, thread_id) DO UPDATE SET touched_at = EXCLUDED.touched_at
    RETURNING pk
)"""

# What the checkpoint will weigh as a read weighs it (``app.checkpoints.reads``): its bytes
# (``own``), its JSON as PostgreSQL stores it, the values its versions reference that are stored
# and not brought, and every value brought (``brought``, whether referenced or not: all are stored).
_PUT = "WITH" + _THREAD + """
w AS (
    SELECT :own + octet_length(CAST(CAST(:metadata AS JSONB) AS TEXT))
        + octet_length(CAST(CAST(:versions_json AS JSONB) AS TEXT)) + :brought + COALESCE((
            SELECT sum((
                SELECT """ + _STORED_VALUE + """
                FROM checkpoint_blobs b
                WHERE b.thread_pk = (SELECT pk FROM tp) AND b.checkpoint_ns = :cns AND b.channel = v.key
                  AND b.version = v.value LIMIT 1
            ))
            FROM jsonb_each_text(CAST(:versions_json AS JSONB)) AS v
            WHERE NOT EXISTS (SELECT FROM unnest(:channels, :versions) AS x(channel, version)
                              WHERE x.channel = v.key AND x.version = v.value)
        ), 0) AS weight
),""" + _TOUCH + """, vals AS (
    INSERT INTO checkpoint_blobs (thread_pk, checkpoint_ns, channel, version, type, blob)
    SELECT t.pk, :cns, x.channel, x.version, x.type, x.blob
    FROM t, unnest(:channels, :versions, :types, :blobs) AS x(channel, version, type, blob)
    ON CONFLICT DO NOTHING
), c AS (
    INSERT INTO checkpoints (thread_pk, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,
                             channel_versions, metadata)
    SELECT t.pk, :cns, :cid, :parent, :type, :data, CAST(:versions_json AS JSONB), CAST(:metadata AS JSONB) FROM t
    ON CONFLICT (thread_pk, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, type = EXCLUDED.type, checkpoint = EXCLUDED.checkpoint,
        channel_versions = EXCLUDED.channel_versions, metadata = EXCLUDED.metadata
)
SELECT weight FROM w
"""


# What the checkpoint's pending writes will weigh: the other tasks' and indexes' as stored, and
# each written (task, idx) with its new weight (``lens``) if they replace, else as stored if it is.
_WRITES = "WITH" + _THREAD + """
w AS (
    SELECT COALESCE((
        SELECT sum(""" + _STORED_WRITE + """) FROM checkpoint_writes o
        WHERE o.thread_pk = (SELECT pk FROM tp) AND o.checkpoint_ns = :cns AND o.checkpoint_id = :cid
          AND NOT (o.task_id = :task_id AND o.idx = ANY(:idxs))
    ), 0) + COALESCE((
        SELECT sum({kept}) FROM unnest(:idxs, :lens) AS x(idx, len)
        LEFT JOIN checkpoint_writes o ON o.thread_pk = (SELECT pk FROM tp) AND o.checkpoint_ns = :cns
          AND o.checkpoint_id = :cid AND o.task_id = :task_id AND o.idx = x.idx
    ), 0) AS weight
),""" + _TOUCH + """, i AS (
    INSERT INTO checkpoint_writes (thread_pk, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, blob)
    SELECT t.pk, :cns, :cid, :task_id, x.idx, :task_path, x.channel, x.type, x.blob
    FROM t, unnest(:idxs, :channels, :types, :blobs) AS x(idx, channel, type, blob)
    ON CONFLICT (thread_pk, checkpoint_ns, checkpoint_id, task_id, idx) DO {conflict}
)
SELECT weight FROM w
"""


def _utf8(text: str) -> int:
    return len(text.encode("utf-8"))


def _statement(sql: str) -> Any:
    typed: list[BindParameter[Any]] = [
        bindparam("ns", type_=Text), bindparam("tid", type_=Text), bindparam("cns", type_=Text),
        bindparam("channels", type_=ARRAY(Text)), bindparam("types", type_=ARRAY(Text)),
        bindparam("blobs", type_=ARRAY(LargeBinary)),
        bindparam("max", type_=BigInteger),
    ]
    if ":versions," in sql:
        typed += [bindparam("versions", type_=ARRAY(Text)), bindparam("own", type_=BigInteger),
                  bindparam("brought", type_=BigInteger)]
    else:
        typed += [bindparam("idxs", type_=ARRAY(Integer)), bindparam("lens", type_=ARRAY(BigInteger))]
    return text(sql).bindparams(*typed).columns(weight=BigInteger)


class PostgresWriter:
    def __init__(self, fixed: type[FixedStatement]) -> None:
        self._put = fixed(_statement(_PUT))
        self._insert_writes = fixed(_statement(_WRITES.format(kept=f"COALESCE({_STORED_WRITE}, x.len)", conflict="NOTHING")))
        self._replace_writes = fixed(_statement(_WRITES.format(
            kept="x.len", conflict="UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob",
        )))

    async def put(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        parent: str | None, type_: str, data: bytes, versions_json: str, metadata_json: str,
        metadata: Mapping[str, Any], values: Sequence[NewValue], max_bytes: int,
    ) -> int:
        row = await self._put.first(conn, {
            "ns": ns, "tid": thread_id, "now": now, "cns": checkpoint_ns, "cid": checkpoint_id, "parent": parent,
            "type": type_, "data": data, "versions_json": versions_json, "metadata": metadata_json,
            "own": len(data) + ROW_BYTES, "max": max_bytes,
            "brought": sum(value_weight(_utf8(c), _utf8(t), len(d)) for c, _, t, d in values),
            "channels": [v[0] for v in values], "versions": [v[1] for v in values],
            "types": [v[2] for v in values], "blobs": [v[3] for v in values],
        })
        assert row is not None  # ``w`` is one row
        return int(row[0])

    async def put_writes(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        task_id: str, task_path: str, rows: Sequence[NewWrite], *, replace: bool, max_bytes: int,
    ) -> int:
        stmt = self._replace_writes if replace else self._insert_writes
        row = await stmt.first(conn, {
            "ns": ns, "tid": thread_id, "now": now, "cns": checkpoint_ns, "cid": checkpoint_id, "task_id": task_id,
            "task_path": task_path, "idxs": [r[0] for r in rows], "channels": [r[1] for r in rows],
            "types": [r[2] for r in rows], "blobs": [r[3] for r in rows], "max": max_bytes,
            "lens": [write_weight(_utf8(task_id), _utf8(r[1]), _utf8(r[2]), len(r[3]), _utf8(task_path)) for r in rows],
        })
        assert row is not None
        return int(row[0])


_KEY = (cp.c.thread_pk == bindparam("pk"), cp.c.checkpoint_ns == bindparam("cns"), cp.c.checkpoint_id == bindparam("cid"))


class SqliteWriter:
    def __init__(self, repository: CheckpointsRepository, backend: CheckpointsBackend) -> None:
        self._repo = repository
        self._backend = backend
        self._checkpoint_weight = select(checkpoint_bytes(backend)).where(*_KEY)
        key = select(bindparam("pk").label("thread_pk"), bindparam("cns").label("checkpoint_ns"),
                     bindparam("cid").label("checkpoint_id")).subquery("key")
        self._pending_weight = select(pending_bytes(key))

    async def put(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        parent: str | None, type_: str, data: bytes, versions_json: str, metadata_json: str,
        metadata: Mapping[str, Any], values: Sequence[NewValue], max_bytes: int,
    ) -> int:
        pk = await self._repo.touch_thread(conn, ns, thread_id, now)  # type: ignore[arg-type]
        await self._repo.put_checkpoint(
            conn, pk, checkpoint_ns, checkpoint_id, parent, type_, data, versions_json, metadata_json, values  # type: ignore[arg-type]
        )
        await self._backend.write_terms(conn, pk, checkpoint_ns, checkpoint_id, metadata)  # type: ignore[arg-type]
        key = {"pk": pk, "cns": checkpoint_ns, "cid": checkpoint_id}
        stored = int((await conn.execute(self._checkpoint_weight, key)).scalar_one())  # type: ignore[union-attr]
        # values brought that no version of the checkpoint references are stored too: counted as PostgreSQL does
        referenced = {(k, v if isinstance(v, str) else str(v)) for k, v in orjson.loads(versions_json).items()}
        unreferenced: int = sum(value_weight(_utf8(c), _utf8(t), len(d)) for c, v, t, d in values if (c, v) not in referenced)
        return stored + unreferenced

    async def put_writes(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        task_id: str, task_path: str, rows: Sequence[NewWrite], *, replace: bool, max_bytes: int,
    ) -> int:
        pk = await self._repo.touch_thread(conn, ns, thread_id, now)  # type: ignore[arg-type]
        await self._repo.put_writes(conn, pk, checkpoint_ns, checkpoint_id, task_id, task_path, rows, replace=replace)  # type: ignore[arg-type]
        key = {"pk": pk, "cns": checkpoint_ns, "cid": checkpoint_id}
        return int((await conn.execute(self._pending_weight, key)).scalar_one())  # type: ignore[union-attr]


def writer_for(dialect: str, repository: CheckpointsRepository, backend: CheckpointsBackend, fixed: type[FixedStatement]) -> CheckpointWriter:
    return PostgresWriter(fixed) if dialect == "postgresql" else SqliteWriter(repository, backend)
