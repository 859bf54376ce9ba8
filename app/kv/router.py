"""HTTP routes of the kv capability: JSON values by key, with ETags and optional expiry."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Query, Request, Response

from app.core.http.conditions import Conditions
from app.core.http.pagination import MAX_CURSOR_CHARS
from app.core.dependencies import CollectionPath, Key, MetadataConnection, NamespacePath, PageLimit
from app.core.errors import (
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    ServiceUnavailable,
    problem_responses,
)
from app.core.fast import fast
from app.core.http.limits import Body, accepts
from app.core.http.routing import CapabilityRouter
from app.core.names import KEY_PATTERN
from app.kv.dependencies import KvServiceDep
from app.kv.schemas import (
    VALUE_REQUEST_BODY,
    VALUE_RESPONSE,
    KvBatchRead,
    KvBatchWrite,
    KvBatchWritten,
    KvEtag,
    KvKeys,
    KvPage,
)

log = logging.getLogger("app.kv")

router = CapabilityRouter("kv", tags=["kv"])

JSON = "application/json"


# --- batches: many keys of one collection in one request -------------------------------------


@router.post(
    "/{collection}/get",
    summary="Get many values",
    response_model=KvBatchRead,
    responses=problem_responses(InvalidInput, PayloadTooLarge, ServiceUnavailable),
)
@accepts(Body.JSON, read_only=True)
async def get_values(
    namespace: NamespacePath,
    collection: CollectionPath,
    body: KvKeys,
    conn: MetadataConnection,
    service: KvServiceDep,
) -> Response:
    """The entries `{key, value, etag}` of `keys` in one request (a `kv:read`): `missing` names the keys
    without one, `unread` those left for another request once the answer's values reached `limits.max_page_bytes`."""
    return Response(content=await service.get_many(conn, namespace, collection, body.keys), media_type=JSON)


@router.post(
    "/{collection}",
    summary="Set many values",
    response_model=KvBatchWritten,
    responses=problem_responses(InvalidInput, PayloadTooLarge, ServiceUnavailable),
)
@accepts(Body.JSON)
async def set_values(
    namespace: NamespacePath,
    collection: CollectionPath,
    body: KvBatchWrite,
    request: Request,
    conn: MetadataConnection,
    service: KvServiceDep,
) -> KvBatchWritten:
    """Upsert every entry of the batch atomically, unconditionally: all are stored, or (on any error) none."""
    # The body was read once already; the service takes the values' numbers as written from it.
    written = await service.set_many(
        conn, namespace, collection, body.items, await request.body(), ttl_seconds=body.ttl_seconds
    )
    return KvBatchWritten(items=[KvEtag(key=k, etag=e) for k, e in written])


@router.post(
    "/{collection}/delete",
    summary="Delete many values",
    status_code=204,
    responses=problem_responses(InvalidInput, PayloadTooLarge, ServiceUnavailable),
)
@accepts(Body.JSON)
async def delete_values(
    namespace: NamespacePath,
    collection: CollectionPath,
    body: KvKeys,
    conn: MetadataConnection,
    service: KvServiceDep,
) -> Response:
    """Delete every key of `keys` in one statement; 204 whether or not they existed."""
    await service.delete_many(conn, namespace, collection, body.keys)
    return Response(status_code=204)


# --- one key ------------------------------------------------------------------------------


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
@fast(one_statement=True)
async def set_value(
    namespace: NamespacePath,
    collection: CollectionPath,
    key: Key,
    request: Request,
    conn: MetadataConnection,
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
@fast(one_statement=True)
async def get_value(
    namespace: NamespacePath,
    collection: CollectionPath,
    key: Key,
    conn: MetadataConnection,
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
@fast(one_statement=True)
async def delete_value(
    namespace: NamespacePath,
    collection: CollectionPath,
    key: Key,
    conn: MetadataConnection,
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
@fast(one_statement=True)
async def list_entries(
    namespace: NamespacePath,
    collection: CollectionPath,
    conn: MetadataConnection,
    service: KvServiceDep,
    limit: PageLimit,
    prefix: Annotated[str | None, Query(max_length=1024, pattern=KEY_PATTERN, description="Only keys starting with this.")] = None,
    cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_CHARS, description="`next_cursor` of the previous page.")] = None,
    keys_only: Annotated[bool, Query(description="Leave the values out of the items.")] = False,
) -> Response:
    """Entries `{key, value, etag}` sorted by key (UTF-8 byte order), a page at a time."""
    page = await service.list(
        conn, namespace, collection,
        prefix=prefix or None, limit=limit, cursor=cursor, keys_only=keys_only,
    )
    return Response(content=page.body, media_type=JSON)
