"""What a capability is: one descriptor that everything else reads.

A capability is one package (``kv``, ``records``, ... under ``app/``, or a deployment's own)
whose ``capability.py`` exports a ``Capability``, and one line in ``app.capabilities`` (or the
``extra_capabilities`` setting). From the descriptor:

- the app factory includes its router behind a gate on its name (``app.core.http.routing``), runs its
  lifecycle in the app's lifespan and its periodic tasks while the app runs (``app.main``);
- auth accepts ``<name>:read`` / ``<name>:write`` scopes for it (``app.auth.service``);
- the gate applies each route's body class and limit (``@accepts`` on the endpoint) and its
  read/write scope (GET/HEAD, or ``@accepts(read_only=True)``);
- metrics and the access log label its requests by route template; OpenAPI documents its routes
  under its tag, described by ``summary``;
- a database error of its own is answered as its ``errors`` say (``app.core.errors``);
- the shared tests (``tests/capability_checks.py``) cover its ``tables`` with its ``samples``;
- quotas count its items and bytes in the tables its ``usage`` names (``app.quotas.usage``);
- delete-namespace (and export/import, #47) walk its ``data``; the change log (#46) records its
  ``changes``.

Convention for service lifetimes: the lifecycle builds the capability's service once per process
(the backend choice, caches, background workers); the service keeps no request state; a request's
dependency (``app.core.state.service_of``) hands it the request's connection and namespace.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.config import Database
from app.core.errors import DatabaseErrorRule
from app.core.namespace_data import NamespaceData, TableData, writer
from app.quotas.tables import RESERVED, Counted, Kept
from app.core.samples import NO_SAMPLES, Samples

if TYPE_CHECKING:
    from app.core.http.routing import CapabilityRouter
    from app.core.state import GatewayState

log = logging.getLogger("app")

S = TypeVar("S")


@dataclass(frozen=True)
class Periodic:
    """A background job of a capability: ``run`` every ``every`` seconds while the app runs.

    A round that raises is logged and the next one runs on time: a sweep never takes the service
    down. ``at_start``: run the first round at start-up instead of after one interval.
    """

    name: str
    every: float
    run: Callable[[], Awaitable[object]]
    at_start: bool = False


Lifecycle = Callable[["GatewayState"], AbstractAsyncContextManager[S]]
"""Builds the capability's service once the databases are open; cleans up on exit."""


@dataclass(frozen=True)
class Change:
    """A kind of write that the change log (#46) records: its ``kind`` (``"set"``), the routes
    that make it (``"PUT /{collection}/{key}"``: method and path under the capability's prefix),
    and the periodic job that makes it too, if one does (``"kv-sweep"``: expiry)."""

    kind: str
    routes: tuple[str, ...] = ()
    job: str | None = None


@dataclass(frozen=True, eq=False)
class Capability(Generic[S]):
    """One capability, as the app factory, auth, the gate, OpenAPI and the shared tests see it."""

    name: str
    router: CapabilityRouter
    database: Database
    lifecycle: Lifecycle[S]
    summary: str
    tables: tuple[Table, ...] = ()
    """Its namespaced tables: every statement on them is scoped (tests/test_scoping.py); a
    namespace's data is their rows unless ``data`` says more."""
    periodic: Callable[[S, GatewayState], Iterable[Periodic]] = field(default=lambda service, state: ())
    samples: Samples = NO_SAMPLES
    """Sample data and requests for the shared tests (``app.core.samples``)."""
    data: NamespaceData[S] | None = None
    """How a namespace's data is exported, imported and deleted; default: ``TableData(tables)``."""
    changes: tuple[Change, ...] = ()
    """Every kind of write it makes: each writing route belongs to one (tests/test_capabilities.py)."""
    errors: tuple[DatabaseErrorRule, ...] = ()
    """Database errors of its own answered as 4xx (tried before the gateway's own rules)."""
    usage: tuple[Counted | Kept, ...] = ()
    """What its quotas count (``app.quotas``: a row an item, its bytes as declared); none: no quota."""

    def __post_init__(self) -> None:
        if self.router.capability != self.name:
            raise ValueError(f"capability {self.name!r} has the router of {self.router.capability!r}")
        for table in self.tables:
            if "namespace" not in table.c:
                raise ValueError(f"capability {self.name!r}: table {table.name} has no namespace column")
        if self.data is None:
            object.__setattr__(self, "data", TableData(self.tables))

    @property
    def namespace_data(self) -> NamespaceData[S]:
        data = self.data
        assert data is not None  # set by __post_init__
        return data

    def samples_for(self, *needed: str) -> Samples:
        """Its samples, which must define each of ``needed`` (else ``MissingSample`` says what to write)."""
        self.samples.require(self.name, *needed)
        return self.samples



@asynccontextmanager
async def running(periodic: Iterable[Periodic]) -> AsyncIterator[None]:
    """Run each job on its schedule until the block exits, then cancel them all."""
    tasks = [asyncio.create_task(_forever(job), name=job.name) for job in periodic]
    try:
        yield
    finally:
        await cancel_and_wait(*tasks)


async def cancel_and_wait(*tasks: asyncio.Task[Any]) -> None:
    """Cancel ``tasks`` and wait until they end, raising what one raised other than its cancel.
    A cancel of the caller itself propagates (``suppress(CancelledError)`` around ``await task``
    would swallow it too, and a caller whose task never ends could then not be cancelled)."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled() and (exc := task.exception()) is not None:
            raise exc


async def _forever(job: Periodic) -> None:
    if not job.at_start:
        await asyncio.sleep(job.every)
    while True:
        try:
            await job.run()
        except asyncio.CancelledError:
            raise
        except Exception:  # the next round tries again
            stop_if_cancelled()
            log.warning("%s failed", job.name, exc_info=True)
        await asyncio.sleep(job.every)


def stop_if_cancelled() -> None:
    """In a background loop's ``except Exception``: raise ``CancelledError`` if this task was asked
    to stop. A job's cleanup can replace the ``CancelledError`` with an error of its own (an
    ``await`` in a ``finally`` on a connection the cancel broke); the loop would then sleep and go
    on, and whoever awaits the cancelled task (an app's shutdown) would wait forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")  # a path segment, and the CAP of CAP:ACTION scopes


async def in_batches(engine: AsyncEngine, step: Callable[[AsyncConnection], Awaitable[int]], batch: int) -> None:
    """A periodic job's round: ``step`` in its own write transaction (SQLite: ``BEGIN IMMEDIATE``),
    again while a step handled a whole ``batch``, so one round never holds the lock for long."""
    while True:
        async with writer(engine).begin() as conn:
            handled = await step(conn)
        if handled < batch:
            return


def expiry_sweep(
    name: str, engine: AsyncEngine, sweep: Callable[[AsyncConnection], Awaitable[int]], batch: int, every: float,
    log: logging.Logger, what: str,
) -> Periodic:
    """A capability's TTL sweep: ``sweep`` deletes up to ``batch`` expired rows a step (``in_batches``),
    every ``every`` seconds, logging how many ``what`` each step deleted."""

    async def step(conn: AsyncConnection) -> int:
        deleted = await sweep(conn)
        if deleted:
            log.info("%s deleted %d expired %s", name.replace("-", " "), deleted, what)
        return deleted

    async def run() -> None:
        await in_batches(engine, step, batch)

    return Periodic(name, every, run)


async def create_tables(state: GatewayState, database: Database, *tables: Table) -> None:
    """Create ``tables`` in ``database`` where they do not exist yet: the migration of a capability
    kept outside the gateway's tree (its tables on a ``MetaData`` of its own, which the gateway's
    Alembic revisions do not know), run by its lifecycle. One gateway process at a time should
    start with a new table (PostgreSQL: two racing ``CREATE TABLE`` statements, one fails)."""
    engine = state.databases.engine(database)
    # IMMEDIATE: another gateway on the same SQLite files may be writing (a deferred transaction
    # that read the schema could not then take the write lock: SQLITE_BUSY without waiting)
    async with writer(engine).begin() as conn:
        for table in tables:
            await conn.run_sync(table.create, checkfirst=True)


RESERVED_NAMES = RESERVED | {"export", "import", "namespace"}
"""Routes of a namespace as a whole (usage: app.quotas; export, import: app.portability), which no
capability's gate may shadow."""


def check_unique(capabilities: Iterable[Capability[Any]]) -> tuple[Capability[Any], ...]:
    """The capabilities in order, refusing a bad name or two with one name (gates would shadow)."""
    out: dict[str, Capability[Any]] = {}
    for capability in capabilities:
        if not _NAME.fullmatch(capability.name):
            raise ValueError(f"capability name {capability.name!r} is not [a-z][a-z0-9_]*")
        if capability.name in out:
            raise ValueError(f"two capabilities are named {capability.name!r}")
        if capability.name in RESERVED_NAMES:
            raise ValueError(f"{capability.name!r} names a route of the namespace itself (/v1/{{namespace}}/{capability.name})")
        out[capability.name] = capability
    return tuple(out.values())
