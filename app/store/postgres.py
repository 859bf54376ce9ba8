"""The store on PostgreSQL + pgvector: the value as jsonb, vectors of any dimension in one column,
each dimension in use with a partial HNSW index of its own (``app.store.indexes``) that a query
search over many items walks, a namespace's labels split from its text (``split_part``)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.db.tables import UtcDateTime
from app.store.repository import ITEM_COLUMNS, UPSERT_ROWS, ItemWrite, Scope, StoredItem, StoreSql, stamp, typed, typed_kept, vector_norm
from app.vectors.filters import SqlBuilder
from app.vectors.nulescape import escape_json, unescape_json

_OPERATOR = {"cosine": "<=>", "l2": "<->", "inner_product": "<#>"}
HNSW_MAX_DIMS = 2000  # pgvector's limit for an HNSW index of `vector`
WITH_ITEMS = 500  # most vectors inserted in the statement of their items (6 parameters each)


def hnsw_index_name(dims: int) -> str:
    return f"store_hnsw_{int(dims)}"


def hnsw_index_sql(dims: int, m: int = 16, ef_construction: int = 64) -> str:
    """The partial HNSW index of the vectors of one size (cosine)."""
    n = int(dims)
    return (
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {hnsw_index_name(n)} ON store_vectors USING hnsw "
        f"((CAST(embedding AS vector({n}))) vector_cosine_ops) WITH (m = {int(m)}, ef_construction = {int(ef_construction)}) "
        f"WHERE dims = {n}"
    )


class PostgresStoreSql(StoreSql):
    dialect = "postgresql"
    value_out = "CAST(i.value AS text)"
    value_in = "CAST({} AS jsonb)"
    nulls_last = "{0} ASC NULLS LAST"

    def __init__(self, ef_search: int = 100) -> None:
        super().__init__()
        self.ef_search = ef_search
        self.indexed: frozenset[int] = frozenset()
        """Embedding sizes whose HNSW index is valid (the index builder keeps it up to date)."""

    def stored(self, value: str) -> str:
        return escape_json(value)  # jsonb holds no U+0000 (app.vectors.nulescape)

    def item(self, row: Any) -> StoredItem:
        item = super().item(row)
        item.value = unescape_json(item.value)
        return item

    def one_statement(self, writes: Sequence[ItemWrite]) -> bool:
        return len(writes) <= UPSERT_ROWS and sum(len(w.vectors) for w in writes) <= WITH_ITEMS

    async def autocommit(self, conn: AsyncConnection) -> None:
        if conn.in_transaction():  # a write's, begun by its dependency: asyncpg sends BEGIN only with a first statement
            await conn.rollback()
        await conn.execution_options(isolation_level="AUTOCOMMIT")

    async def upsert_chunk(
        self, conn: AsyncConnection, ns: str, chunk: Sequence[ItemWrite], now: datetime
    ) -> list[tuple[int, bool]]:
        """The items and all their vectors in one statement (up to ``WITH_ITEMS`` vectors; past
        that the items alone, ``replace_vectors`` then writing their vectors): a new item's vectors
        are inserted; a replaced item's are updated in place by field, and those of fields it no
        longer has deleted. Each vector row is touched by one part of the statement only (the parts
        of one statement cannot see each other's changes)."""
        sql_text, params, types = self.items_upsert(ns, chunk, now)
        if sum(len(item.vectors) for item in chunk) > WITH_ITEMS:
            rows = await conn.execute(typed_kept(sql_text + " RETURNING id, prefix, key", **types), params)
            ids = {(r[1], r[2]): int(r[0]) for r in rows}
            return [(ids[(item.prefix, item.key)], False) for item in chunk]
        vectors = []
        for n, item in enumerate(chunk):
            for j, (field, vector) in enumerate(item.vectors):
                x = f"{n}_{j}"
                params.update({f"xf{x}": field, f"xd{x}": len(vector), f"xe{x}": vector, f"xn{x}": vector_norm(vector)})
                vectors.append(
                    f"({n}, CAST(:xf{x} AS text), CAST(:xd{x} AS smallint), CAST(:xn{x} AS double precision), CAST(:xe{x} AS vector))"
                )
        positions = ", ".join(f"(:p{n}, :k{n}, {n})" for n in range(len(chunk)))
        parts = [f"up AS ({sql_text} RETURNING id, prefix, key, (xmax = 0) AS inserted)", f"pos (p, k, n) AS (VALUES {positions})"]
        if vectors:
            parts += [
                f"x (n, f, d, nm, e) AS (VALUES {', '.join(vectors)})",
                "gone AS (DELETE FROM store_vectors v USING up JOIN pos ON up.prefix = pos.p AND up.key = pos.k "
                "WHERE v.item_id = up.id AND NOT up.inserted AND NOT EXISTS (SELECT 1 FROM x WHERE x.n = pos.n AND x.f = v.field))",
                "vs AS (INSERT INTO store_vectors (item_id, field, dims, norm, embedding) SELECT up.id, x.f, x.d, x.nm, x.e "
                "FROM x JOIN pos ON pos.n = x.n JOIN up ON up.prefix = pos.p AND up.key = pos.k "
                "ON CONFLICT (item_id, field) DO UPDATE SET dims = excluded.dims, norm = excluded.norm, embedding = excluded.embedding)",
            ]
        else:
            parts.append("gone AS (DELETE FROM store_vectors v USING up WHERE v.item_id = up.id AND NOT up.inserted)")
        rows = await conn.execute(typed_kept(f"WITH {', '.join(parts)} SELECT id, prefix, key FROM up", **types), params)
        ids = {(r[1], r[2]): int(r[0]) for r in rows}
        return [(ids[(item.prefix, item.key)], True) for item in chunk]

    def keys_shape(self, keys: int) -> int:
        return min(keys, 2)  # one statement text for two or more (``keys_match``)

    def keys_params(self, keys: Sequence[tuple[str, str]]) -> dict[str, Any]:
        return {"ps": [p for p, _ in keys], "ks": [k for _, k in keys]}

    def keys_match(self, keys: int) -> str:
        """One lookup of the unique index per pair, the pairs as two array parameters: one
        statement text for any number of keys. (An OR of 16 pairs, a BitmapOr, took 1.2 ms to
        execute in PostgreSQL for 2,000 items.)"""
        return (
            "(i.prefix, i.key) IN (SELECT w.p COLLATE \"C\", w.k FROM unnest(CAST(:ps AS text[]), CAST(:ks AS text[])) AS w (p, k))"
        )

    def ids_in(self, column: str, ids: Sequence[int]) -> tuple[str, dict[str, Any]]:
        """One array parameter: one statement text, prepared once by asyncpg (ids written out made
        each write a new statement, prepared in a round trip of its own)."""
        return f"{column} = ANY(CAST(:ids AS bigint[]))", {"ids": [int(i) for i in ids]}

    def distance(self, distance: str, dims: int) -> str:
        return f"(v.embedding {_OPERATOR[distance]} :q)"

    def vector_param(self, vector: array[float]) -> Any:
        return vector  # the vectors engine's binary codec (app.vectors.pgvector.install_vector_codec)

    def label(self, position: int, sql: SqlBuilder, from_end: bool) -> str:
        return f"split_part(i.prefix, '.', {-int(position) if from_end else int(position) + 1})"

    def truncated(self, depth_param: str) -> str:
        return f"array_to_string((string_to_array(i.prefix, '.'))[1:CAST({depth_param} AS integer)], '.')"

    def walks(self, dims: int, distance: str) -> bool:
        return distance == "cosine" and dims in self.indexed and dims <= HNSW_MAX_DIMS

    async def reading(self, conn: AsyncConnection, queries: Sequence[tuple[array[float], str]]) -> None:
        """Reads run each statement in autocommit, as AsyncPostgresStore's do: no BEGIN and COMMIT
        (two round trips) around them. Unless a query search may walk a graph: it sets its
        ``hnsw.ef_search`` for its transaction alone (``SET LOCAL``)."""
        if not any(self.walks(len(vector), distance) for vector, distance in queries):
            await self.autocommit(conn)

    async def graph_search(
        self, conn: AsyncConnection, ns: str, scope: Scope, q: array[float], dims: int, distance: str,
        want: int,
    ) -> list[StoredItem] | None:
        """The nearest vectors of the size's HNSW index (cosine only), then the scope on their items;
        None without a valid index or when more are wanted than the graph gives at once."""
        if not self.walks(dims, distance):
            return None
        candidates = max(self.ef_search, want * 4)
        if candidates > 1000:
            return None
        sql = SqlBuilder()
        where = self._scope_sql(sql, scope)
        n = int(dims)
        await conn.execute(text(f"SET LOCAL hnsw.ef_search = {candidates}"))
        # The candidates are MATERIALIZED: walked once, whatever the join's plan (with statistics
        # that see a scope of one item, a nested loop walked the graph again for each item).
        stmt = typed(
            f"WITH c AS MATERIALIZED (SELECT v.item_id, (CAST(v.embedding AS vector({n})) <=> :q) AS d "
            f"FROM store_vectors v WHERE v.dims = {n} ORDER BY CAST(v.embedding AS vector({n})) <=> :q LIMIT {candidates}) "
            f"SELECT {ITEM_COLUMNS.format(value=self.value_out)}, min(c.d) AS d FROM c "
            f"JOIN store_items i ON i.id = c.item_id WHERE {where} GROUP BY i.id ORDER BY d, i.updated_at DESC, i.prefix, i.key "
            f"LIMIT {int(want)}",
            now=stamp(),
        ).columns(created_at=UtcDateTime(), updated_at=UtcDateTime())
        rows = await conn.execute(stmt, {**sql.params, "ns": ns, "now": scope.now, "q": q})
        return [self._scored(r, "cosine") for r in rows]
