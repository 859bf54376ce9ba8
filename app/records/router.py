"""HTTP routes of the records capability: JSON records per collection, ordered by key."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request, Response

from app.core.dependencies import (
    CheckpointsConnection,
    CollectionPath,
    Key,
    NamespacePath,
    PageLimit,
)
from app.core.errors import (
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    problem_responses,
)
from app.core.fast import fast
from app.core.http.limits import Body, accepts
from app.core.http.pagination import MAX_CURSOR_CHARS
from app.core.http.routing import CapabilityRouter
from app.core.names import KEY_PATTERN
from app.records.dependencies import RecordsServiceDep
from app.records.schemas import (
    VALUE_REQUEST_BODY,
    RecordBatchCreate,
    RecordBatchResult,
    RecordPage,
    RecordRead,
    SortOrder,
    TrimRequest,
    TrimResult,
)

router = CapabilityRouter("records", tags=["records"])

JSON = "application/json"
_ERRORS = problem_responses(InvalidInput, ServiceUnavailable)


@router.put(
    "/{collection}/{key:path}",
    summary="Upsert a record",
    status_code=204,
    openapi_extra=VALUE_REQUEST_BODY,
    responses={204: {"description": "Stored."}, **problem_responses(InvalidInput, PayloadTooLarge, ServiceUnavailable)},
)
@accepts(Body.VALUE)
@fast(one_statement=True)
async def upsert_record(
    namespace: NamespacePath,
    collection: CollectionPath,
    key: Key,
    request: Request,
    conn: CheckpointsConnection,
    service: RecordsServiceDep,
) -> Response:
    """Store the JSON request body as the record `key` (replacing any record with that key)."""
    await service.upsert(conn, namespace, collection, key, await request.body())
    return Response(status_code=204)


@router.post(
    "/{collection}/trim",
    summary="Trim a collection",
    response_model=TrimResult,
    responses=_ERRORS,
)
@accepts(Body.JSON)
async def trim_records(
    namespace: NamespacePath,
    collection: CollectionPath,
    trim: TrimRequest,
    conn: CheckpointsConnection,
    service: RecordsServiceDep,
) -> TrimResult:
    """Delete keys strictly below `before` (the key `before` itself stays) and/or all but the `keep_last` largest, in one statement."""
    deleted = await service.trim(
        conn, namespace, collection, before=trim.before, keep_last=trim.keep_last
    )
    return TrimResult(deleted=deleted)


@router.post(
    "/{collection}",
    summary="Upsert a batch of records",
    response_model=RecordBatchResult,
    responses=problem_responses(InvalidInput, PayloadTooLarge, ServiceUnavailable),
)
@accepts(Body.JSON)
async def upsert_records(
    namespace: NamespacePath,
    collection: CollectionPath,
    batch: RecordBatchCreate,
    request: Request,
    service: RecordsServiceDep,
) -> RecordBatchResult:
    """Upsert every record of the batch atomically: all are stored, or (on any error) none."""
    # The body was read once already; the service takes the values' numbers as written from it.
    count = await service.upsert_batch(namespace, collection, batch.records, await request.body())
    return RecordBatchResult(upserted=count)


@router.get(
    "/{collection}/{key:path}",
    summary="Get a record",
    response_model=RecordRead,
    responses=problem_responses(InvalidInput, NotFound, ServiceUnavailable),
)
@fast(one_statement=True)
async def get_record(
    namespace: NamespacePath,
    collection: CollectionPath,
    key: Key,
    conn: CheckpointsConnection,
    service: RecordsServiceDep,
) -> Response:
    """The record `{key, value}`, its value exactly as stored; 404 when missing."""
    body = await service.get(conn, namespace, collection, key)
    return Response(content=body, media_type=JSON)


@router.delete(
    "/{collection}/{key:path}",
    summary="Delete a record",
    status_code=204,
    responses=_ERRORS,
)
@fast(one_statement=True)
async def delete_record(
    namespace: NamespacePath,
    collection: CollectionPath,
    key: Key,
    conn: CheckpointsConnection,
    service: RecordsServiceDep,
) -> Response:
    """Delete the record `key`; 204 whether or not it existed."""
    await service.delete(conn, namespace, collection, key)
    return Response(status_code=204)


@router.get(
    "/{collection}",
    summary="List records in key order",
    response_model=RecordPage,
    responses=_ERRORS,
)
@fast(one_statement=True)
async def list_records(
    namespace: NamespacePath,
    collection: CollectionPath,
    conn: CheckpointsConnection,
    service: RecordsServiceDep,
    limit: PageLimit,
    order: Annotated[
        SortOrder | None, Query(description="`asc` (default) or `desc`: `desc` with `limit` n gives the n largest keys, largest first.")
    ] = None,
    after: Annotated[str | None, Query(max_length=1024, pattern=KEY_PATTERN, description="Only keys strictly greater.")] = None,
    before: Annotated[str | None, Query(max_length=1024, pattern=KEY_PATTERN, description="Only keys strictly smaller.")] = None,
    cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_CHARS, description="`next_cursor` of the previous page.")] = None,
) -> Response:
    """Records `{key, value}` ordered by key (UTF-8 byte order), never by insertion time."""
    body = await service.page(
        conn, namespace, collection,
        order=order, limit=limit, after=after, before=before, cursor=cursor,
    )
    return Response(content=body, media_type=JSON)
