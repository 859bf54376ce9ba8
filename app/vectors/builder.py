"""Background HNSW builds for pgvector collections (one builder per process).

A collection is created without its HNSW index (inserting into pgvector's graph row by row is
~90x slower than into a plain table, and a bulk ``CREATE INDEX`` afterwards is fast). This
builder adds the index with ``CREATE INDEX CONCURRENTLY`` once the collection holds at least
``vectors.index_min_rows`` points and has had no point writes in this process for
``vectors.index_quiet_seconds``:

- after each committed point write to an HNSW collection, ``notice`` (re)schedules a check of it
  at now + quiet (a debounce: a bulk load is indexed once, after its last batch);
- at start-up and every ``vectors.index_sweep_seconds`` a sweep looks at every HNSW collection
  big enough and without a valid index (a crash, a cancelled build, writes made by other
  processes). Whether anyone still writes to it is read from PostgreSQL's own counters
  (``pg_stat_user_tables``, all processes and replicas together): one that had no writes since
  the previous sweep is checked right away, and later writes do not postpone that; one still
  being written to is left to the processes writing to it, unless it has been so for
  ``MAX_BUSY_SWEEPS`` sweeps in a row (a collection written to without a pause is indexed
  anyway). The first two sweeps after start-up are ``FIRST_SWEEP_GAP_SECONDS`` apart, so a
  build interrupted by a crash is redone within seconds.

Checks run one at a time, each on its own connection from the vectors engine. A build holds a
session-level advisory lock on the collection id, so of several workers or replicas one builds
and the others skip; an index that is invalid while nobody holds the lock is what a crashed or
cancelled build left behind, and is dropped and rebuilt. Shutdown cancels a running build
(PostgreSQL leaves an invalid index; the next start-up's sweep rebuilds it). Dropping or
resetting a collection cancels a build on its table (``PgVectorIndex._exclusive``); the builder
takes that, and a table that vanished under it, as normal.

Once a collection's HNSW index is valid, each check also makes its payload subgraphs
(``app.vectors.subgraphs``: partial HNSW indexes of the common values of declared fields)
from the latest ``ANALYZE`` statistics, after the main index, one at a time, and drops invalid
leftovers of interrupted ones first. Each sweep looks again at every such collection whose
statistics changed (``last_analyze``/``last_autoanalyze``) or that has an invalid subgraph
nobody builds, so the subgraphs follow the data as autovacuum's ``ANALYZE`` sees it.

A payload index that PostgreSQL refuses to build from the stored values (a key too large for a
B-tree, stored before writes checked declared values) fails alone: its invalid leftover is
dropped, the failure is kept as the payload GIN index's comment (``PayloadFailure``: describe
shows the index ``failed``, naming points to fix), the rest of the check goes on, and the build is
tried again ``FAILED_RETRY_SWEEPS`` sweep intervals later.

Once the main graph is valid, and again when the collection has doubled or halved since, a check
also measures its recall (``app.vectors.recall``: sampled points searched exactly and through the
graph at growing ``ef_search``) before the subgraphs, and keeps the ``ef_search`` that reaches
``vectors.target_recall`` as the index's comment; the sweep finds valid graphs without one (a
restart during the measurement, a collection grown by other processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.capability import cancel_and_wait, stop_if_cancelled
from app.vectors.settings import VectorsSettings
from app.vectors.backend import CollectionInfo
from app.vectors import recall, subgraphs
from app.vectors.payload_index import MAX_DECLARED_VALUE_BYTES, PayloadIndex, sql_index_name
from app.vectors.pgvector import (
    BUILD_LOCK_CLASS,
    BUILDER_APPLICATION_NAME,
    HNSW_KINDS,
    INDEX_COMMENT,
    FIELD_STATS,
    SUBGRAPH_INDEXES,
    PAYLOAD_FAILURES_COMMENT,
    TABLE_ROWS,
    PayloadFailure,
    build_record,
    calibration_statements,
    hnsw_index_name,
    hnsw_index_sql,
    index_comment_sql,
    declared_stats,
    offending_points_sql,
    parse_payload_failures,
    payload_failures_sql,
    payload_index_sql,
    subgraph_index_sql,
    subgraph_like,
)
from app.vectors.telemetry import INDEX_BUILD_TOTAL, INDEX_BUILD_TUPLES

log = logging.getLogger("app.vectors")

ADVISORY_LOCK_CLASS = BUILD_LOCK_CLASS
BUILD_TIMEOUT_SECONDS = 7 * 24 * 3600.0  # client-side bound of one build (the server's is off)
MAX_BUSY_SWEEPS = 5
PROGRESS_POLL_SECONDS = 5.0
FIRST_SWEEP_GAP_SECONDS = 3.0
FAILED_RETRY_SWEEPS = 5  # a payload index refused from the stored values is tried again after this many sweeps' time
OFFENDERS_NAMED = 3
LOAD_GROWTH = 0.25  # a graph build is postponed when this share of the rows is written meanwhile (``_build``)
MAX_POSTPONE_SECONDS = 1800.0
PROGRAM_LIMIT_EXCEEDED = "54000"  # a B-tree key past its size bound

# Collections without a valid HNSW index or missing a declared payload index, with the table's
# write counter; small ones (by the statistics' live-row estimate) only when a stale invalid HNSW
# index needs dropping. With $2 (calibration on), also those with a valid HNSW index, with its
# comment (its recall calibration) and the table's estimated rows: whether it is due is
# ``recall.due``'s to say.
_PAYLOAD_VALID = (
    "(SELECT count(*) FROM jsonb_array_elements(COALESCE(CAST(c.index_options AS jsonb) -> 'payload_indexes', "
    "'[]'::jsonb)) WITH ORDINALITY AS e(d, n) JOIN pg_index pi "
    "ON pi.indexrelid = to_regclass('vec_' || c.id || '_p' || (e.n - 1)) WHERE pi.indisvalid)"
)
_PAYLOAD_DECLARED = "jsonb_array_length(COALESCE(CAST(c.index_options AS jsonb) -> 'payload_indexes', '[]'::jsonb))"
_SWEEP = (
    "SELECT c.id, c.index_options, COALESCE(s.n_tup_ins + s.n_tup_upd + s.n_tup_del, 0), "
    f"i.indisvalid IS NOT TRUE, {_PAYLOAD_VALID} < {_PAYLOAD_DECLARED}, "
    "CASE WHEN i.indisvalid THEN obj_description(i.indexrelid, 'pg_class') END, "
    "GREATEST(t.reltuples, COALESCE(s.n_live_tup, 0), 0) "
    "FROM vector_collections c "
    "LEFT JOIN pg_index i ON i.indexrelid = to_regclass('vec_' || c.id || '_hnsw') "
    "LEFT JOIN pg_class t ON t.oid = to_regclass('vec_' || c.id) "
    "LEFT JOIN pg_stat_user_tables s ON s.relid = t.oid "
    f"WHERE (i.indisvalid IS NOT TRUE OR {_PAYLOAD_VALID} < {_PAYLOAD_DECLARED} OR (i.indisvalid AND $2)) "
    "AND (i.indexrelid IS NOT NULL OR COALESCE(s.n_live_tup, 0) >= $1)"
)
# A table's write counter (all processes, as their statistics are flushed: within a second or
# so) and its estimated rows ($1: the table).
_WRITES = (
    "SELECT COALESCE(s.n_tup_ins + s.n_tup_upd + s.n_tup_del, 0), GREATEST(c.reltuples, COALESCE(s.n_live_tup, 0), 0) "
    "FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = to_regclass($1)"
)
_PROGRESS = (
    "SELECT p.phase, p.tuples_done, p.tuples_total, p.blocks_done, p.blocks_total "
    "FROM pg_stat_progress_create_index p WHERE p.pid = $1"
)
_REGISTRY_ROW = (
    "SELECT id, namespace, collection, vector_size, distance, index_options, text_field, created_at "
    "FROM vector_collections WHERE id = $1"
)
_INDEX_VALID = "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)"
# HNSW collections with a valid index and a declared payload field: when their statistics were
# last gathered, and how many invalid payload subgraphs nobody builds they have.
_SUBGRAPH_SWEEP = (
    "SELECT c.id, COALESCE(CAST(GREATEST(s.last_analyze, s.last_autoanalyze) AS text), ''), "
    "(SELECT count(*) FROM pg_index x JOIN pg_class xc ON xc.oid = x.indexrelid "
    "WHERE x.indrelid = i.indrelid AND NOT x.indisvalid AND xc.relname LIKE 'vec\\_' || c.id || '\\_p%\\_g%' "
    "AND NOT EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = x.indexrelid)) "
    "FROM vector_collections c JOIN pg_index i ON i.indexrelid = to_regclass('vec_' || c.id || '_hnsw') "
    "LEFT JOIN pg_stat_user_tables s ON s.relid = i.indrelid "
    "WHERE i.indisvalid AND jsonb_array_length(COALESCE(CAST(c.index_options AS jsonb) -> 'payload_indexes', "
    "'[]'::jsonb)) > 0"
)


class _Session:
    """The builder's connection for one check, and whether it must be closed afterwards."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.dirty = False


class IndexBuilder:
    """Schedules and runs the background HNSW builds of this process."""

    def __init__(
        self, engine: AsyncEngine, settings: VectorsSettings, on_change: Callable[[int], None] | None = None
    ) -> None:
        self.engine = engine
        self.on_change = on_change  # told of a collection whose indexes a check changed (the search path's caches)
        self.min_rows = settings.index_min_rows
        self.quiet = settings.index_quiet_seconds
        self.sweep_seconds = settings.index_sweep_seconds
        self.memory_mb = settings.index_build_memory_mb
        self.progress_log_seconds = settings.index_progress_log_seconds
        self.subgraph_min_points = settings.exact_search_threshold
        self.subgraph_max_share = settings.subgraph_max_share
        self.subgraph_max_count = settings.subgraph_max_count
        self.target_recall = settings.target_recall
        self.calibration_queries = settings.calibration_queries
        self.failed_retry_seconds = FAILED_RETRY_SWEEPS * settings.index_sweep_seconds
        self._subgraphs_seen: dict[int, tuple[str, int]] = {}  # id -> (statistics' time, invalid leftovers)
        self._due: dict[int, float] = {}  # collection id -> when to check it (monotonic)
        self._postponing: set[int] = set()  # graph builds cancelled because the collection is still being loaded
        self._postponed: dict[int, tuple[int, float]] = {}  # id -> (builds postponed in a row, when first)
        self._forced: set[int] = set()  # due by the sweep's word: writes do not postpone them
        # (when, id): at most one entry per collection, except after an earlier re-schedule;
        # an entry whose id is no longer due is dropped, one due later is pushed back.
        self._heap: list[tuple[float, int]] = []
        self._writes_seen: dict[int, int] = {}  # id -> write counter at the last sweep
        self._busy_sweeps: dict[int, int] = {}  # id -> sweeps in a row that found it written to
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- scheduling ---------------------------------------------------------------------------

    async def notice(self, coll: CollectionInfo) -> None:
        """A point write to ``coll`` committed: check it once writes have been quiet (async, so
        that Starlette runs it on the event loop after the response, not in a thread)."""
        if coll.index.get("kind") in HNSW_KINDS or coll.payload_indexes:
            self._schedule(coll.id, time.monotonic() + self.quiet, debounce=True)

    def _schedule(self, coll_id: int, when: float, *, debounce: bool) -> None:
        """Check ``coll_id`` at ``when``. A write (``debounce``) postpones a check scheduled by an
        earlier write, but not one the sweep asked for: once the sweep decides (quiet across
        processes, or busy for ``MAX_BUSY_SWEEPS`` sweeps), the check runs."""
        current = self._due.get(coll_id)
        if current is not None:
            if not debounce and current <= when:
                return  # already due as early
            if debounce and coll_id in self._forced:
                return
        if not debounce:
            self._forced.add(coll_id)
        self._due[coll_id] = when
        if current is None or when < current:
            heapq.heappush(self._heap, (when, coll_id))
            self._wake.set()
        # else: postponed; its entry is pushed back when it comes up

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name="vectors-index-builder"),
            asyncio.create_task(self._sweep_forever(), name="vectors-index-sweep"),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks = []

    async def _run(self) -> None:
        while True:
            while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
                when, coll_id = heapq.heappop(self._heap)
                due = self._due.get(coll_id)
                if due is not None and due > when:
                    heapq.heappush(self._heap, (due, coll_id))  # postponed by a write
            if not self._heap:
                self._wake.clear()
                await self._wake.wait()
                continue
            when, coll_id = self._heap[0]
            delay = when - time.monotonic()
            if delay > 0:
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                continue
            heapq.heappop(self._heap)
            del self._due[coll_id]
            self._forced.discard(coll_id)
            try:
                await self.check(coll_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # the next write or sweep tries again; never take the service down
                stop_if_cancelled()
                log.warning("vectors index check of collection %d failed", coll_id, exc_info=True)

    async def _sweep_forever(self) -> None:
        sweeps = 0
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except asyncpg.UndefinedTableError:
                log.info("vectors index sweep: no collection registry yet (migrations not run)")
            except Exception:
                stop_if_cancelled()
                log.warning("vectors index sweep failed", exc_info=True)
            sweeps += 1
            await asyncio.sleep(min(self.sweep_seconds, FIRST_SWEEP_GAP_SECONDS) if sweeps == 1 else self.sweep_seconds)

    async def sweep(self) -> int:
        """Schedule the HNSW collections without a valid index that nobody writes to any more
        (or that have been written to for ``MAX_BUSY_SWEEPS`` sweeps); how many."""
        async with self.engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            assert raw is not None  # a checked-out connection has its asyncpg connection
            rows = await raw.fetch(_SWEEP, int(self.min_rows), self.target_recall > 0)
            subgraph_rows = await raw.fetch(_SUBGRAPH_SWEEP)
        now = time.monotonic()
        scheduled = 0
        pending: set[int] = set()
        for coll_id, options, writes, hnsw_missing, payload_missing, comment, points in rows:
            hnsw = json.loads(options).get("kind") in HNSW_KINDS
            uncalibrated = hnsw and not hnsw_missing and recall.due(recall.parse(comment), int(points), self.target_recall)
            if not (hnsw and hnsw_missing) and not payload_missing and not uncalibrated:
                continue
            pending.add(coll_id)
            before = self._writes_seen.get(coll_id)
            self._writes_seen[coll_id] = writes
            if before is None:
                continue  # first sight: whether it is still written to shows next time
            busy = self._busy_sweeps.get(coll_id, 0) + 1 if writes != before else 0
            self._busy_sweeps[coll_id] = busy
            if busy == 0 or busy >= MAX_BUSY_SWEEPS:
                self._schedule(coll_id, now, debounce=False)
                self._busy_sweeps[coll_id] = 0
                scheduled += 1
        for gone in set(self._writes_seen) - pending:  # indexed, or dropped
            self._writes_seen.pop(gone, None)
            self._busy_sweeps.pop(gone, None)
        # Payload subgraphs: look again at a collection whose statistics changed (or that has a
        # leftover of an interrupted subgraph build); a check with nothing to do is a few reads.
        seen: set[int] = set()
        for coll_id, analyzed, leftovers in subgraph_rows:
            seen.add(coll_id)
            key = (analyzed, int(leftovers))
            if self._subgraphs_seen.get(coll_id) != key:
                self._subgraphs_seen[coll_id] = key
                if coll_id not in pending:
                    self._schedule(coll_id, now, debounce=False)
                    scheduled += 1
        for gone in set(self._subgraphs_seen) - seen:
            self._subgraphs_seen.pop(gone, None)
        return scheduled

    # --- one check ------------------------------------------------------------------------------

    async def check(self, coll_id: int) -> str:
        """Build the collection's index if it is due; what was done (for logs and tests)."""
        async with self.engine.connect() as conn:
            session = _Session((await conn.get_raw_connection()).driver_connection)
            try:
                done = await self._check(session, coll_id)
                if done == "built" and self.on_change is not None:
                    self.on_change(coll_id)
                return done
            except asyncpg.UndefinedTableError:
                return "gone"  # dropped meanwhile (the table, or the index a calibration measured)
            finally:
                # A session that took the lock or changed settings is not pooled again: closing
                # it releases the lock whatever happened (a cancelled build included).
                if session.dirty:
                    await conn.invalidate()

    async def _check(self, session: _Session, coll_id: int) -> str:
        raw = session.raw
        row = await raw.fetchrow(_REGISTRY_ROW, coll_id)
        if row is None:
            return "gone"
        coll = CollectionInfo(
            id=row["id"], namespace=row["namespace"], collection=row["collection"],
            vector_size=row["vector_size"], distance=row["distance"], index=json.loads(row["index_options"]),
            text_field=row["text_field"], created_at=row["created_at"],
        )
        hnsw = coll.index.get("kind") in HNSW_KINDS
        if not hnsw and not coll.payload_indexes:
            return "exact"
        index = hnsw_index_name(coll)
        valid = await raw.fetchval(_INDEX_VALID, index) if hnsw else True
        payload = await self._payload_validity(raw, coll)
        if (
            valid and all(payload.values()) and not any(await self._subgraph_work(raw, coll, valid=hnsw, locked=False))
            and not (hnsw and await self._calibration_due(raw, coll))
        ):
            return "ready"
        stale = valid is False or any(v is False for v in payload.values())
        if not valid and not stale and await self._rows(raw, coll) < self.min_rows:
            return "small"
        if not await raw.fetchval("SELECT pg_try_advisory_lock($1, $2)", ADVISORY_LOCK_CLASS, coll.id):
            return "locked"  # another worker or replica is on it
        session.dirty = True
        await raw.execute(
            f"SET application_name = '{BUILDER_APPLICATION_NAME}'; SET statement_timeout = 0; "
            f"SET lock_timeout = 0; SET maintenance_work_mem = '{int(self.memory_mb)}MB'"
        )
        valid = await raw.fetchval(_INDEX_VALID, index) if hnsw else True
        payload = await self._payload_validity(raw, coll)
        if (
            valid and all(payload.values()) and not any(await self._subgraph_work(raw, coll, valid=hnsw, locked=True))
            and not (hnsw and await self._calibration_due(raw, coll))
        ):
            return "ready"
        try:
            # Invalid and nobody holds the lock: a crashed or cancelled build left it.
            for p in coll.payload_indexes:
                if payload[p.position] is False:
                    await self._drop_invalid(raw, coll, sql_index_name(coll.data_table, p))
            if valid is False:
                await self._drop_invalid(raw, coll, index)
            if not valid and await self._rows(raw, coll) < self.min_rows:
                return "small"
            # The payload indexes first: B-trees take seconds where the graph takes minutes,
            # and filtered searches use them while the graph is still building.
            built = await self._payload_indexes(raw, coll, [p for p in coll.payload_indexes if not payload[p.position]])
            if built or (not valid and coll.payload_indexes):
                # Statistics of the new index expressions: PostgreSQL's planner and the gateway's
                # (``app.vectors.estimate``) estimate filters on declared fields from them, and
                # the payload subgraphs are chosen from them. Autovacuum would gather them only
                # after enough rows change, and a table emptied by a reset keeps its old ones: a
                # graph (re)built means a (re)load.
                await raw.execute(f"ANALYZE {coll.data_table}", timeout=BUILD_TIMEOUT_SECONDS)
            if not valid:
                detail = f", m={coll.index.get('m')}, ef_construction={coll.index.get('ef_construction')}"
                await self._build(raw, coll, "HNSW index", hnsw_index_sql(coll), detail, watch=index)
            if hnsw:
                # The main graph's recall first: its searches take the measured ef_search at once,
                # while the subgraphs take minutes more at 500,000 points.
                if await self._calibration_due(raw, coll):
                    await self._calibrate(raw, coll)
                await self._subgraphs(raw, coll)
        except asyncpg.QueryCanceledError:
            if coll.id in self._postponing:
                self._postponing.discard(coll.id)
                count, first = self._postponed.get(coll.id, (0, time.monotonic()))
                self._postponed[coll.id] = (count + 1, first)
                # Checked again once writes are quiet (the next point write postpones it further),
                # waiting longer each time: a load slow enough to pause for a second now and then
                # would otherwise start a build every few seconds.
                wait = min(self.sweep_seconds, max(self.quiet, PROGRESS_POLL_SECONDS) * 2 ** count)
                self._schedule(coll.id, time.monotonic() + wait, debounce=True)
                return "postponed"
            log.info("vectors: index build of %s/%s cancelled (collection dropped or reset)",
                     coll.namespace, coll.collection)
            return "cancelled"
        self._postponed.pop(coll.id, None)
        return "built"

    async def _calibration_due(self, raw: Any, coll: CollectionInfo) -> bool:
        """Whether the collection's HNSW index, valid (every caller has seen it so, or built it),
        wants a recall calibration (``recall.due``)."""
        if self.target_recall <= 0:
            return False
        current = recall.parse(await raw.fetchval(INDEX_COMMENT, hnsw_index_name(coll)))
        if not recall.due(current, int(await raw.fetchval(TABLE_ROWS, coll.data_table) or 0), self.target_recall):
            return False
        # The estimate can run well past the rows (below): confirmed on the count before measuring.
        return recall.due(current, await _count_rows(raw, coll), self.target_recall)

    async def _calibrate(self, raw: Any, coll: CollectionInfo) -> recall.Calibration | None:
        """Measure the recall of the collection's graph (``app.vectors.recall``), keep the result
        as the HNSW index's comment and log it; holding the build lock, on a session closed after."""
        started = time.perf_counter()
        target, n = self.target_recall, self.calibration_queries
        points = await _count_rows(raw, coll)
        sample_sql, exact_sql, graph_sql = calibration_statements(coll, recall.K + 1)
        pct = 100.0 if points <= 0 else min(100.0, 100.0 * 4 * n / points)
        sampled = await raw.fetch(sample_sql, pct, n, timeout=BUILD_TIMEOUT_SECONDS)
        if not sampled and pct < 100:  # an estimate far above the rows there are
            sampled = await raw.fetch(sample_sql, 100.0, n, timeout=BUILD_TIMEOUT_SECONDS)
        if not sampled:
            return None  # emptied meanwhile: ``recall.due`` says no once the estimate sees it
        truths = [[r[0] for r in await raw.fetch(exact_sql, vec, timeout=BUILD_TIMEOUT_SECONDS)] for _, vec in sampled]
        # The graph, as searches use it (PostgreSQL would sort a small table instead).
        await raw.execute("SET enable_seqscan = off")
        ladder: dict[int, float] = {}
        for ef in recall.LADDER:
            await raw.execute(f"SET hnsw.ef_search = {int(ef)}")
            scores = []
            for (pid, vec), truth in zip(sampled, truths, strict=True):
                found = [r[0] for r in await raw.fetch(graph_sql, vec, timeout=BUILD_TIMEOUT_SECONDS)]
                scores.append(recall.recall_at_k(truth, found, pid))
            ladder[ef] = round(sum(scores) / len(scores), 4)  # as the comment keeps it
            if ladder[ef] >= target or recall.settled(ladder):
                break
        await raw.execute("RESET enable_seqscan; RESET hnsw.ef_search")
        ef = recall.pick(ladder, target)
        result = recall.Calibration(
            ef_search=ef, recall=ladder[ef], target=target, points=points, queries=len(sampled),
            seconds=time.perf_counter() - started, ladder=ladder,
        )
        await raw.execute(index_comment_sql(hnsw_index_name(coll), result.comment()))
        below = "" if result.recall >= target else f" (below the target {target}: the graph's best measured)"
        log.info(
            "vectors: calibrated the HNSW index of %s/%s: ef_search %d, recall@%d %.3f%s over %d sampled of %d points "
            "in %.1f s (%s)",
            coll.namespace, coll.collection, ef, recall.K, result.recall, below, result.queries, points,
            result.seconds, ", ".join(f"ef {e}: {r:.3f}" for e, r in ladder.items()),
            extra={"collection_id": coll.id, "ef_search": ef, "recall": round(result.recall, 4),
                   "calibration_seconds": round(result.seconds, 3)},
        )
        return result

    async def _subgraph_work(
        self, raw: Any, coll: CollectionInfo, *, valid: bool, locked: bool
    ) -> tuple[list[subgraphs.Wanted], list[str], list[str]]:
        """The payload subgraphs to build, the invalid leftovers of interrupted builds to drop,
        and the valid ones no longer wanted to drop (beyond ``subgraph_max_count`` only: a
        subgraph chosen from older statistics is still correct); nothing while the HNSW index is
        not ``valid``. An invalid one being built elsewhere (before we hold the lock) is left."""
        if not valid or not coll.payload_indexes:
            return [], [], []
        t = coll.data_table
        existing = [
            (name, ok, running) for name, ok, running in await raw.fetch(SUBGRAPH_INDEXES, t, subgraph_like(t))
            if subgraphs.is_subgraph_name(t, name)
        ]
        names = {sql_index_name(t, p): p for p in coll.payload_indexes}
        rows = int(await raw.fetchval(TABLE_ROWS, t) or 0)
        # values as stored: a subgraph's predicate spells the stored value
        stats = {
            names[r[0]].position: declared_stats(r, rows, names[r[0]].kind)
            for r in await raw.fetch(FIELD_STATS, list(names))
        }
        wanted = subgraphs.wanted(
            t, coll.payload_indexes, stats, rows, min_points=self.subgraph_min_points,
            max_share=self.subgraph_max_share, max_count=self.subgraph_max_count,
        )
        ready = [name for name, ok, _ in existing if ok]
        leftovers = [name for name, ok, running in existing if not ok and (locked or not running)]
        building = {name for name, ok, running in existing if not ok and running and not locked}
        build = [w for w in wanted if w.name not in ready and w.name not in building]
        wanted_names = {w.name for w in wanted}
        surplus = len(ready) + len(build) - max(0, self.subgraph_max_count)
        unwanted = [name for name in ready if name not in wanted_names][: max(0, surplus)]
        return build, leftovers, unwanted

    async def _subgraphs(self, raw: Any, coll: CollectionInfo) -> None:
        """Drop the subgraph indexes to drop and build the missing ones (holding the lock)."""
        build, leftovers, unwanted = await self._subgraph_work(raw, coll, valid=True, locked=True)
        for name in leftovers:
            await self._drop_invalid(raw, coll, name)
        for name in unwanted:
            log.info("vectors: dropping the payload subgraph %s of %s/%s (its value is no longer among the "
                     "most common)", name, coll.namespace, coll.collection)
            await raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}", timeout=BUILD_TIMEOUT_SECONDS)
        for w in build:
            await self._build(
                raw, coll, f"payload subgraph of {w.index.field!r} = {w.value!r} (~{w.points} points)",
                subgraph_index_sql(coll, w.index, w.value), watch=w.name,
            )

    async def _payload_indexes(self, raw: Any, coll: CollectionInfo, missing: list[PayloadIndex]) -> list[PayloadIndex]:
        """Build the ``missing`` payload indexes; those built. One that PostgreSQL refuses to
        build from the stored values (a value too large for a B-tree key, stored by a version
        that did not refuse it) is recorded as failed (``PayloadFailure``) and left until
        ``failed_retry_seconds`` have passed, while the rest of the check goes on: a bad point
        once kept every later build, the HNSW index's included, from running."""
        failures = parse_payload_failures(await raw.fetchval(PAYLOAD_FAILURES_COMMENT, coll.data_table))
        recorded = dict(failures)
        built = []
        for p in missing:
            failure = failures.get(p.position)
            if failure is not None and time.time() - failure.at < self.failed_retry_seconds:
                continue
            try:
                seconds = await self._build(raw, coll, f"{p.kind} payload index on {p.field!r}", payload_index_sql(coll, p))
                index = sql_index_name(coll.data_table, p)
                await raw.execute(index_comment_sql(index, build_record(seconds, await _count_rows(raw, coll))))
            except asyncpg.PostgresError as exc:
                if exc.sqlstate != PROGRAM_LIMIT_EXCEEDED:
                    raise
                failures[p.position] = await self._payload_failed(raw, coll, p, exc)
                continue
            built.append(p)
            if failures.pop(p.position, None) is not None:
                log.info("vectors: the %s payload index on %r of %s/%s, refused before, is built",
                         p.kind, p.field, coll.namespace, coll.collection, extra={"collection_id": coll.id})
        if failures != recorded:
            await raw.execute(payload_failures_sql(coll.data_table, failures))
        return built

    async def _payload_failed(self, raw: Any, coll: CollectionInfo, p: PayloadIndex, exc: asyncpg.PostgresError) -> PayloadFailure:
        """Drop what the refused build left (an invalid index that every write would still
        maintain) and say which points to fix."""
        await self._drop_invalid(raw, coll, sql_index_name(coll.data_table, p))
        ids = [r[0] for r in await raw.fetch(offending_points_sql(coll, p), OFFENDERS_NAMED + 1, timeout=BUILD_TIMEOUT_SECONDS)]
        named = ", ".join(repr(i) for i in ids[:OFFENDERS_NAMED]) + (" and more" if len(ids) > OFFENDERS_NAMED else "")
        points = (
            f"points whose {p.field!r} is an array, an object or more than {MAX_DECLARED_VALUE_BYTES} bytes of JSON "
            f"(writes refuse such values now): {named}" if ids else f"no point's {p.field!r} is past the write bound"
        )
        # PostgreSQL's message without the index's name (``vec_<id>_p<n>``: the gateway's, not the
        # caller's), and without its detail (the table's name and a row's place).
        said = re.sub(r' for index "[^"]*"', "", str(getattr(exc, "message", "") or type(exc).__name__))
        error = (
            f"PostgreSQL refused to build the index from the stored values ({said}); {points}. Update or delete them: "
            f"the build is tried again {self.failed_retry_seconds:.0f} s after it failed, and filters on "
            f"{p.field!r} are correct meanwhile (without the index)"
        )
        log.warning("vectors: the %s payload index on %r of %s/%s failed: %s", p.kind, p.field, coll.namespace,
                    coll.collection, error, extra={"collection_id": coll.id})
        return PayloadFailure(error, time.time())

    async def _payload_validity(self, raw: Any, coll: CollectionInfo) -> dict[int, bool | None]:
        """Each declared payload index by position: valid, invalid (False) or missing (None)."""
        out: dict[int, bool | None] = {}
        for p in coll.payload_indexes:
            out[p.position] = await raw.fetchval(_INDEX_VALID, sql_index_name(coll.data_table, p))
        return out

    async def _drop_invalid(self, raw: Any, coll: CollectionInfo, index: str) -> None:
        log.info("vectors: dropping the invalid index %s of %s/%s (an interrupted build)",
                 index, coll.namespace, coll.collection)
        await raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index}", timeout=BUILD_TIMEOUT_SECONDS)

    async def _build(
        self, raw: Any, coll: CollectionInfo, what: str, stmt: str, detail: str = "", watch: str | None = None
    ) -> float:
        """Run one ``CREATE INDEX CONCURRENTLY``, logging its progress every
        ``progress_log_seconds`` and when it is done; its seconds.

        ``watch`` (a graph: its index's name): the build is cancelled (``QueryCanceledError``, the
        check says ``postponed`` and runs again once writes are quiet) when the collection takes more than
        ``LOAD_GROWTH`` of its rows (and at least ``index_min_rows``) in writes meanwhile, from any
        process: a bulk load that paused for a quiet second. CREATE INDEX CONCURRENTLY inserts
        every row written after its scan into the graph one by one, in its validation and in
        each writer's INSERT: a 500,000-point load on pgvector 0.6.2 ran at 681 points/s
        instead of 4,293 and was ready after 1,481 s instead of 541 (issue 49). Not for longer than
        ``MAX_POSTPONE_SECONDS`` from the first postponement: a collection written to without
        pause is built anyway. A cancelled build's invalid index is dropped at once, under the lock
        that built it: left until the next check, the load's writes could keep it up to date
        point by point (a build cancelled in its validation leaves an index PostgreSQL
        maintains), and that check would take it for a crashed build."""
        started = time.perf_counter()
        kind = "hnsw" if what.startswith(("HNSW", "payload subgraph")) else "payload"
        load = None
        since = self._postponed.get(coll.id, (0, time.monotonic()))[1]
        if watch and time.monotonic() - since < MAX_POSTPONE_SECONDS:
            row = await raw.fetchrow(_WRITES, coll.data_table)
            if row is not None:
                load = (int(row[0]), max(float(self.min_rows), LOAD_GROWTH * float(row[1])))
        reporter = asyncio.create_task(self._report_progress(raw.get_server_pid(), coll, what, kind, started, load))
        try:
            await raw.execute(stmt, timeout=BUILD_TIMEOUT_SECONDS)
            self._postponing.discard(coll.id)  # done before the cancel came
        except asyncpg.QueryCanceledError:
            if watch is not None and coll.id in self._postponing:
                log.info("vectors: dropping the postponed %s of %s/%s (%s)", what, coll.namespace, coll.collection, watch)
                await raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {watch}", timeout=BUILD_TIMEOUT_SECONDS)
            raise
        finally:
            await cancel_and_wait(reporter)
            INDEX_BUILD_TUPLES.labels(kind).set(0)
            INDEX_BUILD_TOTAL.labels(kind).set(0)
        # The build counted the rows for the statistics: no second scan of a big table.
        rows = int(await raw.fetchval("SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)", coll.data_table))
        elapsed = time.perf_counter() - started
        log.info(
            "vectors: built the %s of %s/%s (%d points%s) in %.1f s",
            what, coll.namespace, coll.collection, rows, detail, elapsed,
            extra={"collection_id": coll.id, "index_build_seconds": round(elapsed, 3), "points": rows},
        )
        return elapsed

    async def _report_progress(
        self, pid: int, coll: CollectionInfo, what: str, kind: str, started: float, load: tuple[int, float] | None
    ) -> None:
        """While a build runs: its progress as gauges, and a log line every so often; with
        ``load`` (the table's write counter when the build began, and the writes that postpone
        it), the build is cancelled once that many were written meanwhile (``_build``)."""
        last_log = time.perf_counter()
        while True:
            await asyncio.sleep(min(PROGRESS_POLL_SECONDS, self.progress_log_seconds))
            try:
                async with self.engine.connect() as conn:
                    raw = (await conn.get_raw_connection()).driver_connection
                    assert raw is not None  # a checked-out connection has its asyncpg connection
                    row = await raw.fetchrow(_PROGRESS, pid)
                    if load is not None:
                        writes = await raw.fetchrow(_WRITES, coll.data_table)
                        written = int(writes[0]) - load[0] if writes is not None else 0
                        if written > load[1] and coll.id not in self._postponing:
                            self._postponing.add(coll.id)
                            log.info(
                                "vectors: postponing the %s of %s/%s: %d points written since it began (still being "
                                "loaded); built once writes are quiet", what, coll.namespace, coll.collection, written,
                                extra={"collection_id": coll.id},
                            )
                            await raw.execute("SELECT pg_cancel_backend($1)", pid)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - progress is best effort
                stop_if_cancelled()
                continue
            if row is None:
                continue
            INDEX_BUILD_TUPLES.labels(kind).set(int(row[1] or 0))
            INDEX_BUILD_TOTAL.labels(kind).set(int(row[2] or 0))
            now = time.perf_counter()
            if now - last_log >= self.progress_log_seconds:
                last_log = now
                log.info(
                    "vectors: building the %s of %s/%s: %s, %d/%d tuples, %d/%d blocks, %.0f s so far",
                    what, coll.namespace, coll.collection, row[0], row[1] or 0, row[2] or 0,
                    row[3] or 0, row[4] or 0, now - started,
                    extra={"collection_id": coll.id, "phase": row[0], "tuples_done": int(row[1] or 0)},
                )

    async def _rows(self, raw: Any, coll: CollectionInfo) -> int:
        """The collection's point count, counted no further than ``index_min_rows``."""
        return await _count_rows(raw, coll, cap=max(int(self.min_rows), 1))


async def _count_rows(raw: Any, coll: CollectionInfo, cap: int | None = None) -> int:
    """The collection's rows, counted (no further than ``cap``). A calibration counts them all:
    it compares every sampled point with every row, so a count costs it little (20-35 ms at
    500,000 rows), where PostgreSQL's estimate (``TABLE_ROWS``) ran 5% past the rows of a
    50,000-point load and 83% past a 3,000-point test's: an ANALYZE counts rows whose writer has
    not flushed its statistics yet, which the flush then adds again."""
    rows = coll.data_table if cap is None else f"(SELECT 1 FROM {coll.data_table} LIMIT {int(cap)}) s"
    return int(await raw.fetchval(f"SELECT count(*) FROM {rows}", timeout=BUILD_TIMEOUT_SECONDS))
