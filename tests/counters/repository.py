"""All SQL of the counters capability; every statement starts from ``in_scope``."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.db.scoping import in_scope
from app.core.db.upsert import insert_builder
from tests.counters.models import counters


class CountersRepository:
    def __init__(self, dialect: str) -> None:
        self.insert = insert_builder(dialect)

    async def increment(self, conn: AsyncConnection, namespace: str, name: str, n: int) -> int:
        """Add ``n`` (a new counter starts at 0); the new value."""
        statement = self.insert(counters).values(namespace=namespace, name=name, value=n)
        statement = statement.on_conflict_do_update(
            index_elements=["namespace", "name"], set_={"value": counters.c.value + statement.excluded.value}
        ).returning(counters.c.value)
        return (await conn.execute(statement)).scalar_one()

    async def get(self, conn: AsyncConnection, namespace: str, name: str) -> int | None:
        query = select(counters.c.value).where(in_scope(counters, namespace), counters.c.name == name)
        return (await conn.execute(query)).scalar_one_or_none()

    async def list(self, conn: AsyncConnection, namespace: str, after: str | None, limit: int) -> list[tuple[str, int]]:
        query = select(counters.c.name, counters.c.value).where(in_scope(counters, namespace))
        if after is not None:
            query = query.where(counters.c.name > after)
        rows = await conn.execute(query.order_by(counters.c.name).limit(limit))
        return [(row.name, row.value) for row in rows]

    async def delete(self, conn: AsyncConnection, namespace: str, name: str) -> bool:
        result = await conn.execute(delete(counters).where(in_scope(counters, namespace), counters.c.name == name))
        return bool(result.rowcount)
