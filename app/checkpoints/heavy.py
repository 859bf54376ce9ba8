"""The long writes of checkpoints in turns (``app.fairness.fairshare``): copies on both backends,
deletes, prunes and the retention sweep on SQLite (PostgreSQL keeps one transaction for those).

Every row of a thread hangs off its registry row's ``pk``; a registry row parked in a namespace no
request can name (``~copy``, ``~trash``: ``NAME_PATTERN`` starts with a letter or digit) hides all
of them from every read, and its ``thread_id`` (``<namespace>/...``) says whose they were. That is
the whole design:

- a **copy** reads the source at one snapshot (SQLite: a read transaction, the rows written back
  from the gateway; PostgreSQL: ``pg_export_snapshot``, each turn copying a range of keys in the
  database as of it), writes its rows in turns under
  a registry row parked in ``~copy`` (the staging thread), then renames that row to the target in
  one short transaction: the whole copy appears at once, or none of it. When the target has rows
  by then (a copy into a thread in use), the staged rows are moved into it in turns, table by
  table (values, pending writes, metadata terms, and checkpoints last), so each checkpoint appears
  with its values and writes: such a copy is atomic per checkpoint, and one cut short completes
  when run again (rows the target has stay, as ever);
- a **delete** (a thread, a prune's ``delete``, a thread idle past its TTL) parks the registry row
  in ``~trash`` in one short transaction (the thread is gone for every read; a write makes a new
  one), then purges its rows in turns;
- a **prune** (keep-latest, a run's checkpoints, the sweep's trims) deletes whole checkpoints with
  their pending writes and metadata terms in turns, each turn forgetting parents no longer stored,
  then the values no checkpoint uses: seen halfway, some old checkpoints are gone, each whole; one
  cut short is finished by the next;
- what a crash leaves parked (in ``~trash``, or in ``~copy`` untouched for ``STALE_SECONDS``) is
  purged by the retention sweep (``collect_parked``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
from sqlalchemy import ColumnElement, Integer, Table, Text, bindparam, cast, delete, exists, func, literal, select, true, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.checkpoints.lineage import doomed_checkpoints
from app.checkpoints.models import checkpoint_blobs as blobs
from app.checkpoints.models import checkpoint_metadata_terms as terms
from app.checkpoints.models import checkpoint_threads as threads
from app.checkpoints.models import checkpoint_writes as writes
from app.checkpoints.models import checkpoints as cp
from app.checkpoints.reads import ROW_BYTES, checkpoint_row_bytes, pending_bytes
from app.checkpoints.repository import DELETE_CHUNK, CheckpointKey, CheckpointsRepository
from app.fairness.fairshare import DELETE_WEIGHT, Chunks, HeavyWrites

COPYING = "~copy"  # the namespace of staging threads
TRASH = "~trash"  # the namespace of deleted threads whose rows are being purged
STALE_SECONDS = 600.0  # a staging thread untouched this long belongs to a copy that died
_TABLES = (blobs, writes, terms, cp)  # a copy's order: what a checkpoint needs before it
_PURGE_ORDER = (writes, terms, cp, blobs)

_PK = bindparam("pk", type_=Integer)
_THREAD = bindparam("thread", type_=Integer)  # a registry row's pk ("pk" is its column's name: taken in an UPDATE)


def _key(table: Table) -> list[Any]:
    """The primary key columns of ``table`` after ``thread_pk``, in order."""
    return [c for c in table.primary_key.columns if c.name != "thread_pk"]


def _weight(row: Sequence[Any]) -> int:
    return sum(len(v) for v in row if isinstance(v, (bytes, str))) + ROW_BYTES


def _owned_by(ns: str) -> ColumnElement[bool]:
    """A parked registry row of namespace ``ns`` (its thread_id starts ``<ns>/``)."""
    return threads.c.thread_id.startswith(ns + "/", autoescape=True)


class ParkedThreads:
    """Copies, deletes, prunes and the retention sweep of checkpoints on SQLite, in turns."""

    def __init__(self, heavy: HeavyWrites, repo: CheckpointsRepository) -> None:
        self.heavy = heavy
        self.repo = repo
        self._insert = {t: repo.insert_builder(t).on_conflict_do_nothing() for t in _TABLES}
        self._weights_of = {table: weight for table, weight in repo.copied}

    # --- parking -------------------------------------------------------------------------

    @staticmethod
    async def _park(conn: AsyncConnection, pks: Sequence[int], where: str, ns: str | None) -> None:
        """Move registry rows ``pks`` (of namespace ``ns``; None: the sweep's, any) into ``where``."""
        nonce = uuid.uuid4().hex[:12]
        new_id = threads.c.namespace + "/" + cast(threads.c.pk, Text) + "/" + nonce
        stmt = update(threads).where(threads.c.pk.in_(bindparam("pks", expanding=True)))
        params: dict[str, Any] = {"pks": list(pks)}
        if ns is not None:
            stmt = stmt.where(threads.c.namespace == bindparam("ns"))
            params["ns"] = ns
        await conn.execute(stmt.values(namespace=where, thread_id=new_id, touched_at=time.time()), params)

    async def _drop_registry(self, conn: AsyncConnection, pk: int, ns: str | None) -> None:
        stmt = delete(threads).where(threads.c.pk == _THREAD, threads.c.namespace.in_((COPYING, TRASH)))
        if ns is not None:
            stmt = stmt.where(_owned_by(ns))
        await conn.execute(stmt, {"thread": pk})

    async def purge(self, pk: int, ns: str | None) -> None:
        """Every row of the parked thread ``pk``, then its registry row, in turns."""
        for table in _PURGE_ORDER:
            key = _key(table)
            while True:
                async with self.heavy.turn() as conn:
                    rows = (await conn.execute(
                        select(*key, self._weights_of[table]).where(table.c.thread_pk == _PK).order_by(*key)
                        .limit(self.heavy.chunk_rows), {"pk": pk},
                    )).all()
                    if not rows:
                        break
                    last, budget = rows[-1], self.heavy.chunk_bytes * DELETE_WEIGHT
                    for row in rows:
                        budget -= row[-1]
                        if budget <= 0:
                            last = row
                            break
                    bound = tuple_(*key) <= tuple_(*(literal(v) for v in last[:-1]))
                    await conn.execute(delete(table).where(table.c.thread_pk == _PK, bound), {"pk": pk})
        async with self.heavy.single() as conn:
            await self._drop_registry(conn, pk, ns)

    async def delete_threads(self, ns: str, thread_ids: Sequence[str]) -> int:
        """Delete these threads of ``ns``: hidden at once, purged in turns; how many checkpoints went."""
        async with self.heavy.single() as conn:
            pks = []
            for thread_id in sorted(set(thread_ids)):
                pk = await self.repo.lock_thread(conn, ns, thread_id)
                if pk is not None:
                    pks.append(pk)
            if not pks:
                return 0
            count = select(func.count()).where(cp.c.thread_pk.in_(bindparam("pks", expanding=True)))
            deleted = int((await conn.execute(count, {"pks": pks})).scalar_one())
            await self._park(conn, pks, TRASH, ns)
        for pk in pks:
            await self.purge(pk, ns)
        return deleted

    async def collect_parked(self) -> int:
        """Purge what copies and deletes cut short left parked; how many threads."""
        async with self.heavy.engine.connect() as conn:
            rows = (await conn.execute(
                select(threads.c.pk, threads.c.namespace, threads.c.touched_at)
                .where(threads.c.namespace.in_((COPYING, TRASH)))
            )).all()
        stale = time.time() - STALE_SECONDS
        purged = 0
        for pk, where, touched in rows:
            if where == TRASH or touched < stale:
                await self.purge(pk, None)
                purged += 1
        return purged

    # --- copy ----------------------------------------------------------------------------

    async def copy(self, ns: str, source: str, target: str, size_limit: int) -> int | tuple[int, int]:
        """Copy thread ``source`` of ``ns`` into ``target``: how many checkpoints were copied, or
        (the source's stored bytes, ``size_limit``) when it holds more than that."""
        async with self.heavy.snapshot() as snap:
            src = (await snap.execute(
                select(threads.c.pk).where(threads.c.namespace == bindparam("ns"), threads.c.thread_id == bindparam("tid")),
                {"ns": ns, "tid": source},
            )).scalar()
            if src is None:
                return 0
            size = await self.repo.thread_bytes(snap, src)
            if size > size_limit:
                return size, size_limit
            count = int((await snap.execute(select(func.count()).where(cp.c.thread_pk == _PK), {"pk": src})).scalar_one())
            async with self.heavy.single() as conn:
                staged = int((await conn.execute(
                    self.repo.insert_builder(threads).values(
                        namespace=COPYING, thread_id=bindparam("tid"), touched_at=time.time(),
                    ).returning(threads.c.pk),
                    {"tid": f"{ns}/copy/{uuid.uuid4().hex}"},
                )).scalar_one())
            try:
                await self._stage(ns, snap, src, staged)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self.purge(staged, ns)
                raise
        try:
            published = await self._publish(ns, target, staged, count)
            if published is not None:
                return published
            return await self._merge(ns, target, staged)
        finally:
            with anyio.CancelScope(shield=True):
                async with self.heavy.engine.connect() as conn:
                    still = (await conn.execute(select(threads.c.pk).where(
                        threads.c.pk == _THREAD, threads.c.namespace == COPYING, _owned_by(ns)), {"thread": staged})).scalar()
                if still is not None:
                    await self.purge(staged, ns)

    async def _stage(self, ns: str, snap: AsyncConnection, src: int, staged: int) -> None:
        """The source's rows, as of the snapshot, under the staging thread, in turns: on SQLite
        read out and written back (a transaction there cannot read at another's snapshot); on
        PostgreSQL copied in the database, a range of keys a turn, each turn reading at the
        snapshot (``pg_export_snapshot``)."""
        if not self.heavy.sqlite:
            await self._stage_in_database(ns, snap, src, staged)
            return
        for table in _TABLES:
            key = _key(table)
            columns = [c for c in table.c if c.name != "thread_pk"]
            names = [c.name for c in columns]
            chunk = Chunks(self.heavy)
            stream = await snap.stream(select(*columns).where(table.c.thread_pk == _PK).order_by(*key), {"pk": src})
            async for row in _rows(stream):
                chunk.add({"thread_pk": staged, **dict(zip(names, row, strict=True))}, _weight(row))
                if chunk.full:
                    await self._write(ns, table, chunk.take(), staged)
            if chunk.rows:
                await self._write(ns, table, chunk.take(), staged)

    async def _stage_in_database(self, ns: str, snap: AsyncConnection, src: int, staged: int) -> None:
        snapshot = await self.heavy.snapshot_id(snap)
        for table in _TABLES:
            key = _key(table)
            weights = select(*key, self._weights_of[table]).where(table.c.thread_pk == _PK).order_by(*key)
            chunk = Chunks(self.heavy)
            after: tuple[Any, ...] | None = None
            async for row in _rows(await snap.stream(weights, {"pk": src})):
                chunk.add(tuple(row[:-1]), int(row[-1]))
                if chunk.full:
                    after = await self._copy_range(ns, table, src, staged, after, chunk.take()[-1], snapshot)
            if chunk.rows:
                await self._copy_range(ns, table, src, staged, after, chunk.take()[-1], snapshot)

    async def _copy_range(
        self, ns: str, table: Table, src: int, staged: int, after: tuple[Any, ...] | None, last: tuple[Any, ...],
        snapshot: str,
    ) -> tuple[Any, ...]:
        """The source's rows of ``table`` with keys after ``after`` up to ``last``, as of
        ``snapshot``, under the staging thread, in one turn; ``last``."""
        key = _key(table)
        columns = [c for c in table.c if c.name != "thread_pk"]
        bound = [table.c.thread_pk == _PK, tuple_(*key) <= tuple_(*(literal(v) for v in last))]
        if after is not None:
            bound.append(tuple_(*key) > tuple_(*(literal(v) for v in after)))
        rows = select(literal(staged, type_=Integer), *columns).where(*bound)
        async with self.heavy.turn(snapshot) as conn:
            await conn.execute(
                self.repo.insert_builder(table).from_select(["thread_pk", *(c.name for c in columns)], rows)
                .on_conflict_do_nothing(), {"pk": src},
            )
            await self._touch_staged(conn, ns, staged)
        return last

    @staticmethod
    async def _touch_staged(conn: AsyncConnection, ns: str, staged: int) -> None:
        """Mark the staging thread alive (``collect_parked`` leaves it alone)."""
        alive = update(threads).where(threads.c.pk == _THREAD, threads.c.namespace == COPYING, _owned_by(ns))
        await conn.execute(alive.values(touched_at=time.time()), {"thread": staged})

    async def _write(self, ns: str, table: Table, rows: list[dict[str, Any]], staged: int) -> None:
        async with self.heavy.turn() as conn:
            await conn.execute(self._insert[table], rows)
            await self._touch_staged(conn, ns, staged)

    async def _publish(self, ns: str, target: str, staged: int, count: int) -> int | None:
        """Rename the staging thread to ``target`` when the target has no rows (its retention
        settings kept): how many checkpoints it has; None when the target has rows."""
        async with self.heavy.single() as conn:
            # the target's registry row, made if new and locked (a put to it waits: PostgreSQL)
            pk = await self.repo.touch_thread(conn, ns, target, time.time())
            has_rows = select(true()).where(
                exists().where(cp.c.thread_pk == _PK) | exists().where(blobs.c.thread_pk == _PK)
                | exists().where(writes.c.thread_pk == _PK) | exists().where(terms.c.thread_pk == _PK)
            )
            if (await conn.execute(has_rows, {"pk": pk})).scalar():
                return None
            keep, ttl = await self.repo.thread_retention(conn, ns, target)
            await conn.execute(delete(threads).where(threads.c.pk == _THREAD, threads.c.namespace == bindparam("ns")),
                               {"thread": pk, "ns": ns})
            await conn.execute(
                update(threads).where(threads.c.pk == _THREAD, threads.c.namespace == COPYING).values(
                    namespace=bindparam("ns"), thread_id=bindparam("tid"), touched_at=time.time(), pruned_at=None,
                    keep_latest=keep, idle_ttl_seconds=ttl,
                ),
                {"thread": staged, "ns": ns, "tid": target},
            )
        return count

    async def _merge(self, ns: str, target: str, staged: int) -> int:
        """Move the staged rows into ``target`` (which has rows) in turns, checkpoints last."""
        copied = 0
        for table in _TABLES:
            key = _key(table)
            columns = [c for c in table.c if c.name != "thread_pk"]
            while True:
                async with self.heavy.turn() as conn:
                    pk = await self.repo.touch_thread(conn, ns, target, time.time())
                    rows = (await conn.execute(
                        select(*key, self._weights_of[table]).where(table.c.thread_pk == _PK).order_by(*key)
                        .limit(self.heavy.chunk_rows), {"pk": staged},
                    )).all()
                    if not rows:
                        break
                    last, budget = rows[-1], self.heavy.chunk_bytes
                    for row in rows:
                        budget -= row[-1]
                        if budget <= 0:
                            last = row
                            break
                    bound = tuple_(*key) <= tuple_(*(literal(v) for v in last[:-1]))
                    moving = select(literal(pk, type_=Integer), *columns).where(table.c.thread_pk == _PK, bound)
                    result = await conn.execute(
                        self.repo.insert_builder(table).from_select(["thread_pk", *(c.name for c in columns)], moving)
                        .on_conflict_do_nothing(), {"pk": staged},
                    )
                    if table is cp:
                        copied += result.rowcount or 0
                    await conn.execute(delete(table).where(table.c.thread_pk == _PK, bound), {"pk": staged})
        return copied

    # --- pruning ---------------------------------------------------------------------------

    async def _weights(self, keys: Sequence[CheckpointKey]) -> dict[CheckpointKey, int]:
        """What deleting each of these checkpoints frees: its row and its pending writes."""
        stmt = select(cp.c.thread_pk, cp.c.checkpoint_ns, cp.c.checkpoint_id,
                      checkpoint_row_bytes(self.repo.backend) + pending_bytes()).where(self.repo.backend.keys_in(cp))
        async with self.heavy.engine.connect() as conn:
            rows = (await conn.execute(stmt, self.repo.backend.keys_params(keys))).all()
        return {(pk, ns, cid): int(w) for pk, ns, cid, w in rows}

    async def delete_checkpoints(self, keys: Sequence[CheckpointKey], *, orphans: bool) -> int:
        """Checkpoints ``keys`` (at most ``DELETE_CHUNK``) with their pending writes and terms,
        whole, in turns (``orphans``: each turn also forgets the parents it deleted). How many went."""
        weights = await self._weights(keys)
        deleted = 0
        chunk = Chunks(self.heavy)
        chunk.limit_bytes *= DELETE_WEIGHT
        for i, key in enumerate(keys):
            chunk.add(key, weights.get(key, ROW_BYTES))
            if chunk.full or i == len(keys) - 1:
                some: list[CheckpointKey] = chunk.take()
                async with self.heavy.turn() as conn:
                    deleted += await self.repo.delete_checkpoints(conn, some)
                    if orphans:
                        for pk, ns in sorted({(pk, ns) for pk, ns, _ in some}):
                            await self.repo.orphan_parents(conn, pk, ns)
        return deleted

    async def collect_blobs(self, pks: Sequence[int]) -> None:
        """The values of threads ``pks`` that no checkpoint uses, in turns, several threads a turn
        (each turn looks again which are used, so a put that reuses one meanwhile keeps it)."""
        key = _key(blobs)
        unused = select(*key, self._weights_of[blobs]).where(blobs.c.thread_pk == _PK, self.repo.unused_blob()).order_by(*key)
        todo = list(pks)
        while todo:
            async with self.heavy.turn() as conn:
                budget, rows_left = self.heavy.chunk_bytes * DELETE_WEIGHT, self.heavy.chunk_rows
                while todo and budget > 0 and rows_left > 0:
                    pk, asked = todo[-1], rows_left
                    rows = (await conn.execute(unused.limit(asked), {"pk": pk})).all()
                    taken = []
                    for row in rows:
                        taken.append(tuple(row[:-1]))
                        budget -= row[-1]
                        if budget <= 0:
                            break
                    rows_left -= max(1, len(taken))
                    if taken:
                        await conn.execute(delete(blobs).where(
                            blobs.c.thread_pk == _PK, tuple_(*key).in_(taken), self.repo.unused_blob(),
                        ), {"pk": pk})
                    if len(taken) == len(rows) < asked:
                        todo.pop()  # none left unused in this thread (a full page may have more)

    async def keep_latest(self, pk: int, keep: int) -> int:
        """All but the newest ``keep`` checkpoints per checkpoint_ns of thread ``pk`` (and the
        ancestors its delta channels need), in turns; how many went. Without delta channels the
        keys are read a page at a time (what a page deleted is no longer among the rest)."""
        async with self.heavy.engine.connect() as conn:
            delta = await self.repo.has_delta_channels(conn, pk)
            doomed = await doomed_checkpoints(self.repo, conn, pk, keep) if delta else []
        deleted = 0
        if delta:
            for start in range(0, len(doomed), DELETE_CHUNK):
                deleted += await self.delete_checkpoints(doomed[start : start + DELETE_CHUNK], orphans=True)
        else:
            while True:
                async with self.heavy.engine.connect() as conn:
                    page = await self.repo.all_but_newest(conn, pk, keep, DELETE_CHUNK)
                if page:
                    deleted += await self.delete_checkpoints(page, orphans=True)
                if len(page) < DELETE_CHUNK:
                    break
        if deleted:
            await self.collect_blobs([pk])
        return deleted

    async def delete_runs(self, ns: str, run_ids: Sequence[str]) -> int:
        """The checkpoints of these runs in namespace ``ns``, whole, in turns, a page of keys (of
        up to ``DELETE_CHUNK`` threads) at a time, as ``CheckpointsService`` deletes them in its
        transaction; then the values no checkpoint uses. How many went."""
        async with self.heavy.engine.connect() as conn:
            found: set[int] = set()
            for run_id in run_ids:
                found.update(await self.repo.run_threads(conn, ns, run_id))
        pks = sorted(found)
        deleted = 0
        for run_id in run_ids:
            for start in range(0, len(pks), DELETE_CHUNK):
                some = pks[start : start + DELETE_CHUNK]
                after: CheckpointKey | None = None
                while True:
                    async with self.heavy.engine.connect() as conn:
                        page = await self.repo.run_checkpoints(conn, run_id, some, after, DELETE_CHUNK)
                    if not page:
                        break
                    deleted += await self.delete_checkpoints(page, orphans=False)
                    after = page[-1]
        await self.collect_blobs(pks)
        return deleted

    # --- the retention sweep -----------------------------------------------------------------

    async def sweep(self, batch: int) -> int:
        """One bounded batch of retention over every namespace, in turns (as
        ``CheckpointsService.sweep``); then what copies and deletes cut short left parked."""
        now = time.time()
        async with self.heavy.single() as conn:
            idle = await self.repo.idle_threads(conn, now, batch)
            if idle:
                await self._park(conn, idle, TRASH, None)
        for pk in idle:
            await self.purge(pk, None)
        async with self.heavy.engine.connect() as conn:
            trims = await self.repo.threads_to_trim(conn, batch)
        for pk, keep in trims:
            await self.keep_latest(pk, keep)
        if trims:
            async with self.heavy.single() as conn:
                await self.repo.mark_pruned(conn, [pk for pk, _ in trims], now)
        return max(len(idle), len(trims))


async def _rows(result: Any) -> AsyncIterator[Any]:
    async for row in result:
        yield row


