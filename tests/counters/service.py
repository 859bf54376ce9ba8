"""The rules of the counters capability; built once per process by its lifecycle, no request state."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.errors import NotFound
from app.core.http.pagination import Page, decode_cursor, encode_cursor
from tests.counters.repository import CountersRepository
from tests.counters.schemas import Counter


class CountersService:
    def __init__(self, repository: CountersRepository) -> None:
        self.repo = repository

    async def increment(self, conn: AsyncConnection, namespace: str, name: str, n: int) -> Counter:
        return Counter(name=name, value=await self.repo.increment(conn, namespace, name, n))

    async def get(self, conn: AsyncConnection, namespace: str, name: str) -> Counter:
        value = await self.repo.get(conn, namespace, name)
        if value is None:
            raise NotFound(f"no counter {name!r}")
        return Counter(name=name, value=value)

    async def list(self, conn: AsyncConnection, namespace: str, cursor: str | None, limit: int) -> Page[Counter]:
        after = decode_cursor(cursor, "after")["after"] if cursor else None
        rows = await self.repo.list(conn, namespace, after, limit + 1)
        more = len(rows) > limit
        items = [Counter(name=name, value=value) for name, value in rows[:limit]]
        return Page[Counter](items=items, next_cursor=encode_cursor({"after": items[-1].name}) if more else None)

    async def delete(self, conn: AsyncConnection, namespace: str, name: str) -> None:
        await self.repo.delete(conn, namespace, name)
