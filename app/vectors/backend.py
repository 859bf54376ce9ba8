"""What the service needs from a vector backend, the values passed across that line, and the
steps every backend takes.

``VectorIndex`` has one PostgreSQL/pgvector and one SQLite/sqlite-vec implementation; the
capability's lifespan picks one from the vectors database's dialect, once. Every method takes the
request's session and the collection's registry row; data tables are named from the row's
integer id only (``vec_<id>``, ``fts_<id>``).

``VectorIndex`` holds the skeleton both backends share (the order of the statements, guards,
filters, id lists, point and hit shaping, the search's plan-then-run-then-fall-back); a backend
implements only its abstract methods: its SQL and a few facts (how a payload, a vector and a list
of ids travel, how a search connects and plans).
"""

from __future__ import annotations

import builtins
import math
import time
from abc import ABC, abstractmethod
from array import array
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal

from sqlalchemy import BigInteger, bindparam, column, literal_column, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.db.pages import budgeted, byte_length_sql
from app.vectors.filters import FilterSql, Node, SqlBuilder
from app.vectors.planner import Plan
from app.vectors.recall import Calibration
from app.vectors.usage import point_usage
from app.vectors.payload_index import PayloadIndex, PayloadKind, declared_kinds, from_options

Distance = Literal["cosine", "l2", "ip"]
IndexKind = Literal["hnsw", "hnsw_halfvec", "exact"]
IndexState = Literal["pending", "building", "ready", "exact"]


@dataclass(frozen=True)
class PayloadIndexState:
    """A declared payload index's state: ``failed`` when PostgreSQL refused to build it from the
    stored values (``error`` says which and what to do; the builder tries again later)."""

    state: Literal["pending", "building", "ready", "failed"]
    error: str | None = None
    build: dict[str, Any] | None = None  # a ready index's build (seconds, points, built_at), a building one's progress


@dataclass(frozen=True)
class CollectionInfo:
    """A collection's registry row."""

    id: int
    namespace: str
    collection: str
    vector_size: int
    distance: Distance
    index: dict[str, Any]
    text_field: str | None
    created_at: datetime
    text_language: str | None = None  # the stemmer of the text field's terms (``app.vectors.text``)

    @property
    def data_table(self) -> str:
        return f"vec_{int(self.id)}"

    @property
    def text_table(self) -> str:
        return f"fts_{int(self.id)}"

    @property
    def payload_indexes(self) -> tuple[PayloadIndex, ...]:
        return from_options(self.index)

    @property
    def declared(self) -> dict[str, PayloadKind]:
        """Declared payload fields by name, with their kind."""
        return declared_kinds(self.payload_indexes)


@dataclass
class PointIn:
    """A checked point to store: float32 vector, payload as compact JSON, its hybrid text and
    that text's terms (``app.vectors.text``: the service fills them; None: not indexed)."""

    id: str
    vector: array[float]
    payload_json: str
    text: str | None = None
    norm: float = 0.0
    terms: builtins.list[str] | None = None


@dataclass
class PointOut:
    id: str
    payload_json: str
    vector: array[float] | None = None


@dataclass
class Hit:
    """A search candidate: raw distance (lower is nearer; ``-ip`` for inner product), and its
    payload as JSON text, None past the answer's byte budget (``budgeted_hits``)."""

    id: str
    distance: float
    payload_json: str | None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Search:
    """One search as a backend's search steps see it."""

    coll: CollectionInfo
    q: dict[str, Any]  # the query vector's parameters (``_query_params``)
    limit: int
    flt: Node | None
    ef_search: int | None
    sql: SqlBuilder  # the filter's parameters (``_search_builder``)
    budget: int  # bytes of payloads the hits may carry (``budgeted_hits``)
    where: str = ""  # the filter as SQL
    narrowed: bool = False  # an index narrows the rows the filter keeps
    # What the statements found: the filter's matches an exact plan compared (counted by its
    # statement), those among a graph plan's candidates, and the seconds each took.
    matches: int | None = None
    matched: int | None = None
    exact_s: float = 0.0
    graph_s: float = 0.0


@dataclass
class TextRanking:
    """A text search's answer: the best BM25 matches, best first, with their scores; the score
    of each point asked for besides (0: none of the terms); and how many leading hits are proven
    to be BM25's exact top (all of them, but on PostgreSQL when ``TEXT_CANDIDATES`` bounded the
    search: see ``pgvector.py``)."""

    hits: builtins.list[tuple[str, float]]
    scores: dict[str, float]
    exact: int


class MissingTable(Exception):
    """A collection's data table is gone: the registry row this process cached is stale (the
    collection was dropped, or dropped and re-created, by another process)."""


class RegistryCache:
    """Registry rows by (namespace, collection), per process, for the search hot path.

    A row never changes while its collection exists (settings are fixed at creation; a new
    collection gets a new id and new tables), so a cached row is valid exactly as long as its
    data table exists: a backend raises ``MissingTable`` when it is gone, and the service then
    forgets the row and reads the registry again.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self.max_entries = max_entries
        self._rows: dict[tuple[str, str], CollectionInfo] = {}

    def get(self, namespace: str, collection: str) -> CollectionInfo | None:
        return self._rows.get((namespace, collection))

    def put(self, info: CollectionInfo) -> None:
        if len(self._rows) >= self.max_entries:
            self._rows.clear()
        self._rows[(info.namespace, info.collection)] = info

    def forget(self, namespace: str, collection: str) -> None:
        self._rows.pop((namespace, collection), None)


EXACT_PLANS = ("exact_scan", "filter_first")

# What a listed point, or a search's hit, weighs beyond its payload's JSON.
LIST_ROW_BYTES = 256


class VectorIndex(ABC):
    """Storage and search of one backend: the shared steps here, the backend's SQL in its
    abstract methods.

    A backend names itself (``name``), its filter dialect (``filter_sql``) and how a SELECT
    reads a payload back as JSON text (``payload_text``, ``payload_column``).
    """

    name: ClassVar[str]
    dialect: ClassVar[str]  # SQLAlchemy's name of the database's dialect
    filter_sql: ClassVar[type[FilterSql]]
    payload_text: ClassVar[str]  # a stored payload ``{}`` as JSON text
    payload_column: ClassVar[str]  # ``payload_text`` of the ``payload`` column

    # --- collections (all the backend's) -----------------------------------------------------------

    @abstractmethod
    def index_kind(self, vector_size: int, requested: str) -> IndexKind:
        """The index a collection of this size gets here (``requested`` is ``hnsw`` or ``exact``)."""

    @abstractmethod
    async def create(self, session: AsyncConnection, coll: CollectionInfo) -> None: ...

    @abstractmethod
    async def drop(self, session: AsyncConnection, coll: CollectionInfo) -> None: ...

    @abstractmethod
    async def reset(self, session: AsyncConnection, coll: CollectionInfo) -> None: ...

    @abstractmethod
    async def index_states(self, session: AsyncConnection, colls: builtins.list[CollectionInfo]) -> dict[int, IndexState]:
        """Each collection's index state by id: ``exact`` (no ANN index by design), or for HNSW
        kinds ``pending`` (not built yet), ``building`` or ``ready``."""

    @abstractmethod
    async def payload_index_states(
        self, session: AsyncConnection, colls: builtins.list[CollectionInfo]
    ) -> dict[int, builtins.list[PayloadIndexState]]:
        """By collection id, the state of each declared payload index in declaration order
        (``pending``, ``building``, ``ready`` or ``failed``)."""

    async def subgraph_states(
        self, session: AsyncConnection, colls: builtins.list[CollectionInfo]
    ) -> dict[int, dict[int, tuple[int, int]]]:
        """By collection id and declaration position, each declared field's payload
        subgraphs (``app.vectors.subgraphs``) as (built, building); a backend without them, or a
        collection without a graph, is left out."""
        return {}

    def forget(self, coll_id: int, learned: bool = False) -> None:
        """Drop what this process keeps of a collection's indexes (and, ``learned``, of its
        searches): one was built or dropped, or the collection reset or dropped."""
        return None  # SQLite keeps nothing

    async def calibration(self, session: AsyncConnection, coll: CollectionInfo) -> Calibration | None:
        """What the recall calibration of the collection's graph measured (``app.vectors.recall``);
        None before one, and for a backend or collection without a graph."""
        return None

    @abstractmethod
    async def build_progress(self, session: AsyncConnection, coll: CollectionInfo) -> dict[str, Any] | None:
        """The running index build on the collection (phase, tuples and blocks done/total), or None."""

    # --- the backend's facts -------------------------------------------------------------------------

    @abstractmethod
    def _payload_out(self, stored: Any) -> str:
        """A payload read through ``payload_column``, as the JSON text it was stored from."""

    @abstractmethod
    def _vector_out(self, stored: Any) -> array[float]:
        """A stored ``embedding`` as read."""

    @abstractmethod
    def _ids_in(self, ids: builtins.list[str]) -> tuple[str, Any]:
        """The condition ``id`` is one of ``:ids``, and the value bound to ``:ids``."""

    @abstractmethod
    def _ids_ordered(self, ids: builtins.list[str]) -> tuple[str, Any]:
        """A relation ``x`` of ``:ids`` with their positions (columns ``id``, ``n``), and the value bound to ``:ids``."""

    @abstractmethod
    def _distance_expr(self, coll: CollectionInfo) -> str:
        """The distance of ``embedding`` to the query (bound by ``_query_params``), lower nearer."""

    @abstractmethod
    def _query_params(self, vector: array[float]) -> dict[str, Any]:
        """The query vector's parameters, as ``_distance_expr`` and ``_exact`` take them."""

    @abstractmethod
    async def _insert(self, session: AsyncConnection, coll: CollectionInfo, points: builtins.list[PointIn]) -> None:
        """Insert or replace ``points`` (at least one, ids unique) in one statement."""

    @abstractmethod
    def _set_vector(self, vector: PointIn, params: dict[str, Any]) -> builtins.list[str]:
        """The SET clauses (their parameters added to ``params``) that replace a point's vector."""

    @abstractmethod
    def _set_payload(
        self, coll: CollectionInfo, payload_json: str, terms: builtins.list[str] | None, params: dict[str, Any]
    ) -> builtins.list[str]:
        """The SET clauses (their parameters added to ``params``) that replace a point's payload
        (and, with a ``text_field``, its text's ``terms``)."""

    @abstractmethod
    async def _text_written(
        self, session: AsyncConnection, coll: CollectionInfo, pairs: builtins.list[tuple[str, builtins.list[str] | None]]
    ) -> None:
        """After points of a collection with a ``text_field`` were written: their (id, terms)."""

    @abstractmethod
    async def _text_deleting(self, session: AsyncConnection, coll: CollectionInfo, where: str, params: dict[str, Any]) -> None:
        """Before the points matching ``where`` of a collection with a ``text_field`` are deleted."""

    @abstractmethod
    async def _text_rank(
        self, session: AsyncConnection, coll: CollectionInfo, terms: builtins.list[str], limit: int,
        flt: Node | None, also: builtins.list[str],
    ) -> TextRanking:
        """The BM25 ranking of the points matching ``flt`` that hold any of ``terms`` (at most
        ``limit``), and the scores of the points ``also``; on the search's connection
        (``_search_connection``), the filter bound as it binds parameters."""

    # --- the search's facts ---------------------------------------------------------------------------

    @abstractmethod
    def _search_connection(self, session: AsyncConnection) -> AbstractAsyncContextManager[Any]:
        """The connection a search runs on; raises ``MissingTable`` for a missing data table."""

    @abstractmethod
    def _search_builder(self) -> SqlBuilder:
        """The parameters of a search's filter, as the search connection binds them."""

    @abstractmethod
    async def _plan(self, conn: Any, search: Search) -> Plan:
        """How ``search`` runs."""

    @abstractmethod
    async def _exact(self, conn: Any, search: Search) -> builtins.list[Hit]:
        """The exact ``limit`` nearest points that match the filter, nearest first."""

    async def _graph(self, conn: Any, search: Search, plan: Plan) -> builtins.list[Hit]:
        """An ANN index's candidates for ``plan`` (only a backend with one plans a graph search)."""
        raise NotImplementedError(f"{self.name} has no ANN index")  # pragma: no cover

    # --- the shared steps -----------------------------------------------------------------------------

    def _where(self, flt: Node | None, sql: SqlBuilder, coll: CollectionInfo) -> str:
        return self.filter_sql(sql, coll.declared).compile(flt)

    def _hits(self, rows: Iterable[Any]) -> builtins.list[Hit]:
        """Rows of (id, payload or NULL, distance) as hits; a point without a finite distance to the
        query (a vector stored before ``encoding`` bounded norms: NULL on SQLite, NaN or infinity
        on PostgreSQL) is none."""
        return [
            Hit(r[0], float(r[2]), None if r[1] is None else self._payload_out(r[1]))
            for r in rows if r[2] is not None and math.isfinite(r[2])
        ]

    @classmethod
    def budgeted_hits(cls, stmt: str, budget: int, counted: bool = False) -> str:
        """``stmt``'s rows (``id``, ``p``: the payload as stored, ``d``: the distance; at most a
        search's ``limit``), nearest first, with ``p`` as JSON text, NULL from the first row whose
        running sum of payload bytes (and ``LIST_ROW_BYTES`` a row) passes ``budget``: an answer's
        hits are all there, its payloads stop at the budget (none: ``budget`` 0). A list cuts its
        page the same way (``app.core.db.pages.budgeted``); a top-k answer has no cursor to go on
        with, so its hits stay and only their payloads are left out (the client reads those
        points). The payload goes through the window as stored (on PostgreSQL a TOAST pointer,
        not its text) and becomes text only where it is answered."""
        # ``counted``: ``stmt`` has a column n (the matches its plan saw), passed on.
        n, hn = (", n", ", h.n") if counted else ("", "")
        if budget <= 0:
            return f"SELECT id, NULL AS p, d{n} FROM ({stmt}) AS h ORDER BY d, id"
        as_text = cls.payload_text.format("p")
        weight = f"{byte_length_sql(as_text, cls.dialect)} + {LIST_ROW_BYTES}"
        upto = f"sum({weight}) OVER (ORDER BY d, id ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
        return (
            f"SELECT id, CASE WHEN upto <= {int(budget)} THEN {as_text} END AS p, d{n} "
            f"FROM (SELECT h.id, h.p, h.d{hn}, {upto} AS upto FROM ({stmt}) AS h) AS w ORDER BY d, id"
        )

    async def count(self, session: AsyncConnection, coll: CollectionInfo, flt: Node | None = None) -> int:
        sql = SqlBuilder()
        where = self._where(flt, sql, coll)
        result = await session.execute(text(f"SELECT count(*) FROM {coll.data_table} WHERE {where}"), sql.params)
        return int(result.scalar_one())

    async def stored(
        self, session: AsyncConnection, coll: CollectionInfo, ids: builtins.list[str] | None = None, flt: Node | None = None
    ) -> tuple[int, int]:
        """(points, bytes) of ``coll``'s points among ``ids`` and matching ``flt`` (neither: all), as
        quotas count them (``app.vectors.usage``)."""
        sql = SqlBuilder()
        where = self._where(flt, sql, coll)
        if ids is not None:
            among, sql.params["ids"] = self._ids_in(ids)
            where += f" AND {among}"
        return await point_usage(session, coll.data_table, coll.vector_size, where, sql.params)

    async def upsert(self, session: AsyncConnection, coll: CollectionInfo, points: builtins.list[PointIn]) -> None:
        if not points:
            return
        await self._insert(session, coll, points)
        if coll.text_field is not None:
            await self._text_written(session, coll, [(p.id, p.terms) for p in points])

    async def get(
        self, session: AsyncConnection, coll: CollectionInfo, point_id: str, with_vector: bool
    ) -> PointOut | None:
        vec = ", embedding" if with_vector else ""
        row = (
            await session.execute(
                text(f"SELECT id, {self.payload_column}{vec} FROM {coll.data_table} WHERE id = :id"),
                {"id": point_id},
            )
        ).first()
        if row is None:
            return None
        return PointOut(row[0], self._payload_out(row[1]), self._vector_out(row[2]) if with_vector else None)

    async def update(
        self,
        session: AsyncConnection,
        coll: CollectionInfo,
        point_id: str,
        vector: PointIn | None,
        payload_json: str | None,
        terms: builtins.list[str] | None,
    ) -> bool:
        """Replace the vector and/or payload of an existing point (with the payload, its text's
        ``terms``); False when it does not exist."""
        sets = []
        params: dict[str, Any] = {"id": point_id}
        if vector is not None:
            sets += self._set_vector(vector, params)
        if payload_json is not None:
            sets += self._set_payload(coll, payload_json, terms, params)
        if not sets:
            sets.append("id = id")
        result = await session.execute(
            text(f"UPDATE {coll.data_table} SET {', '.join(sets)} WHERE id = :id RETURNING id"), params
        )
        found = result.first() is not None
        if found and payload_json is not None and coll.text_field is not None:
            await self._text_written(session, coll, [(point_id, terms)])
        return found

    async def delete(
        self, session: AsyncConnection, coll: CollectionInfo, ids: builtins.list[str] | None, flt: Node | None
    ) -> int:
        sql = SqlBuilder()
        where = self._where(flt, sql, coll)
        if ids is not None:
            among, sql.params["ids"] = self._ids_in(ids)
            where += f" AND {among}"
        if coll.text_field is not None:
            await self._text_deleting(session, coll, where, sql.params)
        result = await session.execute(text(f"DELETE FROM {coll.data_table} WHERE {where}"), sql.params)
        return int(result.rowcount or 0)

    async def list(
        self,
        session: AsyncConnection,
        coll: CollectionInfo,
        flt: Node | None,
        after: str | None,
        limit: int,
        with_vectors: bool,
        budget: int,
        dimension_bytes: int = 0,
    ) -> tuple[builtins.list[PointOut], bool]:
        """Points in id order after ``after``: up to ``limit``, and only as many as weigh at most
        ``budget`` bytes together (at least one: their payload's JSON, ``LIST_ROW_BYTES``, and
        ``dimension_bytes`` a dimension with their vectors); True with them: the page was cut at
        the budget, and more follow. The page is cut as ``app.core.db.pages.budgeted`` cuts one:
        a running sum, and the row after the cut comes without its payload and vector."""
        sql = SqlBuilder()
        where = self._where(flt, sql, coll)
        if after is not None:
            where += " AND id > :after"
            sql.params["after"] = after
        sql.params |= {"limit": limit, "budget": budget,
                       "row": LIST_ROW_BYTES + (dimension_bytes * coll.vector_size if with_vectors else 0)}
        vec = ", embedding" if with_vectors else ""
        # The payload goes through the window as stored (on PostgreSQL a TOAST pointer, not its
        # text: up to ``limit`` texts of 1 MiB would spill to temp files) and becomes text only
        # where it is answered, as a search's does (``budgeted_hits``).
        page = text(
            f"SELECT id, payload AS p{vec}, {byte_length_sql(self.payload_column, self.dialect)} + :row AS weight "
            f"FROM {coll.data_table} WHERE {where} ORDER BY id LIMIT :limit"
        ).columns(*(column(name) for name in ("id", "p", *(["embedding"] if with_vectors else []), "weight")))
        cut = budgeted(
            page, [("id", False)], bindparam("budget", type_=BigInteger), first_always=True, heavy=["p", "embedding"]
        ).subquery("cut")
        stmt = select(
            cut.c.id, literal_column(self.payload_text.format("cut.p")).label("p"),
            *([cut.c.embedding] if with_vectors else []), cut.c.within,
        ).order_by(cut.c.id)
        rows = (await session.execute(stmt, sql.params)).mappings().all()
        cut = bool(rows) and not rows[-1]["within"]
        points = [
            PointOut(r["id"], self._payload_out(r["p"]), self._vector_out(r["embedding"]) if with_vectors else None)
            for r in (rows[:-1] if cut else rows)
        ]
        return points, cut

    async def search(
        self,
        session: AsyncConnection,
        coll: CollectionInfo,
        vector: array[float],
        limit: int,
        flt: Node | None,
        ef_search: int | None,
        budget: int,
    ) -> tuple[builtins.list[Hit], Plan]:
        """The ``min(limit, matches)`` nearest points that match ``flt``, nearest first, with
        ``budget`` bytes of their payloads (``budgeted_hits``), and the plan that found them
        (``ef_search`` None: chosen by the planner); ``MissingTable`` when the collection's table
        no longer exists.

        A graph search that returns fewer than ``limit`` points is redone exactly (``fallback``).
        """
        search = Search(coll, self._query_params(vector), int(limit), flt, ef_search, self._search_builder(), int(budget))
        async with self._search_connection(session) as conn:
            filter_sql = self.filter_sql(search.sql, coll.declared)
            search.where = filter_sql.compile(flt)
            search.narrowed = flt is not None and filter_sql.narrows(flt)
            plan = await self._plan(conn, search)
            if plan.kind in EXACT_PLANS:
                hits = await self._timed_exact(conn, search)
            else:
                started = time.perf_counter()
                hits = await self._graph(conn, search, plan)
                search.graph_s = time.perf_counter() - started
                if len(hits) < search.limit:
                    # Fewer candidates matched than asked for: the exact answer (min(limit, matches)),
                    # without holding the graph's answer meanwhile.
                    del hits
                    plan.fallback = True
                    hits = await self._timed_exact(conn, search)
            plan.found_matches = search.matches if search.matches is not None else search.matched
            plan.ms = round((search.exact_s + search.graph_s) * 1000, 3)
            self._observe(search, plan)
            return hits, plan

    async def _timed_exact(self, conn: Any, search: Search) -> builtins.list[Hit]:
        """``_exact``, its seconds kept in ``search``."""
        started = time.perf_counter()
        hits = await self._exact(conn, search)
        search.exact_s = time.perf_counter() - started
        return hits

    def _observe(self, search: Search, plan: Plan) -> None:
        """After a search: what its plan found (``search``), for a backend that learns from it."""
        return None  # a hook: SQLite's plans are all exact

    async def text_search(
        self,
        session: AsyncConnection,
        coll: CollectionInfo,
        terms: builtins.list[str],
        limit: int,
        flt: Node | None,
        also: builtins.list[str] = [],  # noqa: B006 - never changed
    ) -> TextRanking:
        """The ``min(limit, matches)`` points matching ``flt`` that hold any of the query's
        ``terms`` (``app.vectors.text.query_terms``), by descending BM25 score over the
        collection's statistics (the filter chooses the points, never the statistics), and the
        scores of the points ``also`` (a hybrid search's vector hits)."""
        if coll.text_field is None or not terms:
            return TextRanking([], {}, 0)
        return await self._text_rank(session, coll, terms, int(limit), flt, also)

    async def distances(
        self, session: AsyncConnection, coll: CollectionInfo, vector: array[float], ids: builtins.list[str]
    ) -> builtins.list[Hit]:
        """The distance of each stored point in ``ids`` to ``vector``, without payloads."""
        if not ids:
            return []
        among, listed = self._ids_in(ids)
        rows = await session.execute(
            text(f"SELECT id, NULL, {self._distance_expr(coll)} FROM {coll.data_table} WHERE {among}"),
            {**self._query_params(vector), "ids": listed},
        )
        return self._hits(rows)

    async def vectors(
        self, session: AsyncConnection, coll: CollectionInfo, ids: builtins.list[str]
    ) -> dict[str, array[float]]:
        """The stored vectors of the points of ``ids`` that exist, by id."""
        if not ids:
            return {}
        among, listed = self._ids_in(ids)
        rows = await session.execute(
            text(f"SELECT id, embedding FROM {coll.data_table} WHERE {among}"), {"ids": listed}
        )
        return {r[0]: self._vector_out(r[1]) for r in rows}

    async def payloads(
        self, session: AsyncConnection, coll: CollectionInfo, ids: builtins.list[str], budget: int
    ) -> dict[str, str]:
        """The payloads (JSON text) of the stored points of ``ids``, in that order while together
        they weigh at most ``budget`` (``budgeted_hits``, the position as the distance)."""
        if not ids:
            return {}
        ordered, listed = self._ids_ordered(ids)
        stmt = f"SELECT t.id, t.payload AS p, x.n AS d FROM {ordered} JOIN {coll.data_table} AS t ON t.id = x.id"
        rows = await session.execute(text(self.budgeted_hits(stmt, budget)), {"ids": listed})
        return {r[0]: self._payload_out(r[1]) for r in rows if r[1] is not None}
