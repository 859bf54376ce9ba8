"""The application: lifespan-owned databases, the capabilities under ``/v1/{namespace}``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from app import __version__
from app.auth.cache import KeyCache
from app.auth.dependencies import admin_guard, capability_guard, namespace_read_guard
from app.portability import router as portability
from app.portability import staging
from app.auth.ratelimit import RateLimiter
from app.auth.router import router as admin_router
from app.core.db import migrations
from app.core.ops import telemetry as observability
from app.core.config import Database, Settings, get_settings
from app.core.db.databases import Databases, DatabaseSetupError
from app.core.db.diskspace import keep_disk_space
from app.core.errors import install_error_handlers
from app.core.ops.health import router as health_router
from app.core.http.docs import install_docs
from app.core.http.openapi import install_openapi
from app import capabilities
from app.core.capability import cancel_and_wait, running
from app.quotas import usage as quotas
from app.core.http.routing import include_capability, include_guarded
from app.quotas.router import include_namespace_routes, router as quotas_router, usage_router
from app.core.ops.gc_tuning import tune_garbage_collector
from app.fairness.walcheckpoints import checkpointing
from app.core.state import GatewayState
from app.core.db.transactions import TransactionMiddleware

log = logging.getLogger("app")

DESCRIPTION = """\
Isolated persistent storage for AI-agent plugins: ordered **records**, **key-value**,
streamed **files**, **vector** search and agent **checkpoints**, each scoped to a namespace.
Errors are `application/problem+json` with a stable `code`.
"""


async def prepare_databases(databases: Databases) -> None:
    """Check every database answers (and migrate the ones configured to), or raise naming it."""
    settings = databases.settings
    for db in Database:
        try:
            await databases.check(db)
        except Exception as exc:  # noqa: BLE001 - any connect failure: a setup error that names the database
            raise DatabaseSetupError(describe_connect_error(settings, db, exc)) from None
        if settings.migrates_at_startup(db):
            await migrations.upgrade(databases, db)
            log.info("migrated %s database to head", db.value)


def describe_connect_error(settings: Settings, db: Database, exc: BaseException) -> str:
    url = settings.database_url(db)
    safe = url.split("@")[-1] if "@" in url else url
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
    if "load_extension" in reason or "enable_load_extension" in reason or "vec0" in reason:
        reason = (
            "cannot load the sqlite-vec extension: this Python's sqlite3 cannot load extensions; "
            "install sqlean-py or pysqlite3-binary"
        )
    return f"{db.value} database ({safe}) is not usable: {reason}"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    state = GatewayState(
        settings=settings,
        capabilities=capabilities.load(settings.extra_capabilities),
        rate_limiter=RateLimiter(settings.auth.rate_limit_per_second, settings.auth.rate_limit_burst),
        namespace_limiter=RateLimiter(settings.auth.namespace_rate_limit_per_second, settings.auth.namespace_rate_limit_burst),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        databases = Databases.open(settings)
        state.databases = databases
        try:
            await prepare_databases(databases)
            quotas_pending = await quotas.install(state)
            if settings.auth.mode == "disabled":
                log.warning("auth is DISABLED: every request is allowed without a key (host %s)", settings.host)
            keys = KeyCache(databases.engine(Database.metadata), settings.auth.revocation_check_seconds)
            state.key_cache = keys
            async with AsyncExitStack() as stack:
                await stack.enter_async_context(checkpointing(databases))
                await stack.enter_async_context(keep_disk_space(state, databases))
                watcher = asyncio.create_task(keys.watch(), name="key-revocations")
                stack.push_async_callback(cancel_and_wait, watcher)
                for capability in state.capabilities:
                    state.services[capability.name] = await stack.enter_async_context(capability.lifecycle(state))
                # Background jobs start once every lifecycle is done: a sweep's write transaction
                # must not race a lifecycle's start-up work on the same SQLite file.
                jobs = [job for c in state.capabilities for job in c.periodic(state.services[c.name], state)]
                jobs += [quotas.reconciler(state), quotas.installer(state, quotas_pending), staging.recovery(state)]
                await stack.enter_async_context(running(jobs))
                tune_garbage_collector()
                yield
        finally:
            state.services.clear()
            await databases.close()

    app = FastAPI(
        title="storage-gateway",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        root_path=settings.root_path,
        openapi_tags=[{"name": c.name, "description": c.summary} for c in state.capabilities],
        docs_url=None,  # app.core.http.docs serves /docs from the gateway itself (and no ReDoc)
        redoc_url=None,
    )
    app.state.gateway = state
    install_error_handlers(app)
    install_openapi(app)
    install_docs(app)
    app.add_middleware(TransactionMiddleware)  # innermost: ends connections as the answer starts
    observability.install(app)  # last: request ids and telemetry wrap everything above
    # Capabilities first, each behind a gate on its name (app.core.http.routing): every request pays
    # for the routes tried before its own. The gates authorize before any body is read.
    for capability in state.capabilities:
        include_capability(app, capability.router, "/v1/{namespace}", capability_guard)
    app.include_router(health_router)
    include_guarded(app, admin_router, admin_guard)
    include_guarded(app, quotas_router, admin_guard)
    include_namespace_routes(app, "usage", usage_router, namespace_read_guard)
    portability.include(app)  # /v1/{namespace}/export and /import, after the capabilities' gates
    return app


def app_factory() -> FastAPI:
    """Entry point for ``uvicorn --factory app.main:app_factory``."""
    return create_app()


@asynccontextmanager
async def services(settings: Settings) -> AsyncIterator[GatewayState]:
    """The gateway's state with its databases open and every capability's service built by its
    lifecycle, without HTTP and without background jobs: for commands that act on stored data
    (``storage-gateway delete-namespace``) and for tests. Migrations are not run."""
    state = GatewayState(
        settings=settings,
        capabilities=capabilities.load(settings.extra_capabilities),
        rate_limiter=RateLimiter(settings.auth.rate_limit_per_second, settings.auth.rate_limit_burst),
    )
    databases = Databases.open(settings)
    state.databases = databases
    try:
        async with AsyncExitStack() as stack:
            for capability in state.capabilities:
                state.services[capability.name] = await stack.enter_async_context(capability.lifecycle(state))
            yield state
    finally:
        state.services.clear()
        await databases.close()
