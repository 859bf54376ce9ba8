"""Quotas of vectors (``app.quotas``): points per namespace and their bytes (payload JSON text and
4 bytes a dimension).

A collection's points are a table of its own (``vec_<id>``) with no namespace column, so no
usage trigger can count them (``app.quotas.usage``). Every write to them goes through
``VectorService`` in one transaction, which reads the points it touches before and after
(``point_usage``) and adds the difference to the namespace's usage in that same transaction
(``app.quotas.usage.keep``: refused at the quota with a 507, rolled back, nothing changed).
Collection deletes, namespace deletes and resets take their points' usage away the same way.
``recount`` is the reconciliation's count (``Kept``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.db.pages import byte_length_sql
from app.vectors.models import vector_collections

FLOAT_BYTES = 4
"""Bytes a dimension of a stored vector counts (float32)."""


async def point_usage(
    conn: AsyncConnection, table: str, vector_size: int, where: str = "1 = 1", params: dict[str, Any] | None = None
) -> tuple[int, int]:
    """(points, bytes) of the rows of a collection's ``table`` that match ``where``."""
    dialect = conn.dialect.name
    payload = byte_length_sql("payload" if dialect == "sqlite" else "CAST(payload AS text)", dialect)
    row = (await conn.execute(
        text(f"SELECT count(*), coalesce(sum({payload}), 0) FROM {table} WHERE {where}"), params or {}
    )).one()
    points = int(row[0])
    return points, int(row[1]) + points * FLOAT_BYTES * int(vector_size)


async def recount(conn: AsyncConnection, namespace: str) -> tuple[int, int]:
    """(points, bytes) of every collection of ``namespace`` (one count a collection)."""
    vc = vector_collections
    rows = await conn.execute(select(vc.c.id, vc.c.vector_size).where(vc.c.namespace == namespace).order_by(vc.c.id))
    points = size = 0
    for collection_id, vector_size in rows.all():
        n, b = await point_usage(conn, f"vec_{int(collection_id)}", vector_size)
        points, size = points + n, size + b
    return points, size
