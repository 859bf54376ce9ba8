"""All SQL of the records capability. Every statement starts from ``in_scope``.

Trim is one ``DELETE`` (``key < :before``, and for ``keep_last`` ``key <`` the n-th largest key
found by a subquery of the same statement), so it is atomic against concurrent upserts: a record
written while the trim runs is either seen by it and judged by its key, or not seen at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import bindparam, delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.scoping import in_scope
from app.core.upsert import InsertBuilder
from app.records.models import records as t

_NS, _C, _K = bindparam("ns"), bindparam("c"), bindparam("k")
_PK = [t.c.namespace, t.c.collection, t.c.key]


class RecordsRepository:
    def __init__(self, insert: InsertBuilder) -> None:
        ins = insert(t).values(
            namespace=_NS, collection=_C, key=_K, value=bindparam("v"),
            updated_at=bindparam("now", type_=t.c.updated_at.type),
        )
        self._upsert = ins.on_conflict_do_update(
            index_elements=_PK, set_={"value": ins.excluded.value, "updated_at": ins.excluded.updated_at}
        )
        self._get = select(t.c.value).where(in_scope(t, _NS, _C), t.c.key == _K)
        self._delete = delete(t).where(in_scope(t, _NS, _C), t.c.key == _K)
        self._page_asc = (
            select(t.c.key, t.c.value).where(in_scope(t, _NS, _C)).order_by(t.c.key.asc())
            .limit(bindparam("lim"))
        )
        self._page_desc = (
            select(t.c.key, t.c.value).where(in_scope(t, _NS, _C)).order_by(t.c.key.desc())
            .limit(bindparam("lim"))
        )

    async def upsert(self, conn: AsyncConnection, ns: str, c: str, k: str, value: str, now: datetime) -> None:
        await conn.execute(self._upsert, {"ns": ns, "c": c, "k": k, "v": value, "now": now})

    async def upsert_many(
        self, conn: AsyncConnection, ns: str, c: str, items: Sequence[tuple[str, str]], now: datetime
    ) -> None:
        """All of ``items`` in the caller's transaction (one executemany)."""
        if items:
            await conn.execute(
                self._upsert, [{"ns": ns, "c": c, "k": k, "v": v, "now": now} for k, v in items]
            )

    async def get(self, conn: AsyncConnection, ns: str, c: str, k: str) -> str | None:
        return (await conn.execute(self._get, {"ns": ns, "c": c, "k": k})).scalar_one_or_none()

    async def delete(self, conn: AsyncConnection, ns: str, c: str, k: str) -> None:
        await conn.execute(self._delete, {"ns": ns, "c": c, "k": k})

    async def page(
        self, conn: AsyncConnection, ns: str, c: str, *, descending: bool, limit: int,
        after: str | None, before: str | None,
    ) -> list[tuple[str, str]]:
        """Up to ``limit`` records strictly between ``after`` and ``before``, in key order."""
        stmt = self._page_desc if descending else self._page_asc
        if after is not None:
            stmt = stmt.where(t.c.key > after)
        if before is not None:
            stmt = stmt.where(t.c.key < before)
        rows = await conn.execute(stmt, {"ns": ns, "c": c, "lim": limit})
        return [(r[0], r[1]) for r in rows]

    async def trim(
        self, conn: AsyncConnection, ns: str, c: str, *, before: str | None, keep_last: int | None
    ) -> int:
        """Delete keys ``< before`` and/or all but the ``keep_last`` largest; how many went."""
        stmt = delete(t).where(in_scope(t, ns, c))
        if before is not None:
            stmt = stmt.where(t.c.key < before)
        if keep_last is not None and keep_last > 0:
            newest = t.alias("newest")  # its own FROM, never correlated with the DELETE's table
            nth_largest = (
                select(newest.c.key).where(in_scope(newest, ns, c)).order_by(newest.c.key.desc())
                .offset(keep_last - 1).limit(1).scalar_subquery()
            )
            # Fewer than keep_last records: the subquery is NULL and nothing compares below it.
            stmt = stmt.where(t.c.key < nth_largest)
        result = await conn.execute(stmt)
        return result.rowcount or 0
