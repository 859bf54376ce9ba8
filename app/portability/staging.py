"""Where an import loads before anyone can see it, and how it becomes the namespace.

An import loads into a hidden namespace, ``~imp.<job>`` (no request can name it: ``NAME_PATTERN``
has no ``~``), and records it in ``namespace_imports`` (metadata database, one row per target:
its job, staging namespace and state). Only a complete, verified load is published: the row goes
``loading`` -> ``publishing`` (only if it still names this job), then each capability's tables
are renamed from the staging namespace to the target in one transaction per capability
(``UPDATE t SET namespace = target WHERE namespace = staging``; a vector collection's points,
a thread's checkpoints and a file's bytes hang off rows that carry the namespace, so they move
with them), the usage of the ``Kept`` capabilities is recounted, and the row is deleted.

Rules: the target is never written before the publish, so a failed or killed load leaves it as
it was. A ``publishing`` row is finished by whoever sees it next (the next import of the target,
or ``recover``, at start-up and every ``RECOVER_SECONDS``, once it is ``PUBLISH_STALE``): each step is idempotent. A ``loading``
row whose job is not running is a killed import: the next import of the target sweeps its
staging namespace before loading (bounded batches, ``delete_namespace``), and ``recover`` sweeps
those idle for more than ``ABANDON_AFTER`` (an import touches its row at least every
``HEARTBEAT_SECONDS`` while it loads).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import anyio
from sqlalchemy import Column, String, Table, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from app.core.config import Database
from app.core.db.tables import METADATA, UtcDateTime, byte_ordered
from app.core.errors import Conflict
from app.core.namespace_data import DEFAULT_BATCH, delete_namespace, writer

if TYPE_CHECKING:
    from app.core.capability import Periodic
    from app.core.state import GatewayState

log = logging.getLogger("app.portability")

STAGING_PREFIX = "~imp."
HEARTBEAT_SECONDS = 10.0
ABANDON_AFTER = timedelta(hours=1)  # a loading import untouched this long is taken for killed
PUBLISH_STALE = timedelta(seconds=60)  # a publish untouched this long is finished by ``recover``
RECOVER_SECONDS = 300.0
RECOVER_ROWS = 10  # rows one recovery round looks at
SWEEP_BATCHES = 200  # batches (``DEFAULT_BATCH`` items each) one recovery round deletes of a staging namespace

CRASH_AT = os.environ.get("SG_TEST_CRASH_AT", "")
"""Fault injection for tests/test_portability.py: the process SIGKILLs itself at this point
(``load:<member>`` once the member is committed, ``publish:<capability>`` once it is renamed)."""


def crash_point(name: str) -> None:
    if CRASH_AT == name:
        os.kill(os.getpid(), signal.SIGKILL)


namespace_imports = Table(
    "namespace_imports", METADATA[Database.metadata],
    Column("target", byte_ordered(128), primary_key=True),
    Column("job", String(32), nullable=False),
    Column("staging", byte_ordered(128), nullable=False),
    Column("state", String(16), nullable=False, comment="loading | publishing"),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)


class ImportSuperseded(Conflict):
    code = "import_superseded"


class PublishConflict(Conflict):
    code = "import_publish_conflict"


@dataclass(frozen=True)
class Pending:
    target: str
    job: str
    staging: str
    state: str
    updated_at: datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


async def pending(state: GatewayState, target: str) -> Pending | None:
    """The target's unfinished import, if one is recorded."""
    async with state.databases.engine(Database.metadata).connect() as conn:
        row = (await conn.execute(select(namespace_imports).where(namespace_imports.c.target == target))).first()
    return None if row is None else Pending(row.target, row.job, row.staging, row.state, row.updated_at)


async def begin(state: GatewayState, target: str, previous: Pending | None) -> Pending:
    """A new job for ``target``: the previous (killed) job's staging swept first, then the row
    (re)written, so a kill in between leaves a row that still names what is left to sweep."""
    if previous is not None:
        await sweep(state, previous.staging)
    job = uuid.uuid4().hex[:24]
    now = utcnow()
    new = Pending(target, job, STAGING_PREFIX + job, "loading", now)
    async with writer(state.databases.engine(Database.metadata)).begin() as conn:
        await conn.execute(delete(namespace_imports).where(namespace_imports.c.target == target))
        await conn.execute(insert(namespace_imports).values(
            target=target, job=job, staging=new.staging, state="loading", created_at=now, updated_at=now,
        ))
    return new


class Heartbeat:
    """Touches the job's row at most every ``HEARTBEAT_SECONDS`` (``recover`` leaves a fresh row alone)."""

    def __init__(self, state: GatewayState, job: Pending) -> None:
        self.state, self.job, self.last = state, job, time.monotonic()

    async def __call__(self) -> None:
        if time.monotonic() - self.last < HEARTBEAT_SECONDS:
            return
        self.last = time.monotonic()
        async with writer(self.state.databases.engine(Database.metadata)).begin() as conn:
            await conn.execute(
                update(namespace_imports)
                .where(namespace_imports.c.target == self.job.target, namespace_imports.c.job == self.job.job)
                .values(updated_at=utcnow())
            )


async def abandon(state: GatewayState, job: Pending) -> None:
    """A failed load: its staging deleted, then its row (if it is still this job's)."""
    await sweep(state, job.staging)
    async with writer(state.databases.engine(Database.metadata)).begin() as conn:
        await conn.execute(
            delete(namespace_imports)
            .where(namespace_imports.c.target == job.target, namespace_imports.c.job == job.job)
        )


async def sweep(state: GatewayState, staging: str, max_batches: int | None = None) -> bool:
    """Delete a staging namespace's data, ``DEFAULT_BATCH`` items a transaction; whether all is gone."""
    assert staging.startswith(STAGING_PREFIX), staging
    with anyio.CancelScope(shield=True):
        report = await delete_namespace(state, staging, batch=DEFAULT_BATCH, max_batches=max_batches)
        if report.done:
            await _drop_usage(state, staging)
    return report.done


async def _drop_usage(state: GatewayState, namespace: str) -> None:
    """The staging namespace's usage rows (all zero once its data is gone or moved)."""
    from app.quotas.tables import TABLES

    for db, (usage, _) in TABLES.items():
        async with writer(state.databases.engine(db)).begin() as conn:
            await conn.execute(delete(usage).where(usage.c.namespace == namespace))


async def claim(state: GatewayState, job: Pending) -> None:
    """Turn this job's ``loading`` row to ``publishing``: from here on the import is finished by
    whoever sees the row. 409 ``import_superseded`` if another import of the target took it over."""
    async with writer(state.databases.engine(Database.metadata)).begin() as conn:
        done = await conn.execute(
            update(namespace_imports)
            .where(namespace_imports.c.target == job.target, namespace_imports.c.job == job.job,
                   namespace_imports.c.state == "loading")
            .values(state="publishing", updated_at=utcnow())
        )
        if done.rowcount != 1:
            raise ImportSuperseded(f"another import of {job.target!r} took over this one's place")


async def publish(state: GatewayState, job: Pending) -> dict[str, int]:
    """Make a claimed job's staging namespace the target: rows renamed per capability, one
    transaction each; how many rows moved per capability. Run again, it finishes what is left."""
    meta = writer(state.databases.engine(Database.metadata))
    moved: dict[str, int] = {}
    with anyio.CancelScope(shield=True):  # once publishing, a gone client does not stop it halfway
        for capability in state.capabilities:
            tables: Sequence[Table] = capability.tables
            try:
                async with writer(state.databases.engine(capability.database)).begin() as conn:
                    n = 0
                    for table in tables:
                        result = await conn.execute(
                            update(table).where(table.c.namespace == job.staging).values(namespace=job.target)
                        )
                        n += max(result.rowcount, 0)
            except IntegrityError:
                raise PublishConflict(
                    f"{capability.name} of {job.target!r} was written while the import was published; "
                    "the import stays pending: empty the namespace and send the archive again"
                ) from None
            moved[capability.name] = n
            crash_point(f"publish:{capability.name}")
        from app.quotas.usage import reconcile_namespace

        await reconcile_namespace(state, job.target)  # what no trigger moved (vector points)
        await _drop_usage(state, job.staging)
        async with meta.begin() as conn:
            await conn.execute(
                delete(namespace_imports)
                .where(namespace_imports.c.target == job.target, namespace_imports.c.job == job.job)
            )
    return moved


async def recover(state: GatewayState) -> dict[str, int]:
    """One round: finish the publishes left pending (a process killed while publishing) and
    sweep (bounded) the staging of loads idle past ``ABANDON_AFTER``; what it did."""
    from app.portability.importer import importing

    async with state.databases.engine(Database.metadata).connect() as conn:
        rows = (await conn.execute(
            select(namespace_imports).order_by(namespace_imports.c.updated_at).limit(RECOVER_ROWS)
        )).all()
    out = {"published": 0, "swept": 0}
    now = utcnow()
    for row in rows:
        job = Pending(row.target, row.job, row.staging, row.state, row.updated_at)
        if job.target in importing:
            continue
        if job.state == "publishing" and job.updated_at < now - PUBLISH_STALE:
            await publish(state, job)
            out["published"] += 1
            log.info("portability: finished the pending publish of an import into %s", job.target)
        elif job.state == "loading" and job.updated_at < now - ABANDON_AFTER:
            if await sweep(state, job.staging, max_batches=SWEEP_BATCHES):
                async with writer(state.databases.engine(Database.metadata)).begin() as conn:
                    await conn.execute(
                        delete(namespace_imports)
                        .where(namespace_imports.c.target == job.target, namespace_imports.c.job == job.job)
                    )
            out["swept"] += 1
            log.warning("portability: swept the staging of an import into %s abandoned since %s", job.target, job.updated_at)
    return out


def recovery(state: GatewayState) -> Periodic:
    """The background job: ``recover`` at start-up and every ``RECOVER_SECONDS``."""
    from app.core.capability import Periodic

    async def run() -> None:
        await recover(state)

    return Periodic("portability-recover", RECOVER_SECONDS, run, at_start=True)
