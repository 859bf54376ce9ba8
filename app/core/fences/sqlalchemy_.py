"""SQLAlchemy internals for the driver-level statements of ``app.core.fast.fixed_statements``.

Single-statement requests send asyncpg statements on a connection borrowed from SQLAlchemy's
pool (``AsyncEngine.raw_connection()``, public) without a ``Connection`` around it. What a
``Connection`` would then do for them has no public API:

- ``close_pooled``: ``PoolProxiedConnection.close()`` is synchronous and, on an async driver,
  must run in a greenlet (it resets the connection with an awaited ROLLBACK).
  ``sqlalchemy.util.concurrency.greenlet_spawn`` is what SQLAlchemy's own ``AsyncConnection.close``
  uses; it is undocumented.
- ``raise_as_dbapi_error``: the asyncpg adapter's ``_handle_exception(error)`` maps an asyncpg
  error onto the DBAPI-style error class SQLAlchemy wraps (``loaded_dbapi.Error``); the mapping
  is the dialect's and private.
- ``recycle_pool_generation``: after a disconnect, ``Connection`` calls
  ``pool._invalidate(connection, exc, _checkin=False)``: every connection opened before this one
  is recycled on its next checkout (as after a server restart). ``engine.dispose()`` is public
  but replaces the whole pool, and connections lent out at that moment are no longer counted
  against its size, so it is not the same thing.
- ``is_dialect_conditional``: ``SchemaItem.ddl_if()`` (public) stores its condition in
  ``_ddl_if``, which has no public reader; Alembic's autogenerate (``app.core.db.migrations``)
  needs to know an index is created on one dialect only.
- ``resize_statement_cache``: asyncpg takes ``statement_cache_size`` only when it connects (the
  engine's, shared by the databases); one connection's LRU is resized through its ``_stmt_cache``.
"""

from __future__ import annotations

from typing import Any, NoReturn

from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util.concurrency import greenlet_spawn


async def close_pooled(conn: PoolProxiedConnection) -> None:
    """Give a borrowed connection back to its pool (or close it, if invalidated)."""
    await greenlet_spawn(conn.close)


def raise_as_dbapi_error(conn: PoolProxiedConnection, exc: Exception) -> NoReturn:
    """Raise ``exc`` as the asyncpg adapter of ``conn`` translates it (``loaded_dbapi.Error``
    subclasses for asyncpg's errors; anything else unchanged)."""
    adapter: Any = conn.dbapi_connection
    adapter._handle_exception(exc)
    raise exc  # (not reached: _handle_exception always raises)


def recycle_pool_generation(conn: PoolProxiedConnection, exc: BaseException) -> None:
    """Recycle every connection of ``conn``'s pool opened no later than ``conn``."""
    pool = getattr(conn, "_pool", None)
    if pool is not None:
        pool._invalidate(conn, exc, _checkin=False)


def is_dialect_conditional(obj: Any) -> bool:
    """Whether ``obj`` (an ``Index``, a ``Constraint``) was declared with ``.ddl_if(...)``."""
    return getattr(obj, "_ddl_if", None) is not None


def resize_statement_cache(conn: Any, size: int) -> None:
    """Hold at most ``size`` prepared statements in asyncpg connection ``conn``'s cache (nothing
    when the driver has no such cache)."""
    cache = getattr(conn, "_stmt_cache", None)
    if cache is not None:
        cache.set_max_size(size)
