"""SQLite + sqlite-vec: exact search over a plain table, filters in SQL before the limit.

Each collection is a table of float32 blobs (``vec_<id>``) with the payload as JSON text; search
is ``WHERE <filter> ORDER BY <distance> LIMIT k``, so a filtered search always returns
``min(limit, matches)`` points and recall is exact. sqlite-vec has cosine and L2 distances; the
inner product is derived from the cosine distance and the stored norm of each vector. A
collection with a ``text_field`` gets an FTS5 table (``fts_<id>``) keyed by the row id.
"""

from __future__ import annotations

import builtins
from array import array
from collections.abc import Mapping
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.vectors.backend import (
    CollectionInfo,
    Hit,
    IndexKind,
    IndexState,
    MissingTable,
    PointIn,
    PointOut,
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
        return f"(json_extract(payload, {p}) = {self.sql.bind(v)} AND json_type(payload, {p}) {kinds})"

    def compare(self, node: Compare) -> str:
        p = self._p(node.key)
        kinds = "= 'text'" if isinstance(node.value, str) else "IN ('integer', 'real')"
        return (
            f"(json_extract(payload, {p}) {COMPARE_SQL[node.op]} {self.sql.bind(node.value)} "
            f"AND json_type(payload, {p}) {kinds})"
        )

    def exists(self, node: Exists) -> str:
        return f"(json_type(payload, {self.sql.bind(_path(node.key))}) IS NOT NULL)"

    def negate(self, condition: str) -> str:
        return f"(NOT IFNULL({condition}, 0))"

    def serves(self, node: Eq | Compare) -> bool:
        kind = self.declared.get(node.key)
        return kind is not None and node.value is not None and serves_value(kind, node.value)


def served(node: Node | None, declared: Mapping[str, PayloadKind]) -> bool:
    """Whether a declared index narrows the rows of ``node`` (a top-level conjunct on one)."""
    return SqliteFilter(SqlBuilder(), declared).narrows(node)


def _blob(vec: array[float]) -> bytes:
    return vec.tobytes()


def _unblob(data: bytes) -> array[float]:
    out = array("f")
    out.frombytes(data)
    return out


class SqliteVecIndex:
    """``VectorIndex`` on SQLite with sqlite-vec (exact search)."""

    name = "sqlite-vec"

    def index_kind(self, vector_size: int, requested: str) -> IndexKind:
        return "exact"

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

    def _qparams(self, vector: array[float]) -> dict[str, Any]:
        import math

        return {"q": _blob(vector), "qn": math.hypot(*vector)}

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
            await session.execute(
                text(f"CREATE VIRTUAL TABLE {coll.text_table} USING fts5(body, tokenize='porter unicode61')")
            )

    async def drop(self, session: AsyncConnection, coll: CollectionInfo) -> None:
        await session.execute(text(f"DROP TABLE IF EXISTS {coll.text_table}"))
        await session.execute(text(f"DROP TABLE IF EXISTS {coll.data_table}"))

    async def reset(self, session: AsyncConnection, coll: CollectionInfo) -> None:
        if coll.text_field is not None:
            await session.execute(text(f"DELETE FROM {coll.text_table}"))
        await session.execute(text(f"DELETE FROM {coll.data_table}"))

    async def index_states(self, session: AsyncConnection, colls: list[CollectionInfo]) -> dict[int, IndexState]:
        return {c.id: "exact" for c in colls}

    async def payload_index_states(
        self, session: AsyncConnection, colls: list[CollectionInfo]
    ) -> dict[int, list[IndexState]]:
        return {c.id: ["ready" for _ in c.payload_indexes] for c in colls}  # made with the table

    async def build_progress(self, session: AsyncConnection, coll: CollectionInfo) -> dict[str, Any] | None:
        return None

    async def count(self, session: AsyncConnection, coll: CollectionInfo, flt: Node | None = None) -> int:
        sql = SqlBuilder()
        where = compile_filter(flt, sql, coll.declared)
        result = await session.execute(text(f"SELECT count(*) FROM {coll.data_table} WHERE {where}"), sql.params)
        return int(result.scalar_one())

    async def upsert(self, session: AsyncConnection, coll: CollectionInfo, points: list[PointIn]) -> None:
        if not points:
            return
        t = coll.data_table
        await session.execute(
            text(
                f"INSERT INTO {t} (id, embedding, norm, payload) VALUES (:id, :e, :n, :p) "
                "ON CONFLICT(id) DO UPDATE SET embedding = excluded.embedding, norm = excluded.norm, "
                "payload = excluded.payload"
            ),
            [{"id": p.id, "e": _blob(p.vector), "n": p.norm, "p": p.payload_json} for p in points],
        )
        if coll.text_field is not None:
            await self._reindex_text(session, coll, [(p.id, p.text) for p in points])

    async def _reindex_text(self, session: AsyncConnection, coll: CollectionInfo, pairs: list[tuple[str, str | None]]) -> None:
        ids = orjson.dumps([i for i, _ in pairs]).decode()
        await session.execute(
            text(
                f"DELETE FROM {coll.text_table} WHERE rowid IN "
                f"(SELECT rid FROM {coll.data_table} WHERE id IN (SELECT value FROM json_each(:ids)))"
            ),
            {"ids": ids},
        )
        bodies = orjson.dumps([[i, t] for i, t in pairs if t]).decode()
        await session.execute(
            text(
                f"INSERT INTO {coll.text_table} (rowid, body) SELECT v.rid, t.body FROM {coll.data_table} v "
                "JOIN (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS body "
                "FROM json_each(:pairs)) t ON t.id = v.id"
            ),
            {"pairs": bodies},
        )

    async def get(
        self, session: AsyncConnection, coll: CollectionInfo, point_id: str, with_vector: bool
    ) -> PointOut | None:
        row = (
            await session.execute(
                text(f"SELECT id, payload, embedding FROM {coll.data_table} WHERE id = :id"), {"id": point_id}
            )
        ).first()
        if row is None:
            return None
        return PointOut(row[0], row[1], _unblob(row[2]) if with_vector else None)

    async def update(
        self,
        session: AsyncConnection,
        coll: CollectionInfo,
        point_id: str,
        vector: PointIn | None,
        payload_json: str | None,
        text_value: str | None,
    ) -> bool:
        sets = []
        params: dict[str, Any] = {"id": point_id}
        if vector is not None:
            sets += ["embedding = :e", "norm = :n"]
            params.update(e=_blob(vector.vector), n=vector.norm)
        if payload_json is not None:
            sets.append("payload = :p")
            params["p"] = payload_json
        if not sets:
            sets.append("id = id")
        result = await session.execute(
            text(f"UPDATE {coll.data_table} SET {', '.join(sets)} WHERE id = :id RETURNING id"), params
        )
        found = result.first() is not None
        if found and payload_json is not None and coll.text_field is not None:
            await self._reindex_text(session, coll, [(point_id, text_value)])
        return found

    async def delete(
        self, session: AsyncConnection, coll: CollectionInfo, ids: list[str] | None, flt: Node | None
    ) -> int:
        sql = SqlBuilder()
        where = compile_filter(flt, sql, coll.declared)
        if ids is not None:
            where += " AND id IN (SELECT value FROM json_each(:ids))"
            sql.params["ids"] = orjson.dumps(ids).decode()
        if coll.text_field is not None:
            await session.execute(
                text(
                    f"DELETE FROM {coll.text_table} WHERE rowid IN "
                    f"(SELECT rid FROM {coll.data_table} WHERE {where})"
                ),
                sql.params,
            )
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
    ) -> list[PointOut]:
        sql = SqlBuilder()
        where = compile_filter(flt, sql, coll.declared)
        if after is not None:
            where += " AND id > :after"
            sql.params["after"] = after
        sql.params["limit"] = limit
        vec = ", embedding" if with_vectors else ""
        rows = await session.execute(
            text(f"SELECT id, payload{vec} FROM {coll.data_table} WHERE {where} ORDER BY id LIMIT :limit"),
            sql.params,
        )
        return [PointOut(r[0], r[1], _unblob(r[2]) if with_vectors else None) for r in rows]

    async def search(
        self,
        session: AsyncConnection,
        coll: CollectionInfo,
        vector: array[float],
        limit: int,
        flt: Node | None,
        ef_search: int | None,
    ) -> tuple[builtins.list[Hit], Plan]:
        sql = SqlBuilder()
        where = compile_filter(flt, sql, coll.declared)
        sql.params.update(self._qparams(vector), limit=limit)
        try:
            rows = await session.execute(
                text(
                    f"SELECT id, payload, {self._distance_expr(coll)} AS d FROM {coll.data_table} "
                    f"WHERE {where} ORDER BY d, id LIMIT :limit"
                ),
                sql.params,
            )
        except OperationalError as exc:
            if "no such table" in str(exc.orig):
                raise MissingTable() from None
            raise
        if flt is not None and served(flt, coll.declared):
            plan = Plan("filter_first", "a declared payload index narrows the filter (exact search)")
        else:
            plan = Plan("exact_scan", "sqlite-vec compares every point the filter keeps")
        return [Hit(r[0], float(r[2]), r[1]) for r in rows], plan

    async def text_search(
        self, session: AsyncConnection, coll: CollectionInfo, words: builtins.list[str], limit: int, flt: Node | None
    ) -> builtins.list[str]:
        if coll.text_field is None or not words:
            return []
        sql = SqlBuilder()
        where = compile_filter(flt, sql, coll.declared)
        sql.params.update(match=" OR ".join(f'"{w}"' for w in words), limit=limit)
        ft = coll.text_table
        rows = await session.execute(
            text(
                f"SELECT v.id FROM {ft} JOIN {coll.data_table} v ON v.rid = {ft}.rowid "
                f"WHERE {ft} MATCH :match AND {where} ORDER BY bm25({ft}), v.id LIMIT :limit"
            ),
            sql.params,
        )
        return [r[0] for r in rows]

    async def distances(
        self, session: AsyncConnection, coll: CollectionInfo, vector: array[float], ids: builtins.list[str]
    ) -> builtins.list[Hit]:
        if not ids:
            return []
        params = {**self._qparams(vector), "ids": orjson.dumps(ids).decode()}
        rows = await session.execute(
            text(
                f"SELECT id, payload, {self._distance_expr(coll)} FROM {coll.data_table} "
                "WHERE id IN (SELECT value FROM json_each(:ids))"
            ),
            params,
        )
        return [Hit(r[0], float(r[2]), r[1]) for r in rows]
