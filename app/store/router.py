"""HTTP routes of the store capability: LangGraph's batch of operations, namespace subtrees, TTL sweep.

``POST /batch`` takes any operations (a key with ``store:write``), ``POST /read`` only gets,
searches and namespace listings (``store:read``), ``POST /get`` only gets (one statement, on the
fast path); all answer in operation order, so that the client's ``AsyncBatchedBaseStore`` sends
one request per event-loop tick. LangGraph Platform's own
``/store`` API is ``app.store.platform``.
"""

from __future__ import annotations

from fastapi import Response
from starlette.background import BackgroundTask

from app.core.dependencies import NamespacePath, VectorsConnection
from app.core.errors import InvalidInput, PayloadTooLarge, ServiceUnavailable, problem_responses
from app.core.fast import fast
from app.core.http.limits import Body, accepts
from app.core.http.routing import CapabilityRouter
from app.store.dependencies import StoreServiceDep
from app.store.schemas import BatchRequest, BatchResults, Deleted, GetRequest, ReadRequest, SubtreeDelete

router = CapabilityRouter("store", tags=["store"])

_ERRORS = problem_responses(InvalidInput, PayloadTooLarge, ServiceUnavailable)
JSON = "application/json"


@router.post("/batch", summary="Run store operations", response_model=BatchResults, responses=_ERRORS)
@accepts(Body.JSON)
@fast()
async def batch(body: BatchRequest, namespace: NamespacePath, conn: VectorsConnection, service: StoreServiceDep) -> Response:
    """Gets, puts (a null value deletes), searches and namespace listings, answered in order in
    one transaction: each sees the writes before it, and a refused batch changes nothing."""
    outcome = await service.run(conn, namespace, service.check(body.ops), body.omit_expired, writes=True)
    after = BackgroundTask(service.dims_committed, outcome.new_dims) if outcome.new_dims else None
    return Response(outcome.body, media_type=JSON, background=after)


@router.post("/read", summary="Run store reads", response_model=BatchResults, responses=_ERRORS)
@accepts(Body.JSON, read_only=True)
@fast()
async def read(body: ReadRequest, namespace: NamespacePath, conn: VectorsConnection, service: StoreServiceDep) -> Response:
    """Gets, searches and namespace listings, answered in order; a TTL refreshed by the read
    (`refresh_ttl`) restarts just after the answer."""
    outcome = await service.run(conn, namespace, service.check(body.ops), body.omit_expired, writes=False)
    after = BackgroundTask(service.refresh_after, namespace, outcome.refresh) if outcome.refresh else None
    return Response(outcome.body, media_type=JSON, background=after)


@router.post("/get", summary="Get items", response_model=BatchResults, responses=_ERRORS)
@accepts(Body.JSON, read_only=True)
@fast(one_statement=True)
async def get(body: GetRequest, namespace: NamespacePath, conn: VectorsConnection, service: StoreServiceDep) -> Response:
    """Items by namespace and key, answered in order (null: none), in one statement; a TTL
    refreshed by the read (`refresh_ttl`) restarts just after the answer."""
    outcome = await service.get(conn, namespace, service.check(body.ops), body.omit_expired)
    after = BackgroundTask(service.refresh_after, namespace, outcome.refresh) if outcome.refresh else None
    return Response(outcome.body, media_type=JSON, background=after)


@router.post("/namespaces/delete", summary="Delete a namespace subtree", response_model=Deleted, responses=_ERRORS)
@accepts(Body.JSON)
async def delete_subtree(
    body: SubtreeDelete, namespace: NamespacePath, conn: VectorsConnection, service: StoreServiceDep,
) -> Response:
    """Delete the items whose namespace starts with `prefix`, at most `store.delete_batch` per
    request (`done`: none left)."""
    deleted, done = await service.delete_subtree(conn, namespace, body.prefix)
    return Response(Deleted(deleted=deleted, done=done).model_dump_json(), media_type=JSON)


@router.post("/sweep", summary="Delete expired items", response_model=Deleted, responses=_ERRORS)
@accepts(Body.NONE)
async def sweep(namespace: NamespacePath, conn: VectorsConnection, service: StoreServiceDep) -> Response:
    """Delete this namespace's items whose TTL has passed, at most `store.delete_batch` per request
    (the gateway also sweeps every `store.sweep_interval_seconds`)."""
    deleted, done = await service.sweep_namespace(conn, namespace)
    return Response(Deleted(deleted=deleted, done=done).model_dump_json(), media_type=JSON)
