"""All SQL of auth: the keys table (metadata database). Rules live in ``app.auth.service``."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import Row, RowMapping, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth.models import api_keys


async def insert_key(
    conn: AsyncConnection, key_id: str, secret_hash: str, pattern: str, scopes: list[str], description: str,
    created_at: datetime,
) -> None:
    await conn.execute(
        insert(api_keys).values(
            key_id=key_id, secret_hash=secret_hash, namespace_pattern=pattern,
            scopes=json.dumps(scopes), description=description, created_at=created_at,
        )
    )


async def page_of_keys(conn: AsyncConnection, after: str | None, limit: int) -> list[RowMapping]:
    query = select(api_keys).order_by(api_keys.c.key_id).limit(limit)
    if after:
        query = query.where(api_keys.c.key_id > after)
    return list((await conn.execute(query)).mappings().all())


async def revoke(conn: AsyncConnection, key_id: str, at: datetime) -> bool:
    """Revoke an active key; False when there is none with that id."""
    result = await conn.execute(
        update(api_keys).where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None)).values(revoked_at=at)
    )
    return result.rowcount > 0


async def revocation_state(conn: AsyncConnection) -> tuple[object, ...]:
    row = (await conn.execute(select(func.count(api_keys.c.revoked_at), func.max(api_keys.c.revoked_at)))).one()
    return tuple(row)


async def key_for_check(conn: AsyncConnection, key_id: str) -> Row[Any, Any, Any, Any] | None:
    """What checking a presented key needs: its hash, pattern, scopes and revocation."""
    query = select(
        api_keys.c.secret_hash, api_keys.c.namespace_pattern, api_keys.c.scopes, api_keys.c.revoked_at
    ).where(api_keys.c.key_id == key_id)
    return (await conn.execute(query)).first()
