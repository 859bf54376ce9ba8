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

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import asyncpg
import asyncpg.exceptions._base as asyncpg_client_errors
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import asyncpg as asyncpg_dialect
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql.selectable import ExecutableReturnsRows

Row = Sequence[Any]
StatementConnection = AsyncConnection | PoolProxiedConnection
"""What a single-statement route gets: a pooled driver connection on PostgreSQL, else SQLAlchemy's."""

observers: list[Callable[[str, Sequence[Any]], None]] = []
"""Called with (SQL, arguments) for every statement sent on the driver path."""


class FixedStatement:
    """A statement run through SQLAlchemy (SQLite, and any connection inside a transaction)."""

    def __init__(self, statement: ExecutableReturnsRows) -> None:
        self.statement = statement

    async def first(self, conn: StatementConnection, params: Mapping[str, Any]) -> Row | None:
        return (await _sqlalchemy(conn).execute(self.statement, params)).first()

    async def all(self, conn: StatementConnection, params: Mapping[str, Any]) -> list[Row]:
        return list((await _sqlalchemy(conn).execute(self.statement, params)).all())

    async def rowcount(self, conn: StatementConnection, params: Mapping[str, Any]) -> int:
        return (await _sqlalchemy(conn).execute(self.statement, params)).rowcount or 0


def _sqlalchemy(conn: StatementConnection) -> AsyncConnection:
    """A statement run through SQLAlchemy needs SQLAlchemy's connection, never a driver's."""
    if not isinstance(conn, AsyncConnection):
        raise TypeError("a FixedStatement got a driver connection; only _AsyncpgStatement takes one")
    return conn


class _AsyncpgStatement(FixedStatement):
    """The statement compiled once for asyncpg; sent with asyncpg on a pooled driver connection."""

    # SQLAlchemy's dialect classes carry no annotations on __init__ and import_dbapi.
    _dialect: Dialect = asyncpg_dialect.dialect(dbapi=asyncpg_dialect.dialect.import_dbapi())  # type: ignore[no-untyped-call]

    def __init__(self, statement: ExecutableReturnsRows) -> None:
        super().__init__(statement)
        compiled = statement.compile(dialect=self._dialect)
        for column in getattr(statement, "selected_columns", ()) or getattr(statement, "_returning", ()):
            if column.type.result_processor(self._dialect, None) is not None:
                raise TypeError(f"fixed statements return driver values; {column} needs result processing")
        if "POSTCOMPILE" in compiled.string:  # an expanding IN: its SQL depends on each call's values
            raise TypeError("fixed statements need a fixed number of bound values; use StatementShapes")
        self.sql = compiled.string
        # (name, whether the caller must give it, the value the statement itself carries, the
        # type's bind processor), in $n order
        self._binds: list[tuple[str, bool, Any, Callable[[Any], Any] | None]] = [
            (b.key, b.required, b.value, b.type.bind_processor(self._dialect))
            for b in (compiled.binds[name] for name in compiled.positiontup or ())
        ]

    def _args(self, params: Mapping[str, Any]) -> list[Any]:
        args = []
        for name, required, own, process in self._binds:
            value = params[name] if required else params.get(name, own)  # (a missing one: KeyError, as SQLAlchemy)
            args.append(process(value) if process is not None and value is not None else value)
        return args

    async def _send(self, conn: PoolProxiedConnection, method: str, params: Mapping[str, Any]) -> Any:
        args = self._args(params)
        for observe in observers:
            observe(self.sql, args)
        try:
            return await getattr(conn.driver_connection, method)(self.sql, *args)
        except Exception as exc:  # translated as SQLAlchemy would, then raised
            raise translate_driver_error(conn, exc, self.sql) from exc

    async def first(self, conn: StatementConnection, params: Mapping[str, Any]) -> Row | None:
        if isinstance(conn, AsyncConnection):
            return await super().first(conn, params)
        row: Row | None = await self._send(conn, "fetchrow", params)  # an asyncpg Record
        return row

    async def all(self, conn: StatementConnection, params: Mapping[str, Any]) -> list[Row]:
        if isinstance(conn, AsyncConnection):
            return await super().all(conn, params)
        rows: list[Row] = await self._send(conn, "fetch", params)
        return rows

    async def rowcount(self, conn: StatementConnection, params: Mapping[str, Any]) -> int:
        if isinstance(conn, AsyncConnection):
            return await super().rowcount(conn, params)
        status = await self._send(conn, "execute", params)  # e.g. "DELETE 3", "INSERT 0 1"
        last = status.rsplit(" ", 1)[-1] if status else ""
        return int(last) if last.isdigit() else 0


def _connection_suspect(exc: Exception) -> bool:
    """Whether the connection may be unusable after ``exc``. Not after an error the server
    answered for this statement alone (a constraint, a type) or a value asyncpg refused to
    encode before sending anything; after anything else (a lost socket, a timeout, a protocol
    state asyncpg gave up on, the server shutting down) it is."""
    if isinstance(exc, asyncpg.PostgresError):
        return (exc.sqlstate or "").startswith(("08", "57P"))
    return not isinstance(exc, asyncpg_client_errors.DataError)  # (the client-side one, not SQLSTATE 22)


def translate_driver_error(conn: PoolProxiedConnection, exc: Exception, sql: str | None = None) -> Exception:
    """What SQLAlchemy's ``Connection`` would have raised for ``exc``, an error of a statement
    sent with asyncpg on the pooled ``conn`` (here and in vector search), with its side effects.

    asyncpg's errors become SQLAlchemy's ``DBAPIError`` (others, such as a timeout, stay as
    they are), so the app answers both paths alike (503 for an unreachable or hung database).
    A connection that may be broken is never pooled again; when the server dropped it, every
    connection opened before it is recycled too, as after a restart or a failover.
    """
    adapter = conn.dbapi_connection
    dialect = _AsyncpgStatement._dialect
    try:
        adapter._handle_exception(exc)  # type: ignore[union-attr]  # raises the DBAPI-level error, or exc
    except dialect.loaded_dbapi.Error as dbapi_error:
        disconnect = bool(dialect.is_disconnect(dbapi_error, adapter, None))
        invalidated = disconnect or _connection_suspect(exc)
        if disconnect:
            pool = getattr(conn, "_pool", None)
            if pool is not None:
                pool._invalidate(conn, dbapi_error, _checkin=False)  # what Connection does on a disconnect
        if invalidated:
            conn.invalidate(dbapi_error)
        return sa_exc.DBAPIError.instance(
            sql, None, dbapi_error, dialect.loaded_dbapi.Error, connection_invalidated=invalidated
        )
    except Exception as other:  # noqa: BLE001 (not asyncpg's: returned unchanged)
        if _connection_suspect(other):
            conn.invalidate(other)
        return other
    return exc  # (not reached: _handle_exception always raises)


def fixed_statements(dialect: str) -> type[FixedStatement]:
    """What builds fixed statements on ``dialect`` (``sqlite`` or ``postgresql``), chosen once."""
    return _AsyncpgStatement if dialect == "postgresql" else FixedStatement


class StatementShapes:
    """The fixed statement of each shape ``build(*shape)`` makes, built on first use.

    The ``keep`` most recently used shapes are kept, so a client sending rare shapes (an
    ``If-Match`` listing dozens of ETags) cannot push the common ones out for good; a shape
    not kept is built again when it comes back (correct, about 0.3 ms slower).
    """

    def __init__(self, fixed: type[FixedStatement], build: Callable[..., ExecutableReturnsRows], keep: int = 64) -> None:
        self._fixed, self._build, self._keep = fixed, build, keep
        self._shapes: OrderedDict[Hashable, FixedStatement] = OrderedDict()

    def __call__(self, *shape: Hashable) -> FixedStatement:
        statement = self._shapes.get(shape)
        if statement is None:
            statement = self._shapes[shape] = self._fixed(self._build(*shape))
            if len(self._shapes) > self._keep:
                self._shapes.popitem(last=False)
        else:
            self._shapes.move_to_end(shape)
        return statement
