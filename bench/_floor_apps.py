"""The ASGI apps of ``bench_http_floor.py``: one kv GET served by progressively fuller stacks.

Each reads the row the gateway stored (``kv_entries``) with the statement the gateway uses, and
answers the value as JSON. ``FLOOR_DSN`` names the metadata database (libpq form).
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import Annotated, Any

import asyncpg
from fastapi import Depends, FastAPI, Response
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

DSN = os.environ.get("FLOOR_DSN", "")
SQL = (
    "SELECT value, version FROM kv_entries WHERE namespace = $1 AND collection = $2 AND key = $3 "
    "AND (expires_at IS NULL OR expires_at > now())"
)
SA_SQL = text(SQL.replace("$1", ":ns").replace("$2", ":c").replace("$3", ":k"))
_state: dict[str, Any] = {}


async def _open() -> None:
    _state["pool"] = await asyncpg.create_pool(DSN, min_size=16, max_size=16)
    _state["engine"] = create_async_engine(DSN.replace("postgresql://", "postgresql+asyncpg://", 1), pool_size=20)


def _answer(row: Any) -> Response:
    return Response(b'{"value":' + row[0].encode() + b"}", media_type="application/json")


async def raw_asgi(scope: dict, receive: Any, send: Any) -> None:
    """No framework: parse the path, one asyncpg statement, two ASGI messages."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await _open()
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    _, _, ns, _, c, k = scope["path"].split("/")
    async with _state["pool"].acquire() as conn:
        row = await conn.fetchrow(SQL, ns, c, k)
    body = b'{"value":' + row[0].encode() + b"}"
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def _lifespan(_app: FastAPI):  # noqa: ANN202
    await _open()
    yield


fastapi_app = FastAPI(lifespan=_lifespan)


@fastapi_app.get("/asyncpg/{ns}/kv/{c}/{k}")
async def with_asyncpg_pool(ns: str, c: str, k: str) -> Response:
    async with _state["pool"].acquire() as conn:
        return _answer(await conn.fetchrow(SQL, ns, c, k))


@fastapi_app.get("/sa-driver/{ns}/kv/{c}/{k}")
async def with_sqlalchemy_connection_and_driver_statement(ns: str, c: str, k: str) -> Response:
    async with _state["engine"].connect() as conn:
        raw = await conn.get_raw_connection()
        return _answer(await raw.driver_connection.fetchrow(SQL, ns, c, k))


@fastapi_app.get("/sa/{ns}/kv/{c}/{k}")
async def with_sqlalchemy_execute(ns: str, c: str, k: str) -> Response:
    async with _state["engine"].connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        return _answer((await conn.execute(SA_SQL, {"ns": ns, "c": c, "k": k})).first())


async def _connection():  # noqa: ANN202
    async with _state["engine"].connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


@fastapi_app.get("/sa-dep/{ns}/kv/{c}/{k}")
async def with_sqlalchemy_connection_dependency(
    ns: str, c: str, k: str, conn: Annotated[Any, Depends(_connection)]
) -> Response:
    return _answer((await conn.execute(SA_SQL, {"ns": ns, "c": c, "k": k})).first())
