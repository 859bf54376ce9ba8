"""The rules of the checkpoints capability: limits, the shape of answers, pruning and retention."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Sequence
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from app.checkpoints.heavy import ParkedThreads
from app.checkpoints.lineage import doomed_checkpoints
from app.checkpoints.reads import CheckpointReader, PageRow
from app.checkpoints.repository import DELETE_CHUNK, CheckpointKey, CheckpointsRepository
from app.checkpoints.writer import CheckpointWriter
from app.checkpoints.schemas import CheckpointCreate, CheckpointSearch, RetentionRead, RetentionUpdate, WritesCreate
from app.checkpoints.settings import CheckpointsSettings
from app.core.capability import in_batches
from app.core.config import LimitsSettings
from app.fairness.fairshare import HeavyWrites
from app.core.errors import InvalidInput, NotFound, PayloadTooLarge
from app.checkpoints.backend import dumps_text
from app.core.jsonvalue import jsonb_text
from app.core.http.pagination import decode_cursor, encode_cursor
from app.core.fast.fixed_statements import StatementConnection

# A NUL in JSON text: the escape \u0000 not itself escaped (an even run of backslashes before it):
# a text holding a backslash then "u0000" is written \\u0000 and is no NUL.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

_b64 = base64.b64encode


def _typed(type_: str, data: bytes) -> dict[str, str]:
    return {"type": type_, "data": _b64(data).decode("ascii")}


class CheckpointsService:
    def __init__(
        self, repository: CheckpointsRepository, reader: CheckpointReader, writer: CheckpointWriter,
        limits: LimitsSettings, settings: CheckpointsSettings, heavy: HeavyWrites,
    ) -> None:
        self.repo = repository
        self.reader = reader
        self.writer = writer
        self.limits = limits
        self.settings = settings
        self.heavy = heavy
        self.copies = ParkedThreads(heavy, repository)
        """Copies in turns on both backends; deletes, prunes and sweeps on SQLite (``parked``)."""
        self.parked = self.copies if heavy.sqlite else None

    # --- limits --------------------------------------------------------------------------

    def _check_count(self, field: str, n: int) -> None:
        if n > self.limits.max_batch_items:
            message = f"at most {self.limits.max_batch_items} items per request (got {n})"
            raise PayloadTooLarge(f"{field}: {message}", errors=[{"loc": [field], "msg": message}])

    def _check_bytes(self, field: str, data: bytes) -> None:
        if len(data) > self.settings.max_blob_bytes:
            message = f"must be at most {self.settings.max_blob_bytes} bytes (got {len(data)})"
            raise PayloadTooLarge(f"{field}: {message}", errors=[{"loc": field.split("."), "msg": message}])

    @staticmethod
    def _too_heavy(field: str, what: str, setting: str, limit: int) -> None:
        message = f"{what}, more than checkpoints.{setting} ({limit})"
        raise PayloadTooLarge(f"{field}: {message}", errors=[{"loc": [field], "msg": message}])

    def stored_json(self, field: str, value: Any, limit: int) -> str:
        """``value`` as stored in a JSON column (jsonb on PostgreSQL: ``jsonb_text``), or a 422
        (not JSON, a NUL), or a 413: over ``limit`` bytes as PostgreSQL answers it, its numbers
        written out (``1e-300`` is 302 characters there: 9,000 ``5e-324`` in 64 KiB of metadata
        read back as 2.95 MB), on both backends alike."""
        try:
            written = jsonb_text(dumps_text(value), value)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(field, f"is not JSON: {exc}") from None
        text = written.text
        if _NUL_ESCAPE.search(text):
            raise InvalidInput(field, "must not contain NUL characters (\\u0000)")
        size = (len(text) if text.isascii() else len(text.encode())) + written.growth  # bytes, not characters
        if size > limit:
            message = f"must be at most {limit} bytes of JSON with its numbers written out in full (got {size})"
            raise PayloadTooLarge(f"{field}: {message}", errors=[{"loc": [field], "msg": message}])
        return text

    # --- writes --------------------------------------------------------------------------

    async def put(self, conn: StatementConnection, ns: str, body: CheckpointCreate) -> dict[str, str]:
        self._check_count("blobs", len(body.blobs))
        self._check_bytes("checkpoint.data", body.checkpoint.data)
        for i, blob in enumerate(body.blobs):
            self._check_bytes(f"blobs.{i}.data", blob.data)
        metadata = self.stored_json("metadata", body.metadata, self.settings.max_metadata_bytes)
        versions = self.stored_json("channel_versions", body.channel_versions, self.settings.max_metadata_bytes)
        limit = self.settings.max_checkpoint_bytes
        values: dict[tuple[str, str], tuple[str, str, str, bytes]] = {}
        for b in body.blobs:  # one per version, the first: as the insert keeps it
            values.setdefault((b.channel, b.version), (b.channel, b.version, b.type, b.data))
        weight = await self.writer.put(
            conn, ns, body.thread_id, time.time(), body.checkpoint_ns, body.checkpoint_id, body.parent_checkpoint_id,
            body.checkpoint.type, body.checkpoint.data, versions, metadata, body.metadata, list(values.values()), limit,
        )
        if weight > limit:  # nothing was stored (PostgreSQL), or the transaction rolls back (SQLite)
            self._too_heavy("checkpoint", f"with its metadata, channel versions and the channel values they reference, "
                            f"the checkpoint would weigh {weight} stored bytes", "max_checkpoint_bytes", limit)
        return {"thread_id": body.thread_id, "checkpoint_ns": body.checkpoint_ns, "checkpoint_id": body.checkpoint_id}

    async def put_writes(self, conn: StatementConnection, ns: str, body: WritesCreate) -> None:
        self._check_count("writes", len(body.writes))
        for i, write in enumerate(body.writes):
            self._check_bytes(f"writes.{i}.data", write.data)
        if not body.writes:
            return
        rows = {w.idx: (w.idx, w.channel, w.type, w.data) for w in body.writes}  # one per idx: the last
        limit = self.settings.max_pending_bytes
        weight = await self.writer.put_writes(
            conn, ns, body.thread_id, time.time(), body.checkpoint_ns, body.checkpoint_id, body.task_id,
            body.task_path, list(rows.values()),
            # LangGraph's rule: special writes (negative idx) replace, regular ones are kept once
            replace=all(w.idx < 0 for w in body.writes), max_bytes=limit,
        )
        if weight > limit:
            self._too_heavy("writes", f"the pending writes of checkpoint {body.checkpoint_id!r} would weigh {weight} "
                            "stored bytes", "max_pending_bytes", limit)

    # --- reads ---------------------------------------------------------------------------

    @staticmethod
    def _tuple(r: PageRow) -> dict[str, Any]:
        return {
            "thread_id": r.thread_id,
            "checkpoint_ns": r.checkpoint_ns,
            "checkpoint_id": r.checkpoint_id,
            "parent_checkpoint_id": r.parent_checkpoint_id,
            "checkpoint": _typed(r.type, r.checkpoint),
            "channel_versions": orjson.Fragment(r.channel_versions),
            "metadata": orjson.Fragment(r.metadata),
            "values": {channel: _typed(t, d) for channel, t, d in r.values},
            "pending_writes": [
                {"task_id": task_id, "channel": channel, **_typed(t, d), "task_path": task_path, "idx": idx}
                for task_id, channel, t, d, task_path, idx in r.writes
            ],
        }

    async def get(self, conn: StatementConnection, ns: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None) -> bytes:
        """The checkpoint (the newest of the thread and checkpoint_ns without an id) as JSON, or 404."""
        rows, _ = await self.reader.page(
            conn, ns, thread_id=thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id, limit=1,
            budget=self.settings.max_page_bytes,
        )
        if not rows:
            what = f"checkpoint {checkpoint_id!r}" if checkpoint_id else "no checkpoint"
            raise NotFound(f"{what} in thread {thread_id!r} (checkpoint_ns {checkpoint_ns!r})")
        return orjson.dumps(self._tuple(rows[0]))

    async def search(self, conn: StatementConnection, ns: str, body: CheckpointSearch) -> bytes:
        """A page newest first; a full page has a ``next_cursor`` (the page after may be empty), and
        so has one cut short by ``checkpoints.max_page_bytes``."""
        limit = body.limit or self.limits.default_page_size
        if limit > self.limits.max_page_size:
            raise InvalidInput("limit", f"must be at most {self.limits.max_page_size}")
        if body.filter and len(body.filter) > self.limits.max_filter_terms:
            raise InvalidInput("filter", f"at most {self.limits.max_filter_terms} entries")
        if body.filter:  # as metadata is written: no NUL (PostgreSQL's jsonb has none), any integer
            self.stored_json("filter", body.filter, self.settings.max_metadata_bytes)
        after = None
        if body.cursor is not None:
            position = decode_cursor(body.cursor, "c", "t", "n")
            after = (position["c"], position["t"], position["n"])
        rows, cut = await self.reader.page(
            conn, ns, thread_id=body.thread_id, checkpoint_ns=body.checkpoint_ns, checkpoint_id=body.checkpoint_id,
            before=body.before, filter=body.filter, after_key=after, limit=limit, budget=self.settings.max_page_bytes,
        )
        last = rows[-1] if len(rows) == limit or cut else None
        next_cursor = encode_cursor({"c": last.checkpoint_id, "t": last.thread_id, "n": last.checkpoint_ns}) if last else None
        return orjson.dumps({"items": [self._tuple(r) for r in rows], "next_cursor": next_cursor})

    # --- deletes, copies, pruning ----------------------------------------------------------
    # One transaction each on PostgreSQL (writers of other rows never wait for it); on SQLite in
    # turns that let other writers in between (``app.checkpoints.heavy``).

    async def delete_thread(self, ns: str, thread_id: str) -> int:
        if self.parked is not None:
            return await self.parked.delete_threads(ns, [thread_id])
        async with self.heavy.turn() as conn:
            pk = await self.repo.lock_thread(conn, ns, thread_id)
            return await self.repo.delete_threads(conn, [pk], ns) if pk is not None else 0

    async def delete_runs(self, ns: str, run_ids: Sequence[str]) -> int:
        self._check_count("run_ids", len(run_ids))
        runs = list(dict.fromkeys(run_ids))
        if self.parked is not None:
            return await self.parked.delete_runs(ns, runs)
        async with self.heavy.turn() as conn:
            return await self._delete_runs(conn, ns, runs)

    async def _delete_runs(self, conn: AsyncConnection, ns: str, runs: Sequence[str]) -> int:
        threads: set[int] = set()
        for run_id in runs:
            threads.update(await self.repo.run_threads(conn, ns, run_id))
        if not threads:
            return 0
        pks = sorted(threads)
        await self.repo.lock_pks(conn, ns, pks)
        # A page of keys at a time (a run's checkpoints were all held in memory at once), of the
        # threads locked: a checkpoint of the run written in another thread since is left, as
        # one written after the request is.
        deleted = 0
        for run_id in runs:
            for start in range(0, len(pks), DELETE_CHUNK):
                some = pks[start : start + DELETE_CHUNK]
                after: CheckpointKey | None = None
                while keys := await self.repo.run_checkpoints(conn, run_id, some, after, DELETE_CHUNK):
                    deleted += await self.repo.delete_checkpoints(conn, keys)
                    after = keys[-1]
        for pk in pks:
            await self.repo.collect_blobs(conn, pk)
        return deleted

    async def copy_thread(self, ns: str, source: str, target: str) -> int:
        """Every checkpoint of ``source`` (the whole parent chain, so delta channels rebuild)
        with its values and pending writes, into ``target``; at most ``fairness.heavy_per_namespace``
        copies of a namespace at once (429)."""
        if source == target:
            raise InvalidInput("target_thread_id", "must differ from source_thread_id")
        slot = self.heavy.admit(ns, "thread copies")
        try:
            copied = await self.copies.copy(ns, source, target, self.settings.max_copy_bytes)
        finally:
            slot.release()
        if isinstance(copied, tuple):
            self._too_heavy("source_thread_id", f"thread {source!r} holds {copied[0]} stored bytes",
                            "max_copy_bytes", copied[1])
        return copied  # type: ignore[return-value]  # (an int: a tuple was refused above)

    async def prune(self, ns: str, thread_ids: Sequence[str], strategy: str) -> int:
        self._check_count("thread_ids", len(thread_ids))
        if self.parked is not None:
            if strategy == "delete":
                return await self.parked.delete_threads(ns, thread_ids)
            async with self.heavy.engine.connect() as conn:
                pks = [pk for t in sorted(set(thread_ids)) if (pk := await self.repo.lock_thread(conn, ns, t)) is not None]
            deleted = 0
            for pk in pks:
                deleted += await self.parked.keep_latest(pk, 1)
            return deleted
        async with self.heavy.turn() as conn:
            pks = []
            for thread_id in sorted(set(thread_ids)):
                pk = await self.repo.lock_thread(conn, ns, thread_id)
                if pk is not None:
                    pks.append(pk)
            if strategy == "delete":
                return await self.repo.delete_threads(conn, pks, ns)
            deleted = 0
            for pk in pks:
                deleted += await self.keep_latest(conn, pk, 1)
            return deleted

    async def keep_latest(self, conn: AsyncConnection, pk: int, keep: int) -> int:
        """Delete all but the newest ``keep`` checkpoints per checkpoint_ns of thread ``pk`` (and
        the ancestors delta channels need: ``app.checkpoints.lineage``), with what only they used.
        Without delta channels this is done in the database, whatever the thread's length; only a
        thread with them has its lineage read (ids, and the versions and counters of its delta
        channels: ``CheckpointsRepository.lineage``)."""
        if not await self.repo.has_delta_channels(conn, pk):
            deleted = await self.repo.delete_all_but_newest(conn, pk, keep)
            if deleted:
                await self.repo.orphan_parents(conn, pk, None)
                await self.repo.collect_blobs(conn, pk)
            return deleted
        doomed = await doomed_checkpoints(self.repo, conn, pk, keep)
        if not doomed:
            return 0
        deleted = await self.repo.delete_checkpoints(conn, doomed)
        for ns in {k[1] for k in doomed}:
            await self.repo.orphan_parents(conn, pk, ns)
        await self.repo.collect_blobs(conn, pk)
        return deleted

    # --- retention -------------------------------------------------------------------------

    async def set_retention(self, conn: AsyncConnection, ns: str, body: RetentionUpdate) -> RetentionRead:
        if body.thread_id is None:
            await self.repo.set_namespace_retention(conn, ns, body.keep_latest, body.idle_ttl_seconds)
        else:
            await self.repo.set_thread_retention(conn, ns, body.thread_id, body.keep_latest, body.idle_ttl_seconds, time.time())
        return RetentionRead(thread_id=body.thread_id, keep_latest=body.keep_latest, idle_ttl_seconds=body.idle_ttl_seconds)

    async def retention(self, conn: AsyncConnection, ns: str, thread_id: str | None) -> RetentionRead:
        if thread_id is None:
            keep, ttl = await self.repo.namespace_retention(conn, ns)
        else:
            keep, ttl = await self.repo.thread_retention(conn, ns, thread_id)
        return RetentionRead(thread_id=thread_id, keep_latest=keep, idle_ttl_seconds=ttl)

    async def sweep_round(self) -> None:
        """Retention in bounded batches, until a batch is not full (SQLite: in turns, and then what
        copies and deletes cut short left behind)."""
        batch = self.settings.sweep_batch
        if self.parked is not None:
            while await self.parked.sweep(batch) >= batch:
                pass
        else:
            await in_batches(self.heavy.engine, self.sweep, batch)
        await self.copies.collect_parked()

    async def sweep(self, conn: AsyncConnection) -> int:
        """One bounded batch of retention over every namespace: idle threads deleted, threads
        written since their last trim cut to their keep-latest; how many threads it handled."""
        now = time.time()
        batch = self.settings.sweep_batch
        idle = await self.repo.idle_threads(conn, now, batch)
        await self.repo.delete_threads(conn, idle, None)
        trims = await self.repo.threads_to_trim(conn, batch)
        for pk, keep in trims:
            await self.keep_latest(conn, pk, keep)
        await self.repo.mark_pruned(conn, [pk for pk, _ in trims], now)
        return max(len(idle), len(trims))
