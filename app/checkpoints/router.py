"""HTTP routes of the checkpoints capability: what ``GatewayCheckpointSaver`` (the client's
LangGraph ``BaseCheckpointSaver``) sends, one route per saver method."""

from __future__ import annotations

import logging
from typing import Annotated

import orjson
from fastapi import Query, Request, Response
from pydantic import TypeAdapter, ValidationError

from app.checkpoints.dependencies import CheckpointsServiceDep
from app.checkpoints.schemas import (
    CheckpointConfig,
    CheckpointCreate,
    CheckpointId,
    CheckpointNs,
    CheckpointPage,
    CheckpointSearch,
    CheckpointTupleRead,
    Copied,
    Deleted,
    RetentionRead,
    RetentionUpdate,
    RunsDelete,
    ThreadCopy,
    ThreadId,
    ThreadsPrune,
    WritesCreate,
)
from app.core.dependencies import CheckpointsConnection, NamespacePath
from app.core.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    problem_responses,
)
from app.core.fast import fast
from app.checkpoints.floats import check_float_range
from app.core.http.limits import Body, accepts
from app.core.names import KEY_PATTERN
from app.core.http.routing import CapabilityRouter

log = logging.getLogger("app.checkpoints")

router = CapabilityRouter("checkpoints", tags=["checkpoints"])

JSON = "application/json"
_ERRORS = problem_responses(InvalidInput, ServiceUnavailable)
_KEY_TEXT = {"pattern": KEY_PATTERN}  # checked by _valid, as the body models check the same fields
_WRITE_ERRORS = problem_responses(InvalidInput, PayloadTooLarge, ServiceUnavailable)
_COPY_ERRORS = problem_responses(InvalidInput, PayloadTooLarge, TooManyRequests, ServiceUnavailable)
_READ_ERRORS = problem_responses(InvalidInput, Conflict, ServiceUnavailable)


@router.post("/put", summary="Store a checkpoint", response_model=CheckpointConfig, responses=_WRITE_ERRORS)
@accepts(Body.JSON)
@fast(one_statement="postgresql")
async def put_checkpoint(
    namespace: NamespacePath, body: CheckpointCreate, request: Request, conn: CheckpointsConnection,
    service: CheckpointsServiceDep,
) -> Response:
    """Store a checkpoint with the channel values new in it (`aput`); values already stored at
    their version are kept once. Storing the same id again replaces the checkpoint. 413 when the
    checkpoint with its metadata, versions and the values they reference would weigh more than
    `checkpoints.max_checkpoint_bytes`; 422 for a number no 64-bit float holds (`1e400`, `1e-400`)."""
    check_float_range(await request.body())
    return Response(orjson.dumps(await service.put(conn, namespace, body)), media_type=JSON)


@router.post("/writes", summary="Store pending writes", status_code=204, responses=_WRITE_ERRORS)
@accepts(Body.JSON)
@fast(one_statement="postgresql")
async def put_writes(
    namespace: NamespacePath, body: WritesCreate, conn: CheckpointsConnection, service: CheckpointsServiceDep
) -> Response:
    """Store one task's writes against a checkpoint (`aput_writes`). 413 when the checkpoint's
    pending writes would weigh more than `checkpoints.max_pending_bytes`."""
    await service.put_writes(conn, namespace, body)
    return Response(status_code=204)


@router.get(
    "/tuple", summary="Get a checkpoint", response_model=CheckpointTupleRead,
    responses=problem_responses(InvalidInput, NotFound, Conflict, ServiceUnavailable),
)
@fast(one_statement="postgresql")
async def get_tuple(
    namespace: NamespacePath,
    thread_id: Annotated[str, Query(min_length=1, max_length=1024, json_schema_extra=_KEY_TEXT, description="LangGraph `thread_id`.")],
    conn: CheckpointsConnection,
    service: CheckpointsServiceDep,
    checkpoint_ns: Annotated[str, Query(max_length=1024, json_schema_extra=_KEY_TEXT, description="`\"\"` for the root graph.")] = "",
    checkpoint_id: Annotated[str | None, Query(max_length=128, json_schema_extra=_KEY_TEXT, description="Omit: the newest.")] = None,
) -> Response:
    """A checkpoint with its channel values and pending writes (`aget_tuple`); 404 when there is
    none, 409 when it weighs more than a read answers (`checkpoints.max_page_bytes`)."""
    thread_id = _valid("thread", "thread_id", thread_id)
    checkpoint_ns = _valid("ns", "checkpoint_ns", checkpoint_ns)
    checkpoint_id = _valid("id", "checkpoint_id", checkpoint_id) if checkpoint_id else None
    return Response(await service.get(conn, namespace, thread_id, checkpoint_ns, checkpoint_id), media_type=JSON)


@router.post("/search", summary="List checkpoints", response_model=CheckpointPage, responses=_READ_ERRORS)
@accepts(Body.JSON, read_only=True)
@fast(one_statement="postgresql")
async def search_checkpoints(
    namespace: NamespacePath, body: CheckpointSearch, request: Request, conn: CheckpointsConnection,
    service: CheckpointsServiceDep,
) -> Response:
    """Checkpoints newest first (`alist`): of a thread (and checkpoint_ns) or of the whole
    namespace, with a metadata `filter` (served by an index), `before` and a page `limit`. A page
    also ends before the checkpoint that would make it hold more than `checkpoints.max_page_bytes`
    (with values and pending writes): follow `next_cursor` until it is null. A first checkpoint
    heavier than that alone is a 409."""
    check_float_range(await request.body())
    return Response(await service.search(conn, namespace, body), media_type=JSON)


@router.delete("/threads", summary="Delete a thread", response_model=Deleted, responses=_ERRORS)
async def delete_thread(
    namespace: NamespacePath,
    thread_id: Annotated[str, Query(min_length=1, max_length=1024, json_schema_extra=_KEY_TEXT, description="LangGraph `thread_id`.")],
    service: CheckpointsServiceDep,
) -> Deleted:
    """Every checkpoint, value and pending write of the thread (`adelete_thread`); fine if it has none."""
    thread_id = _valid("thread", "thread_id", thread_id)
    return Deleted(deleted=await service.delete_thread(namespace, thread_id))


@router.post("/runs/delete", summary="Delete the checkpoints of runs", response_model=Deleted, responses=_WRITE_ERRORS)
@accepts(Body.JSON)
async def delete_runs(namespace: NamespacePath, body: RunsDelete, service: CheckpointsServiceDep) -> Deleted:
    """Checkpoints whose metadata `run_id` is listed, with their writes (`adelete_for_runs`)."""
    return Deleted(deleted=await service.delete_runs(namespace, body.run_ids))


@router.post("/threads/copy", summary="Copy a thread", response_model=Copied, responses=_COPY_ERRORS)
@accepts(Body.JSON)
async def copy_thread(namespace: NamespacePath, body: ThreadCopy, service: CheckpointsServiceDep) -> Copied:
    """Every checkpoint of the source thread with its values and writes into the target (`acopy_thread`),
    all at once into a thread without checkpoints; 413 when the source holds more than
    `checkpoints.max_copy_bytes`; 429 (with `Retry-After`) past `fairness.heavy_per_namespace` copies of the
    namespace at once."""
    return Copied(copied=await service.copy_thread(namespace, body.source_thread_id, body.target_thread_id))


@router.post("/prune", summary="Prune threads", response_model=Deleted, responses=_WRITE_ERRORS)
@accepts(Body.JSON)
async def prune(namespace: NamespacePath, body: ThreadsPrune, service: CheckpointsServiceDep) -> Deleted:
    """`keep_latest`: only the newest checkpoint per checkpoint_ns stays, with the ancestors its
    delta channels need; `delete`: nothing stays (`aprune`)."""
    return Deleted(deleted=await service.prune(namespace, body.thread_ids, body.strategy))


@router.put("/retention", summary="Set retention", response_model=RetentionRead, responses=_ERRORS)
@accepts(Body.JSON)
async def set_retention(
    namespace: NamespacePath, body: RetentionUpdate, conn: CheckpointsConnection, service: CheckpointsServiceDep
) -> RetentionRead:
    """Keep the latest N checkpoints and/or delete threads idle longer than a TTL, for the whole
    namespace or (with `thread_id`) one thread; applied by a background sweep."""
    return await service.set_retention(conn, namespace, body)


@router.get("/retention", summary="Get retention", response_model=RetentionRead, responses=_ERRORS)
async def get_retention(
    namespace: NamespacePath,
    conn: CheckpointsConnection,
    service: CheckpointsServiceDep,
    thread_id: Annotated[str | None, Query(max_length=1024, json_schema_extra=_KEY_TEXT, description="Omit: the namespace's.")] = None,
) -> RetentionRead:
    """The retention set for the namespace or one thread (`null`: not set)."""
    thread_id = _valid("thread", "thread_id", thread_id) if thread_id is not None else None
    return await service.retention(conn, namespace, thread_id)


_ADAPTERS = {name: TypeAdapter(a) for name, a in (("thread", ThreadId), ("ns", CheckpointNs), ("id", CheckpointId))}


def _valid(kind: str, field: str, value: str) -> str:
    """``value`` checked as the body models check the same field (query parameters)."""
    try:
        return _ADAPTERS[kind].validate_python(value)
    except ValidationError as exc:
        raise InvalidInput(field, exc.errors()[0]["msg"]) from None
