"""No query bypasses namespace scoping: every statement a request sends to a namespaced table
carries the caller's namespace as a bound parameter.

The app runs in-process on the test databases with a listener on all three engines; each
capability's workload (``Capability.samples``) calls every one of its routes and touches every
one of its tables. Tables keyed by ids that only a scoped row hands out (file chunks by blob id,
per-collection vector tables by registry id, API keys) are the only exceptions.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import event

import app.models  # noqa: F401
from app.capabilities import BUILTIN
from app.core.fast import fixed_statements as statements
from app.core.config import Settings
from app.core.db.tables import METADATA
from app.quotas import usage as quotas
from app.core.capability import Capability
from app.core.ops.telemetry import route_template
from app.core.state import gateway_state
from app.main import create_app
from tests.conftest import Backend, Server, in_process_settings
from tests.test_isolation import operations

QUOTA_TABLES = {t.name for pair in quotas.TABLES.values() for t in pair}
NAMESPACED = sorted(t.name for capability in BUILTIN for t in capability.tables)
capturing: contextvars.ContextVar[bool] = contextvars.ContextVar("capturing", default=False)


def test_every_namespaced_table_belongs_to_a_capability() -> None:
    """A table with a namespace column that no capability declares would escape the check below."""
    with_namespace = {t.name for md in METADATA.values() for t in md.tables.values() if "namespace" in t.c}
    # but the gateway's own usage and quota rows (app.quotas.usage): written by triggers in each
    # write's transaction, read for one namespace by /v1/{namespace}/usage (tests/test_quotas.py)
    assert with_namespace - QUOTA_TABLES == set(NAMESPACED)


async def capture_statements(
    settings: Settings, run: Callable[[httpx.AsyncClient], Awaitable[None]], routes: set[tuple[str, str]] | None = None
) -> tuple[list[tuple[str, Any]], list[str]]:
    """Every statement the app sends while ``run`` drives it in-process: (statement, parameters),
    and the statements sent on the driver path (``app.core.fast.fixed_statements``); the (method,
    route template) of each request goes into ``routes``."""
    app = create_app(settings)

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)
        if routes is not None and scope["type"] == "http":
            routes.add((scope["method"], route_template(scope)))

    captured: list[tuple[str, Any]] = []

    def listener(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        if capturing.get():
            captured.append((statement, parameters))

    driver_path: list[str] = []

    def driver_listener(statement: str, arguments: Any) -> None:  # what SQLAlchemy's events do not see
        if capturing.get():
            captured.append((statement, arguments))
            driver_path.append(statement)

    async with app.router.lifespan_context(app):
        for engine in gateway_state(app).databases.engines.values():
            event.listen(engine.sync_engine, "before_cursor_execute", listener)
        statements.observers.append(driver_listener)
        transport = httpx.ASGITransport(app=recording)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
                token = capturing.set(True)
                try:
                    await run(client)
                finally:
                    capturing.reset(token)
        finally:
            statements.observers.remove(driver_listener)
    return captured, driver_path


def assert_scoped(captured: list[tuple[str, Any]], tables: list[str], namespace: str, at_least: int) -> None:
    """Each statement naming one of ``tables`` binds ``namespace``; every table was touched."""
    table_re = {name: re.compile(rf'\b"?{name}"?\b') for name in tables}
    checked = 0
    for statement, parameters in captured:
        touched = [name for name, rx in table_re.items() if rx.search(statement)]
        if not touched:
            continue
        checked += 1
        flat = repr(parameters)
        assert "namespace" in statement, statement
        assert namespace in flat, f"statement on {touched} without the caller's namespace bound:\n{statement}\n{flat}"
    assert checked >= at_least, f"only {checked} statements on namespaced tables were seen"
    untouched = set(tables) - {t for s, _ in captured for t in tables if table_re[t].search(s)}
    assert not untouched, f"the workload touches no {sorted(untouched)}: add requests that do"


async def test_every_statement_on_a_namespaced_table_is_scoped(
    backend: Backend, server: Server, namespace: str, tmp_path: Path, capability: Capability[Any]
) -> None:
    """The capability's workload calls each of its routes; each statement on its tables binds the namespace."""
    samples = capability.samples_for("workload")
    settings = in_process_settings(backend, tmp_path, extra_capabilities=list(server.extra_capabilities))
    routes: set[tuple[str, str]] = set()
    captured, _ = await capture_statements(settings, lambda client: samples.workload(client, namespace), routes)
    spec = create_app(settings).openapi()
    missed = sorted(f"{method} {path}" for method, path, _ in operations(spec, capability.name) if (method, path) not in routes)
    assert not missed, f"the workload of {capability.name!r} (its samples) calls no {missed}: add a request for each"
    assert_scoped(captured, [t.name for t in capability.tables], namespace, at_least=len(capability.tables))
