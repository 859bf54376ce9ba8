"""Request connections end before the answer leaves: commit on success, roll back otherwise.

The routes here are test-only, on a real database of each backend, behind the gateway's own
``TransactionMiddleware``, connection dependency and error handlers. A commit that fails
(a deferred foreign key, checked only at COMMIT on both backends) must not be answered as a
success.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy import literal, select, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import PoolProxiedConnection

from app.auth.ratelimit import RateLimiter
from app.core.config import Database
from app.core.db.databases import Databases
from app.core.dependencies import CheckpointsConnection
from app.core.errors import InvalidInput, install_error_handlers
from app.core.fast import fast
from app.core.fast.fixed_statements import fixed_statements
from app.core.fast.inline_sqlite import InlineConnection
from app.core.http.limits import Body, accepts
from app.core.http.routing import CapabilityRouter, include_capability
from app.core.state import GatewayState
from app.core.db.transactions import TransactionMiddleware
from tests.conftest import Backend
from tests.test_migrations import settings_for


@pytest.fixture
async def client(backend: Backend) -> AsyncIterator[tuple[httpx.AsyncClient, Databases, str]]:
    databases = Databases.open(settings_for(backend))
    suffix = uuid.uuid4().hex[:8]
    parent, child = f"tx_parent_{suffix}", f"tx_child_{suffix}"
    async with databases.engine(Database.checkpoints).begin() as conn:
        await conn.execute(text(f"CREATE TABLE {parent} (id integer PRIMARY KEY)"))
        await conn.execute(text(
            f"CREATE TABLE {child} (id integer PRIMARY KEY, parent_id integer NOT NULL "
            f"REFERENCES {parent} (id) DEFERRABLE INITIALLY DEFERRED)"
        ))

    app = FastAPI()
    app.state.gateway = GatewayState(settings=databases.settings, capabilities=(), rate_limiter=RateLimiter(0, 1))
    app.state.gateway.databases = databases
    install_error_handlers(app)
    app.add_middleware(TransactionMiddleware)

    @app.post("/ok/{n}")
    async def ok(n: int, conn: CheckpointsConnection) -> dict:
        await conn.execute(text(f"INSERT INTO {parent} (id) VALUES (:n)"), {"n": n})
        return {"stored": n}

    @app.post("/refused/{n}")
    async def refused(n: int, conn: CheckpointsConnection) -> dict:
        await conn.execute(text(f"INSERT INTO {parent} (id) VALUES (:n)"), {"n": n})
        raise InvalidInput("n", "refused after writing")

    @app.post("/fails-at-commit/{n}")
    async def fails_at_commit(n: int, conn: CheckpointsConnection) -> dict:
        await conn.execute(text(f"INSERT INTO {parent} (id) VALUES (:n)"), {"n": n})
        await conn.execute(text(f"INSERT INTO {child} (id, parent_id) VALUES (:n, :missing)"), {"n": n, "missing": -n})
        return {"stored": n}

    # A capability's routes, behind a gate (which tells the connection what the route is).
    router = CapabilityRouter("tx")

    @router.post("/in-transaction")
    @accepts(Body.NONE)
    @fast(one_statement=True)
    async def in_transaction(conn: CheckpointsConnection) -> Response:
        return JSONResponse({"in_transaction": await driver_in_transaction(conn)})

    @router.get("/writes-in-a-get/{n}")
    async def writes_in_a_get(n: int, conn: CheckpointsConnection) -> dict:
        began = conn.in_transaction()  # a reading route's transaction begins with its first statement
        await conn.execute(text(f"INSERT INTO {parent} (id) VALUES (:n)"), {"n": n})
        return {"began_before": began}

    async def allow(request: Request, gate: str, reads: bool) -> None:
        return None

    include_capability(app, router, "/v1/{namespace}", allow)

    @app.post("/in-transaction/batch")
    async def in_transaction_batch(conn: CheckpointsConnection) -> dict:
        return {"in_transaction": await driver_in_transaction(conn)}

    @app.get("/count")
    async def count(conn: CheckpointsConnection) -> dict:
        return {"n": (await conn.execute(text(f"SELECT count(*) FROM {parent}"))).scalar_one()}

    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield http, databases, parent
    finally:
        async with databases.engine(Database.checkpoints).begin() as conn:
            await conn.execute(text(f"DROP TABLE {child}"))
            await conn.execute(text(f"DROP TABLE {parent}"))
        await databases.close()


async def driver_in_transaction(conn: AsyncConnection | PoolProxiedConnection | InlineConnection) -> bool:
    """Whether the driver connection is inside BEGIN after a statement: what the server was sent."""
    if isinstance(conn, AsyncConnection):
        await conn.execute(text("SELECT 1"))
        driver = (await conn.get_raw_connection()).driver_connection
    elif isinstance(conn, InlineConnection):  # SQLite's single-statement routes: the loop's thread
        assert await fixed_statements("sqlite")(select(literal(1).label("one"))).rowcount(conn, {}) >= 0
        return conn.reader.in_transaction
    else:  # a pooled driver connection (single-statement routes)
        driver = conn.driver_connection
        await (driver.fetchval("SELECT 1") if hasattr(driver, "fetchval") else driver.execute_fetchall("SELECT 1"))
    return driver.is_in_transaction() if hasattr(driver, "is_in_transaction") else driver.in_transaction


async def stored(databases: Databases, table: str) -> list[int]:
    async with databases.engine(Database.checkpoints).connect() as conn:
        return [r[0] for r in await conn.execute(text(f"SELECT id FROM {table} ORDER BY id"))]


async def test_success_is_committed_before_the_answer(client) -> None:  # noqa: ANN001
    http, databases, parent = client
    r = await http.post("/ok/1")
    assert r.status_code == 200
    assert await stored(databases, parent) == [1]  # visible to another connection at once
    assert (await http.get("/count")).json() == {"n": 1}


async def test_an_error_answer_rolls_back_what_the_handler_wrote(client) -> None:  # noqa: ANN001
    http, databases, parent = client
    r = await http.post("/refused/2")
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json")
    assert await stored(databases, parent) == []


async def test_a_failed_commit_is_not_answered_as_a_success(client) -> None:  # noqa: ANN001
    http, databases, parent = client
    r = await http.post("/fails-at-commit/3")
    assert r.status_code >= 500, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "stored" not in r.text
    assert await stored(databases, parent) == []
    # The pool is healthy afterwards: the next request commits normally.
    assert (await http.post("/ok/4")).status_code == 200
    assert await stored(databases, parent) == [4]


async def test_single_statement_requests_skip_begin_and_commit(client) -> None:  # noqa: ANN001
    """A ``@fast(one_statement=True)`` route (kv, records) runs without BEGIN/COMMIT on both backends."""
    http, _databases, _parent = client
    r = await http.post("/v1/ns/tx/in-transaction")  # a write: reads skip BEGIN too
    assert r.status_code == 200
    assert r.json() == {"in_transaction": False}


async def test_connections_back_from_single_statement_requests_begin_transactions_again(client) -> None:  # noqa: ANN001
    """The pool is shared: a connection that served a statement without BEGIN must open a
    transaction again for the next multi-statement request (a records batch)."""
    http, _databases, _parent = client
    for _ in range(12):
        assert (await http.post("/v1/ns/tx/in-transaction")).status_code == 200
    for _ in range(12):
        r = await http.post("/in-transaction/batch")
        assert r.json() == {"in_transaction": True}


async def test_a_reading_route_begins_with_its_first_statement_and_commits_on_success(client) -> None:  # noqa: ANN001
    """A GET's transaction begins lazily, and is ended as any other: what it wrote is committed."""
    http, databases, parent = client
    r = await http.get("/v1/ns/tx/writes-in-a-get/7")
    assert r.status_code == 200 and r.json() == {"began_before": False}
    assert await stored(databases, parent) == [7]
