"""The checkpoints capability: LangGraph graph state (threads, checkpoints, blobs, pending writes)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager

from sqlalchemy import LargeBinary, Table, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.checkpoints.backend import backend_for
from app.checkpoints.models import checkpoints as checkpoint_rows
from app.checkpoints.models import checkpoint_blobs, checkpoint_retention, checkpoint_threads, checkpoint_writes, checkpoints
from app.checkpoints.reads import CheckpointReader
from app.checkpoints.repository import CheckpointsRepository
from app.checkpoints.router import router
from app.checkpoints.samples import SAMPLES
from app.checkpoints.service import CheckpointsService
from app.checkpoints.writer import writer_for
from app.core.capability import Capability, Change, Periodic
from app.quotas.tables import Counted, Part
from app.fairness.fairshare import HeavyWrites
from app.core.config import Database
from app.core.errors import ProblemError
from app.core.names import key_problem
from app.core.namespace_data import (
    Blob,
    Context,
    Deleted,
    NamespaceData,
    RefusedLine,
    Rows,
    decode_row,
    delete_rows,
    encode_row,
    export_table,
    keyset_pages,
    load_rows,
    writer,
)
from app.core.state import GatewayState
from app.core.fast.fixed_statements import fixed_statements
from app.core.db.upsert import insert_builder


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[CheckpointsService]:
    """The checkpoints service for the checkpoints database's backend."""
    settings = state.settings
    dialect = state.databases.dialect(Database.checkpoints)
    backend = backend_for(dialect)
    fixed = fixed_statements(dialect)
    repository = CheckpointsRepository(backend, insert_builder(dialect))
    writer = writer_for(dialect, repository, backend, fixed)
    databases = state.databases
    heavy = HeavyWrites(
        databases.engine(Database.checkpoints), databases.write_queues.get(Database.checkpoints), settings.fairness,
        Database.checkpoints.value,
    )
    yield CheckpointsService(
        repository, CheckpointReader(backend, fixed), writer, settings.limits, settings.checkpoints, heavy
    )


def periodic(service: CheckpointsService, state: GatewayState) -> Iterator[Periodic]:
    yield Periodic("checkpoints-sweep", service.settings.sweep_interval_seconds, service.sweep_round)


class CheckpointsData(NamespaceData[CheckpointsService]):
    """A namespace's threads, each with its checkpoints, channel values, pending writes and
    metadata terms (keyed by the thread's ``pk``), ``batch`` threads a transaction; and its
    retention settings.

    Archive: ``checkpoint_retention``, ``threads`` (retention of their own, ``touched_at`` so an
    idle TTL goes on), then ``checkpoints``, ``blobs`` and ``writes``, each line naming its thread
    by ``thread_id`` (a thread's ``pk`` is the storing gateway's). Checkpoint bytes travel as
    base64, versions and metadata as JSON; SQLite's metadata terms are written again on import."""

    parts = ("checkpoint_retention", "threads", "checkpoints", "blobs", "writes")

    async def export(self, service: CheckpointsService, conn: AsyncConnection, namespace: str, batch: int) -> AsyncIterator[Rows | Blob]:
        async for part in export_table(conn, checkpoint_retention, namespace, batch):
            yield part
        threads = checkpoint_threads
        after: int | None = None
        while True:
            query = select(threads).where(threads.c.namespace == namespace).order_by(threads.c.pk).limit(batch)
            if after is not None:
                query = query.where(threads.c.pk > after)
            rows = (await conn.execute(query)).all()
            if not rows:
                break
            yield Rows("threads", tuple(
                {"thread_id": r.thread_id, "touched_at": r.touched_at, "pruned_at": r.pruned_at,
                 "keep_latest": r.keep_latest, "idle_ttl_seconds": r.idle_ttl_seconds} for r in rows
            ))
            after = rows[-1].pk
        backend = service.repo.backend
        for name, table in _BY_THREAD.items():
            json_columns = ("channel_versions", "metadata") if table is checkpoints else ()
            columns = [
                backend.json_text(c).label(c.name) if c.name in json_columns else c
                for c in table.c if c.name != "thread_pk"
            ]
            pages = keyset_pages(
                conn, [threads.c.thread_id, *columns], list(table.primary_key.columns), [threads.c.namespace == namespace],
                batch, [c for c in table.c if isinstance(c.type, LargeBinary)],  # (not jsonb: length() is text's)
                from_=table.join(threads, threads.c.pk == table.c.thread_pk),
            )
            async for page in pages:
                lines = []
                for found in page:
                    row = dict(found)
                    for c in json_columns:
                        row[c] = json.loads(row[c])  # (not orjson's: it reads an integer past 64 bits as a float)
                    lines.append(encode_row(table, row))
                yield Rows(name, tuple(lines))

    async def load(
        self, service: CheckpointsService, conn: AsyncConnection, namespace: str, part: Rows, ctx: Context | None = None
    ) -> int:
        if part.table == "checkpoint_retention":
            return await load_rows(conn, checkpoint_retention, namespace, part.rows)
        if part.table == "threads":
            for row in part.rows:
                thread_id = row.get("thread_id")
                if not isinstance(thread_id, str) or key_problem(thread_id):
                    raise RefusedLine(f"thread_id {thread_id!r:.80} is not a key")
                values = decode_row(checkpoint_threads, {**row, "pk": 0})
                del values["pk"]
                await conn.execute(insert(checkpoint_threads).values(namespace=namespace, **values))
            return len(part.rows)
        table = _BY_THREAD.get(part.table)
        if table is None:
            raise RefusedLine(f"no part {part.table!r} here (parts: {', '.join(self.parts)})")
        wanted = {row.get("thread_id") for row in part.rows}
        if not all(isinstance(t, str) for t in wanted):
            raise RefusedLine("thread_id must be a string")
        found = (await conn.execute(
            select(checkpoint_threads.c.thread_id, checkpoint_threads.c.pk)
            .where(checkpoint_threads.c.namespace == namespace, checkpoint_threads.c.thread_id.in_(wanted))
        )).all()
        pks = {r.thread_id: r.pk for r in found}
        rows = []
        limit = service.settings.max_metadata_bytes
        for line in part.rows:
            line = dict(line)
            pk = pks.get(line.pop("thread_id"))
            if pk is None:
                raise RefusedLine("a line names a thread the threads part did not list")
            metadata = None
            if table is checkpoints:
                try:
                    metadata = line.get("metadata")
                    if not isinstance(metadata, dict):
                        raise RefusedLine("metadata must be an object")
                    line["metadata"] = service.stored_json("metadata", metadata, limit)
                    line["channel_versions"] = service.stored_json("channel_versions", line.get("channel_versions"), limit)
                except ProblemError as exc:
                    raise RefusedLine(str(exc)) from None
            values = decode_row(table, {**line, "thread_pk": pk})
            if metadata is None:
                rows.append(values)
                continue
            # through the repository: JSON columns are bound as the backend takes them (jsonb)
            await service.repo.put_checkpoint(
                conn, pk, values["checkpoint_ns"], values["checkpoint_id"], values["parent_checkpoint_id"],
                values["type"], values["checkpoint"], values["channel_versions"], values["metadata"], (),
            )
            await service.repo.backend.write_terms(conn, pk, values["checkpoint_ns"], values["checkpoint_id"], metadata)
        if rows:
            await conn.execute(insert(table), rows)
        return len(part.rows)

    async def delete(
        self, service: CheckpointsService, engine: AsyncEngine, namespace: str, batch: int
    ) -> AsyncGenerator[Deleted, None]:
        query = (
            select(checkpoint_threads.c.pk)
            .where(checkpoint_threads.c.namespace == namespace).order_by(checkpoint_threads.c.pk).limit(batch)
        )
        while True:
            async with writer(engine).begin() as conn:
                pks = list((await conn.execute(query)).scalars())
                checkpoints = await service.repo.delete_threads(conn, pks, namespace)
            if pks:
                yield {"threads": len(pks), "checkpoints": checkpoints}
            if len(pks) < batch:
                break
        async for deleted in delete_rows(engine, checkpoint_retention, namespace, batch):
            yield deleted


_BY_THREAD: dict[str, Table] = {"checkpoints": checkpoints, "blobs": checkpoint_blobs, "writes": checkpoint_writes}


CAPABILITY = Capability(
    name="checkpoints",
    router=router,
    database=Database.checkpoints,
    lifecycle=lifecycle,
    periodic=periodic,
    # checkpoints, blobs, writes and metadata terms are keyed by a thread row's id, which only a
    # scoped checkpoint_threads row hands out
    tables=(checkpoint_threads, checkpoint_retention),
    # items: threads (a retention row is one); bytes: their checkpoints', blobs' and pending writes'
    usage=(Counted(checkpoint_threads, parts=(
        Part(checkpoint_rows, "thread_pk", "checkpoint"), Part(checkpoint_blobs, "thread_pk", "blob"),
        Part(checkpoint_writes, "thread_pk", "blob"),
    )),),
    summary="LangGraph graph state: threads, checkpoints, channel blobs and pending writes "
    "(the client's GatewayCheckpointSaver).",
    samples=SAMPLES,
    data=CheckpointsData(),
    changes=(
        Change("put", ("POST /put",)),
        Change("writes", ("POST /writes",)),
        Change("thread_delete", ("DELETE /threads",)),
        Change("runs_delete", ("POST /runs/delete",)),
        Change("thread_copy", ("POST /threads/copy",)),
        Change("prune", ("POST /prune",), job="checkpoints-sweep"),
        Change("retention", ("PUT /retention",)),
    ),
)
