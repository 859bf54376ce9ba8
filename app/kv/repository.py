"""All SQL of the kv capability. Statements are built once (bound parameters) and reused.

Every statement starts from ``in_scope``; the TTL sweep is the one statement that spans
namespaces (it only deletes entries that have already expired, whoever owns them).
Compare-and-swap is a single statement each time: ``UPDATE ... WHERE version IN (...)`` for
``If-Match`` and ``INSERT ... ON CONFLICT DO UPDATE ... WHERE <expired or not matching>`` for
``If-None-Match``, so two racing writers can never both win.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, case, delete, func, or_, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.scoping import in_scope
from app.core.statements import FixedStatement
from app.core.upsert import InsertBuilder
from app.kv.models import kv_entries as t

_NS, _C, _K = bindparam("ns"), bindparam("c"), bindparam("k")
_PK = [t.c.namespace, t.c.collection, t.c.key]


def _now() -> Any:
    return bindparam("now", type_=t.c.updated_at.type)


def _live() -> Any:
    """Not expired at ``:now``."""
    return or_(t.c.expires_at.is_(None), t.c.expires_at > _now())


def _expired() -> Any:
    return and_(t.c.expires_at.is_not(None), t.c.expires_at <= _now())


def new_version() -> int:
    """A fresh entry's first version: random, so a deleted and re-created key never reuses an ETag."""
    return secrets.randbits(52) + 1


@dataclass(frozen=True)
class StoredEntry:
    key: str
    value: str  # compact JSON text
    version: int


class KvRepository:
    """The kv statements, with the ``INSERT ... ON CONFLICT`` builder and the fixed-statement
    runner of the backend in use. Conditional writes with listed versions build their statement
    per call; everything else is fixed."""

    def __init__(self, insert: InsertBuilder, fixed: type[FixedStatement] = FixedStatement) -> None:
        self._insert = insert
        self._get = fixed(select(t.c.value, t.c.version).where(in_scope(t, _NS, _C), t.c.key == _K, _live()))
        self._delete = fixed(delete(t).where(in_scope(t, _NS, _C), t.c.key == _K))
        self._upsert = self._upsert_statement(None)
        self._fixed_upsert = fixed(self._upsert)
        self._create_only = fixed(self._upsert_statement(_expired()))

    # --- statements ----------------------------------------------------------------------

    def _upsert_statement(self, where: Any) -> Any:
        ins = self._insert(t).values(
            namespace=_NS, collection=_C, key=_K, value=bindparam("v"), version=bindparam("nv"),
            created_at=_now(), updated_at=_now(), expires_at=bindparam("exp", type_=t.c.expires_at.type),
        )
        set_ = {
            "value": ins.excluded.value,
            # An expired entry being replaced counts as new: a fresh version and creation time.
            "version": case((_expired(), ins.excluded.version), else_=t.c.version + 1),
            "created_at": case((_expired(), ins.excluded.created_at), else_=t.c.created_at),
            "updated_at": ins.excluded.updated_at,
            "expires_at": ins.excluded.expires_at,
        }
        return ins.on_conflict_do_update(index_elements=_PK, set_=set_, where=where).returning(t.c.version)

    def _params(self, ns: str, c: str, k: str, value: str, now: datetime, expires: datetime | None) -> dict:
        return {"ns": ns, "c": c, "k": k, "v": value, "nv": new_version(), "now": now, "exp": expires}

    # --- reads ---------------------------------------------------------------------------

    async def get(self, conn: AsyncConnection, ns: str, c: str, k: str, now: datetime) -> tuple[str, int] | None:
        row = await self._get.first(conn, {"ns": ns, "c": c, "k": k, "now": now})
        return (row[0], row[1]) if row is not None else None

    async def list(
        self, conn: AsyncConnection, ns: str, c: str, now: datetime, *,
        prefix: str | None, after: str | None, limit: int, with_values: bool = True,
    ) -> list[StoredEntry]:
        cols = [t.c.key, t.c.value if with_values else t.c.version, t.c.version]
        stmt = select(*cols).where(in_scope(t, ns, c), _live())
        if prefix:
            stmt = stmt.where(t.c.key >= prefix, func.substr(t.c.key, 1, len(prefix)) == prefix)
        if after is not None:
            stmt = stmt.where(t.c.key > after)
        stmt = stmt.order_by(t.c.key).limit(limit)
        rows = (await conn.execute(stmt, {"now": now})).all()
        return [StoredEntry(r[0], r[1] if with_values else "", r[2]) for r in rows]

    # --- writes --------------------------------------------------------------------------

    async def upsert(
        self, conn: AsyncConnection, ns: str, c: str, k: str, value: str, now: datetime,
        expires: datetime | None,
    ) -> int:
        """Set unconditionally; the new version."""
        row = await self._fixed_upsert.first(conn, self._params(ns, c, k, value, now, expires))
        assert row is not None  # an unconditional upsert always returns the new version
        return row[0]

    async def create_or_replace_unless(
        self, conn: AsyncConnection, ns: str, c: str, k: str, value: str, now: datetime,
        expires: datetime | None, *, any_version: bool, versions: list[int],
    ) -> int | None:
        """``If-None-Match``: write unless a live entry exists (``any_version``) or has one of
        ``versions``; the new version, or None when the condition failed."""
        params = self._params(ns, c, k, value, now, expires)
        if any_version:
            row = await self._create_only.first(conn, params)
            return row[0] if row is not None else None
        if versions:
            stmt = self._upsert_statement(or_(_expired(), t.c.version.not_in(versions)))
        else:
            stmt = self._upsert
        result = await conn.execute(stmt, params)
        return result.scalar_one_or_none()

    async def replace_if(
        self, conn: AsyncConnection, ns: str, c: str, k: str, value: str, now: datetime,
        expires: datetime | None, *, versions: list[int] | None, not_versions: list[int] | None = None,
    ) -> int | None:
        """``If-Match``: replace a live entry whose version is in ``versions`` (None = any) and
        not in ``not_versions``; the new version, or None when nothing matched."""
        cond = [in_scope(t, ns, c), t.c.key == k, _live()]
        if versions is not None:
            cond.append(t.c.version.in_(versions))
        if not_versions:
            cond.append(t.c.version.not_in(not_versions))
        stmt = (
            update(t).where(*cond)
            .values(value=value, version=t.c.version + 1, updated_at=now, expires_at=expires)
            .returning(t.c.version)
        )
        result = await conn.execute(stmt, {"now": now})
        return result.scalar_one_or_none()

    async def delete(self, conn: AsyncConnection, ns: str, c: str, k: str) -> None:
        await self._delete.run(conn, {"ns": ns, "c": c, "k": k})

    async def sweep_expired(self, conn: AsyncConnection, now: datetime, batch: int) -> int:
        """Delete up to ``batch`` expired entries of any namespace; how many went."""
        doomed = select(*_PK).where(t.c.expires_at <= _now()).limit(batch)
        stmt = delete(t).where(tuple_(*_PK).in_(doomed))
        result = await conn.execute(stmt, {"now": now})
        return result.rowcount or 0

