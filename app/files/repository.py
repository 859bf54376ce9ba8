"""All SQL of the files capability. Every statement on ``files`` starts from ``in_scope``.

Functions take an open ``AsyncConnection`` (or session); the service decides the transactions.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, bindparam, delete, func, insert, null, or_, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.db.scoping import in_scope
from app.core.db.tables import driver_timestamp, from_driver_timestamp
from app.core.fast.inline_sqlite import Execute
from app.core.fast.fixed_statements import FixedStatement, StatementConnection, inline_sql
from app.files.backend import FilesBackend
from app.files.local import LOCAL_KEY_PREFIX
from app.files.models import file_chunks, file_uploads, files

Conn = AsyncConnection


@dataclass(frozen=True)
class FileRow:
    """One stored file version: what its headers and its chunks need."""

    file_id: str
    blob_id: str
    size: int
    chunk_bytes: int
    content_type: str
    sha256: str
    created_at: datetime
    updated_at: datetime
    object_key: str | None = None  # None: chunks in the database; else the bucket's key or a local file's

    @classmethod
    def of(cls, row: Any) -> FileRow:
        return cls(
            file_id=row.file_id,
            blob_id=row.blob_id,
            size=row.size,
            chunk_bytes=row.chunk_bytes,
            content_type=row.content_type,
            sha256=row.sha256,
            created_at=row.created_at,
            updated_at=row.updated_at,
            object_key=row.object_key,
        )


_FILE_COLUMNS = (
    files.c.file_id,
    files.c.blob_id,
    files.c.size,
    files.c.chunk_bytes,
    files.c.content_type,
    files.c.sha256,
    files.c.created_at,
    files.c.updated_at,
    files.c.object_key,
)

# The same columns for a fixed statement: the timestamps as the driver returns them.
_DRIVER_FILE_COLUMNS = tuple(
    driver_timestamp(c).label(c.key) if c.key in ("created_at", "updated_at") else c for c in _FILE_COLUMNS
)


def _download_row(row: Sequence[Any]) -> tuple[FileRow, bytes | None]:
    """A ``_row_and_only_chunk`` row (a driver's row, or SQLAlchemy's): the file and its chunk."""
    file_id, blob_id, size, chunk_bytes, content_type, sha256, created_at, updated_at, object_key, data = row
    return FileRow(
        file_id=file_id, blob_id=blob_id, size=size, chunk_bytes=chunk_bytes, content_type=content_type,
        sha256=sha256, created_at=from_driver_timestamp(created_at),
        updated_at=from_driver_timestamp(updated_at), object_key=object_key,
    ), data


class FilesRepository:
    def __init__(self, backend: FilesBackend, fixed: type[FixedStatement] = FixedStatement) -> None:
        self.backend = backend
        # A download's row and, when the whole file is one chunk in the database, that chunk:
        # a fixed statement, sent with the driver outside a transaction (the timestamps as the
        # driver returns them, converted in ``_download_row``).
        this_file = (in_scope(files, bindparam("ns"), bindparam("c")), files.c.file_id == bindparam("id"))
        self._row_and_only_chunk = fixed(
            select(*_DRIVER_FILE_COLUMNS, file_chunks.c.data)
            .select_from(
                files.outerjoin(
                    file_chunks,
                    and_(
                        file_chunks.c.blob_id == files.c.blob_id,
                        file_chunks.c.seq == 0,
                        files.c.size <= files.c.chunk_bytes,
                        files.c.object_key.is_(None),
                    ),
                )
            )
            .where(*this_file)
        )

        # The same row without its chunk: for a gateway whose files are outside the database,
        # read on SQLite on the loop's thread (``app.core.fast.inline_sqlite``), where a chunk must not be.
        self._row_alone = fixed(
            select(*_DRIVER_FILE_COLUMNS, null().label("data")).where(*this_file)
        )

        # A version's swap on SQLite, run on the loop's thread in one inline transaction
        # (``swap_inline``); the same statements as the methods below, with bound parameters.
        version = {
            c.key: bindparam(c.key, type_=c.type)
            for c in (files.c.blob_id, files.c.size, files.c.chunk_bytes, files.c.content_type, files.c.sha256,
                      files.c.updated_at, files.c.object_key)
        }
        self._replace_version = fixed(update(files).where(*this_file).values(**version))
        self._insert_version = fixed(insert(files).values(
            namespace=bindparam("ns"), collection=bindparam("c"), file_id=bindparam("id"),
            created_at=bindparam("created_at", type_=files.c.created_at.type), **version,
        ))
        self._end_upload = fixed(delete(file_uploads).where(file_uploads.c.blob_id == bindparam("blob_id")))
        self._drop_blob = fixed(delete(file_chunks).where(file_chunks.c.blob_id == bindparam("blob_id")))

    # --- files rows --------------------------------------------------------------------

    def _one(self, namespace: str, collection: str, file_id: str) -> Select[*tuple[Any, ...]]:
        return select(*_FILE_COLUMNS).where(in_scope(files, namespace, collection), files.c.file_id == file_id)

    async def get(self, conn: Conn, namespace: str, collection: str, file_id: str) -> FileRow | None:
        row = (await conn.execute(self._one(namespace, collection, file_id))).first()
        return FileRow.of(row) if row else None

    async def get_with_only_chunk(
        self, conn: StatementConnection, namespace: str, collection: str, file_id: str
    ) -> tuple[FileRow, bytes | None] | None:
        """The row, and its bytes when they are one chunk in the database (None otherwise:
        an empty file, a file of several chunks, or one in S3), in one statement."""
        row = await self._row_and_only_chunk.first(conn, {"ns": namespace, "c": collection, "id": file_id})
        return _download_row(row) if row else None

    async def get_without_chunk(
        self, conn: StatementConnection, namespace: str, collection: str, file_id: str
    ) -> tuple[FileRow, None] | None:
        """``get_with_only_chunk`` that never reads a chunk (the bytes are None)."""
        row = await self._row_alone.first(conn, {"ns": namespace, "c": collection, "id": file_id})
        return (_download_row(row)[0], None) if row else None

    @staticmethod
    def _run_inline(execute: Execute, statement: FixedStatement, params: dict[str, Any]) -> Any:
        return execute(*inline_sql(statement, params))

    def end_upload_inline(self, execute: Execute, blob_id: str) -> bool:
        """``end_upload`` in an inline transaction's body (SQLite, ``InlineStatements.transaction``)."""
        return bool(self._run_inline(execute, self._end_upload, {"blob_id": blob_id}).rowcount == 1)

    def swap_inline(
        self, execute: Execute, namespace: str, collection: str, new: FileRow,
        decide: Callable[[FileRow | None], FileRow],
    ) -> tuple[FileRow, FileRow | None]:
        """A version swap in an inline transaction's body (SQLite): read the current row,
        ``decide`` the new one from it (raising refuses the swap), write it, and drop the old
        version's chunks when they are in the database. (The row stored, the row replaced or None.)"""
        this_file = {"ns": namespace, "c": collection, "id": new.file_id}
        found = self._run_inline(execute, self._row_alone, this_file).fetchone()
        current = _download_row(found)[0] if found else None
        chosen = decide(current)
        values = _row_values(chosen)
        del values["file_id"]
        if current is None:
            self._run_inline(execute, self._insert_version, {**this_file, **values})
            return chosen, None
        del values["created_at"]
        self._run_inline(execute, self._replace_version, {**this_file, **values})
        if current.object_key is None:
            self._run_inline(execute, self._drop_blob, {"blob_id": current.blob_id})
        return chosen, current

    async def get_for_update(self, conn: Conn, namespace: str, collection: str, file_id: str) -> FileRow | None:
        row = (await conn.execute(self.backend.locked(self._one(namespace, collection, file_id)))).first()
        return FileRow.of(row) if row else None

    async def insert_if_absent(
        self, conn: Conn, namespace: str, collection: str, new: FileRow
    ) -> bool:
        """Insert ``new`` unless the id exists (a concurrent writer may have just created it)."""
        stmt = (
            self.backend.insert(files)
            .values(namespace=namespace, collection=collection, **_row_values(new))
            .on_conflict_do_nothing(index_elements=[files.c.namespace, files.c.collection, files.c.file_id])
            .returning(files.c.file_id)
        )
        return (await conn.execute(stmt)).first() is not None

    async def replace(self, conn: Conn, namespace: str, collection: str, new: FileRow) -> None:
        values = _row_values(new)
        values.pop("created_at")
        values.pop("file_id")
        await conn.execute(
            update(files)
            .where(in_scope(files, namespace, collection), files.c.file_id == new.file_id)
            .values(**values)
        )

    async def delete(self, conn: Conn, namespace: str, collection: str, file_id: str) -> None:
        await conn.execute(delete(files).where(in_scope(files, namespace, collection), files.c.file_id == file_id))

    async def list(
        self, conn: Conn, namespace: str, collection: str, *, prefix: str | None, after: str | None, limit: int
    ) -> list[FileRow]:
        stmt = select(*_FILE_COLUMNS).where(in_scope(files, namespace, collection))
        if prefix:
            stmt = stmt.where(files.c.file_id >= prefix, func.substr(files.c.file_id, 1, len(prefix)) == prefix)
        if after is not None:
            stmt = stmt.where(files.c.file_id > after)
        stmt = stmt.order_by(files.c.file_id).limit(limit)
        return [FileRow.of(r) for r in (await conn.execute(stmt)).all()]

    async def usage(self, conn: Conn, namespace: str) -> tuple[int, int]:
        """(total bytes, file count) of ``namespace``."""
        row = (
            await conn.execute(
                select(func.coalesce(func.sum(files.c.size), 0), func.count()).where(in_scope(files, namespace))
            )
        ).one()
        return int(row[0]), int(row[1])

    # --- moving between backends (an operator's command, across every namespace) -----------

    @staticmethod
    def _not_on(target: str) -> ColumnElement[bool]:
        """Rows whose bytes are NOT yet where ``files migrate --to target`` sends them: database
        chunks have no key, a local file's key starts with ``/`` (``app.files.local``), an S3
        key never does."""
        key = files.c.object_key
        local = key.startswith(LOCAL_KEY_PREFIX, autoescape=True)
        if target == "database":
            return key.is_not(None)
        if target == "directory":
            return or_(key.is_(None), ~local)
        return or_(key.is_(None), local)

    async def move_totals(self, conn: Conn, *, target: str) -> tuple[int, int]:
        """(files, bytes) still to move."""
        row = (
            await conn.execute(
                select(func.count(), func.coalesce(func.sum(files.c.size), 0)).where(self._not_on(target))
            )
        ).one()
        return int(row[0]), int(row[1])

    async def to_move(
        self, conn: Conn, *, target: str, after: tuple[str, str, str] | None, limit: int
    ) -> builtins.list[tuple[str, str, FileRow]]:
        """The next ``limit`` rows to move, in key order after ``after``: (namespace, collection, row)."""
        stmt = select(files.c.namespace, files.c.collection, *_FILE_COLUMNS).where(self._not_on(target))
        if after is not None:
            stmt = stmt.where(tuple_(files.c.namespace, files.c.collection, files.c.file_id) > after)
        stmt = stmt.order_by(files.c.namespace, files.c.collection, files.c.file_id).limit(limit)
        return [(r.namespace, r.collection, FileRow.of(r)) for r in (await conn.execute(stmt)).all()]

    # --- chunks ------------------------------------------------------------------------

    async def add_chunk(self, conn: Conn, blob_id: str, seq: int, data: bytes) -> None:
        await conn.execute(file_chunks.insert().values(blob_id=blob_id, seq=seq, data=data))

    async def chunk(self, conn: Conn, blob_id: str, seq: int) -> bytes | None:
        return (
            await conn.execute(
                select(file_chunks.c.data).where(file_chunks.c.blob_id == blob_id, file_chunks.c.seq == seq)
            )
        ).scalar()

    async def drop_blob(self, conn: Conn, blob_id: str) -> None:
        await conn.execute(delete(file_chunks).where(file_chunks.c.blob_id == blob_id))

    async def drop_chunks_of(self, conn: Conn, row: FileRow) -> None:
        """The chunks of a version whose bytes are in the database; nothing (no statement in the
        transaction) for one in S3 or a local file, which goes after the commit."""
        if row.object_key is None:
            await self.drop_blob(conn, row.blob_id)

    # --- uploads in progress -----------------------------------------------------------

    async def start_upload(self, conn: Conn, blob_id: str, now: datetime) -> None:
        await conn.execute(file_uploads.insert().values(blob_id=blob_id, started_at=now, touched_at=now))

    async def touch_upload(self, conn: Conn, blob_id: str, now: datetime) -> bool:
        """Refresh the heartbeat; False when the sweeper already discarded this upload."""
        result = await conn.execute(
            update(file_uploads).where(file_uploads.c.blob_id == blob_id).values(touched_at=now)
        )
        return result.rowcount == 1

    async def end_upload(self, conn: Conn, blob_id: str, *, touched_before: datetime | None = None) -> bool:
        """Forget an upload (only if stale, when ``touched_before`` is given); False if it was gone."""
        stmt = delete(file_uploads).where(file_uploads.c.blob_id == blob_id)
        if touched_before is not None:
            stmt = stmt.where(file_uploads.c.touched_at < touched_before)
        return (await conn.execute(stmt)).rowcount == 1

    async def known_blobs(self, conn: Conn, blob_ids: builtins.list[str]) -> set[str]:
        """Those of ``blob_ids`` that a file row points at or an upload in progress holds."""
        if not blob_ids:
            return set()
        known = set((await conn.execute(select(files.c.blob_id).where(files.c.blob_id.in_(blob_ids)))).scalars())
        known |= set(
            (await conn.execute(select(file_uploads.c.blob_id).where(file_uploads.c.blob_id.in_(blob_ids)))).scalars()
        )
        return known

    async def stale_uploads(self, conn: Conn, touched_before: datetime, limit: int = 100) -> builtins.list[str]:
        rows = await conn.execute(
            select(file_uploads.c.blob_id).where(file_uploads.c.touched_at < touched_before).limit(limit)
        )
        return list(rows.scalars())


def _row_values(row: FileRow) -> dict[str, Any]:
    return {
        "file_id": row.file_id,
        "blob_id": row.blob_id,
        "size": row.size,
        "chunk_bytes": row.chunk_bytes,
        "content_type": row.content_type,
        "sha256": row.sha256,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "object_key": row.object_key,
    }
