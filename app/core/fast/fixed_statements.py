"""Fixed statements: SQL built once, run on whatever connection the route was handed.

A repository builds its statements with ``fixed_statements(dialect)`` once, at start-up. On a
SQLAlchemy connection (the plain path, any transaction) a fixed statement runs through
SQLAlchemy; on the connection a ``@fast(one_statement=...)`` route is handed
(``app.core.fast.one_statement``) it is sent with the driver, compiled once: asyncpg on a pooled
connection in autocommit, aiosqlite in one hand-off to its thread, or SQLite on the loop's
thread (``app.core.fast.inline_sqlite``). A statement whose shape depends on the request is one
fixed statement per shape (``StatementShapes``).

The rules, enforced: a fixed statement returns only driver-ready types (a result column whose
type needs SQLAlchemy's processing is refused when it is built: ``DriverResultTypeError``); a
one-statement connection runs one statement (in strict mode, ``GATEWAY_STRICT_STATEMENTS=1``,
which the tests set, a second raises ``SecondStatementError``); a driver error is raised as
SQLAlchemy would raise it, so both paths answer alike. SQLAlchemy's events do not see the driver
path; ``observers`` do (the scoping test listens there).
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import asyncpg
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import asyncpg as asyncpg_dialect
from sqlalchemy.dialects.sqlite import aiosqlite as aiosqlite_dialect
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.selectable import ExecutableReturnsRows

from app.core.db.sqlite import SQLITE  # first: the sqlite3 module aiosqlite must import

import aiosqlite  # (after the line above, so it imports that sqlite3)
from app.core.fast.inline_sqlite import InlineConnection
from app.core.fences.sqlalchemy_ import raise_as_dbapi_error, recycle_pool_generation

Row = Sequence[Any]
StatementConnection = AsyncConnection | PoolProxiedConnection | InlineConnection
"""What a fixed statement runs on: SQLAlchemy's connection, a pooled driver connection, or an
inline statement on SQLite (``app.core.fast.inline_sqlite``)."""

observers: list[Callable[[str, Sequence[Any]], None]] = []
"""Called with (SQL, arguments) for every statement sent on the driver path."""

# SQLAlchemy's dialect classes carry no annotations on __init__ and import_dbapi.
ASYNCPG_DIALECT: Dialect = asyncpg_dialect.dialect(dbapi=asyncpg_dialect.dialect.import_dbapi())  # type: ignore[no-untyped-call]
AIOSQLITE_DIALECT: Dialect = aiosqlite_dialect.dialect(dbapi=aiosqlite_dialect.dialect.import_dbapi())

STRICT = os.environ.get("GATEWAY_STRICT_STATEMENTS", "") not in ("", "0")
"""Whether one-statement connections check that they run one statement (the tests' setting)."""


class DriverResultTypeError(TypeError):
    """A fixed statement returns a column whose type the driver path cannot process."""


class SecondStatementError(AssertionError):
    """A one-statement connection was asked to run a second statement (strict mode)."""


def check_driver_results(statement: ExecutableReturnsRows) -> None:
    """Refuse ``statement`` if a column it returns (selected, or RETURNING) needs SQLAlchemy's
    result processing on either backend, which the driver path skips: the driver's raw values
    would come back (a string for a SQLite datetime, say)."""
    for column in getattr(statement, "exported_columns", ()):
        if any(column.type.result_processor(d, None) is not None for d in (ASYNCPG_DIALECT, AIOSQLITE_DIALECT)):
            raise DriverResultTypeError(
                f"fixed statements return driver values, but result column {column.key!r} "
                f"({column}) is {type(column.type).__name__}, which needs result processing; "
                "return it as a plain type (e.g. type_coerce(column, its impl type)) or run the "
                "statement through SQLAlchemy"
            )


# Borrowed one-statement connections in strict mode -> whether each has run its statement.
_single: weakref.WeakKeyDictionary[PoolProxiedConnection | InlineConnection, bool] = weakref.WeakKeyDictionary()


def expect_one_statement(conn: PoolProxiedConnection | InlineConnection) -> None:
    """From now on (strict mode), a second statement on ``conn`` raises ``SecondStatementError``."""
    _single[conn] = False


def _ran_statement(conn: PoolProxiedConnection | InlineConnection, sql: str) -> None:
    ran = _single.get(conn)
    if ran is None:
        return
    if ran:
        raise SecondStatementError(
            "a route marked @fast(one_statement=...) runs in autocommit, but was asked for a second "
            f"statement: {sql.strip().splitlines()[0][:200]!r}; a route that runs more than one "
            "statement takes its connection plain (remove one_statement), in one transaction"
        )
    _single[conn] = True


class FixedStatement:
    """A statement run through SQLAlchemy (SQLite, and any connection inside a transaction)."""

    def __init__(self, statement: ExecutableReturnsRows) -> None:
        check_driver_results(statement)  # on SQLite too: the rule is the same on both backends
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


class _DriverStatement(FixedStatement):
    """The statement compiled once for a driver; sent with it on a pooled driver connection
    (a connection in a transaction runs it through SQLAlchemy instead)."""

    dialect: Dialect

    def __init__(self, statement: ExecutableReturnsRows) -> None:
        super().__init__(statement)
        compiled = statement.compile(dialect=self.dialect)
        assert isinstance(compiled, SQLCompiler)  # a Core statement compiles with the SQL compiler
        if "POSTCOMPILE" in compiled.string:  # an expanding IN: its SQL depends on each call's values
            raise TypeError("fixed statements need a fixed number of bound values; use StatementShapes")
        self.sql = compiled.string
        # (name, whether the caller must give it, the value the statement itself carries, the
        # type's bind processor), in positional order
        self._binds: list[tuple[str, bool, Any, Callable[[Any], Any] | None]] = [
            (b.key, b.required, b.value, b.type.bind_processor(self.dialect))
            for b in (compiled.binds[name] for name in compiled.positiontup or ())
        ]

    def _args(self, params: Mapping[str, Any]) -> list[Any]:
        args = []
        for name, required, own, process in self._binds:
            value = params[name] if required else params.get(name, own)  # (a missing one: KeyError, as SQLAlchemy)
            args.append(process(value) if process is not None and value is not None else value)
        return args

    def inline(self, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The SQL and arguments for a statement of an inline transaction (``inline_sql``)."""
        args = self._args(params)
        for observe in observers:
            observe(self.sql, args)
        return self.sql, args

    def _sending(self, conn: PoolProxiedConnection | InlineConnection, params: Mapping[str, Any]) -> list[Any]:
        """The statement's arguments, once strict mode and the observers have seen it."""
        args = self._args(params)
        if STRICT:
            _ran_statement(conn, self.sql)
        for observe in observers:
            observe(self.sql, args)
        return args

    async def _first(self, conn: PoolProxiedConnection | InlineConnection, params: Mapping[str, Any]) -> Row | None:
        raise NotImplementedError

    async def _all(self, conn: PoolProxiedConnection | InlineConnection, params: Mapping[str, Any]) -> list[Row]:
        raise NotImplementedError

    async def _rowcount(self, conn: PoolProxiedConnection | InlineConnection, params: Mapping[str, Any]) -> int:
        raise NotImplementedError

    async def first(self, conn: StatementConnection, params: Mapping[str, Any]) -> Row | None:
        if isinstance(conn, AsyncConnection):
            return await super().first(conn, params)
        return await self._first(conn, params)

    async def all(self, conn: StatementConnection, params: Mapping[str, Any]) -> list[Row]:
        if isinstance(conn, AsyncConnection):
            return await super().all(conn, params)
        return await self._all(conn, params)

    async def rowcount(self, conn: StatementConnection, params: Mapping[str, Any]) -> int:
        if isinstance(conn, AsyncConnection):
            return await super().rowcount(conn, params)
        return await self._rowcount(conn, params)


class _AsyncpgStatement(_DriverStatement):
    """PostgreSQL: sent with asyncpg, in autocommit."""

    dialect = ASYNCPG_DIALECT

    async def _send(self, conn: PoolProxiedConnection | InlineConnection, method: str, params: Mapping[str, Any]) -> Any:
        if isinstance(conn, InlineConnection):
            raise TypeError("inline reads are SQLite's; a PostgreSQL statement got one")
        args = self._sending(conn, params)
        try:
            return await getattr(conn.driver_connection, method)(self.sql, *args)
        except Exception as exc:  # translated as SQLAlchemy would, then raised
            raise translate_driver_error(conn, exc, self.sql) from exc

    async def _first(self, conn: PoolProxiedConnection | InlineConnection, params: Mapping[str, Any]) -> Row | None:
        row: Row | None = await self._send(conn, "fetchrow", params)  # an asyncpg Record
        return row

    async def _all(self, conn: PoolProxiedConnection | InlineConnection, params: Mapping[str, Any]) -> list[Row]:
        rows: list[Row] = await self._send(conn, "fetch", params)
        return rows

    async def _rowcount(self, conn: PoolProxiedConnection | InlineConnection, params: Mapping[str, Any]) -> int:
        status = await self._send(conn, "execute", params)  # e.g. "DELETE 3", "INSERT 0 1"
        last = status.rsplit(" ", 1)[-1] if status else ""
        return int(last) if last.isdigit() else 0


class _Counted:
    """What ``_rowcount`` reads of an inline write: its row count, as a cursor gives it."""

    __slots__ = ("rowcount",)

    def __init__(self, rowcount: int) -> None:
        self.rowcount = rowcount


class _AiosqliteStatement(_DriverStatement):
    """SQLite: sent with aiosqlite in one hand-off to the connection's thread, in autocommit
    (the engine's connections have the sqlite3 module's implicit transactions off)."""

    dialect = AIOSQLITE_DIALECT

    @staticmethod
    def _driver(conn: PoolProxiedConnection) -> aiosqlite.Connection:
        driver = conn.driver_connection
        if not isinstance(driver, aiosqlite.Connection):
            raise TypeError("a SQLite fixed statement got a connection that is not aiosqlite's")
        return driver

    async def _send(self, conn: PoolProxiedConnection | InlineConnection, method: str, params: Mapping[str, Any]) -> Any:
        args = self._sending(conn, params)
        waiting: AbstractContextManager[None] = nullcontext()
        if isinstance(conn, InlineConnection):
            if method == "execute_fetchall":
                rows = conn.reader.read(self.sql, args)
                if rows is not None:
                    return rows
            elif method == "execute":
                count = conn.reader.write(self.sql, args)
                if count is not None:
                    return _Counted(count)
                waiting = conn.wanting()  # a write that waits for the lock says so (app.fairness.fairshare)
            conn = await conn.pooled()  # it could not run inline: as any other statement
        try:
            with waiting:
                return await getattr(self._driver(conn), method)(self.sql, args)
        except Exception as exc:  # translated as SQLAlchemy would, then raised
            raise translate_sqlite_error(conn, exc, self.sql, args) from exc

    async def _all(self, conn: PoolProxiedConnection | InlineConnection, params: Mapping[str, Any]) -> list[Row]:
        return list(await self._send(conn, "execute_fetchall", params))

    async def _first(self, conn: PoolProxiedConnection | InlineConnection, params: Mapping[str, Any]) -> Row | None:
        rows = await self._all(conn, params)  # statements read by `first` select one row (a key)
        return rows[0] if rows else None

    async def _rowcount(self, conn: PoolProxiedConnection | InlineConnection, params: Mapping[str, Any]) -> int:
        # The cursor is left to the garbage collector: closing it would be a second hand-off,
        # and a statement that returns no rows is finished once it has run.
        cursor = await self._send(conn, "execute", params)
        count: int = cursor.rowcount
        return max(count, 0)


def translate_sqlite_error(conn: PoolProxiedConnection, exc: Exception, sql: str, args: Sequence[Any]) -> Exception:
    """What SQLAlchemy's ``Connection`` would have raised for ``exc``, an error of a statement
    sent with aiosqlite on the pooled ``conn``: sqlite3's errors become ``DBAPIError`` (answered
    as on the SQLAlchemy path: 503 for a lock wait that timed out, 507 for a full disk); a
    connection that may be broken (closed, or an error that is not sqlite3's) is not pooled again."""
    dialect = AIOSQLITE_DIALECT
    if isinstance(exc, ValueError) and str(exc).lower() in ("no active connection", "connection closed"):
        exc = SQLITE.OperationalError(str(exc))  # aiosqlite's word for a closed connection, as SQLAlchemy maps it
    if isinstance(exc, SQLITE.Error):
        disconnect = bool(dialect.is_disconnect(exc, conn.dbapi_connection, None))
        if disconnect:
            conn.invalidate(exc)
        error: Exception = sa_exc.DBAPIError.instance(
            sql, list(args), exc, SQLITE.Error, connection_invalidated=disconnect, dialect=dialect,
        )
        return error
    conn.invalidate(exc)
    return exc


def _connection_suspect(exc: Exception) -> bool:
    """Whether the connection may be unusable after ``exc``. Not after an error the server
    answered for this statement alone (a constraint, a type) or a value asyncpg refused to
    encode before sending anything; after anything else (a lost socket, a timeout, a protocol
    state asyncpg gave up on, the server shutting down) it is. (asyncpg raises a value it cannot
    encode as ``asyncpg.exceptions.DataError``, SQLSTATE 22000, pinned by tests/test_fences.py.)"""
    if isinstance(exc, asyncpg.PostgresError):
        return (exc.sqlstate or "").startswith(("08", "57P"))
    return True


def translate_driver_error(conn: PoolProxiedConnection, exc: Exception, sql: str | None = None) -> Exception:
    """What SQLAlchemy's ``Connection`` would have raised for ``exc``, an error of a statement
    sent with asyncpg on the pooled ``conn`` (here and in vector search), with its side effects.

    asyncpg's errors become SQLAlchemy's ``DBAPIError`` (others, such as a timeout, stay as
    they are), so the app answers both paths alike (503 for an unreachable or hung database).
    A connection that may be broken is never pooled again; when the server dropped it, every
    connection opened before it is recycled too, as after a restart or a failover.
    """
    adapter = conn.dbapi_connection
    dialect = ASYNCPG_DIALECT
    try:
        raise_as_dbapi_error(conn, exc)
    except dialect.loaded_dbapi.Error as dbapi_error:
        disconnect = bool(dialect.is_disconnect(dbapi_error, adapter, None))
        invalidated = disconnect or _connection_suspect(exc)
        if disconnect:
            recycle_pool_generation(conn, dbapi_error)  # what Connection does on a disconnect
        if invalidated:
            conn.invalidate(dbapi_error)
        return sa_exc.DBAPIError.instance(
            sql, None, dbapi_error, dialect.loaded_dbapi.Error, connection_invalidated=invalidated
        )
    except Exception as other:  # noqa: BLE001 (not asyncpg's: returned unchanged)
        if _connection_suspect(other):
            conn.invalidate(other)
        return other


def inline_sql(statement: FixedStatement, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """A SQLite fixed statement's SQL and arguments, for a body of an inline transaction
    (``InlineStatements.transaction``); the observers see it as any statement on the driver path."""
    if not isinstance(statement, _AiosqliteStatement):
        raise TypeError("inline transactions are SQLite's; this statement was built for another backend")
    return statement.inline(params)


def fixed_statements(dialect: str) -> type[FixedStatement]:
    """What builds fixed statements on ``dialect`` (``sqlite`` or ``postgresql``), chosen once."""
    return _AsyncpgStatement if dialect == "postgresql" else _AiosqliteStatement


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
