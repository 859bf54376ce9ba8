"""HTTP routes of the vectors capability: collections, points, filtered and hybrid search."""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import BackgroundTasks, Header, Query, Request, Response

from app.core.dependencies import CollectionPath, NamespacePath, PageLimit, VectorsConnection
from app.core.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    problem_responses,
)
from app.core.fast import fast
from app.core.http.limits import Body, accepts
from app.core.http.routing import CapabilityRouter
from app.vectors.dependencies import PointId, PointNamespace, VectorServiceDep
from app.vectors.encoding import json_response
from app.vectors.schemas import (
    CollectionCreate,
    CollectionPage,
    CollectionRead,
    Deleted,
    PointPage,
    PointRead,
    PointsDelete,
    PointsList,
    PointsUpsert,
    PointsUpserted,
    PointUpdate,
    SearchRequest,
    SearchResults,
)
from app.vectors.backend import CollectionInfo
from app.vectors.service import VectorService

log = logging.getLogger("app.vectors")

router = CapabilityRouter("vectors", tags=["vectors"])

_ERRORS = problem_responses(InvalidInput, NotFound, ServiceUnavailable)
VectorFormat = Annotated[
    Literal["json", "b64"], Query(description="`b64`: vectors as base64 little-endian float32 (`vector_b64`).")
]


@router.get("", summary="List collections", response_model=CollectionPage, responses=_ERRORS)
async def list_collections(
    namespace: NamespacePath,
    conn: VectorsConnection,
    service: VectorServiceDep,
    limit: PageLimit,
    cursor: Annotated[str | None, Query()] = None,
) -> Response:
    """The namespace's vector collections, by name."""
    return json_response(await service.list_collections(conn, namespace, limit, cursor))


@router.put(
    "/{collection}",
    summary="Create or ensure a collection",
    response_model=CollectionRead,
    status_code=201,
    responses={200: {"description": "Already existed with these settings."}, **problem_responses(InvalidInput, Conflict, ServiceUnavailable)},
)
@accepts(Body.JSON)
async def create_collection(
    collection: CollectionPath, body: CollectionCreate, namespace: NamespacePath, conn: VectorsConnection, service: VectorServiceDep
) -> Response:
    """Idempotent: 201 when created, 200 when it exists with the same settings, 409 otherwise."""
    info, created = await service.create(conn, namespace, collection, body)
    return json_response(await service.read_created(conn, info), 201 if created else 200)


@router.get("/{collection}", summary="Describe a collection", response_model=CollectionRead, responses=_ERRORS)
async def describe_collection(
    collection: CollectionPath, namespace: NamespacePath, conn: VectorsConnection, service: VectorServiceDep
) -> Response:
    """Settings, point count and the index in use."""
    return json_response(await service.describe(conn, namespace, collection))


@router.delete("/{collection}", summary="Drop a collection", status_code=204, responses=_ERRORS)
async def drop_collection(
    collection: CollectionPath, namespace: NamespacePath, conn: VectorsConnection, service: VectorServiceDep
) -> Response:
    """Drop the collection and all its points; 204 whether or not it existed."""
    await service.drop(conn, namespace, collection)
    return Response(status_code=204)


@router.post("/{collection}/reset", summary="Remove all points", status_code=204, responses=_ERRORS)
@accepts(Body.NONE)
async def reset_collection(
    collection: CollectionPath, namespace: NamespacePath, conn: VectorsConnection, service: VectorServiceDep
) -> Response:
    """Remove every point and keep the collection and its settings."""
    await service.reset(conn, namespace, collection)
    return Response(status_code=204)


@router.post(
    "/{collection}/points",
    summary="Insert or update points",
    response_model=PointsUpserted,
    responses=problem_responses(InvalidInput, NotFound, Conflict, PayloadTooLarge, ServiceUnavailable),
)
@accepts(Body.JSON)
async def upsert_points(
    collection: CollectionPath,
    body: PointsUpsert,
    request: Request,
    namespace: NamespacePath,
    service: VectorServiceDep,
    background: BackgroundTasks,
    idempotency_key: Annotated[
        str | None,
        Header(alias="Idempotency-Key", description="A retry with the same key and body replays the first answer."),
    ] = None,
) -> Response:
    """Upsert a batch in one statement; ids are generated for points without one. The batch is one
    transaction; a large one a heavy write's turn (on SQLite it begins after the single writes waiting)."""
    raw = await request.body()
    async with service.heavy.batch(namespace, len(raw)) as conn:
        answer, written = await service.upsert(conn, namespace, collection, body, raw, idempotency_key)
    _after_commit(service, written, background)
    return json_response(answer)


@router.post("/{collection}/search", summary="Search", response_model=SearchResults, responses=_ERRORS)
@accepts(Body.JSON, read_only=True)
@fast()
async def search(
    collection: CollectionPath, body: SearchRequest, namespace: NamespacePath, conn: VectorsConnection,
    service: VectorServiceDep,
) -> Response:
    """The `min(limit, matches)` nearest points matching `filters`, by descending score (hybrid with `query`)."""
    return json_response(await service.search(conn, namespace, collection, body))


@router.post("/{collection}/points/list", summary="List points", response_model=PointPage, responses=_ERRORS)
@accepts(Body.JSON, read_only=True)
async def list_points(
    collection: CollectionPath, body: PointsList, namespace: NamespacePath, conn: VectorsConnection, service: VectorServiceDep
) -> Response:
    """Points matching `filters`, by id, a page at a time."""
    return json_response(await service.list_points(conn, namespace, collection, body))


@router.post("/{collection}/points/delete", summary="Delete points by ids or filter", response_model=Deleted, responses=_ERRORS)
@accepts(Body.JSON)
async def delete_points(
    collection: CollectionPath,
    body: PointsDelete,
    namespace: NamespacePath,
    conn: VectorsConnection,
    service: VectorServiceDep,
    background: BackgroundTasks,
) -> Response:
    """Delete the points in `ids` and/or matching `filters`; answers how many went."""
    answer, written = await service.delete_points(conn, namespace, collection, body)
    _after_commit(service, written, background)
    return json_response(answer)


@router.get("/{collection}/points/{point_id:path}", summary="Get a point", response_model=PointRead, responses=_ERRORS)
async def get_point(
    collection: CollectionPath,
    point_id: PointId,
    namespace: PointNamespace,
    conn: VectorsConnection,
    service: VectorServiceDep,
    vector_format: VectorFormat = "json",
    with_vector: Annotated[bool, Query(description="Include the vector.")] = True,
) -> Response:
    """One point with its payload (and vector)."""
    return json_response(await service.get_point(conn, namespace, collection, point_id, with_vector, vector_format))


@router.patch("/{collection}/points/{point_id:path}", summary="Update a point", response_model=PointRead, responses=_ERRORS)
@accepts(Body.JSON)
async def update_point(
    collection: CollectionPath,
    point_id: PointId,
    body: PointUpdate,
    namespace: PointNamespace,
    conn: VectorsConnection,
    service: VectorServiceDep,
    background: BackgroundTasks,
) -> Response:
    """Replace the vector and/or the payload; a field left out or null keeps what is stored."""
    answer, written = await service.update_point(conn, namespace, collection, point_id, body)
    _after_commit(service, written, background)
    return json_response(answer)


@router.delete("/{collection}/points/{point_id:path}", summary="Delete a point", status_code=204, responses=_ERRORS)
async def delete_point(
    collection: CollectionPath,
    point_id: PointId,
    namespace: PointNamespace,
    conn: VectorsConnection,
    service: VectorServiceDep,
    background: BackgroundTasks,
) -> Response:
    """Delete one point; 204 whether or not it existed."""
    written = await service.delete_point(conn, namespace, collection, point_id)
    _after_commit(service, written, background)
    return Response(status_code=204)


def _after_commit(service: VectorService, written: CollectionInfo | None, background: BackgroundTasks) -> None:
    """Tell the index builder about the request's point writes (``written``: the collection the
    service call wrote) once they are committed: the write transaction commits as the answer
    starts, background tasks run after the answer."""
    if service.builder is not None and written is not None:
        background.add_task(service.builder.notice, written)
