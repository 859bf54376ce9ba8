"""All SQL of the kv capability. Statements are built once (bound parameters) and reused.

Every statement starts from ``in_scope``; the TTL sweep is the one statement that spans
namespaces (it only deletes entries that have already expired, whoever owns them).
Compare-and-swap is a single statement each time: ``UPDATE ... WHERE version IN (...)`` for
``If-Match`` and ``INSERT ... ON CONFLICT DO UPDATE ... WHERE <expired or not matching>`` for
``If-None-Match``, so two racing writers can never both win.

A batch (get, set or delete many keys) is SQLAlchemy Core in the request's transaction: an
expanding ``IN`` of its keys, or one executemany of its entries.

Every write stores a version it chose itself (``new_version``: random, as a new entry's always
was), so no write needs ``RETURNING``: whether a conditional write happened is its row count. On
SQLite a ``RETURNING`` statement keeps its write transaction open between its first step (the
change) and the last (the commit), and in between aiosqlite's thread must take the GIL back from
a busy event loop: 16 concurrent kv sets held SQLite's write lock while idle that way, the other
writers slept in SQLite's busy handler, and the gateway served 1,440-1,460 sets/s against
1,850-1,910 without ``RETURNING`` (docs/benchmarks.md).
"""

from __future__ import annotations

import builtins
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, BindParameter, Integer, and_, bindparam, case, delete, func, or_, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.db.pages import budgeted, byte_length
from app.core.db.scoping import in_scope
from app.core.fast.fixed_statements import FixedStatement, StatementConnection, StatementShapes
from app.core.db.upsert import InsertBuilder
from app.kv.models import kv_entries as t

_NS: BindParameter[str] = bindparam("ns")
_C: BindParameter[str] = bindparam("c")
_K: BindParameter[str] = bindparam("k")
_BUDGET: BindParameter[int] = bindparam("budget", type_=BigInteger)
_PK = [t.c.namespace, t.c.collection, t.c.key]


def _now() -> Any:
    return bindparam("now", type_=t.c.updated_at.type)


def _live() -> Any:
    """Not expired at ``:now``."""
    return or_(t.c.expires_at.is_(None), t.c.expires_at > _now())


def _expired() -> Any:
    return and_(t.c.expires_at.is_not(None), t.c.expires_at <= _now())


def new_version() -> int:
    """The version a write stores: random (52 bits), so a deleted and re-created key never reuses
    an ETag, and a write can know its version without reading it back."""
    return secrets.randbits(52) + 1


def _numbered(name: str, n: int) -> list[Any]:
    """``n`` bound parameters ``name0 .. name{n-1}``: a version list of a fixed length."""
    return [bindparam(f"{name}{i}", type_=t.c.version.type) for i in range(n)]


def _numbered_params(name: str, values: list[int]) -> dict[str, int]:
    return {f"{name}{i}": v for i, v in enumerate(values)}


def _replace_if(versions: int | None, not_versions: int) -> Any:
    cond = [in_scope(t, _NS, _C), t.c.key == _K, _live()]
    if versions is not None:
        cond.append(t.c.version.in_(_numbered("mv", versions)))
    if not_versions:
        cond.append(t.c.version.not_in(_numbered("xv", not_versions)))
    return update(t).where(*cond).values(
        value=bindparam("v"), version=bindparam("nv"), updated_at=_now(), expires_at=bindparam("exp", type_=t.c.expires_at.type)
    )


def _list(prefix: bool, after: bool, with_values: bool) -> Any:
    columns = [t.c.key, t.c.value, t.c.version, byte_length(t.c.value).label("weight")] if with_values else [t.c.key, t.c.version, t.c.version]
    stmt = select(*columns).where(in_scope(t, _NS, _C), _live())
    if prefix:
        p = bindparam("prefix", type_=t.c.key.type)
        stmt = stmt.where(t.c.key >= p, func.substr(t.c.key, 1, bindparam("plen", type_=Integer)) == p)
    if after:
        stmt = stmt.where(t.c.key > bindparam("after", type_=t.c.key.type))
    stmt = stmt.order_by(t.c.key).limit(bindparam("lim", type_=Integer))
    if not with_values:
        return stmt
    # (key, value, version, weight, upto, within): a last row not within was cut (its value NULL)
    return budgeted(stmt, [("key", False)], _BUDGET, first_always=True, heavy=["value"])


@dataclass(frozen=True)
class StoredEntry:
    key: str
    value: str  # compact JSON text
    version: int


class KvRepository:
    """The kv statements, with the ``INSERT ... ON CONFLICT`` builder and the fixed-statement
    runner of the backend in use (``app.core.fast.fixed_statements``)."""

    def __init__(self, insert: InsertBuilder, fixed: type[FixedStatement] = FixedStatement) -> None:
        self._insert = insert
        self._get = fixed(select(t.c.value, t.c.version).where(in_scope(t, _NS, _C), t.c.key == _K, _live()))
        self._delete = fixed(delete(t).where(in_scope(t, _NS, _C), t.c.key == _K))
        self._upsert = fixed(self._upsert_statement(None))
        self._create_only = fixed(self._upsert_statement(_expired()))
        # If-None-Match with n listed versions; If-Match with n (None: any) and m excluded versions.
        self._create_unless = StatementShapes(
            fixed, lambda n: self._upsert_statement(or_(_expired(), t.c.version.not_in(_numbered("iv", n))))
        )
        self._replace_if = StatementShapes(fixed, _replace_if)
        self._list = StatementShapes(fixed, _list)
        # Batches: run through SQLAlchemy in the request's transaction.
        keys: BindParameter[str] = bindparam("keys", expanding=True)
        self._upsert_many = self._upsert_statement(None)
        self._delete_many = delete(t).where(in_scope(t, _NS, _C), t.c.key.in_(keys))
        found = select(t.c.key, t.c.value, t.c.version, byte_length(t.c.value).label("weight")).where(
            in_scope(t, _NS, _C), t.c.key.in_(keys), _live()
        ).order_by(t.c.key)
        # (key, value, version, weight, upto, within): a last row not within was cut (its value NULL)
        self._get_many = budgeted(found, [("key", False)], _BUDGET, first_always=True, heavy=["value"])

    # --- statements ----------------------------------------------------------------------

    def _upsert_statement(self, where: Any) -> Any:
        ins = self._insert(t).values(
            namespace=_NS, collection=_C, key=_K, value=bindparam("v"), version=bindparam("nv"),
            created_at=_now(), updated_at=_now(), expires_at=bindparam("exp", type_=t.c.expires_at.type),
        )
        set_ = {
            "value": ins.excluded.value,
            "version": ins.excluded.version,
            # An expired entry being replaced counts as new: its creation time is now.
            "created_at": case((_expired(), ins.excluded.created_at), else_=t.c.created_at),
            "updated_at": ins.excluded.updated_at,
            "expires_at": ins.excluded.expires_at,
        }
        return ins.on_conflict_do_update(index_elements=_PK, set_=set_, where=where)

    def _params(self, ns: str, c: str, k: str, value: str, now: datetime, expires: datetime | None) -> dict[str, Any]:
        return {"ns": ns, "c": c, "k": k, "v": value, "nv": new_version(), "now": now, "exp": expires}

    # --- reads ---------------------------------------------------------------------------

    async def get(self, conn: StatementConnection, ns: str, c: str, k: str, now: datetime) -> tuple[str, int] | None:
        row = await self._get.first(conn, {"ns": ns, "c": c, "k": k, "now": now})
        return (row[0], row[1]) if row is not None else None

    async def list(
        self, conn: StatementConnection, ns: str, c: str, now: datetime, *,
        prefix: str | None, after: str | None, limit: int, with_values: bool = True, budget: int,
    ) -> tuple[list[StoredEntry], bool]:
        """Live entries in key order after ``after``: up to ``limit``, and with their values only as
        many as weigh at most ``budget`` bytes together (at least one); True with them: the page
        was cut at the budget, and more follow."""
        params = {"ns": ns, "c": c, "now": now, "lim": limit, "prefix": prefix,
                  "plen": len(prefix) if prefix else 0, "after": after}
        rows = await self._list(bool(prefix), after is not None, with_values).all(conn, {**params, "budget": budget})
        cut = with_values and bool(rows) and not rows[-1][-1]
        if cut:
            rows = rows[:-1]
        return [StoredEntry(r[0], r[1] if with_values else "", r[2]) for r in rows], cut

    async def get_many(
        self, conn: AsyncConnection, ns: str, c: str, keys: builtins.list[str], now: datetime, *, budget: int
    ) -> tuple[builtins.list[StoredEntry], str | None]:
        """The live entries of ``keys`` in key order, as many as weigh at most ``budget`` bytes
        together (at least one), and the key of the first one left out for the budget (None: all read)."""
        rows = (await conn.execute(self._get_many, {"ns": ns, "c": c, "keys": keys, "now": now, "budget": budget})).all()
        cut = rows[-1][0] if rows and not rows[-1][-1] else None
        return [StoredEntry(r[0], r[1], r[2]) for r in (rows[:-1] if cut is not None else rows)], cut

    # --- writes --------------------------------------------------------------------------

    async def upsert(
        self, conn: StatementConnection, ns: str, c: str, k: str, value: str, now: datetime,
        expires: datetime | None,
    ) -> int:
        """Set unconditionally; the new version."""
        params = self._params(ns, c, k, value, now, expires)
        written = await self._upsert.rowcount(conn, params)
        assert written == 1  # an unconditional upsert always writes
        version: int = params["nv"]
        return version

    async def create_or_replace_unless(
        self, conn: StatementConnection, ns: str, c: str, k: str, value: str, now: datetime,
        expires: datetime | None, *, any_version: bool, versions: builtins.list[int],
    ) -> int | None:
        """``If-None-Match``: write unless a live entry exists (``any_version``) or has one of
        ``versions``; the new version, or None when the condition failed."""
        params = self._params(ns, c, k, value, now, expires)
        if any_version:
            stmt = self._create_only
        elif versions:
            stmt = self._create_unless(len(versions))
            params.update(_numbered_params("iv", versions))
        else:
            stmt = self._upsert
        return params["nv"] if await stmt.rowcount(conn, params) else None

    async def replace_if(
        self, conn: StatementConnection, ns: str, c: str, k: str, value: str, now: datetime,
        expires: datetime | None, *, versions: builtins.list[int] | None, not_versions: builtins.list[int] | None = None,
    ) -> int | None:
        """``If-Match``: replace a live entry whose version is in ``versions`` (None = any) and
        not in ``not_versions``; the new version, or None when nothing matched."""
        if versions is not None and not versions:
            return None  # none of the listed ETags is one of ours: nothing can match
        not_versions = not_versions or []
        stmt = self._replace_if(None if versions is None else len(versions), len(not_versions))
        params = self._params(ns, c, k, value, now, expires)
        params.update(_numbered_params("mv", versions or []))
        params.update(_numbered_params("xv", not_versions))
        return params["nv"] if await stmt.rowcount(conn, params) else None

    async def delete(self, conn: StatementConnection, ns: str, c: str, k: str) -> None:
        await self._delete.rowcount(conn, {"ns": ns, "c": c, "k": k})

    async def upsert_many(
        self, conn: AsyncConnection, ns: str, c: str, items: builtins.list[tuple[str, str]], now: datetime,
        expires: datetime | None,
    ) -> builtins.list[int]:
        """Set every ``(key, value)`` unconditionally in the caller's transaction (one
        executemany); their new versions, in order."""
        params = [self._params(ns, c, k, v, now, expires) for k, v in items]
        await conn.execute(self._upsert_many, params)
        return [p["nv"] for p in params]

    async def delete_many(self, conn: AsyncConnection, ns: str, c: str, keys: builtins.list[str]) -> None:
        await conn.execute(self._delete_many, {"ns": ns, "c": c, "keys": keys})

    async def sweep_expired(self, conn: AsyncConnection, now: datetime, batch: int) -> int:
        """Delete up to ``batch`` expired entries of any namespace; how many went."""
        doomed = select(*_PK).where(t.c.expires_at <= _now()).limit(batch)
        # Expired again on the row deleted, not only in the subquery's snapshot: PostgreSQL
        # rechecks this condition on a row a writer changed meanwhile, and an entry rewritten
        # since (a new value, no TTL) stays; before, it was deleted after its write's 204.
        stmt = delete(t).where(tuple_(*_PK).in_(doomed), t.c.expires_at <= _now())
        result = await conn.execute(stmt, {"now": now})
        return result.rowcount or 0

