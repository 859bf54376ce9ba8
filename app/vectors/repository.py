"""All SQL of the vectors registry: collections and idempotency keys (vectors database).

Every statement starts from ``in_scope``. The points themselves live in per-collection tables
that only a registry row names; their SQL is the vector backends' (the steps shared in ``backend.py``,
the dialect in ``pgvector.py`` and ``sqlite_vec.py``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, func, insert, literal, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.db.scoping import in_scope
from app.vectors.models import vector_collections as vc
from app.vectors.models import vector_idempotency as vi


async def find_collection(
    session: AsyncConnection, namespace: str, collection: str, *, lock: bool = False
) -> Row[Any] | None:
    stmt = select(vc).where(in_scope(vc, namespace, collection))
    if lock:
        stmt = stmt.with_for_update(read=True)
    return (await session.execute(stmt)).first()


async def insert_collection(session: AsyncConnection, **values: Any) -> int | None:
    """The new registry row's id, or ``None`` when the name was taken concurrently."""
    try:
        async with session.begin_nested():
            new_id: int = (await session.execute(insert(vc).values(**values).returning(vc.c.id))).scalar_one()
            return new_id
    except IntegrityError:
        return None


async def count_collections_locked(session: AsyncConnection, namespace: str) -> int:
    """The namespace's collections, counted under the namespace's transaction lock (PostgreSQL's
    advisory lock on its name; SQLite writes one at a time), held until the caller's transaction
    ends: creates at the same moment are counted one after another."""
    if session.dialect.name == "postgresql":
        key = func.hashtextextended(literal("vector_collections:" + namespace), 0)
        await session.execute(select(func.pg_advisory_xact_lock(key)))
    stmt = select(func.count()).select_from(vc).where(in_scope(vc, namespace))
    return int((await session.execute(stmt)).scalar_one())


async def page_of_collections(
    session: AsyncConnection, namespace: str, after: str | None, limit: int
) -> list[Row[Any]]:
    stmt = select(vc).where(in_scope(vc, namespace)).order_by(vc.c.collection).limit(limit)
    if after is not None:
        stmt = stmt.where(vc.c.collection > after)
    return list((await session.execute(stmt)).all())


async def delete_collection(session: AsyncConnection, namespace: str, collection: str) -> None:
    """The registry row and its idempotency keys."""
    await session.execute(delete(vc).where(in_scope(vc, namespace, collection)))
    await session.execute(delete(vi).where(in_scope(vi, namespace, collection)))


async def forget_keys_before(session: AsyncConnection, namespace: str, collection: str, before: datetime) -> None:
    await session.execute(delete(vi).where(in_scope(vi, namespace, collection), vi.c.created_at < before))


async def claim_key(
    session: AsyncConnection, namespace: str, collection: str, key: str, request_hash: str, now: datetime
) -> bool:
    """Record ``key`` for this request; ``False`` when an earlier request holds it."""
    try:
        async with session.begin_nested():
            await session.execute(
                insert(vi).values(
                    namespace=namespace, collection=collection, idempotency_key=key,
                    request_hash=request_hash, response=None, created_at=now,
                )
            )
        return True
    except IntegrityError:
        return False


async def claimed_key(
    session: AsyncConnection, namespace: str, collection: str, key: str
) -> Row[Any, Any] | None:
    """(request_hash, response) recorded for ``key``."""
    query = select(vi.c.request_hash, vi.c.response).where(
        in_scope(vi, namespace, collection), vi.c.idempotency_key == key
    )
    return (await session.execute(query)).first()


async def record_answer(session: AsyncConnection, namespace: str, collection: str, key: str, response: str) -> None:
    await session.execute(
        update(vi)
        .where(in_scope(vi, namespace, collection), vi.c.idempotency_key == key)
        .values(response=response)
    )
