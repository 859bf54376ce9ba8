"""All SQL of the records capability. Every statement starts from ``in_scope``.

Trim is one ``DELETE`` (``key < :before``, and for ``keep_last`` ``key <`` the n-th largest key
found by a subquery of the same statement), so it is atomic against concurrent upserts: a record
written while the trim runs is either seen by it and judged by its key, or not seen at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, BindParameter, Integer, bindparam, delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.db.pages import budgeted, byte_length
from app.core.db.scoping import in_scope
from app.core.fast.fixed_statements import FixedStatement, StatementConnection, StatementShapes
from app.core.db.upsert import InsertBuilder
from app.records.models import records as t

_NS: BindParameter[str] = bindparam("ns")
_C: BindParameter[str] = bindparam("c")
_K: BindParameter[str] = bindparam("k")
_MAX_BIGINT = 2**63 - 1
_PK = [t.c.namespace, t.c.collection, t.c.key]


def _page(descending: bool, after: bool, before: bool) -> Any:
    stmt = select(t.c.key, t.c.value, byte_length(t.c.value).label("weight")).where(in_scope(t, _NS, _C))
    if after:
        stmt = stmt.where(t.c.key > bindparam("after", type_=t.c.key.type))
    if before:
        stmt = stmt.where(t.c.key < bindparam("before", type_=t.c.key.type))
    stmt = stmt.order_by(t.c.key.desc() if descending else t.c.key.asc()).limit(bindparam("lim", type_=Integer))
    # (key, value, weight, upto, within): a last row not within was cut (its value NULL)
    return budgeted(stmt, [("key", descending)], bindparam("budget", type_=BigInteger), first_always=True, heavy=["value"])


def _trim(before: bool, keep_last: bool) -> Any:
    stmt = delete(t).where(in_scope(t, _NS, _C))
    if before:
        stmt = stmt.where(t.c.key < bindparam("before", type_=t.c.key.type))
    if keep_last:
        newest = t.alias("newest")  # its own FROM, never correlated with the DELETE's table
        nth_largest = (
            select(newest.c.key).where(in_scope(newest, _NS, _C)).order_by(newest.c.key.desc())
            .offset(bindparam("skip", type_=BigInteger)).limit(1).scalar_subquery()
        )
        # Fewer than keep_last records: the subquery is NULL and nothing compares below it.
        stmt = stmt.where(t.c.key < nth_largest)
    return stmt


class RecordsRepository:
    def __init__(self, insert: InsertBuilder, fixed: type[FixedStatement] = FixedStatement) -> None:
        ins = insert(t).values(
            namespace=_NS, collection=_C, key=_K, value=bindparam("v"),
            updated_at=bindparam("now", type_=t.c.updated_at.type),
        )
        self._upsert = ins.on_conflict_do_update(
            index_elements=_PK, set_={"value": ins.excluded.value, "updated_at": ins.excluded.updated_at}
        )
        self._upsert_one = fixed(self._upsert)
        self._get = fixed(select(t.c.value).where(in_scope(t, _NS, _C), t.c.key == _K))
        self._delete = fixed(delete(t).where(in_scope(t, _NS, _C), t.c.key == _K))
        # A page's shape: its order and which exclusive bounds are given; trim's: which limits are.
        self._page = StatementShapes(fixed, _page)
        self._trim = StatementShapes(fixed, _trim)

    async def upsert(self, conn: StatementConnection, ns: str, c: str, k: str, value: str, now: datetime) -> None:
        await self._upsert_one.rowcount(conn, {"ns": ns, "c": c, "k": k, "v": value, "now": now})

    async def upsert_many(
        self, conn: AsyncConnection, ns: str, c: str, items: Sequence[tuple[str, str]], now: datetime
    ) -> None:
        """All of ``items`` in the caller's transaction (one executemany)."""
        if items:
            await conn.execute(
                self._upsert, [{"ns": ns, "c": c, "k": k, "v": v, "now": now} for k, v in items]
            )

    async def get(self, conn: StatementConnection, ns: str, c: str, k: str) -> str | None:
        row = await self._get.first(conn, {"ns": ns, "c": c, "k": k})
        return row[0] if row is not None else None

    async def delete(self, conn: StatementConnection, ns: str, c: str, k: str) -> None:
        await self._delete.rowcount(conn, {"ns": ns, "c": c, "k": k})

    async def page(
        self, conn: StatementConnection, ns: str, c: str, *, descending: bool, limit: int,
        after: str | None, before: str | None, budget: int,
    ) -> tuple[list[tuple[str, str]], bool]:
        """Records strictly between ``after`` and ``before`` in key order: up to ``limit``, and only
        as many as weigh at most ``budget`` bytes together (at least one); True with them: the page
        was cut at the budget, and more follow."""
        stmt = self._page(descending, after is not None, before is not None)
        params = {"ns": ns, "c": c, "lim": limit, "after": after, "before": before, "budget": budget}
        rows = await stmt.all(conn, params)
        cut = bool(rows) and not rows[-1][-1]
        return [(r[0], r[1]) for r in (rows[:-1] if cut else rows)], cut

    async def trim(
        self, conn: StatementConnection, ns: str, c: str, *, before: str | None, keep_last: int | None
    ) -> int:
        """Delete keys ``< before`` and/or all but the ``keep_last`` largest; how many went."""
        keep = keep_last is not None and keep_last > 0
        # (keeping more records than a collection can hold deletes nothing: OFFSET stays a BIGINT)
        params = {"ns": ns, "c": c, "before": before, "skip": min((keep_last or 1) - 1, _MAX_BIGINT)}
        return await self._trim(before is not None, keep).rowcount(conn, params)
