"""All SQL of the checkpoints capability.

A thread's rows are found through ``checkpoint_threads``, always by (namespace, thread_id) in a
request (``_thread_pk`` / ``touch_thread``), so no statement a request sends can reach another
namespace's rows; only the retention sweep and the turns of long writes (``app.checkpoints.heavy``:
threads parked in ``~copy`` and ``~trash``, found by a scoped lookup first) go by ``pk``.
Statements that delete a thread's rows lock its registry row first (``FOR UPDATE`` on PostgreSQL;
SQLite writes one at a time), so a concurrent ``put`` that reuses a stored blob is never
interleaved with the statement collecting unreferenced blobs.
"""

from __future__ import annotations

import asyncio
import functools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson
from sqlalchemy import (
    BindParameter,
    Integer,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    exists,
    func,
    literal,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ColumnElement

from app.checkpoints.backend import CheckpointsBackend
from app.checkpoints.models import checkpoint_blobs as blobs
from app.checkpoints.models import checkpoint_metadata_terms as terms
from app.checkpoints.models import checkpoint_retention as retention
from app.checkpoints.models import checkpoint_threads as threads
from app.checkpoints.models import checkpoint_writes as writes
from app.checkpoints.models import checkpoints as cp
from app.checkpoints.reads import checkpoint_row_bytes, term_row_bytes, value_row_bytes, write_row_bytes
from app.core.db.upsert import InsertBuilder

_NS: BindParameter[str] = bindparam("ns")
_TID: BindParameter[str] = bindparam("tid")
_PK = bindparam("pk", type_=Integer)
_CNS = bindparam("cns", type_=Text)
_CHILD_TABLES = (writes, terms, cp, blobs)
DELETE_CHUNK = 1000  # checkpoint keys a DELETE names (3 parameters each)
DELTA_COUNTERS = "counters_since_delta_snapshot"  # the metadata member a DeltaChannel's updates are counted in
# Distinct delta channel names a thread's lineage is read for. A graph has a few; past this many
# (only metadata written to make pruning costly) every ancestor of a kept checkpoint is kept.
MAX_DELTA_CHANNELS = 64

CheckpointKey = tuple[int, str, str]  # (thread_pk, checkpoint_ns, checkpoint_id)


def _thread_pk() -> Any:
    """The pk of thread ``:tid`` of namespace ``:ns`` (NULL when it has none)."""
    return select(threads.c.pk).where(threads.c.namespace == _NS, threads.c.thread_id == _TID).scalar_subquery()


@dataclass(frozen=True, slots=True)
class Lineage:
    """What pruning needs of one checkpoint."""

    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    channel_versions: Mapping[str, Any]  # of the thread's delta channels only (``lineage``: those with a stored value)
    delta_channels: frozenset[str]  # its metadata's counters_since_delta_snapshot keys


_NO_VERSIONS: Mapping[str, Any] = MappingProxyType({})
LINEAGE_BATCH = 200  # rows of a lineage built between two turns given to the event loop


ANY_CHANNELS = frozenset({""})
"""The delta channels of a checkpoint whose thread counts more than ``MAX_DELTA_CHANNELS``: one
no checkpoint stores a value of, so that all its ancestors are kept."""


class CheckpointsRepository:
    def __init__(self, backend: CheckpointsBackend, insert: InsertBuilder) -> None:
        self.backend = backend
        self._insert = insert
        b = backend
        touch = insert(threads).values(
            namespace=_NS, thread_id=_TID, touched_at=bindparam("now"),
        )
        self._touch = touch.on_conflict_do_update(
            index_elements=[threads.c.namespace, threads.c.thread_id],
            set_={"touched_at": touch.excluded.touched_at},
        ).returning(threads.c.pk)
        self._lock = (
            select(threads.c.pk).where(threads.c.namespace == _NS, threads.c.thread_id == _TID).with_for_update()
        )
        blob_insert = insert(blobs).values(
            thread_pk=_PK, checkpoint_ns=_CNS, channel=bindparam("channel"), version=bindparam("version"),
            type=bindparam("type"), blob=bindparam("blob"),
        )
        self._put_blob = blob_insert.on_conflict_do_nothing()
        ins = insert(cp).values(
            thread_pk=_PK, checkpoint_ns=_CNS, checkpoint_id=bindparam("cid"),
            parent_checkpoint_id=bindparam("parent"), type=bindparam("type"), checkpoint=bindparam("data"),
            channel_versions=b.json_param("versions"), metadata=b.json_param("metadata"),
        )
        self._put_checkpoint = ins.on_conflict_do_update(
            index_elements=[cp.c.thread_pk, cp.c.checkpoint_ns, cp.c.checkpoint_id],
            set_={
                "parent_checkpoint_id": ins.excluded.parent_checkpoint_id, "type": ins.excluded.type,
                "checkpoint": ins.excluded.checkpoint, "channel_versions": ins.excluded.channel_versions,
                "metadata": ins.excluded.metadata,
            },
        )
        w = insert(writes).values(
            thread_pk=_PK, checkpoint_ns=_CNS, checkpoint_id=bindparam("cid"), task_id=bindparam("task_id"),
            idx=bindparam("idx"), task_path=bindparam("task_path"), channel=bindparam("channel"),
            type=bindparam("type"), blob=bindparam("blob"),
        )
        self._insert_writes = w.on_conflict_do_nothing()
        self._upsert_writes = w.on_conflict_do_update(
            index_elements=[writes.c.thread_pk, writes.c.checkpoint_ns, writes.c.checkpoint_id, writes.c.task_id, writes.c.idx],
            set_={"channel": w.excluded.channel, "type": w.excluded.type, "blob": w.excluded.blob},
        )
        # The tables a copy writes again, each with what one of its rows stores: the copy limit
        # weighs what a copy writes (``app.checkpoints.heavy``), table by table, as ``app.checkpoints.reads`` defines it.
        self.copied: tuple[tuple[Table, Any], ...] = (
            (blobs, value_row_bytes()), (cp, checkpoint_row_bytes(b)), (writes, write_row_bytes()), (terms, term_row_bytes()),
        )

    def insert_builder(self, table: Table) -> Any:
        """``INSERT INTO table`` of this backend (with its ``on_conflict_*``)."""
        return self._insert(table)

    # --- threads -------------------------------------------------------------------------

    async def touch_thread(self, conn: AsyncConnection, ns: str, thread_id: str, now: float) -> int:
        """The pk of the thread (created if new), marked as written at ``now``."""
        pk: int = (await conn.execute(self._touch, {"ns": ns, "tid": thread_id, "now": now})).scalar_one()
        return pk

    async def lock_thread(self, conn: AsyncConnection, ns: str, thread_id: str) -> int | None:
        """The pk of the thread, its row locked until the end of the transaction; None if it has none."""
        return (await conn.execute(self._lock, {"ns": ns, "tid": thread_id})).scalar()

    # --- writes --------------------------------------------------------------------------

    async def put_checkpoint(
        self, conn: AsyncConnection, pk: int, ns: str, checkpoint_id: str, parent: str | None, type_: str,
        data: bytes, versions_json: str, metadata_json: str, new_blobs: Sequence[tuple[str, str, str, bytes]],
    ) -> None:
        if new_blobs:
            await conn.execute(self._put_blob, [
                {"pk": pk, "cns": ns, "channel": c, "version": v, "type": t, "blob": d} for c, v, t, d in new_blobs
            ])
        await conn.execute(self._put_checkpoint, {
            "pk": pk, "cns": ns, "cid": checkpoint_id, "parent": parent, "type": type_, "data": data,
            "versions": versions_json, "metadata": metadata_json,
        })

    async def put_writes(
        self, conn: AsyncConnection, pk: int, ns: str, checkpoint_id: str, task_id: str, task_path: str,
        rows: Sequence[tuple[int, str, str, bytes]], *, replace: bool,
    ) -> None:
        stmt = self._upsert_writes if replace else self._insert_writes
        await conn.execute(stmt, [
            {"pk": pk, "cns": ns, "cid": checkpoint_id, "task_id": task_id, "task_path": task_path,
             "idx": idx, "channel": channel, "type": t, "blob": d}
            for idx, channel, t, d in rows
        ])

    # --- reads ---------------------------------------------------------------------------

    async def has_delta_channels(self, conn: AsyncConnection, pk: int) -> bool:
        """Whether a checkpoint of the thread counts updates of a ``DeltaChannel`` (its metadata
        has ``counters_since_delta_snapshot``): only then does pruning need the lineage."""
        counters = self.backend.json_member_text(cp.c.metadata, DELTA_COUNTERS)
        stmt = select(exists().where(cp.c.thread_pk == _PK, counters.is_not(None)))
        return bool((await conn.execute(stmt, {"pk": pk})).scalar())

    @staticmethod
    def _all_but_newest() -> Any:
        """(checkpoint_ns, checkpoint_id) of all but the newest ``:keep`` checkpoints of each
        checkpoint_ns of thread ``:pk``."""
        ranked = select(
            cp.c.checkpoint_ns, cp.c.checkpoint_id,
            func.row_number().over(partition_by=cp.c.checkpoint_ns, order_by=cp.c.checkpoint_id.desc()).label("nth"),
        ).where(cp.c.thread_pk == _PK).subquery("ranked")
        return select(ranked.c.checkpoint_ns, ranked.c.checkpoint_id).where(ranked.c.nth > bindparam("keep", type_=Integer))

    async def all_but_newest(self, conn: AsyncConnection, pk: int, keep: int, limit: int | None = None) -> list[CheckpointKey]:
        """The keys ``delete_all_but_newest`` deletes, read out (the first ``limit``, oldest first)."""
        stmt = self._all_but_newest()
        if limit is not None:
            stmt = stmt.order_by(stmt.selected_columns[0], stmt.selected_columns[1]).limit(limit)
        rows = (await conn.execute(stmt, {"pk": pk, "keep": keep})).all()
        return [(pk, r[0], r[1]) for r in rows]

    async def delete_all_but_newest(self, conn: AsyncConnection, pk: int, keep: int) -> int:
        """All but the newest ``keep`` checkpoints of each checkpoint_ns of the thread, with their
        pending writes and metadata terms, in the database (nothing of them is read out); how
        many checkpoints went."""
        doomed = self._all_but_newest()
        async with self.backend.hash_joins(conn):
            return await _delete_of_checkpoints(
                conn, lambda t: and_(t.c.thread_pk == _PK, tuple_(t.c.checkpoint_ns, t.c.checkpoint_id).in_(doomed)),
                {"pk": pk, "keep": keep},
            )

    async def delta_channel_names(self, conn: AsyncConnection, pk: int) -> frozenset[str] | None:
        """The channels the thread's checkpoints count as delta channels (the keys of their
        metadata's ``counters_since_delta_snapshot``), found in the database; None past
        ``MAX_DELTA_CHANNELS`` of them."""
        k = self.backend.member_keys(cp.c.metadata, DELTA_COUNTERS)
        stmt = (
            select(k.c.key).distinct().select_from(cp.join(k, true()))
            .where(cp.c.thread_pk == _PK).limit(MAX_DELTA_CHANNELS + 1)
        )
        names = frozenset((await conn.execute(stmt, {"pk": pk})).scalars())
        return names if len(names) <= MAX_DELTA_CHANNELS else None

    async def lineage(
        self, conn: AsyncConnection, pk: int, channels: frozenset[str] | None, stored: set[tuple[str, str, str]],
    ) -> list[Lineage]:
        """Every checkpoint of the thread, newest first per checkpoint_ns, with the versions of
        ``channels`` it has a stored value of (``stored``: ``blob_keys``; None: no versions), and
        its delta counters of ``channels`` only (None: ``ANY_CHANNELS`` for counters of any).
        Streamed, and kept small: a version without a stored value is dropped (``kept_ids`` only
        asks whether one is stored), and equal sets of delta channels are one object. 64 delta
        channels a checkpoint took 6 KB a row (40 MiB for a thread of 7,000); now about 0.3 KB.
        The event loop gets a turn every ``LINEAGE_BATCH`` rows."""
        j = self.backend.json_text
        stmt = select(
            cp.c.checkpoint_ns, cp.c.checkpoint_id, cp.c.parent_checkpoint_id,
            j(cp.c.channel_versions) if channels is not None else literal(None, Text),
            self.backend.json_member_text(cp.c.metadata, DELTA_COUNTERS),
        ).where(cp.c.thread_pk == _PK).order_by(cp.c.checkpoint_ns, cp.c.checkpoint_id.desc())
        out: list[Lineage] = []
        shared: dict[frozenset[str], frozenset[str]] = {}
        async for ns, cid, parent, versions, counters_json in await conn.stream(stmt, {"pk": pk}):
            counters = orjson.loads(counters_json) if counters_json is not None else None
            if not isinstance(counters, dict) or not counters:
                delta: frozenset[str] = frozenset()
            elif channels is None:
                delta = ANY_CHANNELS
            else:
                delta = channels.intersection(counters)
            delta = shared.setdefault(delta, delta)
            kept: Mapping[str, Any] = _NO_VERSIONS
            if channels is not None and stored:
                kept = {
                    ch: v for ch, v in orjson.loads(versions).items()
                    if ch in channels and (ns, ch, str(v)) in stored
                } or _NO_VERSIONS
            out.append(Lineage(ns, cid, parent, kept, delta))
            if len(out) % LINEAGE_BATCH == 0:
                await asyncio.sleep(0)
        return out

    async def blob_keys(self, conn: AsyncConnection, pk: int, channels: frozenset[str]) -> set[tuple[str, str, str]]:
        """(checkpoint_ns, channel, version) of every stored value of the thread's ``channels``."""
        stmt = select(blobs.c.checkpoint_ns, blobs.c.channel, blobs.c.version).where(
            blobs.c.thread_pk == _PK, blobs.c.channel.in_(bindparam("channels", expanding=True)),
        )
        return {tuple(r) for r in (await conn.execute(stmt, {"pk": pk, "channels": sorted(channels)})).all()}

    # --- deletes -------------------------------------------------------------------------

    async def delete_threads(self, conn: AsyncConnection, pks: Sequence[int], ns: str | None) -> int:
        """Every row of these threads, and the threads (of namespace ``ns``; None: the sweep,
        any); how many checkpoints went."""
        if not pks:
            return 0
        keys: BindParameter[list[int]] = bindparam("pks", expanding=True)
        deleted = 0
        for table in _CHILD_TABLES:
            result = await conn.execute(delete(table).where(table.c.thread_pk.in_(keys)), {"pks": list(pks)})
            if table is cp:
                deleted = result.rowcount or 0
        stmt = delete(threads).where(threads.c.pk.in_(keys))
        if ns is not None:
            stmt = stmt.where(threads.c.namespace == _NS)
        await conn.execute(stmt, {"pks": list(pks), "ns": ns})
        return deleted

    async def delete_checkpoints(self, conn: AsyncConnection, keys: Sequence[CheckpointKey]) -> int:
        """These checkpoints with their pending writes and metadata terms (not their blobs: ``collect_blobs``)."""
        deleted = 0
        # Three parameters a key: a statement holds DELETE_CHUNK keys, far below asyncpg's 32,767
        # parameters (a prune of 11,000 checkpoints was refused whole, and retried in vain).
        for start in range(0, len(keys), DELETE_CHUNK):
            deleted += await _delete_of_checkpoints(
                conn, self.backend.keys_in, self.backend.keys_params(keys[start : start + DELETE_CHUNK])
            )
        return deleted

    async def orphan_parents(self, conn: AsyncConnection, pk: int, ns: str | None) -> None:
        """Forget parents that are no longer stored (a kept checkpoint becomes a chain root), in
        checkpoint_ns ``ns`` (None: every one of the thread)."""
        parent = cp.alias("parent")
        gone = ~select(parent.c.checkpoint_id).where(
            parent.c.thread_pk == cp.c.thread_pk, parent.c.checkpoint_ns == cp.c.checkpoint_ns,
            parent.c.checkpoint_id == cp.c.parent_checkpoint_id,
        ).exists()
        stmt = update(cp).where(cp.c.thread_pk == _PK, cp.c.parent_checkpoint_id.is_not(None), gone)
        if ns is not None:
            stmt = stmt.where(cp.c.checkpoint_ns == _CNS)
        stmt = stmt.values(parent_checkpoint_id=None)
        await conn.execute(stmt, {"pk": pk, "cns": ns})

    def unused_blob(self) -> ColumnElement[bool]:
        """A stored value of thread ``:pk`` that no checkpoint of it uses."""
        c = cp.alias("c")
        v = self.backend.versions_of(c)
        used = (
            select(c.c.checkpoint_ns, v.c.key, cast(v.c.value, Text))
            .select_from(c.join(v, true()))
            .where(c.c.thread_pk == _PK)
        )
        return tuple_(blobs.c.checkpoint_ns, blobs.c.channel, blobs.c.version).not_in(used)

    async def collect_blobs(self, conn: AsyncConnection, pk: int) -> int:
        """Delete the thread's stored values that no checkpoint of it uses any more."""
        stmt = delete(blobs).where(blobs.c.thread_pk == _PK, self.unused_blob())
        return (await conn.execute(stmt, {"pk": pk})).rowcount or 0

    async def run_threads(self, conn: AsyncConnection, ns: str, run_id: str) -> list[int]:
        """The threads (pks) that hold checkpoints of run ``run_id`` in the namespace."""
        stmt = (
            select(cp.c.thread_pk).distinct().select_from(cp.join(threads, threads.c.pk == cp.c.thread_pk))
            .where(threads.c.namespace == _NS, *self.backend.metadata_filter_shape(cp, 1))
        )
        params = {"ns": ns, **self.backend.metadata_filter_params({"run_id": run_id})}
        return [r[0] for r in (await conn.execute(stmt, params)).all()]

    async def run_checkpoints(
        self, conn: AsyncConnection, run_id: str, pks: Sequence[int], after: CheckpointKey | None, limit: int
    ) -> list[CheckpointKey]:
        """Up to ``limit`` keys of run ``run_id``'s checkpoints in threads ``pks`` (at most
        ``DELETE_CHUNK``, of one namespace: ``run_threads``), in key order after ``after``: a
        run's keys a page at a time. The checkpoints table alone, so that its primary key gives
        the order: joined with the threads for the namespace, PostgreSQL sorted every remaining
        match of the run for each page."""
        key = (cp.c.thread_pk, cp.c.checkpoint_ns, cp.c.checkpoint_id)
        stmt = (
            select(*key).where(cp.c.thread_pk.in_(bindparam("pks", expanding=True)), *self.backend.metadata_filter_shape(cp, 1))
            .order_by(*key).limit(limit)
        )
        params = self.backend.metadata_filter_params({"run_id": run_id})
        if after is not None:
            stmt = stmt.where(tuple_(*key) > tuple_(*(bindparam(f"after{i}") for i in range(3))))
            params.update({f"after{i}": v for i, v in enumerate(after)})
        return [(r[0], r[1], r[2]) for r in (await conn.execute(stmt, {**params, "pks": list(pks)})).all()]

    async def lock_pks(self, conn: AsyncConnection, ns: str, pks: Iterable[int]) -> None:
        pks = sorted(set(pks))
        stmt = select(threads.c.pk).where(
            threads.c.namespace == _NS, threads.c.pk.in_(bindparam("pks", expanding=True))
        ).with_for_update()
        # in chunks, in order: a statement of one parameter per thread was refused past 32,767
        for start in range(0, len(pks), DELETE_CHUNK):
            await conn.execute(stmt, {"ns": ns, "pks": pks[start : start + DELETE_CHUNK]})

    # --- copy ----------------------------------------------------------------------------

    async def thread_bytes(self, conn: AsyncConnection, pk: int) -> int:
        """What a copy of the thread writes, in stored bytes: every row of it whole (bytes, JSON,
        keys and identifiers, 256 bytes a row), summed in the database in one statement."""
        def total(table: Table, weight: Any) -> Any:
            return select(func.coalesce(func.sum(weight), 0)).where(table.c.thread_pk == _PK).scalar_subquery()

        totals = [total(table, weight) for table, weight in self.copied]
        stmt = select(functools.reduce(operator.add, totals))
        return int((await conn.execute(stmt, {"pk": pk})).scalar_one())

    # --- retention settings ----------------------------------------------------------------

    async def set_namespace_retention(self, conn: AsyncConnection, ns: str, keep: int | None, ttl: float | None) -> None:
        ins = self._insert(retention).values(namespace=_NS, keep_latest=bindparam("keep"), idle_ttl_seconds=bindparam("ttl"))
        stmt = ins.on_conflict_do_update(
            index_elements=[retention.c.namespace],
            set_={"keep_latest": ins.excluded.keep_latest, "idle_ttl_seconds": ins.excluded.idle_ttl_seconds},
        )
        await conn.execute(stmt, {"ns": ns, "keep": keep, "ttl": ttl})

    async def namespace_retention(self, conn: AsyncConnection, ns: str) -> tuple[int | None, float | None]:
        stmt = select(retention.c.keep_latest, retention.c.idle_ttl_seconds).where(retention.c.namespace == _NS)
        row = (await conn.execute(stmt, {"ns": ns})).first()
        return (row[0], row[1]) if row is not None else (None, None)

    async def set_thread_retention(
        self, conn: AsyncConnection, ns: str, thread_id: str, keep: int | None, ttl: float | None, now: float
    ) -> None:
        ins = self._insert(threads).values(
            namespace=_NS, thread_id=_TID, touched_at=bindparam("now"), keep_latest=bindparam("keep"),
            idle_ttl_seconds=bindparam("ttl"),
        )
        stmt = ins.on_conflict_do_update(
            index_elements=[threads.c.namespace, threads.c.thread_id],
            set_={"keep_latest": ins.excluded.keep_latest, "idle_ttl_seconds": ins.excluded.idle_ttl_seconds,
                  "pruned_at": None},
        )
        await conn.execute(stmt, {"ns": ns, "tid": thread_id, "now": now, "keep": keep, "ttl": ttl})

    async def thread_retention(self, conn: AsyncConnection, ns: str, thread_id: str) -> tuple[int | None, float | None]:
        stmt = select(threads.c.keep_latest, threads.c.idle_ttl_seconds).where(
            threads.c.namespace == _NS, threads.c.thread_id == _TID
        )
        row = (await conn.execute(stmt, {"ns": ns, "tid": thread_id})).first()
        return (row[0], row[1]) if row is not None else (None, None)

    # --- the retention sweep (every namespace) ------------------------------------------------

    async def idle_threads(self, conn: AsyncConnection, now: float, batch: int) -> list[int]:
        """Threads idle longer than their (or their namespace's) TTL, locked until the sweep's
        transaction ends (PostgreSQL; SQLite's sweep holds the write lock): a write to one of them
        waits, and touches it again once the thread is gone, so an acknowledged checkpoint is never
        deleted with it. A thread a write holds is skipped, and one written since it was found is
        found idle again or not (PostgreSQL rechecks the condition on the row it locks)."""
        ttl = func.coalesce(threads.c.idle_ttl_seconds, retention.c.idle_ttl_seconds)
        stmt = (
            select(threads.c.pk)
            .select_from(threads.outerjoin(retention, retention.c.namespace == threads.c.namespace))
            .where(ttl > 0, threads.c.touched_at + ttl < bindparam("now"))
            .limit(bindparam("lim", type_=Integer))
            .with_for_update(of=threads, skip_locked=True)
        )
        return [r[0] for r in (await conn.execute(stmt, {"now": now, "lim": batch})).all()]

    async def threads_to_trim(self, conn: AsyncConnection, batch: int) -> list[tuple[int, int]]:
        """(pk, keep_latest) of threads written since keep-latest retention last ran on them."""
        keep = func.coalesce(threads.c.keep_latest, retention.c.keep_latest)
        stmt = (
            select(threads.c.pk, keep)
            .select_from(threads.outerjoin(retention, retention.c.namespace == threads.c.namespace))
            .where(keep > 0, (threads.c.pruned_at.is_(None)) | (threads.c.pruned_at < threads.c.touched_at))
            .limit(bindparam("lim", type_=Integer))
            .with_for_update(of=threads)
        )
        return [(r[0], r[1]) for r in (await conn.execute(stmt, {"lim": batch})).all()]

    async def mark_pruned(self, conn: AsyncConnection, pks: Sequence[int], now: float) -> None:
        if pks:
            stmt = update(threads).where(threads.c.pk.in_(bindparam("pks", expanding=True))).values(pruned_at=bindparam("now"))
            await conn.execute(stmt, {"pks": list(pks), "now": now})


async def _delete_of_checkpoints(
    conn: AsyncConnection, which: Callable[[Table], ColumnElement[bool]], params: dict[str, Any]
) -> int:
    """Delete the checkpoints ``which`` selects (a condition on a table's thread_pk,
    checkpoint_ns and checkpoint_id) with their pending writes and metadata terms, those first;
    how many checkpoints went."""
    deleted = 0
    for table in (writes, terms, cp):
        result = await conn.execute(delete(table).where(which(table)), params)
        if table is cp:
            deleted = result.rowcount or 0
    return deleted
