"""``GET /v1/{namespace}/export``, ``POST /v1/{namespace}/import``: a namespace as one archive;
``DELETE /v1/{namespace}``: all of its data, in bounded batches.

All three are for the admin key and for keys with the ``namespace:admin`` scope on the namespace
(``*:*`` does not include it: an all-data key should not take or replace a namespace wholesale);
the gate checks that from the headers, before any byte of the body is read. The export is the
response, streamed from one snapshot per database; the import reads the request body as it
arrives (at most ``MAX_ARCHIVE_BYTES``) into an empty namespace; the delete works for at most
``wait`` seconds a request (202 with what went so far: send it again).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import ClientDisconnect

from app.auth.dependencies import authenticate, refuse_foreign_origin
from app.auth.service import ANONYMOUS
from app.core.dependencies import NamespacePath
from app.core.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    PayloadTooLarge,
    ServiceUnavailable,
    problem_responses,
)
from app.core.http.limits import Body, accepts
from app.core.http.routing import GatedRoutes, copy_routes
from app.core.state import disk_space_of, gateway_state
from app.portability.exporter import export_archive
from app.core.namespace_data import DeleteReport, delete_namespace
from app.portability.importer import import_archive, importing

ROUTES = ("export", "import")  # and DELETE on /v1/{namespace} itself
TAG = "namespace"

router = APIRouter(tags=[TAG])

MAX_CONCURRENT_EXPORTS = 2
_exports = asyncio.Semaphore(MAX_CONCURRENT_EXPORTS)


async def namespace_admin_guard(request: Request, _gate: str, _reads: bool) -> None:
    """403 unless the caller administers the namespace (admin key, or ``namespace:admin`` on it)."""
    principal = await authenticate(request)
    namespace = request.path_params.get("namespace", "")
    if request.method in ("POST", "DELETE"):  # an import or a delete writes: as a capability's gate does for a write
        if principal is ANONYMOUS:
            refuse_foreign_origin(request)
        if (space := disk_space_of(request)) is not None:
            space.check_write(request)  # 507 while the disk is full
    if principal is ANONYMOUS or principal.administers(namespace):
        return
    raise Forbidden("exporting, importing or deleting a whole namespace needs the admin key or a key with the namespace:admin scope on it")


class NamespaceRoutes(GatedRoutes):
    """Routes of a namespace as a whole: ``/v1/{namespace}`` itself and ``/v1/{namespace}/<name>``."""

    def selects(self, parts: list[str]) -> bool:
        return parts[1:2] == ["v1"] and (len(parts) == 3 or (len(parts) == 4 and parts[3] in ROUTES))


def include(app: FastAPI) -> None:
    routes = copy_routes(app, router, "/v1/{namespace}")
    app.router.routes.append(NamespaceRoutes(TAG, routes, namespace_admin_guard, gateway_state(app).settings))


@router.get(
    "/export", summary="Export a namespace as an archive", response_class=StreamingResponse,
    responses={200: {"content": {"application/x-tar": {}}, "description": "The archive (docs/archive-format.md)."},
               **problem_responses(ServiceUnavailable)},
    openapi_extra={"x-required-scope": "namespace:admin"},
)
async def export_namespace(namespace: NamespacePath, request: Request) -> StreamingResponse:
    """Every capability's data of the namespace, from one snapshot per database, as a tar streamed
    as it is read. An error after the first byte cuts the archive short (an import refuses it)."""
    state = gateway_state(request.app)
    if _exports.locked():  # each holds a connection per database for as long as its client reads
        raise ServiceUnavailable(
            f"{MAX_CONCURRENT_EXPORTS} exports are running in this process; try again later", headers={"Retry-After": "5"}
        )
    await _exports.acquire()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    body = export_archive(state, namespace)
    try:
        first = await anext(body)  # the snapshots are open and the manifest written: errors before this are answers
    except BaseException:
        _exports.release()
        await body.aclose()
        raise

    async def stream() -> AsyncIterator[bytes]:
        try:
            yield first
            async for piece in body:
                yield piece
        finally:
            _exports.release()
            await body.aclose()  # the snapshots end with the answer, however it ends

    return StreamingResponse(
        stream(), media_type="application/x-tar",
        headers={"Content-Disposition": f'attachment; filename="{namespace}-{stamp}.sgw.tar"'},
    )


@router.post(
    "/import", summary="Import an archive into an empty namespace",
    openapi_extra={
        "x-required-scope": "namespace:admin",
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            "description": "The archive (a tar, docs/archive-format.md); any Content-Type is accepted.",
        },
    },
    responses=problem_responses(Conflict, InvalidInput, PayloadTooLarge),
)
@accepts(Body.ARCHIVE)
async def import_namespace(
    namespace: NamespacePath, request: Request,
    mode: Annotated[Literal["fail"], Query(description="`fail`: the namespace must be empty (merge and replace: later).")] = "fail",
) -> JSONResponse:
    """Load an archive (the request body, streamed) into the namespace, which must be empty
    (``mode=fail``, the only mode yet). Every member is checked before it is stored; a refused
    archive (422/413, naming the member) leaves the namespace empty: it loads into a hidden
    namespace and is published only once whole (docs/archive-format.md)."""
    state = gateway_state(request.app)

    async def body() -> AsyncIterator[bytes]:
        try:
            async for piece in request.stream():
                if piece:
                    yield piece
        except ClientDisconnect:
            return

    report: dict[str, Any] = await import_archive(state, namespace, body())
    return JSONResponse(report)


DELETE_BATCH = 500  # items a transaction
DELETE_ROUND = 20  # batches between two looks at the clock


@router.delete(
    "", summary="Delete a namespace's data, every capability",
    responses={
        200: {"description": "All deleted: what was, by capability (`done`: true)."},
        202: {"description": "`wait` ran out first: what was deleted so far (`done`: false); send the request again to go on."},
        **problem_responses(Conflict),
    },
    openapi_extra={"x-required-scope": "namespace:admin"},
)
async def delete_namespace_data(
    namespace: NamespacePath, request: Request,
    wait: Annotated[float, Query(ge=0, le=30, description="Seconds to go on deleting before answering 202 (at least one round).")] = 10,
) -> JSONResponse:
    """Delete every capability's data of the namespace (files' bytes too), ``DELETE_BATCH`` items
    a transaction, for at most ``wait`` seconds; what was deleted, by capability and table. An
    interrupted delete leaves the rest in place: the same request goes on with it."""
    state = gateway_state(request.app)
    if namespace in importing:
        raise Conflict(f"an import into {namespace!r} is running", code="import_in_progress")
    deadline = asyncio.get_running_loop().time() + wait
    total = DeleteReport(namespace)
    while True:
        report = await delete_namespace(state, namespace, batch=DELETE_BATCH, max_batches=DELETE_ROUND)
        for cap, counts in report.deleted.items():
            total.add(cap, counts)
        if report.done or asyncio.get_running_loop().time() >= deadline:
            break
    body = {"namespace": namespace, "deleted": total.deleted, "done": report.done}
    return JSONResponse(body, status_code=200 if report.done else 202)
