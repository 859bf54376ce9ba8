"""Storing a checkpoint and storing pending writes: one statement each on PostgreSQL.

Each write also registers (or touches) the thread. On PostgreSQL that is one statement with
CTEs (the thread upsert, the values or writes from ``unnest`` of arrays, the checkpoint), which
is atomic by itself and so runs without BEGIN/COMMIT on a pooled driver connection
(``app.core.db.statements``): one round trip, as ``AsyncPostgresSaver``'s pipeline. On SQLite the
same steps are separate statements in the request's (in-process) transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import Integer, LargeBinary, Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY

from app.checkpoints.backend import CheckpointsBackend
from app.checkpoints.repository import CheckpointsRepository
from app.core.db.statements import FixedStatement, StatementConnection

NewValue = tuple[str, str, str, bytes]  # channel, version, type, bytes
NewWrite = tuple[int, str, str, bytes]  # idx, channel, type, bytes


class CheckpointWriter(Protocol):
    async def put(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        parent: str | None, type_: str, data: bytes, versions_json: str, metadata_json: str,
        metadata: Mapping[str, Any], values: Sequence[NewValue],
    ) -> None: ...

    async def put_writes(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        task_id: str, task_path: str, rows: Sequence[NewWrite], *, replace: bool,
    ) -> None: ...


_TOUCH = """
WITH t AS (
    INSERT INTO checkpoint_threads (namespace, thread_id, touched_at) VALUES (:ns, :tid, :now)
    ON CONFLICT (namespace, thread_id) DO UPDATE SET touched_at = EXCLUDED.touched_at
    RETURNING pk
)"""

_PUT = _TOUCH + """, v AS (
    INSERT INTO checkpoint_blobs (thread_pk, checkpoint_ns, channel, version, type, blob)
    SELECT t.pk, :cns, x.channel, x.version, x.type, x.blob
    FROM t, unnest(:channels, :versions, :types, :blobs) AS x(channel, version, type, blob)
    ON CONFLICT DO NOTHING
)
INSERT INTO checkpoints (thread_pk, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,
                         channel_versions, metadata)
SELECT t.pk, :cns, :cid, :parent, :type, :data, CAST(:versions_json AS JSONB), CAST(:metadata AS JSONB) FROM t
ON CONFLICT (thread_pk, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, type = EXCLUDED.type, checkpoint = EXCLUDED.checkpoint,
    channel_versions = EXCLUDED.channel_versions, metadata = EXCLUDED.metadata
"""

_WRITES = _TOUCH + """
INSERT INTO checkpoint_writes (thread_pk, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, blob)
SELECT t.pk, :cns, :cid, :task_id, x.idx, :task_path, x.channel, x.type, x.blob
FROM t, unnest(:idxs, :channels, :types, :blobs) AS x(idx, channel, type, blob)
ON CONFLICT (thread_pk, checkpoint_ns, checkpoint_id, task_id, idx) DO """


def _statement(sql: str) -> Any:
    return text(sql).bindparams(
        bindparam("ns", type_=Text), bindparam("tid", type_=Text), bindparam("cns", type_=Text),
        bindparam("channels", type_=ARRAY(Text)), bindparam("types", type_=ARRAY(Text)),
        bindparam("blobs", type_=ARRAY(LargeBinary)),
        *([bindparam("versions", type_=ARRAY(Text))] if ":versions," in sql else []),
        *([bindparam("idxs", type_=ARRAY(Integer))] if ":idxs" in sql else []),
    )


class PostgresWriter:
    def __init__(self, fixed: type[FixedStatement]) -> None:
        self._put = fixed(_statement(_PUT))
        self._insert_writes = fixed(_statement(_WRITES + "NOTHING"))
        self._replace_writes = fixed(_statement(
            _WRITES + "UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob"
        ))

    async def put(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        parent: str | None, type_: str, data: bytes, versions_json: str, metadata_json: str,
        metadata: Mapping[str, Any], values: Sequence[NewValue],
    ) -> None:
        await self._put.rowcount(conn, {
            "ns": ns, "tid": thread_id, "now": now, "cns": checkpoint_ns, "cid": checkpoint_id, "parent": parent,
            "type": type_, "data": data, "versions_json": versions_json, "metadata": metadata_json,
            "channels": [v[0] for v in values], "versions": [v[1] for v in values],
            "types": [v[2] for v in values], "blobs": [v[3] for v in values],
        })

    async def put_writes(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        task_id: str, task_path: str, rows: Sequence[NewWrite], *, replace: bool,
    ) -> None:
        stmt = self._replace_writes if replace else self._insert_writes
        await stmt.rowcount(conn, {
            "ns": ns, "tid": thread_id, "now": now, "cns": checkpoint_ns, "cid": checkpoint_id, "task_id": task_id,
            "task_path": task_path, "idxs": [r[0] for r in rows], "channels": [r[1] for r in rows],
            "types": [r[2] for r in rows], "blobs": [r[3] for r in rows],
        })


class SqliteWriter:
    def __init__(self, repository: CheckpointsRepository, backend: CheckpointsBackend) -> None:
        self._repo = repository
        self._backend = backend

    async def put(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        parent: str | None, type_: str, data: bytes, versions_json: str, metadata_json: str,
        metadata: Mapping[str, Any], values: Sequence[NewValue],
    ) -> None:
        pk = await self._repo.touch_thread(conn, ns, thread_id, now)  # type: ignore[arg-type]
        await self._repo.put_checkpoint(
            conn, pk, checkpoint_ns, checkpoint_id, parent, type_, data, versions_json, metadata_json, values  # type: ignore[arg-type]
        )
        await self._backend.write_terms(conn, pk, checkpoint_ns, checkpoint_id, metadata)  # type: ignore[arg-type]

    async def put_writes(
        self, conn: StatementConnection, ns: str, thread_id: str, now: float, checkpoint_ns: str, checkpoint_id: str,
        task_id: str, task_path: str, rows: Sequence[NewWrite], *, replace: bool,
    ) -> None:
        pk = await self._repo.touch_thread(conn, ns, thread_id, now)  # type: ignore[arg-type]
        await self._repo.put_writes(conn, pk, checkpoint_ns, checkpoint_id, task_id, task_path, rows, replace=replace)  # type: ignore[arg-type]


def writer_for(dialect: str, repository: CheckpointsRepository, backend: CheckpointsBackend, fixed: type[FixedStatement]) -> CheckpointWriter:
    return PostgresWriter(fixed) if dialect == "postgresql" else SqliteWriter(repository, backend)
