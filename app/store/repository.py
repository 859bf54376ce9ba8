"""All SQL of the store capability: the statements both backends share, and the few facts each
backend supplies (``SqliteStoreSql``, ``PostgresStoreSql``): how a value and a vector travel, the
distance of a vector to the query, a label of a namespace, a namespace cut to a depth.

Every statement on ``store_items`` binds the caller's namespace (``i.namespace = :ns``) except the
background sweep, which deletes only expired items, whoever owns them. ``store_vectors`` rows are
reached through an item's id, which only a scoped ``store_items`` row hands out.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import Float, Integer, bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.sql.selectable import TextualSelect

from app.core.db.tables import UtcDateTime, from_driver_timestamp
from app.core.fast.fixed_statements import StatementConnection, StatementShapes, fixed_statements
from app.store.filters import FILTERS, Node
from app.vectors.filters import SqlBuilder

DISTANCES = ("cosine", "l2", "inner_product")
UPSERT_ROWS = 100  # items per INSERT of a run of puts (11 parameters each)
SIZE_TTL = 5.0  # seconds a scope's size (exact search or the graph) is taken as known
SIZE_ENTRIES = 4096
GET_SHAPES = 256  # statements of a run of gets kept built (by number of keys, omit_expired)
ITEM_COLUMNS = "i.id, i.prefix, i.key, {value}, i.created_at, i.updated_at, i.ttl_minutes"


@dataclass(slots=True)
class StoredItem:
    id: int
    prefix: str
    key: str
    value: str  # the JSON object's text as stored
    created_at: datetime
    updated_at: datetime
    ttl_minutes: float | None
    score: float | None = None

    @property
    def namespace(self) -> list[str]:
        return self.prefix.split(".")


@dataclass(slots=True)
class ItemWrite:
    prefix: str
    key: str
    depth: int
    labels: str  # JSON array
    value: str
    ttl_minutes: float | None
    expires_at: datetime | None
    vectors: list[tuple[str, array[float]]]  # (field path, float32 vector)


@dataclass(frozen=True, slots=True)
class Scope:
    """Which items a search or listing sees: a namespace prefix, a filter, expired or not."""

    prefix: tuple[str, ...]
    flt: Node | None
    omit_expired: bool
    now: datetime


def vector_norm(vector: array[float]) -> float:
    """The Euclidean norm stored beside a vector (``store_vectors.norm``)."""
    return math.hypot(*vector)


def typed(sql: str, **types: Any) -> TextClause:
    stmt = text(sql)
    binds = [bindparam(name, type_=type_) for name, type_ in types.items() if f":{name}" in sql]
    return stmt.bindparams(*binds) if binds else stmt


_TEXTS: OrderedDict[str, TextClause] = OrderedDict()
TEXTS_KEPT = 256


def typed_kept(sql: str, **types: Any) -> TextClause:
    """``typed``, kept for the next statement of the same text (the ``TEXTS_KEPT`` most recent; a
    text always comes with the same types): SQLAlchemy then finds its compiled form by the kept
    statement's memoized cache key instead of parsing, building and keying the text again."""
    stmt = _TEXTS.get(sql)
    if stmt is None:
        stmt = _TEXTS[sql] = typed(sql, **types)
        if len(_TEXTS) > TEXTS_KEPT:
            _TEXTS.popitem(last=False)
    else:
        _TEXTS.move_to_end(sql)
    return stmt


def stamp() -> UtcDateTime:
    return UtcDateTime()


def prefix_range(sql: SqlBuilder, labels: Sequence[str], column: str = "i.prefix") -> str:
    """Namespaces that start with ``labels``: the namespace itself, or a byte range (a label never
    holds ``.``, and ``/`` follows ``.``)."""
    if not labels:
        return "1 = 1"
    joined = ".".join(labels)
    return (
        f"({column} = {sql.bind(joined)} OR ({column} >= {sql.bind(joined + '.')} AND {column} < {sql.bind(joined + '/')}))"
    )


class StoreSql(ABC):
    """The store's statements on one backend."""

    def __init__(self) -> None:
        self._sizes: dict[tuple[str, tuple[str, ...], int], tuple[float, bool]] = {}
        self._gets = StatementShapes(fixed_statements(self.dialect), self._get_statement, keep=GET_SHAPES)

    dialect: ClassVar[str]
    value_out: ClassVar[str]  # the value column as JSON text
    value_in: ClassVar[str]  # a bound JSON text (``{}``) as the value column takes it
    nulls_last: ClassVar[str]  # ORDER BY ``d`` ascending, NULL (no vector) last

    def stored(self, value: str) -> str:
        """A value's JSON text as this backend stores it."""
        return value

    def item(self, row: Any) -> StoredItem:
        """An item from a row of ``ITEM_COLUMNS``."""
        return StoredItem(row[0], row[1], row[2], row[3], from_driver_timestamp(row[4]), from_driver_timestamp(row[5]), row[6])

    # --- the backend's facts -------------------------------------------------------------------------

    def keys_shape(self, keys: int) -> int:
        """What the statement of ``keys`` gets differs by: their number (two or more: ``keys_match``)."""
        return keys

    def keys_params(self, keys: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """The parameters of ``keys_match`` for these (prefix, key) pairs (two or more; one is an
        equality of its own)."""
        params: dict[str, Any] = {}
        for n, (prefix, key) in enumerate(keys):
            params[f"p{n}"], params[f"k{n}"] = prefix, key
        return params

    def keys_match(self, keys: int) -> str:
        """``i`` is one of ``keys`` (two or more) (prefix, key) pairs ``:p0, :k0, ...``: an OR of
        lookups of the unique index."""
        return "(" + " OR ".join(f"(i.prefix = :p{n} AND i.key = :k{n})" for n in range(keys)) + ")"

    def ids_in(self, column: str, ids: Sequence[int]) -> tuple[str, dict[str, Any]]:
        """``column`` is one of ``ids`` (SQL and its parameters): on SQLite the ids written out."""
        return f"{column} IN ({', '.join(str(int(i)) for i in ids)})", {}

    @abstractmethod
    def distance(self, distance: str, dims: int) -> str:
        """The distance of ``v.embedding`` to ``:q`` (``:qn``: the query's norm), lower nearer."""

    @abstractmethod
    def vector_param(self, vector: array[float]) -> Any: ...

    @abstractmethod
    def label(self, position: int, sql: SqlBuilder, from_end: bool) -> str:
        """The label at ``position`` (0-based; from the end: 1 is the last) of ``i``'s namespace."""

    @abstractmethod
    def truncated(self, depth_param: str) -> str:
        """``i.prefix`` cut to its first ``depth_param`` labels."""

    def walks(self, dims: int, distance: str) -> bool:
        """Whether a query search of this size and distance can take candidates from an ANN index."""
        return False

    def one_statement(self, writes: Sequence[ItemWrite]) -> bool:
        """Whether ``upsert`` writes these items and all their vectors in one statement."""
        return False

    async def autocommit(self, conn: AsyncConnection) -> None:  # noqa: B027 - nothing by default
        """Run each statement on ``conn`` (no transaction begun yet) as a transaction of its own."""

    async def reading(self, conn: AsyncConnection, queries: Sequence[tuple[array[float], str]]) -> None:  # noqa: B027 - nothing by default
        """Before a read-only batch (``queries``: its query searches' vectors and distances) runs
        on ``conn``, a connection no transaction has begun on yet."""

    async def graph_search(
        self, conn: AsyncConnection, ns: str, scope: Scope, q: array[float], dims: int, distance: str,
        want: int,
    ) -> list[StoredItem] | None:
        """The ``want`` nearest items by an ANN index, or None when there is none to ask (exact)."""
        return None

    # --- reads ---------------------------------------------------------------------------------------

    def _scope_sql(self, sql: SqlBuilder, scope: Scope) -> str:
        parts = ["i.namespace = :ns", prefix_range(sql, scope.prefix), FILTERS[self.dialect](sql, "i.value").compile(scope.flt)]
        if scope.omit_expired:
            parts.append("(i.expires_at IS NULL OR i.expires_at > :now)")
        return " AND ".join(parts)

    async def get_many(
        self, conn: StatementConnection, ns: str, keys: Sequence[tuple[str, str]], omit_expired: bool, now: datetime
    ) -> dict[tuple[str, str], StoredItem]:
        """The items of ``keys`` ((prefix, key) pairs) that exist: one fixed statement (the
        ``/get`` route runs it with the driver, a batch through SQLAlchemy)."""
        if not keys:
            return {}
        pairs = {"p0": keys[0][0], "k0": keys[0][1]} if len(keys) == 1 else self.keys_params(keys)
        rows = await self._gets(self.keys_shape(len(keys)), omit_expired).all(conn, {"ns": ns, "now": now, **pairs})
        return {(r[1], r[2]): self.item(r) for r in rows}

    def _get_statement(self, keys: int, omit_expired: bool) -> TextualSelect:
        """The statement reading ``keys`` items; its timestamps come back as the driver gives them (``from_driver_timestamp``)."""
        match = "i.prefix = :p0 AND i.key = :k0" if keys == 1 else self.keys_match(keys)
        where = f"i.namespace = :ns AND {match}"
        if omit_expired:
            where += " AND (i.expires_at IS NULL OR i.expires_at > :now)"
        return typed(f"SELECT {ITEM_COLUMNS.format(value=self.value_out)} FROM store_items i WHERE {where}", now=stamp()).columns()

    async def search(
        self, conn: AsyncConnection, ns: str, scope: Scope, limit: int, offset: int,
        query: tuple[array[float], str] | None, exact_threshold: int,
    ) -> list[StoredItem]:
        """Items in ``scope``: with ``query`` (vector, distance) nearest first by their best field
        (those without a vector of its size last), otherwise most recently updated first."""
        if query is not None:
            vector, distance = query
            if self.walks(len(vector), distance) and await self._larger_than(conn, ns, scope, exact_threshold):
                found = await self.graph_search(conn, ns, scope, vector, len(vector), distance, offset + limit)
                if found is not None and len(found) >= offset + limit:
                    return found[offset:offset + limit]
        sql = SqlBuilder()
        where = self._scope_sql(sql, scope)
        params: dict[str, Any] = {**sql.params, "ns": ns, "now": scope.now, "lim": limit, "off": offset}
        recent = "i.updated_at DESC, i.prefix, i.key"
        if query is None:
            sql_text = (
                f"SELECT {ITEM_COLUMNS.format(value=self.value_out)}, NULL AS d FROM store_items i "
                f"WHERE {where} ORDER BY {recent} LIMIT :lim OFFSET :off"
            )
        else:
            # each item's best field (its vectors of the query's size, grouped), ranked on ids
            # and sort keys alone; only the page's items are read whole
            vector, distance = query
            params.update(q=self.vector_param(vector), qn=vector_norm(vector), dims=len(vector))
            # The size is tested in the aggregate, not the join: with a fresh table's statistics
            # (one row, before autovacuum's first ANALYZE) PostgreSQL joined through a BitmapAnd
            # with the size's index, reading every vector of the size once per item (68 ms for
            # 2,000 items, against 10 ms by the primary key alone and 3 ms once analyzed).
            ranked = (
                f"SELECT i.id, min(CASE WHEN v.dims = :dims THEN {self.distance(distance, len(vector))} END) AS d, "
                "i.updated_at AS u, i.prefix AS p, "
                "i.key AS k FROM store_items i LEFT JOIN store_vectors v ON v.item_id = i.id "
                f"WHERE {where} GROUP BY i.id, i.updated_at, i.prefix, i.key "
                f"ORDER BY {self.nulls_last.format('d')}, u DESC, p, k LIMIT :lim OFFSET :off"
            )
            sql_text = (
                f"SELECT {ITEM_COLUMNS.format(value=self.value_out)}, s.d FROM ({ranked}) s "
                f"JOIN store_items i ON i.id = s.id ORDER BY {self.nulls_last.format('s.d')}, s.u DESC, s.p, s.k"
            )
        stmt = typed(sql_text, now=stamp()).columns(created_at=UtcDateTime(), updated_at=UtcDateTime())
        rows = await conn.execute(stmt, params)
        return [self._scored(r, query[1] if query else None) for r in rows]

    def _scored(self, row: Any, distance: str | None) -> StoredItem:
        item = self.item(row)
        d = row[7]
        if distance is not None and d is not None and math.isfinite(d):
            item.score = 1.0 - d if distance == "cosine" else -d
        return item

    async def _larger_than(self, conn: AsyncConnection, ns: str, scope: Scope, threshold: int) -> bool:
        """Whether more than ``threshold`` items are under the scope's prefix (its filter aside),
        as counted within the last ``SIZE_TTL`` seconds (a scope's size only chooses a plan)."""
        now = time.monotonic()
        cache_key = (ns, scope.prefix, threshold)
        cached = self._sizes.get(cache_key)
        if cached is not None and cached[0] > now:
            return cached[1]
        if len(self._sizes) >= SIZE_ENTRIES:
            self._sizes.clear()
        larger = await self._count_above(conn, ns, scope, threshold)
        self._sizes[cache_key] = (now + SIZE_TTL, larger)
        return larger

    async def _count_above(self, conn: AsyncConnection, ns: str, scope: Scope, threshold: int) -> bool:
        sql = SqlBuilder()
        where = f"i.namespace = :ns AND {prefix_range(sql, scope.prefix)}"
        stmt = text(f"SELECT count(*) FROM (SELECT 1 FROM store_items i WHERE {where} LIMIT :t) s")
        count = (await conn.execute(stmt, {**sql.params, "ns": ns, "t": threshold + 1})).scalar_one()
        return int(count) > threshold

    async def list_namespaces(
        self, conn: AsyncConnection, ns: str, conditions: Sequence[tuple[str, Sequence[str]]], max_depth: int | None,
        limit: int, offset: int, omit_expired: bool, now: datetime,
    ) -> list[list[str]]:
        """Distinct namespaces matching every (match_type, path) condition (``*``: any one label),
        cut to ``max_depth`` labels, in byte order."""
        sql = SqlBuilder()
        parts = ["i.namespace = :ns"]
        for match_type, path in conditions:
            if not path:
                continue
            parts.append(f"i.depth >= {len(path)}")
            if match_type == "prefix":
                literal = []
                for label in path:
                    if label == "*":
                        break
                    literal.append(label)
                parts.append(prefix_range(sql, literal))
                positions = [(n, label) for n, label in enumerate(path) if n >= len(literal) and label != "*"]
                parts += [f"{self.label(n, sql, False)} = {sql.bind(label)}" for n, label in positions]
            else:
                parts += [
                    f"{self.label(len(path) - n, sql, True)} = {sql.bind(label)}"
                    for n, label in enumerate(path) if label != "*"
                ]
        if omit_expired:
            parts.append("(i.expires_at IS NULL OR i.expires_at > :now)")
        column = "i.prefix" if max_depth is None else f"(CASE WHEN i.depth > :depth THEN {self.truncated(':depth')} ELSE i.prefix END)"
        stmt = typed(
            f"SELECT DISTINCT {column} AS n FROM store_items i WHERE {' AND '.join(parts)} "
            "ORDER BY n LIMIT :lim OFFSET :off",
            now=stamp(), depth=Integer(),
        )
        params = {**sql.params, "ns": ns, "now": now, "depth": max_depth, "lim": limit, "off": offset}
        return [str(r[0]).split(".") for r in await conn.execute(stmt, params)]

    # --- writes --------------------------------------------------------------------------------------

    async def upsert(self, conn: AsyncConnection, ns: str, items: Sequence[ItemWrite], now: datetime) -> list[int]:
        """Insert or replace ``items`` (unique by prefix and key) and their vectors: the items in
        one statement per ``UPSERT_ROWS`` (``upsert_chunk``), then the vectors of those whose
        vectors did not go in with them (``replace_vectors``); the items' ids."""
        ids: list[int] = []
        replaced: list[tuple[int, ItemWrite]] = []
        for start in range(0, len(items), UPSERT_ROWS):
            chunk = items[start:start + UPSERT_ROWS]
            for item, (item_id, vectors_in) in zip(chunk, await self.upsert_chunk(conn, ns, chunk, now), strict=True):
                ids.append(item_id)
                if not vectors_in:
                    replaced.append((item_id, item))
        await self.replace_vectors(conn, replaced)
        return ids

    async def upsert_chunk(
        self, conn: AsyncConnection, ns: str, chunk: Sequence[ItemWrite], now: datetime
    ) -> list[tuple[int, bool]]:
        """Insert or replace ``chunk``'s items: each one's id, and whether its vectors went in with
        it (here never: ``replace_vectors`` writes them)."""
        sql_text, params, types = self.items_upsert(ns, chunk, now)
        found = {(r[1], r[2]): int(r[0]) for r in await conn.execute(typed_kept(sql_text + " RETURNING id, prefix, key", **types), params)}
        return [(found[(item.prefix, item.key)], False) for item in chunk]

    def items_upsert(self, ns: str, chunk: Sequence[ItemWrite], now: datetime) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """The INSERT ... ON CONFLICT of ``chunk``'s items (no RETURNING), its parameters and their types."""
        params: dict[str, Any] = {"ns": ns, "now": now}
        types: dict[str, Any] = {"now": stamp()}
        rows = []
        for n, item in enumerate(chunk):
            params.update({f"p{n}": item.prefix, f"k{n}": item.key, f"d{n}": item.depth, f"l{n}": item.labels,
                           f"v{n}": self.stored(item.value), f"e{n}": item.expires_at, f"t{n}": item.ttl_minutes})
            types.update({f"e{n}": stamp(), f"t{n}": Float()})
            rows.append(f"(:ns, :p{n}, :k{n}, :d{n}, :l{n}, {self.value_in.format(f':v{n}')}, :now, :now, :e{n}, :t{n})")
        sql_text = (
            "INSERT INTO store_items (namespace, prefix, key, depth, labels, value, created_at, updated_at, "
            f"expires_at, ttl_minutes) VALUES {', '.join(rows)} ON CONFLICT (namespace, prefix, key) DO UPDATE SET "
            "value = excluded.value, updated_at = excluded.updated_at, expires_at = excluded.expires_at, "
            "ttl_minutes = excluded.ttl_minutes"
        )
        return sql_text, params, types

    async def replace_vectors(self, conn: AsyncConnection, written: Sequence[tuple[int, ItemWrite]]) -> None:
        """The vectors of the items ``written`` (id, item) become theirs alone."""
        if not written:
            return
        match, match_params = self.ids_in("item_id", [item_id for item_id, _ in written])
        await conn.execute(text(f"DELETE FROM store_vectors WHERE {match}"), match_params)
        vectors = [
            {"id": item_id, "field": field, "dims": len(vector), "norm": vector_norm(vector),
             "e": self.vector_param(vector)}
            for item_id, item in written for field, vector in item.vectors
        ]
        if vectors:
            await conn.execute(
                text("INSERT INTO store_vectors (item_id, field, dims, norm, embedding) VALUES (:id, :field, :dims, :norm, :e)"),
                vectors if len(vectors) > 1 else vectors[0],
            )

    async def delete(self, conn: AsyncConnection, ns: str, keys: Sequence[tuple[str, str]]) -> None:
        params: dict[str, Any] = {"ns": ns}
        pairs = []
        for n, (prefix, key) in enumerate(keys):
            params[f"p{n}"], params[f"k{n}"] = prefix, key
            pairs.append(f"(prefix = :p{n} AND key = :k{n})")
        await conn.execute(text(f"DELETE FROM store_items WHERE namespace = :ns AND ({' OR '.join(pairs)})"), params)

    async def register_dims(self, conn: AsyncConnection, dims: int) -> None:
        """Note an embedding size in use (``store_dims``: the index builder's list)."""
        await conn.execute(text("INSERT INTO store_dims (dims) VALUES (:d) ON CONFLICT (dims) DO NOTHING"), {"d": dims})

    async def refresh(self, conn: AsyncConnection, ns: str, items: Sequence[StoredItem], now: datetime) -> None:
        """Restart the TTL of ``items`` that have one."""
        from datetime import timedelta

        by_ttl: dict[float, list[int]] = {}
        for item in items:
            if item.ttl_minutes is not None:
                by_ttl.setdefault(item.ttl_minutes, []).append(item.id)
        for ttl, ids in by_ttl.items():
            match, match_params = self.ids_in("id", ids)
            await conn.execute(
                typed(f"UPDATE store_items SET expires_at = :exp WHERE namespace = :ns AND {match}", exp=stamp()),
                {**match_params, "ns": ns, "exp": now + timedelta(minutes=ttl)},
            )

    async def delete_subtree(self, conn: AsyncConnection, ns: str, prefix: Sequence[str], batch: int) -> int:
        """Delete up to ``batch`` items whose namespace starts with ``prefix``; how many went."""
        sql = SqlBuilder()
        where = f"i.namespace = :ns AND {prefix_range(sql, prefix)}"
        result = await conn.execute(
            text(f"DELETE FROM store_items WHERE namespace = :ns AND id IN (SELECT i.id FROM store_items i WHERE {where} LIMIT :b)"),
            {**sql.params, "ns": ns, "b": batch},
        )
        return int(result.rowcount or 0)

    async def sweep_namespace(self, conn: AsyncConnection, ns: str, now: datetime, batch: int) -> int:
        """Delete up to ``batch`` expired items of ``ns``; how many went."""
        stmt = typed(
            "DELETE FROM store_items WHERE namespace = :ns AND expires_at <= :now AND id IN "
            "(SELECT i.id FROM store_items i WHERE i.namespace = :ns AND i.expires_at <= :now LIMIT :b)",
            now=stamp(),
        )
        return int((await conn.execute(stmt, {"ns": ns, "now": now, "b": batch})).rowcount or 0)

    async def sweep(self, conn: AsyncConnection, now: datetime, batch: int) -> int:
        """Delete up to ``batch`` expired items of any namespace (their vectors go with them)."""
        stmt = typed(
            "DELETE FROM store_items WHERE expires_at <= :now AND id IN "
            "(SELECT id FROM store_items WHERE expires_at <= :now LIMIT :b)",
            now=stamp(),
        )
        return int((await conn.execute(stmt, {"now": now, "b": batch})).rowcount or 0)
