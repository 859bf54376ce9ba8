"""No query bypasses namespace scoping: every statement a request sends to a namespaced table
carries the caller's namespace as a bound parameter.

The app runs in-process on the test databases with a listener on all three engines; a workload
touches every capability. Tables keyed by ids that only a scoped row hands out (file chunks by
blob id, per-collection vector tables by registry id, API keys) are the only exceptions.
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
from app.core.db import statements
from app.core.config import Settings
from app.core.db.tables import METADATA
from app.core.state import gateway_state
from app.main import create_app
from tests.conftest import Backend, Server, in_process_settings

NAMESPACED = sorted(t.name for capability in BUILTIN for t in capability.tables)
capturing: contextvars.ContextVar[bool] = contextvars.ContextVar("capturing", default=False)


async def workload(client: httpx.AsyncClient, ns: str) -> None:
    async def ok(method: str, url: str, **kw: Any) -> httpx.Response:
        r = await client.request(method, url, **kw)
        assert r.status_code < 400 or r.status_code == 404, (method, url, r.status_code, r.text)
        return r

    await ok("PUT", f"/v1/{ns}/kv/c/k", json={"a": 1})
    etag = (await ok("GET", f"/v1/{ns}/kv/c/k")).headers["etag"]
    await ok("PUT", f"/v1/{ns}/kv/c/k", json={"a": 2}, headers={"If-Match": etag})
    await ok("PUT", f"/v1/{ns}/kv/c/t", json=1, params={"ttl_seconds": 60})
    await ok("GET", f"/v1/{ns}/kv/c", params={"prefix": "k", "limit": 1})
    await ok("DELETE", f"/v1/{ns}/kv/c/k")
    await ok("POST", f"/v1/{ns}/kv/c", json={"items": [{"key": "m1", "value": 1}, {"key": "m2", "value": 2}]})
    await ok("POST", f"/v1/{ns}/kv/c/get", json={"keys": ["m1", "m2", "t"]})
    await ok("POST", f"/v1/{ns}/kv/c/delete", json={"keys": ["m1", "m2"]})
    await ok("PUT", f"/v1/{ns}/records/h/001", json={"m": 1})
    await ok("POST", f"/v1/{ns}/records/h", json={"records": [{"key": "002", "value": 2}, {"key": "003", "value": 3}]})
    await ok("GET", f"/v1/{ns}/records/h", params={"order": "desc", "limit": 2})
    await ok("GET", f"/v1/{ns}/records/h/002")
    await ok("POST", f"/v1/{ns}/records/h/trim", json={"before": "002"})
    await ok("POST", f"/v1/{ns}/records/h/trim", json={"keep_last": 1})
    await ok("DELETE", f"/v1/{ns}/records/h/003")
    await ok("PUT", f"/v1/{ns}/files/f/a.txt", content=b"hello")
    await ok("GET", f"/v1/{ns}/files/f/a.txt", headers={"Range": "bytes=1-2"})
    await ok("POST", f"/v1/{ns}/files/f", files={"file": ("b.txt", b"multi", "text/plain")})
    await ok("GET", f"/v1/{ns}/files/f")
    await ok("DELETE", f"/v1/{ns}/files/f/a.txt")
    await ok("PUT", f"/v1/{ns}/vectors/v", json={"vector_size": 2, "distance": "cosine", "text_field": "text"})
    await ok("POST", f"/v1/{ns}/vectors/v/points", headers={"Idempotency-Key": "i1"},
             json={"points": [{"id": "p", "vector": [1, 0], "payload": {"u": 1, "text": "tea"}}]})
    await ok("POST", f"/v1/{ns}/vectors/v/search", json={"vector": [1, 0], "query": "tea", "filters": {"u": 1}})
    await ok("POST", f"/v1/{ns}/vectors/v/search", json={"vector": [1, 0], "with_vectors": True, "filters": {"u": 1}})
    await ok("PATCH", f"/v1/{ns}/vectors/v/points/p", json={"payload": {"u": 2}})
    await ok("GET", f"/v1/{ns}/vectors/v/points/p")
    await ok("POST", f"/v1/{ns}/vectors/v/points/list", json={"filters": {"u": 2}})
    await ok("POST", f"/v1/{ns}/vectors/v/points/delete", json={"ids": ["p"]})
    await ok("GET", f"/v1/{ns}/vectors")
    await ok("GET", f"/v1/{ns}/vectors/v")
    await ok("POST", f"/v1/{ns}/vectors/v/reset")
    await ok("DELETE", f"/v1/{ns}/vectors/v")
    blob = {"channel": "m", "version": "1", "type": "bytes", "data": "AQ=="}
    for cid, parent in (("c1", None), ("c2", "c1")):
        await ok("POST", f"/v1/{ns}/checkpoints/put", json={
            "thread_id": "t", "checkpoint_id": cid, "parent_checkpoint_id": parent,
            "checkpoint": {"type": "bytes", "data": "AA=="}, "channel_versions": {"m": "1"},
            "metadata": {"run_id": cid, "step": 1}, "blobs": [blob],
        })
    await ok("POST", f"/v1/{ns}/checkpoints/writes", json={
        "thread_id": "t", "checkpoint_id": "c2", "task_id": "k", "writes": [{"idx": 0, "channel": "m", "type": "b", "data": "AA=="}],
    })
    await ok("GET", f"/v1/{ns}/checkpoints/tuple", params={"thread_id": "t"})
    await ok("POST", f"/v1/{ns}/checkpoints/search", json={"thread_id": "t", "filter": {"step": 1}, "limit": 1})
    await ok("POST", f"/v1/{ns}/checkpoints/search", json={"filter": {"run_id": "c1"}})
    await ok("POST", f"/v1/{ns}/checkpoints/threads/copy", json={"source_thread_id": "t", "target_thread_id": "u"})
    await ok("POST", f"/v1/{ns}/checkpoints/prune", json={"thread_ids": ["t"], "strategy": "keep_latest"})
    await ok("POST", f"/v1/{ns}/checkpoints/runs/delete", json={"run_ids": ["c2"]})
    await ok("PUT", f"/v1/{ns}/checkpoints/retention", json={"keep_latest": 3})
    await ok("PUT", f"/v1/{ns}/checkpoints/retention", json={"thread_id": "t", "idle_ttl_seconds": 60})
    await ok("GET", f"/v1/{ns}/checkpoints/retention")
    await ok("GET", f"/v1/{ns}/checkpoints/retention", params={"thread_id": "t"})
    await ok("POST", f"/v1/{ns}/checkpoints/prune", json={"thread_ids": ["u"], "strategy": "delete"})
    await ok("DELETE", f"/v1/{ns}/checkpoints/threads", params={"thread_id": "t"})


def test_every_namespaced_table_belongs_to_a_capability() -> None:
    """A table with a namespace column that no capability declares would escape the check below."""
    with_namespace = {t.name for md in METADATA.values() for t in md.tables.values() if "namespace" in t.c}
    assert with_namespace == set(NAMESPACED)


async def capture_statements(
    settings: Settings, run: Callable[[httpx.AsyncClient], Awaitable[None]]
) -> tuple[list[tuple[str, Any]], list[str]]:
    """Every statement the app sends while ``run`` drives it in-process: (statement, parameters),
    and the statements sent on the driver path (``app.core.db.statements``)."""
    app = create_app(settings)
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
        transport = httpx.ASGITransport(app=app)
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
    assert {t for s, _ in captured for t in tables if table_re[t].search(s)} == set(tables)


async def test_every_statement_on_a_namespaced_table_is_scoped(
    backend: Backend, server: Server, namespace: str, tmp_path: Path
) -> None:
    captured, driver_path = await capture_statements(
        in_process_settings(backend, tmp_path), lambda client: workload(client, namespace)
    )
    # kv and records statements run on the driver on both backends (app.core.db.statements): all are seen.
    assert len(driver_path) >= 12, driver_path
    assert_scoped(captured, NAMESPACED, namespace, at_least=30)
