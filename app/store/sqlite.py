"""The store on SQLite: the value as JSON text, vectors as float32 bytes compared exactly by
sqlite-vec (cosine and L2; the inner product from the cosine and the stored norms), a namespace's
labels read from its JSON array."""

from __future__ import annotations

from array import array
from typing import Any

from app.store.repository import StoreSql
from app.vectors.filters import SqlBuilder


class SqliteStoreSql(StoreSql):
    dialect = "sqlite"
    value_out = "i.value"
    value_in = "{}"
    nulls_last = "{0} IS NULL, {0}"

    def keys_match(self, keys: int) -> str:
        """A row value IN a VALUES list: SQLite searches the unique index once per pair. (Without
        statistics it planned an OR of 16 pairs as a scan of the namespace by its updated_at index:
        95 ms at 100,000 items, against 0.03.)"""
        return "(i.prefix, i.key) IN (VALUES " + ", ".join(f"(:p{n}, :k{n})" for n in range(keys)) + ")"

    def distance(self, distance: str, dims: int) -> str:
        # an item without a vector of the size has none (sqlite-vec refuses a NULL vector)
        if distance == "cosine":
            return "(CASE WHEN v.embedding IS NULL THEN NULL ELSE vec_distance_cosine(v.embedding, :q) END)"
        if distance == "l2":
            return "(CASE WHEN v.embedding IS NULL THEN NULL ELSE vec_distance_l2(v.embedding, :q) END)"
        # -(a . b) = -(1 - cosine distance) * |a| * |b|; a zero vector has no direction
        return (
            "(CASE WHEN v.embedding IS NULL THEN NULL WHEN v.norm = 0 OR :qn = 0 THEN 0.0 "
            "ELSE -((1.0 - vec_distance_cosine(v.embedding, :q)) * v.norm * :qn) END)"
        )

    def vector_param(self, vector: array[float]) -> Any:
        return vector.tobytes()

    def label(self, position: int, sql: SqlBuilder, from_end: bool) -> str:
        path = f"$[#-{position}]" if from_end else f"$[{position}]"
        return f"json_extract(i.labels, {sql.bind(path)})"

    def truncated(self, depth_param: str) -> str:
        return (
            "(SELECT group_concat(l.value, '.' ORDER BY CAST(l.key AS INTEGER)) FROM json_each(i.labels) l "
            f"WHERE CAST(l.key AS INTEGER) < {depth_param})"
        )
