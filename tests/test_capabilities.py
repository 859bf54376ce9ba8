"""What every capability a gateway serves gets from its descriptor alone, checked per capability.

OpenAPI documents each of its operations under its tag with its scope; metrics count each of its
routes by template (driven by its samples' workload on a real server); a body over its route's
limit is refused from the headers alone (413 with a key, 401 without); every writing route is
a declared change (``Capability.changes``, for the change log); delete-namespace removes its data
of one namespace and nothing else, in batches, resumably; the default namespace data
(``TableData``) exports and imports back to the same API answers.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.capability import Capability
from app.core.namespace_data import DeleteReport, Rows, TableData, delete_namespace
from app.main import services
from tests.conftest import ADMIN_KEY, Backend, Server, in_process_settings
from tests.test_isolation import is_read, operations, stored_rows
from tests.test_ops_telemetry import parse_metrics


async def test_openapi_documents_each_operation(http: httpx.AsyncClient, capability: Capability[Any]) -> None:
    spec = (await http.get("/openapi.json")).json()
    ops = operations(spec, capability.name)
    assert ops, f"{capability.name!r} has no operation under /v1/{{namespace}}/{capability.name}"
    for method, path, op in ops:
        assert op["tags"] == [capability.name], (method, path, op["tags"])
        assert op["x-required-scope"] in (f"{capability.name}:read", f"{capability.name}:write"), (method, path)
        assert op["security"] == [{"bearerKey": []}], (method, path)
    assert {"name": capability.name, "description": capability.summary} in spec["tags"]


async def test_metrics_count_each_route_by_template(
    http: httpx.AsyncClient, namespace: str, capability: Capability[Any]
) -> None:
    samples = capability.samples_for("workload")
    await samples.workload(http, namespace)
    counted = {
        (dict(labels)["method"], dict(labels)["route"])
        for name, labels in parse_metrics((await http.get("/metrics")).text)
        if name == "gateway_http_requests_total"
    }
    spec = (await http.get("/openapi.json")).json()
    missing = [(method, path) for method, path, _ in operations(spec, capability.name) if (method, path) not in counted]
    assert not missing, missing


async def test_bodies_over_the_limit_are_refused_from_the_headers(
    server: Server, http: httpx.AsyncClient, namespace: str, capability: Capability[Any]
) -> None:
    """A claimed body past every limit: 413 for a key allowed to write, 401 without one; no byte read."""
    spec = (await http.get("/openapi.json")).json()
    host, port = server.url.removeprefix("http://").split(":")
    with_body = [(m, p, op) for m, p, op in operations(spec, capability.name) if "requestBody" in op]
    for method, template, op in with_body:
        url = re.sub(r"\{[a-z_]+\}", "x1", template.replace("{namespace}", namespace))
        content_type = next(iter(op["requestBody"]["content"]))
        for key, expected in ((ADMIN_KEY, b"413"), (None, b"401")):
            reader, writer = await asyncio.open_connection(host, int(port))
            auth = f"Authorization: Bearer {key}\r\n" if key else ""
            writer.write(
                f"{method} {url} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: {content_type}\r\n"
                f"Content-Length: {10**12}\r\n\r\n".encode()
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            writer.close()
            assert head.startswith(b"HTTP/1.1 " + expected), (method, template, head)
            assert b"application/problem+json" in head, head


async def test_every_write_is_a_declared_change(http: httpx.AsyncClient, capability: Capability[Any]) -> None:
    """Each writing route belongs to exactly one ``Change`` of the descriptor, and each one named exists."""
    spec = (await http.get("/openapi.json")).json()
    prefix = f"/v1/{{namespace}}/{capability.name}"
    writes = {f"{m} {p.removeprefix(prefix) or '/'}" for m, p, op in operations(spec, capability.name) if not is_read(op)}
    declared = [route for change in capability.changes for route in change.routes]
    undeclared = sorted(writes - set(declared))
    assert not undeclared, (
        f"{capability.name!r} writes through {undeclared} but no Change names them: add each to a Change in Capability.changes"
    )
    assert sorted(set(declared) - writes) == [], "a Change names a route that does not exist or does not write"
    assert len(declared) == len(set(declared)), "a route belongs to two changes"
    kinds = [change.kind for change in capability.changes]
    assert len(kinds) == len(set(kinds)), kinds


async def test_delete_namespace_deletes_its_data_and_nothing_else(
    server: Server, http: httpx.AsyncClient, namespace: str, backend: Backend, tmp_path: Any,
    capability: Capability[Any],
) -> None:
    samples = capability.samples_for("seed", "snapshot")
    gone, kept = f"{namespace}d", f"{namespace}k"
    for ns in (gone, kept):
        await samples.seed(http, ns)
    kept_before = await samples.snapshot(http, kept)
    kept_rows = await stored_rows(backend, (capability,), kept)
    assert all((await stored_rows(backend, (capability,), gone)).values())
    settings = in_process_settings(backend, tmp_path, extra_capabilities=list(server.extra_capabilities))
    async with services(settings) as state:
        first = await delete_namespace(state, gone, batch=1, max_batches=1)  # stopped after one batch
        rest = await delete_namespace(state, gone, batch=1)
        again = await delete_namespace(state, gone)
    assert not first.done and rest.done and again.done
    assert sum(first.deleted[capability.name].values()) > 0, first
    assert not any(again.deleted.values()), again  # nothing was left
    assert await stored_rows(backend, (capability,), gone) == {t.name: [] for t in capability.tables}
    assert await stored_rows(backend, (capability,), kept) == kept_rows
    assert await samples.snapshot(http, kept) == kept_before
    if isinstance(capability.namespace_data, TableData):  # the default counts rows, table by table
        total = DeleteReport(gone)
        for report in (first, rest):
            total.add(capability.name, report.deleted.get(capability.name, {}))
        assert total.deleted[capability.name] == {t.name: len(kept_rows[t.name]) for t in capability.tables}


async def test_table_data_exports_and_imports_to_the_same_answers(
    server: Server, http: httpx.AsyncClient, namespace: str, backend: Backend, tmp_path: Any,
    capabilities_under_test: tuple[Capability[Any], ...],
) -> None:
    """The default namespace data (``TableData``): a namespace exported in small parts and imported
    under another name answers the same (values, versions and ETags, expiry)."""
    table_data = [c for c in capabilities_under_test if isinstance(c.namespace_data, TableData)]
    assert table_data, "no capability under test keeps its data in its tables alone"
    source, target = f"{namespace}s", f"{namespace}t"
    settings = in_process_settings(backend, tmp_path, extra_capabilities=list(server.extra_capabilities))
    async with services(settings) as state:
        for capability in table_data:
            samples = capability.samples_for("seed", "snapshot", "workload")
            await samples.workload(http, source)
            await samples.seed(http, source)
            data, service = capability.namespace_data, state.services[capability.name]
            engine = state.databases.engine(capability.database)
            async with engine.connect() as conn:
                parts: list[Rows] = [part async for part in data.export(service, conn, source, 1)]
            assert parts and all(len(part.rows) == 1 for part in parts)
            assert {part.table for part in parts} == {t.name for t in capability.tables}
            async with engine.execution_options(sqlite_begin="IMMEDIATE").begin() as conn:
                loaded = [await data.load(service, conn, target, part) for part in parts]
            assert sum(loaded) == len(parts)
            assert await samples.snapshot(http, target) == await samples.snapshot(http, source)
            assert await _rows_without_namespace(engine, capability, target) == await _rows_without_namespace(
                engine, capability, source
            )


async def _rows_without_namespace(engine: Any, capability: Capability[Any], ns: str) -> list[Any]:
    async with engine.connect() as conn:
        conn: AsyncConnection
        return [part.rows async for part in capability.namespace_data.export(None, conn, ns, 1000)]
