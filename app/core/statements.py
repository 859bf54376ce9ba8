"""Fixed statements: the hot, unchanging SQL of a capability, run the cheapest way its backend allows.

SQLAlchemy's ``execute`` costs about 50 us of CPU per statement on top of the driver (a greenlet
hop, an execution context, result wrapping): a sixth of a kv read's CPU, measured in-process.
A ``FixedStatement`` is built once, at start-up, from a SQLAlchemy statement whose every value is
a bound parameter. On PostgreSQL it is compiled then and sent with asyncpg on the request's own
connection (the way vector search runs), so the connection and its transaction, if any, stay
the request's. Elsewhere it is executed through SQLAlchemy like any other statement.

Rows come back as the driver returns them, without SQLAlchemy's result processing, so fixed
statements select text, numbers and keys only (checked when they are built).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import asyncpg as asyncpg_dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ClauseElement

Row = Sequence[Any]


class FixedStatement:
    """A statement run through SQLAlchemy (the portable path)."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement

    async def first(self, conn: AsyncConnection, params: Mapping[str, Any]) -> Row | None:
        return (await conn.execute(self.statement, params)).first()

    async def all(self, conn: AsyncConnection, params: Mapping[str, Any]) -> list[Row]:
        return list((await conn.execute(self.statement, params)).all())

    async def run(self, conn: AsyncConnection, params: Mapping[str, Any]) -> None:
        await conn.execute(self.statement, params)


class _AsyncpgStatement(FixedStatement):
    """The same statement compiled once for asyncpg and sent on the driver connection."""

    _dialect = asyncpg_dialect.dialect()

    def __init__(self, statement: ClauseElement) -> None:
        super().__init__(statement)
        compiled = statement.compile(dialect=self._dialect)
        for column in getattr(statement, "selected_columns", None) or getattr(statement, "_returning", ()):
            if column.type.result_processor(self._dialect, None) is not None:
                raise TypeError(f"fixed statements return driver values; {column} needs result processing")
        self.sql = compiled.string
        binds = [compiled.binds[name] for name in compiled.positiontup or ()]
        # (name, value when the statement itself carries it, the type's bind processor)
        self._binds: list[tuple[str, Any, Callable[[Any], Any] | None]] = [
            (b.key, b.value, b.type.bind_processor(self._dialect)) for b in binds
        ]

    def _args(self, params: Mapping[str, Any]) -> list[Any]:
        args = []
        for name, own, process in self._binds:
            value = params[name] if name in params else own
            args.append(process(value) if process is not None and value is not None else value)
        return args

    async def _call(self, conn: AsyncConnection, method: str, params: Mapping[str, Any]) -> Any:
        sync = conn.sync_connection
        # The pooled connection is already checked out: read it without a greenlet hop, unless
        # it was invalidated and SQLAlchemy must reconnect (which needs one).
        pooled = sync.connection if sync is not None and not sync.invalidated else await conn.get_raw_connection()
        adapter = pooled.dbapi_connection
        if not getattr(adapter, "autocommit", False):
            # In a transaction SQLAlchemy begins lazily, on its own first statement: let it.
            result = await conn.execute(self.statement, params)
            return result.first() if method == "fetchrow" else list(result.all()) if method == "fetch" else None
        try:
            return await getattr(pooled.driver_connection, method)(self.sql, *self._args(params))
        except Exception as exc:  # noqa: BLE001 (translated as SQLAlchemy would, then raised)
            raise _translated(conn, pooled, adapter, exc, self.sql) from exc

    async def first(self, conn: AsyncConnection, params: Mapping[str, Any]) -> Row | None:
        return await self._call(conn, "fetchrow", params)

    async def all(self, conn: AsyncConnection, params: Mapping[str, Any]) -> list[Row]:
        return await self._call(conn, "fetch", params)

    async def run(self, conn: AsyncConnection, params: Mapping[str, Any]) -> None:
        await self._call(conn, "execute", params)


def _translated(conn: AsyncConnection, pooled: Any, adapter: Any, exc: Exception, sql: str) -> Exception:
    """``exc`` from asyncpg as the ``DBAPIError`` SQLAlchemy would have raised, so the app's
    error handling (503 for an unreachable database) is the same on both paths; a connection
    the server dropped is invalidated, never pooled again."""
    dialect = conn.dialect
    try:
        adapter._handle_exception(exc)  # raises the DBAPI-level error SQLAlchemy's adapter maps it to
    except Exception as dbapi_error:  # noqa: BLE001
        invalidated = bool(dialect.is_disconnect(dbapi_error, adapter, None))
        if invalidated:
            pooled.invalidate()
        return sa_exc.DBAPIError.instance(
            sql, None, dbapi_error, dialect.loaded_dbapi.Error, connection_invalidated=invalidated
        )
    return exc  # (unreachable: _handle_exception always raises)


def fixed_statements(dialect: str) -> type[FixedStatement]:
    """What builds fixed statements on ``dialect`` (``sqlite`` or ``postgresql``), chosen once."""
    return _AsyncpgStatement if dialect == "postgresql" else FixedStatement
