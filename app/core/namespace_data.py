"""A namespace's data, per capability: what export, import and delete-namespace walk.

Each capability describes its part with a ``NamespaceData`` (``Capability.data``). The default,
``TableData``, is its tables: the rows whose ``namespace`` column is the namespace. A capability
whose data lives elsewhere too (file bytes in chunks, a bucket or a directory; a table per vector
collection; checkpoint rows keyed by their thread's id) overrides what differs.

Export and import (``app.portability``): ``export`` reads one connection given to it (one
snapshot, chosen by the caller) and yields bounded ``Rows`` whose values are ready for a JSON line
(times ISO 8601, bytes base64, JSON text as its string), and ``Blob``s (file bytes, read when
asked); ``load`` writes a part back under any namespace through the caller's transaction,
validating each line as the API would; ``load_blob`` and ``finish`` do what a part cannot.

Rules: a delete runs in bounded batches, each its own write transaction (SQLite: ``BEGIN
IMMEDIATE``), so it never holds a write lock for long, and yields what each batch deleted once it
is committed; stopped at any point and run again, it finishes what is left. An export reads one
connection given to it (one snapshot, chosen by the caller) a bounded part at a time.
``delete_namespace`` reads which capabilities there are from the gateway's registry.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import orjson
from sqlalchemy import Boolean, DateTime, Float, Integer, LargeBinary, Table, Text, delete, func, insert, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.db.databases import SQLITE_BEGIN_OPTION
from app.core.names import NAME_PATTERN, key_problem

if TYPE_CHECKING:
    from app.core.state import GatewayState

S = TypeVar("S")

Deleted = dict[str, int]
"""What one batch of a delete removed: counts by what they count (a table, ``bytes``, ...)."""

DEFAULT_BATCH = 500


@dataclass(frozen=True)
class Rows:
    """A bounded part of a namespace's export: lines of one part (``table``: the part's name, a
    table's for ``TableData``), as dicts of JSON values, without a ``namespace``."""

    table: str
    rows: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Blob:
    """Bytes a part refers to by their sha256 (a file's), read from the export's snapshot by ``open``."""

    sha256: str
    size: int
    open: Callable[[], AsyncIterator[bytes]]


class RefusedLine(ValueError):
    """A line of a part (or a blob) cannot be imported: the message says why (a 422 naming the member)."""


Context = dict[str, Any]
"""What one import keeps between the parts of one capability (``load``, ``load_blob``, ``finish``)."""


def writer(engine: AsyncEngine) -> AsyncEngine:
    """``engine`` whose transactions take SQLite's write lock up front (``BEGIN IMMEDIATE``)."""
    return engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})


class NamespaceData(Generic[S]):
    """How one capability's data of one namespace is exported, imported and deleted.

    ``service`` is what the capability's lifecycle built; ``engine`` / ``conn`` are of the
    capability's database. Subclasses implement what their data needs; what they leave out
    raises ``NotImplementedError`` naming it.
    """

    parts: tuple[str, ...] = ()
    """The names of the parts ``export`` yields, in the order it yields them."""

    def export(self, service: S, conn: AsyncConnection, namespace: str, batch: int) -> AsyncIterator[Rows | Blob]:
        """Every item of ``namespace``, ``batch`` rows at most a part, read through ``conn``; a
        ``Blob`` follows the ``Rows`` that refer to it."""
        raise NotImplementedError(f"{type(self).__name__} does not export yet (issue #47)")

    async def load(self, service: S, conn: AsyncConnection, namespace: str, part: Rows, ctx: Context | None = None) -> int:
        """Write an exported ``part`` into ``namespace`` through ``conn`` (the caller's
        transaction); how many rows. A bad line raises ``RefusedLine``."""
        raise NotImplementedError(f"{type(self).__name__} does not import yet (issue #47)")

    async def load_blob(self, service: S, namespace: str, sha256: str, data: Callable[[], AsyncIterator[bytes]], ctx: Context) -> None:
        """Store bytes (already checked against ``sha256``) that loaded parts refer to."""
        raise RefusedLine(f"{type(self).__name__} takes no blobs")

    async def finish(self, service: S, engine: AsyncEngine, namespace: str, ctx: Context) -> None:
        """After the capability's last part: what the load left to do (indexes, checks)."""

    def delete(self, service: S, engine: AsyncEngine, namespace: str, batch: int) -> AsyncGenerator[Deleted, None]:
        """Delete every item of ``namespace``, ``batch`` at most a transaction; yields each
        committed batch's counts."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete a namespace")


class TableData(NamespaceData[Any]):
    """The default: a namespace's data is the rows of ``tables`` whose ``namespace`` is it."""

    def __init__(self, tables: Sequence[Table]) -> None:
        self.tables = tuple(tables)
        self._by_name = {str(table.name): table for table in self.tables}
        self.parts = tuple(self._by_name)

    async def export(self, service: Any, conn: AsyncConnection, namespace: str, batch: int) -> AsyncIterator[Rows | Blob]:
        for table in self.tables:
            async for part in export_table(conn, table, namespace, batch):
                yield part

    async def load(self, service: Any, conn: AsyncConnection, namespace: str, part: Rows, ctx: Context | None = None) -> int:
        table = self._by_name.get(part.table)
        if table is None:
            raise RefusedLine(f"no part {part.table!r} here (parts: {', '.join(self._by_name)})")
        return await load_rows(conn, table, namespace, part.rows)

    async def delete(self, service: Any, engine: AsyncEngine, namespace: str, batch: int) -> AsyncGenerator[Deleted, None]:
        for table in self.tables:
            async for deleted in delete_rows(engine, table, namespace, batch):
                yield deleted


PAGE_BYTES = 4 * 1024 * 1024
"""About the most bytes of large columns one page of an export reads (at least one row)."""


async def keyset_pages(
    conn: AsyncConnection, columns: Sequence[Any], key: Sequence[Any], where: Sequence[Any], batch: int,
    large: Sequence[Any] = (), from_: Any = None,
) -> AsyncIterator[list[Any]]:
    """``select(*columns).where(*where)`` in ``key`` order, a page at a time: at most ``batch``
    rows and, counting the ``large`` columns' lengths, about ``PAGE_BYTES`` (a value may be MiBs:
    500 of them were too many to hold). Each page is two statements: its keys with the sizes,
    then its rows between two keys."""
    sizes = [func.coalesce(func.length(c), 0) for c in large]
    after: tuple[Any, ...] | None = None
    while True:
        keys = select(*key, *sizes).where(*where).order_by(*key).limit(batch)
        if from_ is not None:
            keys = keys.select_from(from_)
        if after is not None:
            keys = keys.where(tuple_(*key) > tuple_(*after))
        found = (await conn.execute(keys)).all()
        if not found:
            return
        taken, total = 0, 0
        for row in found:
            total += sum(int(n) for n in row[len(key):])
            taken += 1
            if total >= PAGE_BYTES:
                break
        upto = tuple(found[taken - 1][: len(key)])
        query = select(*columns).where(*where, tuple_(*key) <= tuple_(*upto)).order_by(*key)
        if from_ is not None:
            query = query.select_from(from_)
        if after is not None:
            query = query.where(tuple_(*key) > tuple_(*after))
        yield list((await conn.execute(query)).mappings())
        if taken == len(found) < batch:
            return
        after = upto


def large_columns(table: Table) -> list[Any]:
    """The columns whose values may be large: text and bytes without a length."""
    return [c for c in table.c if isinstance(c.type, LargeBinary | Text) and c.name != "namespace"]


async def export_table(conn: AsyncConnection, table: Table, namespace: str, batch: int) -> AsyncIterator[Rows]:
    """The rows of ``namespace`` in ``table`` in primary-key order, ``batch`` (or ``PAGE_BYTES``) a part."""
    columns = [c for c in table.c if c.name != "namespace"]
    # the key without ``namespace`` (fixed by the WHERE): SQLite uses ``(collection, key) > (?, ?)``
    # as a range of the primary key after ``namespace = ?``, but not ``(namespace, collection, key) >
    # (...)``, with which every page scanned the namespace from its start (quadratic in its rows)
    key = [c for c in table.primary_key.columns if c.name != "namespace"] or list(table.primary_key.columns)
    pages = keyset_pages(conn, columns, key, [table.c.namespace == namespace], batch, large_columns(table))
    async for rows in pages:
        yield Rows(str(table.name), tuple(encode_row(table, dict(row)) for row in rows))


async def load_rows(conn: AsyncConnection, table: Table, namespace: str, rows: Sequence[dict[str, Any]]) -> int:
    """Insert exported ``rows`` into ``table`` under ``namespace``; how many."""
    if not rows:
        return 0
    await conn.execute(insert(table), [{**decode_row(table, row), "namespace": namespace} for row in rows])
    return len(rows)


def encode_row(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    """A row of ``table`` as JSON values: times ISO 8601, bytes base64."""
    out: dict[str, Any] = {}
    for name, value in row.items():
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, bytes | bytearray | memoryview):
            value = base64.b64encode(bytes(value)).decode("ascii")
        out[str(name)] = value  # (SQLAlchemy's names are a str subclass, which orjson refuses as a key)
    return out


def _kind(column: Any) -> str:
    t = column.type
    if isinstance(t, DateTime) or isinstance(getattr(t, "impl", None), DateTime):
        return "time"
    if isinstance(t, LargeBinary):
        return "bytes"
    if isinstance(t, Boolean):
        return "bool"
    if isinstance(t, Integer):
        return "int"
    if isinstance(t, Float):
        return "float"
    return "str"


def decode_row(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    """An exported line of ``table`` as column values, each checked against its column: exactly
    the table's columns but ``namespace``, types as declared, NULL only where allowed, and a
    ``value`` column of text must be JSON text (``RefusedLine`` otherwise)."""
    columns = {c.name: c for c in table.c if c.name != "namespace"}
    if set(row) != set(columns):
        raise RefusedLine(f"the line's fields are not {table.name}'s: {sorted(row)} (expected {sorted(columns)})")
    out: dict[str, Any] = {}
    for name, value in row.items():
        column = columns[name]
        if value is None:
            if not column.nullable:
                raise RefusedLine(f"{name} must not be null")
            out[name] = None
            continue
        kind = _kind(column)
        try:
            if kind == "time":
                if not isinstance(value, str):
                    raise TypeError
                parsed = datetime.fromisoformat(value)
                if parsed.tzinfo is None:
                    raise RefusedLine(f"{name}: a time must carry its UTC offset")
                value = parsed
            elif kind == "bytes":
                if not isinstance(value, str):
                    raise TypeError
                value = base64.b64decode(value, validate=True)
            elif kind == "int":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError
            elif kind == "float":
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise TypeError
                value = float(value)
            elif kind == "bool":
                if not isinstance(value, bool):
                    raise TypeError
            elif not isinstance(value, str):
                raise TypeError
            elif (length := getattr(column.type, "length", None)) is not None and len(value) > length:
                raise RefusedLine(f"{name}: longer than {length} characters")
            elif name == "collection" and not re.fullmatch(NAME_PATTERN, value):
                raise RefusedLine(f"collection {value!r:.80} is not a collection name")
            elif name == "key" and (problem := key_problem(value)):
                raise RefusedLine(f"key {value!r:.80}: {problem}")
            elif name == "value":
                orjson.loads(value)  # JSON text the API returns verbatim must be JSON
        except (TypeError, ValueError, binascii.Error, orjson.JSONDecodeError) as exc:
            if isinstance(exc, RefusedLine):
                raise
            raise RefusedLine(f"{name}: {value!r:.80} is not a valid {kind}") from None
        out[name] = value
    return out


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
