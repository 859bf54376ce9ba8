"""Liveness and readiness, outside ``/v1``."""

from __future__ import annotations

import asyncio
import weakref

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from app.core.config import Database
from app.core.db.databases import Databases
from app.core.db.migrations import current_revision, head_revision
from app.core.state import GatewayState, gateway_state

router = APIRouter(tags=["health"])


class DatabaseStatus(BaseModel):
    backend: str = Field(examples=["sqlite"])
    reachable: bool
    migrated: bool
    revision: str | None = None
    head: str | None = None
    error: str | None = None


class StorageStatus(BaseModel):
    """Storage outside the databases (the files bucket): reported, not part of ``ready``."""

    backend: str = Field(examples=["s3"])
    reachable: bool
    location: str | None = Field(default=None, description="The bucket, for s3.")
    error: str | None = None


class Readiness(BaseModel):
    ready: bool
    reason: str | None = Field(default=None, description="Why not ready, when a database's disk is full.")
    auth: str = Field(default="required", description="`required`, or `disabled` when running without keys.")
    databases: dict[str, DatabaseStatus]
    storage: dict[str, StorageStatus] = Field(
        default_factory=dict,
        description="Storage besides the databases (files on s3). An unreachable bucket does not make the "
        "gateway unready: the other capabilities still serve, files routes answer 503 with Retry-After.",
    )


async def _status(databases: Databases, db: Database) -> DatabaseStatus:
    head = head_revision()
    backend = databases.dialect(db)
    timeout = databases.settings.databases.get(db).connect_timeout
    try:
        revision = await asyncio.wait_for(current_revision(databases, db), timeout)
    except Exception as exc:  # noqa: BLE001 - unreachable for any reason: report, never raise
        return DatabaseStatus(backend=backend, reachable=False, migrated=False, head=head,
                              error=exc.__class__.__name__)
    return DatabaseStatus(backend=backend, reachable=True, migrated=revision == head,
                          revision=revision, head=head)


@router.get("/healthz", summary="Liveness: the process is up")
async def healthz() -> dict[str, str]:
    """Answers 200 while the process can serve HTTP; touches no database."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: every database reachable and migrated",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "A database is unreachable or behind"}},
)
async def readyz(request: Request) -> JSONResponse:
    """200 when all three databases answer and are at the migrations' head; 503 otherwise."""
    result = await _shared_check(gateway_state(request.app))
    status = 200 if result.ready else 503
    headers = {} if result.ready else {"Retry-After": "2"}
    return JSONResponse(result.model_dump(), status_code=status, headers=headers)


_checks: weakref.WeakKeyDictionary[GatewayState, asyncio.Future[Readiness]] = weakref.WeakKeyDictionary()


async def _shared_check(state: GatewayState) -> Readiness:
    """The readiness check in progress, or a new one: requests that arrive while one runs share
    its answer. ``/readyz`` needs no key and each check is a statement on each database and a
    request to the bucket, so without this a flood of probes was as many of each."""
    running = _checks.get(state)
    if running is None or running.done():
        running = asyncio.ensure_future(_check(state))
        # retrieved even when every probe waiting on it went away (no "never retrieved" log)
        running.add_done_callback(lambda done: done.cancelled() or done.exception())
        _checks[state] = running
    return await asyncio.shield(running)  # a caller that goes away does not cancel the others' check


async def _check(state: GatewayState) -> Readiness:
    databases = state.databases
    checks = state.storage_checks
    statuses = await asyncio.gather(*(_status(databases, db) for db in Database))
    storage = await asyncio.gather(*(check() for check in checks.values()))
    space = state.disk_space
    disk_full = space.reason() if space is not None else None
    return Readiness(
        ready=all(s.reachable and s.migrated for s in statuses) and disk_full is None,
        reason=disk_full,
        auth=state.settings.auth.mode,
        databases={db.value: s for db, s in zip(Database, statuses, strict=True)},
        storage=dict(zip(checks, storage, strict=True)),
    )
