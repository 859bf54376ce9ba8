"""The HNSW index of each embedding size in use (PostgreSQL): built in the background, one
partial index per size (``WHERE dims = n``) on ``store_vectors``, once that size has
``store.index_min_vectors`` vectors (below that, exact search is as fast).

A round reads the sizes in use (``store_dims``) and the valid indexes, tells the search which
sizes it can walk (``PostgresStoreSql.indexed``), drops an index a failed build left invalid,
and builds a missing one with ``CREATE INDEX CONCURRENTLY`` (writes go on meanwhile), one
build at a time whatever the size (a session advisory lock on the table: two CREATE INDEX
CONCURRENTLY, or one and an ANALYZE, on one table deadlock), without the requests' statement timeout
and with ``vectors.index_build_memory_mb`` of ``maintenance_work_mem``, as collections' builds;
then the table is analyzed, so that the planner walks the new graph at once. A valid index then
links the vectors written after its build from ``store.insert_ef_construction`` candidates (its
``ef_construction``, set by ``ALTER INDEX`` with a short lock timeout, retried next round): the
build's breadth buys recall, and a put costs what LangGraph's own stores' does (measured in
docs/benchmarks.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.settings import StoreSettings
from app.vectors.settings import VectorsSettings
from app.store.postgres import HNSW_MAX_DIMS, PostgresStoreSql, hnsw_index_name, hnsw_index_sql

log = logging.getLogger("app.store")

BUILD_TIMEOUT_SECONDS = 7 * 24 * 3600.0  # client-side bound of one build (the server's is off)
LOCK_CLASS = 0x73746F72  # "stor": key 1 of the builds' advisory lock (key 2: 0, the whole table)
_INDEXES = (
    "SELECT CAST(c.relname AS text), i.indisvalid, CAST(COALESCE(c.reloptions, '{}') AS text[]) FROM pg_index i "
    "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass('store_vectors') AND c.relname LIKE 'store\\_hnsw\\_%'"
)
ALTER_LOCK_TIMEOUT = "1s"  # ALTER INDEX waits this long for the index's lock, then tries next round


class IndexBuilder:
    def __init__(self, engine: AsyncEngine, sql: PostgresStoreSql, settings: StoreSettings, vectors: VectorsSettings) -> None:
        self.engine = engine
        self.sql = sql
        self.settings = settings
        # maintenance_work_mem, m and ef_construction of a build: the vectors capability's
        # (``index_build_memory_mb``, ``hnsw_m``, ``hnsw_ef_construction``). Built with LangGraph's
        # ef_construction of 64, recall@10 at 100,000 items was 0.950-0.982 from build to build,
        # below AsyncPostgresStore's in one of four runs; inserted with 128, a put took 3.9 ms
        # against 2.5 (docs/benchmarks.md): built with 128, inserted with store.insert_ef_construction.
        self.vectors = vectors

    async def round(self) -> None:
        async with self.engine.connect() as conn:
            sizes = [int(r[0]) for r in await conn.execute(text("SELECT dims FROM store_dims ORDER BY dims"))]
            rows = (await conn.execute(text(_INDEXES))).all()
            await conn.rollback()
        indexes = {str(r[0]): bool(r[1]) for r in rows}
        self.sql.indexed = frozenset(d for d in sizes if indexes.get(hnsw_index_name(d)))
        before = self.sql.indexed
        for dims in sizes:
            name = hnsw_index_name(dims)
            if indexes.get(name) or dims > HNSW_MAX_DIMS:
                continue
            await self._build(dims, invalid=name in indexes)
        if self.sql.indexed - before or self._stale(rows):
            await self._insert_breadth()

    def _stale(self, rows: Sequence[Any]) -> list[str]:
        """The valid indexes among ``rows`` (of ``_INDEXES``) whose breadth is not ``store.insert_ef_construction``."""
        breadth = f"ef_construction={int(self.settings.insert_ef_construction)}"
        return [str(r[0]) for r in rows if r[1] and breadth not in r[2]]

    async def _insert_breadth(self) -> None:
        """Every valid index links the vectors written from now on from
        ``store.insert_ef_construction`` candidates."""
        breadth = int(self.settings.insert_ef_construction)
        async with self.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            names = self._stale((await conn.execute(text(_INDEXES))).all())
            await conn.execute(text(f"SET lock_timeout = '{ALTER_LOCK_TIMEOUT}'"))
            for name in names:
                try:
                    await conn.execute(text(f"ALTER INDEX {name} SET (ef_construction = {breadth})"))
                except DBAPIError as exc:  # the lock not had in time (a long search holds the index): next round
                    log.info("store: %s keeps its ef_construction until the next round: %s", name, exc.orig)
            await conn.execute(text("RESET lock_timeout"))

    async def _build(self, dims: int, *, invalid: bool) -> None:
        conn = await self.engine.connect()
        try:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            if not (await conn.execute(text("SELECT pg_try_advisory_lock(:c, 0)"), {"c": LOCK_CLASS})).scalar():
                return  # another process builds it
            try:
                count = (await conn.execute(
                    text("SELECT count(*) FROM (SELECT 1 FROM store_vectors WHERE dims = :d LIMIT :n) s"),
                    {"d": dims, "n": self.settings.index_min_vectors},
                )).scalar_one()
                if int(count) < self.settings.index_min_vectors:
                    return
                raw: Any = (await conn.get_raw_connection()).driver_connection  # asyncpg's
                # A build outlasts the requests' statement_timeout (30 s by default; 100,000 vectors
                # of 384 dimensions take minutes on two cores), and its graph must fit in memory.
                await raw.execute(
                    f"SET statement_timeout = 0; SET lock_timeout = 0; SET maintenance_work_mem = '{int(self.vectors.index_build_memory_mb)}MB'"
                )
                try:
                    if invalid:
                        await raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {hnsw_index_name(dims)}", timeout=BUILD_TIMEOUT_SECONDS)
                    log.info("store: building the HNSW index of %d-dimensional vectors", dims)
                    await raw.execute(hnsw_index_sql(dims, self.vectors.hnsw_m, self.vectors.hnsw_ef_construction), timeout=BUILD_TIMEOUT_SECONDS)
                    # Fresh statistics: planned on tables that grew since autovacuum last looked
                    # (a bulk load), a walk of the graph costs more than sorting the few rows
                    # PostgreSQL believes there are, and every query search compares exactly.
                    await raw.execute("ANALYZE store_items, store_vectors", timeout=BUILD_TIMEOUT_SECONDS)
                finally:
                    await raw.execute("RESET statement_timeout; RESET lock_timeout; RESET maintenance_work_mem")
                self.sql.indexed = self.sql.indexed | {dims}
            finally:
                await conn.execute(text("SELECT pg_advisory_unlock(:c, 0)"), {"c": LOCK_CLASS})
        finally:
            await conn.close()
