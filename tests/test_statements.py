"""Fixed statements on a borrowed driver connection (``@fast(one_statement=...)`` routes, both backends).

What SQLAlchemy would otherwise do for these connections is done by the gateway itself, so it
is tested here: a connection the server dropped surfaces as SQLAlchemy's DBAPIError (answered
503) and is never pooled again; a request that stopped midway discards its connection; one
that ended normally returns it; on SQLite a lock wait that times out is the same 503, and a
connection given back inside a transaction is rolled back.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

import pytest
from sqlalchemy import Float, String, bindparam, column, func, insert, select, table, text
from sqlalchemy import exc as sa_exc

from app.core.config import Database
from app.core.db.databases import Databases
from app.core.errors import is_database_unavailable
from app.core.fast.fixed_statements import StatementShapes, fixed_statements
from app.core.fast.one_statement import borrow_driver_connection, give_back
from app.core.db.transactions import RequestConnections
from app.kv.models import kv_entries as t
from tests.conftest import Backend, Server
from tests.test_migrations import settings_for

SELECT_ONE = select(bindparam("ns", type_=String()).label("echo"))  # needs no table


async def test_both_backends_borrow_a_driver_connection_that_runs_in_autocommit(backend: Backend) -> None:
    databases = Databases.open(settings_for(backend))
    try:
        borrowed = await borrow_driver_connection(databases.engine(Database.metadata))
        assert borrowed is not None
        connections = RequestConnections()
        connections.add_release(lambda clean: give_back(borrowed, clean))
        statement = fixed_statements("postgresql" if backend.is_postgres else "sqlite")(SELECT_ONE)
        echo = f"ns-{uuid.uuid4().hex}"
        assert tuple(await statement.first(borrowed, {"ns": echo})) == (echo,)
        driver = borrowed.driver_connection
        in_transaction = driver.is_in_transaction() if backend.is_postgres else driver.in_transaction
        assert not in_transaction  # autocommit: no BEGIN was sent
        await connections.end(commit=True)
        assert databases.engine(Database.metadata).sync_engine.pool.checkedout() == 0
        # A route that runs one statement on PostgreSQL only is lent no driver connection on SQLite.
        assert databases.one_statement is not None
        several = RequestConnections()
        lent = await databases.one_statement.connection(Database.metadata, "postgresql", several)
        assert (lent is not None) == backend.is_postgres == bool(several)
        await several.end(commit=True)
    finally:
        await databases.close()


def _scratch_table() -> Any:
    return table(f"scratch_{uuid.uuid4().hex[:12]}", column("k", String()))


@pytest.mark.sqlite_only
async def test_a_sqlite_lock_wait_that_times_out_is_a_503_and_the_connection_stays_usable(backend: Backend) -> None:
    settings = settings_for(backend)
    settings.databases.metadata.connect_timeout = 0.2  # the busy timeout
    databases = Databases.open(settings)
    scratch = _scratch_table()
    write = fixed_statements("sqlite")(insert(scratch).values(k=bindparam("k")))
    try:
        async with databases.engine(Database.metadata).begin() as conn:
            await conn.execute(text(f"CREATE TABLE {scratch.name} (k TEXT PRIMARY KEY)"))
        borrowed = await borrow_driver_connection(databases.engine(Database.metadata))
        assert borrowed is not None
        async with databases.engine(Database.metadata).connect() as holder:
            await holder.execution_options(sqlite_begin="IMMEDIATE")
            await holder.begin()  # another writer holds SQLite's write lock
            with pytest.raises(sa_exc.OperationalError) as raised:
                await write.rowcount(borrowed, {"k": "locked"})
            assert is_database_unavailable(raised.value) and not raised.value.connection_invalidated
            await holder.rollback()
        assert await write.rowcount(borrowed, {"k": "free"}) == 1  # the same connection, free now
        await greenlet_close(borrowed)
    finally:
        await databases.close()


@pytest.mark.sqlite_only
async def test_a_sqlite_connection_given_back_inside_a_transaction_is_rolled_back(backend: Backend) -> None:
    """The pool resets a connection only when it is inside a transaction (the reset hook)."""
    databases = Databases.open(settings_for(backend))
    scratch = _scratch_table()
    try:
        async with databases.engine(Database.metadata).begin() as conn:
            await conn.execute(text(f"CREATE TABLE {scratch.name} (k TEXT PRIMARY KEY)"))
        borrowed = await borrow_driver_connection(databases.engine(Database.metadata))
        assert borrowed is not None
        driver = borrowed.driver_connection
        await driver.execute("BEGIN IMMEDIATE")
        await driver.execute(f"INSERT INTO {scratch.name} (k) VALUES ('k')")
        await greenlet_close(borrowed)  # handed back mid-transaction
        assert not driver.in_transaction
        async with databases.engine(Database.metadata).connect() as conn:
            assert (await conn.execute(select(func.count()).select_from(scratch))).scalar_one() == 0
    finally:
        await databases.close()


@pytest.mark.postgres_only
async def test_a_dropped_connection_is_a_503_and_is_never_pooled_again(backend: Backend) -> None:
    databases = Databases.open(settings_for(backend))
    pool = databases.engine(Database.metadata).sync_engine.pool
    try:
        borrowed = await borrow_driver_connection(databases.engine(Database.metadata))
        assert borrowed is not None
        driver = borrowed.driver_connection
        async with databases.engine(Database.metadata).connect() as other:  # the server drops it
            await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": driver.get_server_pid()})
        connections = RequestConnections()
        connections.add_release(lambda clean: give_back(borrowed, clean))
        statement = fixed_statements("postgresql")(SELECT_ONE)
        with pytest.raises(sa_exc.DBAPIError) as raised:
            await statement.first(borrowed, {"ns": "x"})
        assert raised.value.connection_invalidated and is_database_unavailable(raised.value)
        await connections.end(commit=False)
        assert pool.checkedout() == 0
        again = await borrow_driver_connection(databases.engine(Database.metadata))  # a fresh connection
        assert again is not None and again.driver_connection is not driver
        assert tuple(await statement.first(again, {"ns": "y"})) == ("y",)
        await greenlet_close(again)
    finally:
        await databases.close()


@pytest.mark.postgres_only
async def test_a_request_that_stopped_midway_discards_its_connection(backend: Backend) -> None:
    databases = Databases.open(settings_for(backend))
    try:
        borrowed = await borrow_driver_connection(databases.engine(Database.metadata))
        assert borrowed is not None
        driver = borrowed.driver_connection
        connections = RequestConnections()
        connections.add_release(lambda clean: give_back(borrowed, clean))
        await connections.end(commit=False, clean=False)
        assert driver.is_closed()
        clean = await borrow_driver_connection(databases.engine(Database.metadata))
        assert clean is not None
        kept = clean.driver_connection
        connections = RequestConnections()
        connections.add_release(lambda ended_cleanly: give_back(clean, ended_cleanly))
        await connections.end(commit=False)  # an error answer, but the request ended normally
        assert not kept.is_closed()
    finally:
        await databases.close()


def test_statement_shapes_keep_the_most_recently_used() -> None:
    built: list[int] = []

    def build(n: int) -> object:
        built.append(n)
        return select(t.c.key).where(t.c.version.in_([bindparam(f"v{i}") for i in range(n)]))

    shapes = StatementShapes(fixed_statements("postgresql"), build, keep=2)
    assert shapes(1) is shapes(1) and shapes(2) is shapes(2)
    assert "IN ($1, $2)" in shapes(2).sql  # type: ignore[attr-defined]
    one = shapes(1)  # the common shape, used again
    for rare in (3, 4, 5):  # rare shapes come and go...
        shapes(rare)
        assert shapes(1) is one  # ...without pushing out the one in use
    assert built == [1, 2, 3, 4, 5]


def test_a_missing_parameter_is_an_error_not_a_null() -> None:
    statement = fixed_statements("postgresql")(SELECT_ONE)
    with pytest.raises(KeyError):
        statement._args({})  # type: ignore[attr-defined]


@pytest.mark.postgres_only
async def test_after_a_server_restart_one_failed_request_recycles_the_whole_pool(backend: Backend) -> None:
    """As SQLAlchemy's Connection does on a disconnect: every connection opened before the
    dropped one is replaced, so a restart or failover costs one failed request, not one per
    pooled connection."""
    databases = Databases.open(settings_for(backend))
    statement = fixed_statements("postgresql")(SELECT_ONE)
    try:
        held = [await borrow_driver_connection(databases.engine(Database.metadata)) for _ in range(4)]
        pids = [conn.driver_connection.get_server_pid() for conn in held]  # type: ignore[union-attr]
        for conn in held:
            await greenlet_close(conn)
        other = Databases.open(settings_for(backend))  # not from this pool: a restart, as the pool sees it
        try:
            async with other.engine(Database.metadata).connect() as admin:
                for pid in pids:
                    await admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        finally:
            await other.close()
        first = await borrow_driver_connection(databases.engine(Database.metadata))
        assert first is not None
        with pytest.raises(sa_exc.DBAPIError) as raised:
            await statement.first(first, {"ns": "x"})
        assert raised.value.connection_invalidated
        await greenlet_close(first)
        for _ in range(4):  # every other pooled connection was recycled: no second failure
            conn = await borrow_driver_connection(databases.engine(Database.metadata))
            assert conn is not None and conn.driver_connection.get_server_pid() not in pids
            assert tuple(await statement.first(conn, {"ns": "y"})) == ("y",)
            await greenlet_close(conn)
    finally:
        await databases.close()


def connection_dependency(annotated: object) -> Any:
    """The dependency function behind an ``Annotated[..., Depends(...)]`` connection type."""
    return annotated.__metadata__[0].dependency  # type: ignore[attr-defined]


async def greenlet_close(conn: object) -> None:
    from sqlalchemy.util.concurrency import greenlet_spawn

    await greenlet_spawn(conn.close)  # type: ignore[attr-defined]


@pytest.mark.postgres_only
async def test_a_statement_cancelled_by_statement_timeout_is_retryable_and_keeps_the_connection(backend: Backend) -> None:
    databases = Databases.open(settings_for(backend))
    try:
        borrowed = await borrow_driver_connection(databases.engine(Database.metadata))
        assert borrowed is not None
        driver = borrowed.driver_connection
        await driver.execute("SET statement_timeout = 100")
        slow = fixed_statements("postgresql")(select(func.pg_sleep(bindparam("s", type_=Float()))))
        with pytest.raises(sa_exc.DBAPIError) as raised:
            await slow.first(borrowed, {"s": 5})
        assert is_database_unavailable(raised.value)  # answered 503 with Retry-After
        assert not raised.value.connection_invalidated and not driver.is_closed()  # the server answered: still usable
        await driver.execute("RESET statement_timeout")
        await greenlet_close(borrowed)
    finally:
        await databases.close()


# --- the rules fixed statements enforce -------------------------------------------------


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_a_result_column_the_driver_path_cannot_process_is_refused_when_built(dialect: str) -> None:
    from sqlalchemy import insert, update

    from app.core.fast.fixed_statements import DriverResultTypeError

    fixed = fixed_statements(dialect)
    for statement, column in (
        (select(t.c.key, t.c.updated_at), "updated_at"),  # UtcDateTime
        (insert(t).values(key="k").returning(t.c.created_at), "created_at"),
        (update(t).values(value="1").returning(t.c.key, t.c.expires_at), "expires_at"),
    ):
        with pytest.raises(DriverResultTypeError, match=rf"result column '{column}' .* is UtcDateTime"):
            fixed(statement)
    fixed(select(t.c.key, t.c.version))  # text and numbers: fine
    fixed(update(t).values(value="1").returning(t.c.key))


def _request(databases: Databases, method: str = "PUT", one_statement: bool = True) -> object:
    """A request to a gated route that writes, and promises one statement (or not)."""
    from types import SimpleNamespace

    from starlette.requests import Request

    from app.auth.ratelimit import RateLimiter
    from app.core.db.transactions import SCOPE_KEY
    from app.core.http.limits import NO_BODY
    from app.core.http.routing import ROUTE_POLICY, RoutePolicy
    from app.core.state import GatewayState

    gateway = GatewayState(settings=databases.settings, capabilities=(), rate_limiter=RateLimiter(0, 1))
    gateway.databases = databases
    app = SimpleNamespace(state=SimpleNamespace(gateway=gateway))
    policy = RoutePolicy(NO_BODY, 0, reads=method == "GET", one_statement=one_statement)
    return Request({
        "type": "http", "method": method, "headers": [], "app": app, SCOPE_KEY: RequestConnections(), ROUTE_POLICY: policy,
    })


async def test_a_second_statement_on_a_single_statement_connection_raises_in_strict_mode(backend: Backend) -> None:
    from app.core.fast import fixed_statements as statements
    from app.core.dependencies import MetadataConnection
    from app.core.fast.fixed_statements import SecondStatementError
    from app.core.db.transactions import request_connections

    assert statements.STRICT  # the tests run in strict mode (tests/conftest.py), their servers too
    databases = Databases.open(settings_for(backend))
    statement = fixed_statements(databases.dialect(Database.metadata))(SELECT_ONE)
    try:
        for single, method in ((True, "PUT"), (True, "GET"), (False, "PUT")):
            request = _request(databases, method, one_statement=single)
            conn = await connection_dependency(MetadataConnection)(request)
            assert tuple(await statement.first(conn, {"ns": "one"})) == ("one",)
            if single:  # autocommit on the driver path: one statement
                with pytest.raises(SecondStatementError, match="second statement: 'SELECT"):
                    await statement.first(conn, {"ns": "two"})
            else:  # a plain route: a transaction, statements atomic together
                assert tuple(await statement.first(conn, {"ns": "two"})) == ("two",)
            await request_connections(request.scope).end(commit=False)
        # Its pooled driver connection is lent again without the mark (vector search borrows so).
        again = await borrow_driver_connection(databases.engine(Database.metadata))
        assert again is not None
        for n in range(2):
            assert tuple(await statement.first(again, {"ns": str(n)})) == (str(n),)
        await greenlet_close(again)
    finally:
        await databases.close()


async def test_without_strict_mode_a_single_statement_connection_is_not_checked(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.core.fast import fixed_statements as statements
    from app.core.dependencies import MetadataConnection
    from app.core.db.transactions import request_connections

    monkeypatch.setattr(statements, "STRICT", False)
    databases = Databases.open(settings_for(backend))
    statement = fixed_statements(databases.dialect(Database.metadata))(SELECT_ONE)
    try:
        request = _request(databases)
        conn = await connection_dependency(MetadataConnection)(request)
        for n in range(2):
            assert tuple(await statement.first(conn, {"ns": str(n)})) == (str(n),)
        await request_connections(request.scope).end(commit=False)
    finally:
        await databases.close()


async def test_a_one_chunk_file_download_is_one_driver_statement_with_the_stored_timestamps(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    """A download of a file that is one chunk reads its row and bytes in one fixed statement on
    the driver (no BEGIN, nothing through SQLAlchemy), and its timestamps, which the driver
    returns unprocessed (text on SQLite), come back as the stored ones."""
    from tests.test_scoping import capture_statements, in_process_settings

    settings = in_process_settings(backend, tmp_path)  # (the server fixture migrated the databases)
    data = os.urandom(300_000)
    path = "/v1/dl/files/c/one-chunk"
    stored: dict[str, Any] = {}

    async def upload(client: httpx.AsyncClient) -> None:
        put = await client.put(path, content=data, headers={"Content-Type": "text/plain"})
        assert put.status_code == 201, put.text
        stored.update(put.json())

    async def download(client: httpx.AsyncClient) -> None:
        got = await client.get(path)
        assert got.status_code == 200 and got.content == data
        updated = datetime.fromisoformat(stored["updated_at"])
        assert got.headers["last-modified"] == email.utils.format_datetime(updated.astimezone(UTC), usegmt=True)
        assert got.headers["etag"] == f'"{stored["sha256"]}"'
        listed = (await client.get("/v1/dl/files/c")).json()["items"][0]  # read through SQLAlchemy
        assert (listed["created_at"], listed["updated_at"]) == (stored["created_at"], stored["updated_at"])

    await capture_statements(settings, upload)
    captured, driver_path = await capture_statements(settings, download)
    reads = [sql for sql, _ in captured if "file_chunks" in sql]
    assert len(reads) == 1 and reads == [sql for sql in driver_path if "file_chunks" in sql], captured
    assert not any(sql.strip().upper().startswith("BEGIN") for sql in driver_path), captured


@pytest.mark.postgres_only
async def test_a_deadlock_is_retryable(backend: Backend) -> None:
    """PostgreSQL breaks a deadlock by failing one transaction (40P01), rolled back whole:
    retrying it is the remedy, so it is a 503 with Retry-After, not a 500."""
    databases = Databases.open(settings_for(backend))
    scratch = _scratch_table().name
    engine = databases.engine(Database.metadata)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f"CREATE TABLE {scratch} (k TEXT PRIMARY KEY)"))
            await conn.execute(text(f"INSERT INTO {scratch} VALUES ('a'), ('b')"))
        async with engine.connect() as one, engine.connect() as two:
            lock = f"SELECT 1 FROM {scratch} WHERE k = :k FOR UPDATE"
            await one.execute(text(lock), {"k": "a"})
            await two.execute(text(lock), {"k": "b"})

            async def cross(conn: Any, k: str) -> BaseException | None:
                try:
                    await conn.execute(text(lock), {"k": k})
                except sa_exc.DBAPIError as exc:
                    await conn.rollback()  # its locks go with it: the other one goes on
                    return exc
                await conn.commit()
                return None

            results = await asyncio.gather(cross(one, "b"), cross(two, "a"))
        errors = [r for r in results if r is not None]
        assert len(errors) == 1 and getattr(errors[0], "orig", None).sqlstate == "40P01", errors  # type: ignore[union-attr]
        assert is_database_unavailable(errors[0])
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f"DROP TABLE IF EXISTS {scratch}"))
        await databases.close()
