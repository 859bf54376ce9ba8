"""A namespace's data, per capability: what export, import and delete-namespace walk.

Each capability describes its part with a ``NamespaceData`` (``Capability.data``). The default,
``TableData``, is its tables: the rows whose ``namespace`` column is the namespace. A capability
whose data lives elsewhere too (file bytes in chunks, a bucket or a directory; a table per vector
collection; checkpoint rows keyed by their thread's id) overrides what differs.

Rules: a delete runs in bounded batches, each its own write transaction (SQLite: ``BEGIN
IMMEDIATE``), so it never holds a write lock for long, and yields what each batch deleted once it
is committed; stopped at any point and run again, it finishes what is left. An export reads one
connection given to it (one snapshot, chosen by the caller) a bounded part at a time.
``delete_namespace`` reads which capabilities there are from the gateway's registry.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sqlalchemy import Table, delete, insert, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.db.databases import SQLITE_BEGIN_OPTION

if TYPE_CHECKING:
    from app.core.state import GatewayState

S = TypeVar("S")

Deleted = dict[str, int]
"""What one batch of a delete removed: counts by what they count (a table, ``bytes``, ...)."""

DEFAULT_BATCH = 500


@dataclass(frozen=True)
class Rows:
    """A bounded part of a namespace's export: rows of one table, as dicts of column values
    (Python values as the table's types read them), without their ``namespace`` column."""

    table: str
    rows: tuple[dict[str, Any], ...]


def writer(engine: AsyncEngine) -> AsyncEngine:
    """``engine`` whose transactions take SQLite's write lock up front (``BEGIN IMMEDIATE``)."""
    return engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})


class NamespaceData(Generic[S]):
    """How one capability's data of one namespace is exported, imported and deleted.

    ``service`` is what the capability's lifecycle built; ``engine`` / ``conn`` are of the
    capability's database. Subclasses implement what their data needs; what they leave out
    raises ``NotImplementedError`` naming it.
    """

    def export(self, service: S, conn: AsyncConnection, namespace: str, batch: int) -> AsyncIterator[Rows]:
        """Every item of ``namespace``, ``batch`` rows at most a part, read through ``conn``."""
        raise NotImplementedError(f"{type(self).__name__} does not export yet (issue #47)")

    async def load(self, service: S, conn: AsyncConnection, namespace: str, part: Rows) -> int:
        """Write an exported ``part`` into ``namespace`` through ``conn`` (the caller's
        transaction); how many rows."""
        raise NotImplementedError(f"{type(self).__name__} does not import yet (issue #47)")

    def delete(self, service: S, engine: AsyncEngine, namespace: str, batch: int) -> AsyncGenerator[Deleted, None]:
        """Delete every item of ``namespace``, ``batch`` at most a transaction; yields each
        committed batch's counts."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete a namespace")


class TableData(NamespaceData[Any]):
    """The default: a namespace's data is the rows of ``tables`` whose ``namespace`` is it."""

    def __init__(self, tables: Sequence[Table]) -> None:
        self.tables = tuple(tables)
        self._by_name = {table.name: table for table in self.tables}

    async def export(self, service: Any, conn: AsyncConnection, namespace: str, batch: int) -> AsyncIterator[Rows]:
        for table in self.tables:
            async for part in export_table(conn, table, namespace, batch):
                yield part

    async def load(self, service: Any, conn: AsyncConnection, namespace: str, part: Rows) -> int:
        table = self._by_name.get(part.table)
        if table is None:
            raise ValueError(f"no table {part.table!r} here (tables: {', '.join(self._by_name)})")
        return await load_rows(conn, table, namespace, part.rows)

    async def delete(self, service: Any, engine: AsyncEngine, namespace: str, batch: int) -> AsyncGenerator[Deleted, None]:
        for table in self.tables:
            async for deleted in delete_rows(engine, table, namespace, batch):
                yield deleted


async def export_table(conn: AsyncConnection, table: Table, namespace: str, batch: int) -> AsyncIterator[Rows]:
    """The rows of ``namespace`` in ``table`` in primary-key order, ``batch`` a part (keyset pages)."""
    key = list(table.primary_key.columns)
    columns = [c for c in table.c if c.name != "namespace"]
    after: tuple[Any, ...] | None = None
    while True:
        query = select(*columns).where(table.c.namespace == namespace).order_by(*key).limit(batch)
        if after is not None:
            query = query.where(tuple_(*key) > tuple_(*after))
        rows = [dict(row) for row in (await conn.execute(query)).mappings()]
        if not rows:
            return
        yield Rows(table.name, tuple(rows))
        if len(rows) < batch:
            return
        last = rows[-1]
        after = tuple(namespace if c.name == "namespace" else last[c.name] for c in key)


async def load_rows(conn: AsyncConnection, table: Table, namespace: str, rows: Sequence[dict[str, Any]]) -> int:
    """Insert exported ``rows`` into ``table`` under ``namespace``; how many."""
    if not rows:
        return 0
    await conn.execute(insert(table), [{**row, "namespace": namespace} for row in rows])
    return len(rows)


async def delete_rows(engine: AsyncEngine, table: Table, namespace: str, batch: int) -> AsyncGenerator[Deleted, None]:
    """Delete the rows of ``namespace`` from ``table``, ``batch`` a transaction."""
    key = list(table.primary_key.columns)
    while True:
        chosen = select(*key).where(table.c.namespace == namespace).limit(batch)
        async with writer(engine).begin() as conn:
            result = await conn.execute(delete(table).where(table.c.namespace == namespace, tuple_(*key).in_(chosen)))
        count = result.rowcount or 0
        if count:
            yield {table.name: count}
        if count < batch:
            return


@dataclass
class DeleteReport:
    """What ``delete_namespace`` deleted, by capability; ``done`` once nothing is left."""

    namespace: str
    deleted: dict[str, Deleted] = field(default_factory=dict)
    done: bool = False

    def add(self, capability: str, counts: Deleted) -> None:
        mine = self.deleted.setdefault(capability, {})
        for what, n in counts.items():
            mine[what] = mine.get(what, 0) + n


async def delete_namespace(
    state: GatewayState, namespace: str, *, batch: int = DEFAULT_BATCH, max_batches: int | None = None
) -> DeleteReport:
    """Delete ``namespace``'s data in every capability the gateway serves (``state.capabilities``,
    with the services their lifecycles built), ``batch`` items a transaction. With
    ``max_batches`` it stops after that many committed batches (``done`` False): run it again to
    go on from there."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    report = DeleteReport(namespace)
    batches = 0
    for capability in state.capabilities:
        report.deleted.setdefault(capability.name, {})
        engine = state.databases.engine(capability.database)
        steps = capability.namespace_data.delete(state.services[capability.name], engine, namespace, batch)
        async with aclosing(steps):
            async for counts in steps:
                report.add(capability.name, counts)
                batches += 1
                if max_batches is not None and batches >= max_batches:
                    return report
    report.done = True
    return report
