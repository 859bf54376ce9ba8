"""Fixed statements: the SQL of kv and records, built once and run the cheapest way the backend allows.

Every kv request and every records request but a batch is one statement. On PostgreSQL such a
request borrows a connection from the database's SQLAlchemy pool without a SQLAlchemy
``Connection`` around it (``app.core.dependencies``) and sends its statement with asyncpg,
compiled once at start-up: SQLAlchemy's connection and execute layers cost about 60 us of CPU
per request, a quarter of a kv read (measured in-process, ``docs/benchmarks.md``). Statements
without BEGIN run in autocommit, which for one statement is the same thing as a transaction.
On SQLite, and in a transaction, the same ``FixedStatement`` runs through SQLAlchemy.

A statement whose shape depends on the request (which bounds a page has, how many ETags an
``If-Match`` lists) is one fixed statement per shape (``StatementShapes``).

Rows come back as the driver returns them, without SQLAlchemy's result processing, so fixed
statements select text, numbers and keys only (checked when they are built). SQLAlchemy's
events do not see the driver path; ``observers`` do (the scoping test listens there).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import asyncpg
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import asyncpg as asyncpg_dialect
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ClauseElement

Row = Sequence[Any]
StatementConnection = AsyncConnection | PoolProxiedConnection
"""What a single-statement route gets: a pooled driver connection on PostgreSQL, else SQLAlchemy's."""

observers: list[Callable[[str, Sequence[Any]], None]] = []
"""Called with (SQL, arguments) for every statement sent on the driver path."""


class FixedStatement:
    """A statement run through SQLAlchemy (SQLite, and any connection inside a transaction)."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement

    async def first(self, conn: StatementConnection, params: Mapping[str, Any]) -> Row | None:
        return (await conn.execute(self.statement, params)).first()  # type: ignore[union-attr]

    async def all(self, conn: StatementConnection, params: Mapping[str, Any]) -> list[Row]:
        return list((await conn.execute(self.statement, params)).all())  # type: ignore[union-attr]

    async def rowcount(self, conn: StatementConnection, params: Mapping[str, Any]) -> int:
        return (await conn.execute(self.statement, params)).rowcount or 0  # type: ignore[union-attr]


class _AsyncpgStatement(FixedStatement):
    """The statement compiled once for asyncpg; sent with asyncpg on a pooled driver connection."""

    _dialect: Dialect = asyncpg_dialect.dialect(dbapi=asyncpg_dialect.dialect.import_dbapi())

    def __init__(self, statement: ClauseElement) -> None:
        super().__init__(statement)
        compiled = statement.compile(dialect=self._dialect)
        for column in getattr(statement, "selected_columns", None) or getattr(statement, "_returning", ()):
            if column.type.result_processor(self._dialect, None) is not None:
                raise TypeError(f"fixed statements return driver values; {column} needs result processing")
        if "POSTCOMPILE" in compiled.string:  # an expanding IN: its SQL depends on each call's values
            raise TypeError("fixed statements need a fixed number of bound values; use StatementShapes")
        self.sql = compiled.string
        # (name, the value the statement itself carries, the type's bind processor), in $n order
        self._binds: list[tuple[str, Any, Callable[[Any], Any] | None]] = [
            (b.key, b.value, b.type.bind_processor(self._dialect))
            for b in (compiled.binds[name] for name in compiled.positiontup or ())
        ]

    def _args(self, params: Mapping[str, Any]) -> list[Any]:
        args = []
        for name, own, process in self._binds:
            value = params.get(name, own)
            args.append(process(value) if process is not None and value is not None else value)
        return args

    async def _send(self, conn: PoolProxiedConnection, method: str, params: Mapping[str, Any]) -> Any:
        args = self._args(params)
        for observe in observers:
            observe(self.sql, args)
        try:
            return await getattr(conn.driver_connection, method)(self.sql, *args)
        except Exception as exc:  # translated as SQLAlchemy would, then raised
            raise _translated(conn, exc, self.sql) from exc

    async def first(self, conn: StatementConnection, params: Mapping[str, Any]) -> Row | None:
        if isinstance(conn, AsyncConnection):
            return await super().first(conn, params)
        return await self._send(conn, "fetchrow", params)

    async def all(self, conn: StatementConnection, params: Mapping[str, Any]) -> list[Row]:
        if isinstance(conn, AsyncConnection):
            return await super().all(conn, params)
        return await self._send(conn, "fetch", params)

    async def rowcount(self, conn: StatementConnection, params: Mapping[str, Any]) -> int:
        if isinstance(conn, AsyncConnection):
            return await super().rowcount(conn, params)
        status = await self._send(conn, "execute", params)  # e.g. "DELETE 3", "INSERT 0 1"
        last = status.rsplit(" ", 1)[-1] if status else ""
        return int(last) if last.isdigit() else 0


def _connection_suspect(exc: Exception) -> bool:
    """Whether the connection may be unusable after ``exc``: anything but an error the server
    answered for this statement alone (a constraint, a type) leaves it suspect."""
    if isinstance(exc, asyncpg.PostgresError):
        return (exc.sqlstate or "").startswith(("08", "57P"))  # connection exception, shutdown
    return True  # client-side: a lost socket, a timeout, a protocol state asyncpg gave up on


def _translated(conn: PoolProxiedConnection, exc: Exception, sql: str) -> Exception:
    """``exc`` from asyncpg as the ``DBAPIError`` SQLAlchemy would have raised, so the app's
    error handling is the same on both paths; a connection that may be broken is invalidated
    (never pooled again) and the error marked so, which the app answers with a 503."""
    adapter = conn.dbapi_connection
    dialect = _AsyncpgStatement._dialect
    try:
        adapter._handle_exception(exc)  # type: ignore[union-attr]  # raises the DBAPI-level error
    except Exception as dbapi_error:  # noqa: BLE001
        invalidated = _connection_suspect(exc) or bool(dialect.is_disconnect(dbapi_error, adapter, None))  # type: ignore[arg-type]
        if invalidated:
            conn.invalidate()
        return sa_exc.DBAPIError.instance(
            sql, None, dbapi_error, dialect.loaded_dbapi.Error, connection_invalidated=invalidated
        )
    return exc  # (not reached: _handle_exception always raises)


def fixed_statements(dialect: str) -> type[FixedStatement]:
    """What builds fixed statements on ``dialect`` (``sqlite`` or ``postgresql``), chosen once."""
    return _AsyncpgStatement if dialect == "postgresql" else FixedStatement


class StatementShapes:
    """The fixed statement of each shape ``build(*shape)`` makes, built on first use.

    At most ``keep`` shapes are kept; a request with a rarer shape (an ``If-Match`` listing
    dozens of ETags) gets its statement built for it alone.
    """

    def __init__(self, fixed: type[FixedStatement], build: Callable[..., ClauseElement], keep: int = 64) -> None:
        self._fixed, self._build, self._keep = fixed, build, keep
        self._shapes: dict[Hashable, FixedStatement] = {}

    def __call__(self, *shape: Hashable) -> FixedStatement:
        statement = self._shapes.get(shape)
        if statement is None:
            statement = self._fixed(self._build(*shape))
            if len(self._shapes) < self._keep:
                self._shapes[shape] = statement
        return statement
