"""SQLite + sqlite-vec: exact search over a plain table, filters in SQL before the limit.

Each collection is a table of float32 blobs (``vec_<id>``) with the payload as JSON text; search
is ``WHERE <filter> ORDER BY <distance> LIMIT k``, so a filtered search always returns
``min(limit, matches)`` points and recall is exact. sqlite-vec has cosine and L2 distances; the
inner product is derived from the cosine distance and the stored norm of each vector. A
collection with a ``text_field`` gets an FTS5 table (``fts_<id>``) keyed by the row id, given each
point's terms (``app.vectors.text``) rather than its text: its ``ascii`` tokenizer splits them
only at the spaces between them (a term holds letters and digits only, and FTS5's ``ascii``
takes every other character than ASCII punctuation and spaces for part of a word), so FTS5
indexes the gateway's terms, and ranks with its own ``bm25()``.

Only the SQL and the SQLite facts are here; the steps around them are ``VectorIndex``'s
(``app.vectors.backend``) and the filter walk is ``FilterSql``'s (``app.vectors.filters``).
"""

from __future__ import annotations

import builtins
import math
from array import array
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.jsonvalue import jsonb_float
from app.vectors.backend import (
    CollectionInfo, Hit, IndexKind, IndexState, MissingTable, PayloadIndexState, PointIn, Search, TextRanking, VectorIndex,
)
from app.vectors.filters import COMPARE_SQL, Compare, Eq, Exists, FilterSql, Node, SqlBuilder
from app.vectors.planner import Plan
from app.vectors.payload_index import PayloadIndex, PayloadKind, create_index_sql, serves_value

def _path(key: str) -> str:
    return f'$."{key}"'  # filter keys never contain '"' or '\\' (checked by the parser)


def extract_expr(field: str) -> str:
    """The expression a declared field is indexed on (and compared with): a literal path."""
    return f"json_extract(payload, '{_path(field)}')"


def payload_index_sql(coll: CollectionInfo, index: PayloadIndex) -> str:
    return create_index_sql(coll.data_table, index, extract_expr(index.field))


def compile_filter(node: Node | None, sql: SqlBuilder, declared: Mapping[str, PayloadKind] | None = None) -> str:
    """SQL for a filter tree on the ``payload`` JSON text.

    A condition on a declared field compares ``json_extract`` of a literal path, the expression
    its index is on. A negation is ``NOT IFNULL(x, 0)`` (see ``FilterSql``).
    """
    return SqliteFilter(sql, declared or {}).compile(node)


class SqliteFilter(FilterSql):
    """Filters on the ``payload`` JSON text; a declared index narrows a condition on its field."""

    true = "1"
    false = "0"

    def _p(self, key: str) -> str:
        return f"'{_path(key)}'" if key in self.declared else self.sql.bind(_path(key))

    def eq(self, node: Eq) -> str:
        p = self._p(node.key)
        v = node.value
        if v is None:
            return f"(json_type(payload, {p}) = 'null')"
        if isinstance(v, bool):
            cond = f"json_type(payload, {p}) = '{'true' if v else 'false'}'"
            if node.key in self.declared:
                cond = f"json_extract(payload, {p}) = {int(v)} AND {cond}"
            return f"({cond})"
        kinds = "= 'text'" if isinstance(v, str) else "IN ('integer', 'real')"
        return f"(json_extract(payload, {p}) = {self._operand(v)} AND json_type(payload, {p}) {kinds})"

    def compare(self, node: Compare) -> str:
        p = self._p(node.key)
        kinds = "= 'text'" if isinstance(node.value, str) else "IN ('integer', 'real')"
        return (
            f"(json_extract(payload, {p}) {COMPARE_SQL[node.op]} {self._operand(node.value)} "
            f"AND json_type(payload, {p}) {kinds})"
        )

    def _operand(self, v: str | int | float) -> str:
        # A float is read by the parser that reads the payload's (its text as payloads store it:
        # ``jsonb_float``): SQLite's JSON parser is off by one unit in the last place on about
        # one float in ten from 1e16 up and one in four below 1e-4 (9e120, 1e-300), so a bound
        # float missed the point holding it, and ``$lt`` caught it.
        if isinstance(v, float):
            return f"json_extract({self.sql.bind(jsonb_float(v))}, '$')"
        return self.sql.bind(v)

    def exists(self, node: Exists) -> str:
        return f"(json_type(payload, {self.sql.bind(_path(node.key))}) IS NOT NULL)"

    def negate(self, condition: str) -> str:
        return f"(NOT IFNULL({condition}, 0))"

    def serves(self, node: Eq | Compare) -> bool:
        kind = self.declared.get(node.key)
        return kind is not None and node.value is not None and serves_value(kind, node.value)


def fts_table_sql(text_table: str) -> str:
    """The FTS5 table of a collection's terms (module docstring)."""
    return f"CREATE VIRTUAL TABLE {text_table} USING fts5(body, tokenize='ascii')"


def fts_body(terms: builtins.list[str]) -> str:
    return " ".join(terms)


def match_expression(terms: builtins.list[str]) -> str:
    """An FTS5 query matching any of ``terms`` (letters and digits only: quoted, each one term)."""
    return " OR ".join(f'"{t}"' for t in terms)


def _blob(vec: array[float]) -> bytes:
    return vec.tobytes()


def _unblob(data: bytes) -> array[float]:
    out = array("f")
    out.frombytes(data)
    return out


class SqliteVecIndex(VectorIndex):
    """``VectorIndex`` on SQLite with sqlite-vec (exact search)."""

    name = "sqlite-vec"
    dialect = "sqlite"
    filter_sql = SqliteFilter
    payload_text = "{}"
    payload_column = payload_text.format("payload")

    def index_kind(self, vector_size: int, requested: str) -> IndexKind:
        return "exact"

    def _payload_out(self, stored: Any) -> str:
        payload: str = stored
        return payload

    def _vector_out(self, stored: Any) -> array[float]:
        return _unblob(stored)

    def _ids_in(self, ids: builtins.list[str]) -> tuple[str, Any]:
        return "id IN (SELECT value FROM json_each(:ids))", orjson.dumps(ids).decode()

    def _ids_ordered(self, ids: builtins.list[str]) -> tuple[str, Any]:
        return "(SELECT value AS id, key AS n FROM json_each(:ids)) AS x", orjson.dumps(ids).decode()

    def _distance_expr(self, coll: CollectionInfo) -> str:
        if coll.distance == "cosine":
            return "vec_distance_cosine(embedding, :q)"
        if coll.distance == "l2":
            return "vec_distance_l2(embedding, :q)"
        # -(a . b) = -(1 - cos_distance) * |a| * |b|
        return (
            "(CASE WHEN norm = 0 OR :qn = 0 THEN 0.0 "
            "ELSE -((1.0 - vec_distance_cosine(embedding, :q)) * norm * :qn) END)"
        )

    def _query_params(self, vector: array[float]) -> dict[str, Any]:
        return {"q": _blob(vector), "qn": math.hypot(*vector)}

    # --- collections -------------------------------------------------------------------------

    async def create(self, session: AsyncConnection, coll: CollectionInfo) -> None:
        await session.execute(
            text(
                f"CREATE TABLE {coll.data_table} (rid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, "
                "embedding BLOB NOT NULL, norm REAL NOT NULL, payload TEXT NOT NULL)"
            )
        )
        for index in coll.payload_indexes:  # an empty table: made at once, kept up as points come
            await session.execute(text(payload_index_sql(coll, index)))
        if coll.text_field is not None:
            await session.execute(text(fts_table_sql(coll.text_table)))

    async def drop(self, session: AsyncConnection, coll: CollectionInfo) -> None:
        await session.execute(text(f"DROP TABLE IF EXISTS {coll.text_table}"))
        await session.execute(text(f"DROP TABLE IF EXISTS {coll.data_table}"))

    async def reset(self, session: AsyncConnection, coll: CollectionInfo) -> None:
        if coll.text_field is not None:
            await session.execute(text(f"DELETE FROM {coll.text_table}"))
        await session.execute(text(f"DELETE FROM {coll.data_table}"))

    async def index_states(self, session: AsyncConnection, colls: builtins.list[CollectionInfo]) -> dict[int, IndexState]:
        return {c.id: "exact" for c in colls}

    async def payload_index_states(
        self, session: AsyncConnection, colls: builtins.list[CollectionInfo]
    ) -> dict[int, builtins.list[PayloadIndexState]]:
        return {c.id: [PayloadIndexState("ready") for _ in c.payload_indexes] for c in colls}  # made with the table

    async def build_progress(self, session: AsyncConnection, coll: CollectionInfo) -> dict[str, Any] | None:
        return None

    # --- points: the FTS5 table is keyed by the data table's rid --------------------------------

    async def _insert(self, session: AsyncConnection, coll: CollectionInfo, points: builtins.list[PointIn]) -> None:
        await session.execute(
            text(
                f"INSERT INTO {coll.data_table} (id, embedding, norm, payload) VALUES (:id, :e, :n, :p) "
                "ON CONFLICT(id) DO UPDATE SET embedding = excluded.embedding, norm = excluded.norm, "
                "payload = excluded.payload"
            ),
            [{"id": p.id, "e": _blob(p.vector), "n": p.norm, "p": p.payload_json} for p in points],
        )

    def _set_vector(self, vector: PointIn, params: dict[str, Any]) -> builtins.list[str]:
        params.update(e=_blob(vector.vector), n=vector.norm)
        return ["embedding = :e", "norm = :n"]

    def _set_payload(
        self, coll: CollectionInfo, payload_json: str, terms: builtins.list[str] | None, params: dict[str, Any]
    ) -> builtins.list[str]:
        params["p"] = payload_json
        return ["payload = :p"]

    async def _text_written(
        self, session: AsyncConnection, coll: CollectionInfo, pairs: builtins.list[tuple[str, builtins.list[str] | None]]
    ) -> None:
        ids = orjson.dumps([i for i, _ in pairs]).decode()
        await session.execute(
            text(
                f"DELETE FROM {coll.text_table} WHERE rowid IN "
                f"(SELECT rid FROM {coll.data_table} WHERE id IN (SELECT value FROM json_each(:ids)))"
            ),
            {"ids": ids},
        )
        bodies = orjson.dumps([[i, fts_body(t)] for i, t in pairs if t]).decode()
        await session.execute(
            text(
                f"INSERT INTO {coll.text_table} (rowid, body) SELECT v.rid, t.body FROM {coll.data_table} v "
                "JOIN (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS body "
                "FROM json_each(:pairs)) t ON t.id = v.id"
            ),
            {"pairs": bodies},
        )

    async def _text_deleting(self, session: AsyncConnection, coll: CollectionInfo, where: str, params: dict[str, Any]) -> None:
        await session.execute(
            text(f"DELETE FROM {coll.text_table} WHERE rowid IN (SELECT rid FROM {coll.data_table} WHERE {where})"),
            params,
        )

    async def _text_rank(
        self, session: AsyncConnection, coll: CollectionInfo, terms: builtins.list[str], limit: int,
        flt: Node | None, also: builtins.list[str],
    ) -> TextRanking:
        """FTS5's ``bm25()`` (lower is better: its negation is the score) over every match: exact."""
        sql = SqlBuilder()
        where, params = self._where(flt, sql, coll), sql.params
        ft = coll.text_table
        matches = f"SELECT v.id, -bm25({ft}) AS score FROM {ft} JOIN {coll.data_table} v ON v.rid = {ft}.rowid WHERE {ft} MATCH :match"
        match = match_expression(terms)
        scores: dict[str, float] = {}
        async with self._search_connection(session) as conn:
            rows = await conn.execute(
                text(f"{matches} AND {where} ORDER BY bm25({ft}), v.id LIMIT :limit"), {**params, "match": match, "limit": limit}
            )
            hits = [(r[0], float(r[1])) for r in rows]
            if also:
                found = await conn.execute(
                    text(f"{matches} AND v.id IN (SELECT value FROM json_each(:also))"),
                    {"match": match, "also": orjson.dumps(also).decode()},
                )
                scores = {r[0]: float(r[1]) for r in found}
        return TextRanking(hits, {pid: scores.get(pid, 0.0) for pid in also}, len(hits))

    # --- search: exact, one statement on the request's connection ------------------------------

    @asynccontextmanager
    async def _search_connection(self, session: AsyncConnection) -> AsyncIterator[Any]:
        try:
            yield session
        except OperationalError as exc:
            if "no such table" in str(exc.orig):
                raise MissingTable() from None
            raise

    def _search_builder(self) -> SqlBuilder:
        return SqlBuilder()

    async def _plan(self, conn: Any, search: Search) -> Plan:
        if search.narrowed:
            return Plan("filter_first", "a declared payload index narrows the filter (exact search)")
        return Plan("exact_scan", "sqlite-vec compares every point the filter keeps")

    async def _exact(self, conn: Any, search: Search) -> builtins.list[Hit]:
        coll = search.coll
        t = coll.data_table
        if search.flt is None:
            stmt = f"SELECT id, payload AS p, {self._distance_expr(coll)} AS d FROM {t} ORDER BY d, id LIMIT :limit"
        else:
            # A filtered search counts the matches it compared (the plan's ``found_matches``),
            # over row ids and distances only; the k answers' payloads are read by their row id.
            stmt = (
                f"SELECT k.id, t.payload AS p, k.d, k.n FROM (SELECT rid, id, d, count(*) OVER () AS n FROM "
                f"(SELECT rid, id, {self._distance_expr(coll)} AS d FROM {t} WHERE {search.where}) "
                f"ORDER BY d, id LIMIT :limit) k JOIN {t} t ON t.rid = k.rid"
            )
        rows = (await conn.execute(
            text(self.budgeted_hits(stmt, search.budget, counted=search.flt is not None)),
            {**search.sql.params, **search.q, "limit": search.limit},
        )).all()
        if search.flt is not None:
            search.matches = int(rows[0][3]) if rows else 0
        return self._hits(rows)
