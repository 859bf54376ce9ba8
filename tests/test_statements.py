"""Fixed statements on a borrowed driver connection (PostgreSQL's path for kv and records).

What SQLAlchemy would otherwise do for these connections is done by the gateway itself, so it
is tested here: a connection the server dropped surfaces as SQLAlchemy's DBAPIError (answered
503) and is never pooled again; a request that stopped midway discards its connection; one
that ended normally returns it; SQLite has no driver path at all.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import String, bindparam, select, text
from sqlalchemy import exc as sa_exc

from app.core.config import Database
from app.core.databases import Databases
from app.core.errors import is_database_unavailable
from app.core.statements import StatementShapes, fixed_statements
from app.core.transactions import RequestConnections
from app.kv.models import kv_entries as t
from tests.conftest import Backend
from tests.test_migrations import settings_for

SELECT_ONE = select(bindparam("ns", type_=String()).label("echo"))  # needs no table


async def test_sqlite_has_no_driver_path_and_postgresql_borrows_one(backend: Backend) -> None:
    databases = Databases.open(settings_for(backend))
    try:
        borrowed = await databases.borrow_driver_connection(Database.metadata)
        assert (borrowed is not None) == backend.is_postgres
        if borrowed is not None:
            connections = RequestConnections()
            connections.add(borrowed)
            statement = fixed_statements("postgresql")(SELECT_ONE)
            echo = f"ns-{uuid.uuid4().hex}"
            assert tuple(await statement.first(borrowed, {"ns": echo})) == (echo,)
            assert not borrowed.driver_connection.is_in_transaction()  # autocommit: no BEGIN was sent
            await connections.end(commit=True)
            assert databases.engine(Database.metadata).sync_engine.pool.checkedout() == 0
    finally:
        await databases.close()


@pytest.mark.postgres_only
async def test_a_dropped_connection_is_a_503_and_is_never_pooled_again(backend: Backend) -> None:
    databases = Databases.open(settings_for(backend))
    pool = databases.engine(Database.metadata).sync_engine.pool
    try:
        borrowed = await databases.borrow_driver_connection(Database.metadata)
        assert borrowed is not None
        driver = borrowed.driver_connection
        async with databases.engine(Database.metadata).connect() as other:  # the server drops it
            await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": driver.get_server_pid()})
        connections = RequestConnections()
        connections.add(borrowed)
        statement = fixed_statements("postgresql")(SELECT_ONE)
        with pytest.raises(sa_exc.DBAPIError) as raised:
            await statement.first(borrowed, {"ns": "x"})
        assert raised.value.connection_invalidated and is_database_unavailable(raised.value)
        await connections.end(commit=False)
        assert pool.checkedout() == 0
        again = await databases.borrow_driver_connection(Database.metadata)  # a fresh connection
        assert again is not None and again.driver_connection is not driver
        assert tuple(await statement.first(again, {"ns": "y"})) == ("y",)
        await greenlet_close(again)
    finally:
        await databases.close()


@pytest.mark.postgres_only
async def test_a_request_that_stopped_midway_discards_its_connection(backend: Backend) -> None:
    databases = Databases.open(settings_for(backend))
    try:
        borrowed = await databases.borrow_driver_connection(Database.metadata)
        assert borrowed is not None
        driver = borrowed.driver_connection
        connections = RequestConnections()
        connections.add(borrowed)
        await connections.end(commit=False, clean=False)
        assert driver.is_closed()
        clean = await databases.borrow_driver_connection(Database.metadata)
        assert clean is not None
        kept = clean.driver_connection
        connections = RequestConnections()
        connections.add(clean)
        await connections.end(commit=False)  # an error answer, but the request ended normally
        assert not kept.is_closed()
    finally:
        await databases.close()


def test_statement_shapes_are_built_once_and_only_a_bounded_number_kept() -> None:
    built: list[int] = []

    def build(n: int) -> object:
        built.append(n)
        return select(t.c.key).where(t.c.version.in_([bindparam(f"v{i}") for i in range(n)]))

    shapes = StatementShapes(fixed_statements("postgresql"), build, keep=2)
    assert shapes(1) is shapes(1) and shapes(2) is shapes(2)
    assert "IN ($1, $2)" in shapes(2).sql  # type: ignore[attr-defined]
    assert shapes(3) is not shapes(3)  # past the bound: built per call, correct but not kept
    assert built == [1, 2, 3, 3]


async def greenlet_close(conn: object) -> None:
    from sqlalchemy.util.concurrency import greenlet_spawn

    await greenlet_spawn(conn.close)  # type: ignore[attr-defined]
