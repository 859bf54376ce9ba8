"""HTTP routes of the kv capability: JSON values by key, with ETags and optional expiry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, Query, Request, Response

from app.core.conditions import Conditions
from app.core.config import Database
from app.core.databases import SQLITE_BEGIN_OPTION, Databases
from app.core.dependencies import CollectionPath, Key, MetadataStatement, NamespacePath, PageLimit
from app.core.errors import (
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    ServiceUnavailable,
    problem_responses,
)
from app.core.limits import Body, accepts
from app.core.routing import CapabilityRouter
from app.core.statements import fixed_statements
from app.core.upsert import insert_builder
from app.kv.dependencies import KvServiceDep
from app.kv.repository import KvRepository
from app.kv.schemas import VALUE_REQUEST_BODY, VALUE_RESPONSE, KvPage
from app.kv.service import KvService

log = logging.getLogger("app.kv")

router = CapabilityRouter("kv", tags=["kv"])

JSON = "application/json"


@router.put(
    "/{collection}/{key:path}",
    summary="Set a value",
    status_code=204,
    openapi_extra=VALUE_REQUEST_BODY,
    responses={
        204: {"description": "Stored; `ETag` names the new version.",
              "headers": {"ETag": {"schema": {"type": "string"}}}},
        **problem_responses(InvalidInput, PreconditionFailed, PayloadTooLarge, ServiceUnavailable),
    },
)
@accepts(Body.VALUE)
async def set_value(
    namespace: NamespacePath,
    collection: CollectionPath,
    key: Key,
    request: Request,
    conn: MetadataStatement,
    service: KvServiceDep,
    conditions: Conditions,
    ttl_seconds: Annotated[
        float | None,
        Query(gt=0, description="Expire the entry this many seconds from now (omit: never expires)."),
    ] = None,
) -> Response:
    """Upsert the JSON request body as the value of `key`; `If-Match` / `If-None-Match: *` make it conditional."""
    body = await request.body()
    etag = await service.set(
        conn, namespace, collection, key, body,
        ttl_seconds=ttl_seconds, conditions=conditions,
    )
    return Response(status_code=204, headers={"ETag": etag})


@router.get(
    "/{collection}/{key:path}",
    summary="Get a value",
    response_class=Response,
    responses={**VALUE_RESPONSE, **problem_responses(InvalidInput, NotFound, ServiceUnavailable)},
)
async def get_value(
    namespace: NamespacePath,
    collection: CollectionPath,
    key: Key,
    conn: MetadataStatement,
    service: KvServiceDep,
) -> Response:
    """The stored JSON value exactly as stored (a stored `null` is `200 null`); 404 when missing or expired."""
    text, etag = await service.get(conn, namespace, collection, key)
    return Response(content=text, media_type=JSON, headers={"ETag": etag})


@router.delete(
    "/{collection}/{key:path}",
    summary="Delete a value",
    status_code=204,
    responses=problem_responses(InvalidInput, ServiceUnavailable),
)
async def delete_value(
    namespace: NamespacePath,
    collection: CollectionPath,
    key: Key,
    conn: MetadataStatement,
    service: KvServiceDep,
) -> Response:
    """Delete `key`; 204 whether or not it existed."""
    await service.delete(conn, namespace, collection, key)
    return Response(status_code=204)


@router.get(
    "/{collection}",
    summary="List entries",
    response_model=KvPage,
    responses=problem_responses(InvalidInput, ServiceUnavailable),
)
async def list_entries(
    namespace: NamespacePath,
    collection: CollectionPath,
    conn: MetadataStatement,
    service: KvServiceDep,
    limit: PageLimit,
    prefix: Annotated[str | None, Query(max_length=1024, description="Only keys starting with this.")] = None,
    cursor: Annotated[str | None, Query(max_length=4096, description="`next_cursor` of the previous page.")] = None,
    keys_only: Annotated[bool, Query(description="Leave the values out of the items.")] = False,
) -> Response:
    """Entries `{key, value, etag}` sorted by key (UTF-8 byte order), a page at a time."""
    page = await service.list(
        conn, namespace, collection,
        prefix=prefix or None, limit=limit, cursor=cursor, keys_only=keys_only,
    )
    return Response(content=page.body, media_type=JSON)


# --- lifespan: the backend choice and the expiry sweep ---------------------------------------


async def _sweep_forever(databases: Databases, service: KvService) -> None:
    """Delete expired entries in bounded batches, every ``kv.sweep_interval_seconds``."""
    interval = service.settings.sweep_interval_seconds
    engine = databases.engine(Database.metadata).execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
    while True:
        await asyncio.sleep(interval)
        try:
            while True:
                async with engine.begin() as conn:
                    deleted = await service.sweep(conn)
                if deleted:
                    log.info("kv sweep deleted %d expired entries", deleted)
                if deleted < service.settings.sweep_batch:
                    break
        except asyncio.CancelledError:
            raise
        except Exception:  # the next round tries again; a sweep must never take the service down
            log.warning("kv sweep failed", exc_info=True)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Build the kv service for the metadata database's backend and run the expiry sweep."""
    databases: Databases = app.state.databases
    settings = app.state.settings
    dialect = databases.dialect(Database.metadata)
    repository = KvRepository(insert_builder(dialect), fixed_statements(dialect))
    service = KvService(repository, settings.limits, settings.kv)
    app.state.kv_service = service
    sweeper = asyncio.create_task(_sweep_forever(databases, service), name="kv-sweep")
    try:
        yield
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper
