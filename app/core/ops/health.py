"""Liveness and readiness, outside ``/v1``."""

from __future__ import annotations

import asyncio
import logging
import weakref

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from app.auth.dependencies import presents_admin_key
from app.core.config import Database
from app.core.db.databases import Databases
from app.core.db.migrations import current_revision, head_revision
from app.core.state import GatewayState, gateway_state

router = APIRouter(tags=["health"])
log = logging.getLogger("app.health")


class DatabaseStatus(BaseModel):
    backend: str = Field(examples=["sqlite"])
    reachable: bool
    migrated: bool
    revision: str | None = None
    head: str | None = None
    error: str | None = None


class StorageStatus(BaseModel):
    """Storage outside the databases (the files bucket or directory): reported, not part of ``ready``.

    ``location`` and ``error`` may name the bucket or a path, which ``/readyz`` (no key needed)
    shows only to the admin key, or to everyone with auth disabled; anyone else gets ``redacted()``.
    """

    backend: str = Field(examples=["s3"])
    reachable: bool
    location: str | None = Field(
        default=None,
        description="Where the bytes go: the bucket (s3) or the directory (directory). Only for the admin key "
        "(or with auth disabled); null for any other caller.",
    )
    error: str | None = Field(
        default=None,
        description="Why it is not reachable: in full (naming the bucket or a path) for the admin key or with auth "
        "disabled, a short reason that names neither for any other caller.",
    )
    public_error: str | None = Field(
        default=None, exclude=True,
        description="``error`` in words that name no bucket, path or host (never sent: what ``redacted`` shows).",
    )

    def redacted(self) -> StorageStatus:
        """This status as a caller without the admin key sees it: no location, the short reason."""
        public = None if self.error is None else self.public_error or "unreachable"
        return self.model_copy(update={"location": None, "error": public})


class Readiness(BaseModel):
    ready: bool
    reason: str | None = Field(default=None, description="Why not ready, when a database's disk is full.")
    auth: str = Field(default="required", description="`required`, or `disabled` when running without keys.")
    databases: dict[str, DatabaseStatus]
    storage: dict[str, StorageStatus] = Field(
        default_factory=dict,
        description="Storage besides the databases (files on s3 or in a directory). An unreachable bucket does not "
        "make the gateway unready: the other capabilities still serve, files routes answer 503 with Retry-After.",
    )

    def redacted(self) -> Readiness:
        """The answer for a caller without the admin key: each storage's ``redacted()``."""
        return self.model_copy(update={"storage": {name: s.redacted() for name, s in self.storage.items()}})


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
    """200 when all three databases answer and are at the migrations' head; 503 otherwise.

    It needs no key: where file bytes are kept (``storage.*.location``) and errors that name it
    are shown only to the admin key, or to everyone with auth disabled (there are no keys)."""
    state = gateway_state(request.app)
    result = await _shared_check(state)
    if state.settings.auth.mode != "disabled" and not presents_admin_key(request):
        result = result.redacted()
    status = 200 if result.ready else 503
    headers = {} if result.ready else {"Retry-After": "2"}
    return JSONResponse(result.model_dump(), status_code=status, headers=headers)


_checks: weakref.WeakKeyDictionary[GatewayState, asyncio.Future[Readiness]] = weakref.WeakKeyDictionary()
_reachable: weakref.WeakKeyDictionary[GatewayState, dict[str, bool]] = weakref.WeakKeyDictionary()


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
    result = Readiness(
        ready=all(s.reachable and s.migrated for s in statuses) and disk_full is None,
        reason=disk_full,
        auth=state.settings.auth.mode,
        databases={db.value: s for db, s in zip(Database, statuses, strict=True)},
        storage=dict(zip(checks, storage, strict=True)),
    )
    _log_changes(state, result.storage)
    return result


def _log_changes(state: GatewayState, storage: dict[str, StorageStatus]) -> None:
    """The detailed error (and where) at WARNING when a storage stops being reachable, at INFO when
    it is again: once per change, however many probes come (a storage not checked before counts
    as reachable, so one that is down from the start is logged once too). Checks of one state
    never overlap (``_shared_check``)."""
    known = _reachable.setdefault(state, {})
    for name, status in storage.items():
        was = known.get(name, True)
        known[name] = status.reachable
        where = f"{status.backend} {status.location}" if status.location else status.backend
        if was and not status.reachable:
            log.warning("%s storage (%s) is unreachable: %s", name, where, status.error)
        elif not was and status.reachable:
            log.info("%s storage (%s) is reachable again", name, where)
