"""A capability is one package and one registration: ``tests/notes_capability.py``, served with
one setting, gets everything the built-in ones get without a shared list being edited.

Auth scopes, the isolation matrix, the scoping check, metrics, body limits and OpenAPI entries,
each shown on a real gateway process (and the scoping check in-process) on both backends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from app.capabilities import BUILTIN, load
from tests.conftest import ADMIN_KEY, ROOT, Backend, Server, run_cli, start_server, stop_server
from tests.notes_capability import CAPABILITY as NOTES
from tests.test_isolation import isolation_matrix, make_key
from tests.test_scoping import assert_scoped, capture_statements, in_process_settings

REGISTER = {"GATEWAY_EXTRA_CAPABILITIES": json.dumps(["tests.notes_capability:CAPABILITY"])}
BODY_LIMIT = 4096


@pytest.fixture(scope="module")
def notes_server(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    assert run_cli(backend, "migrate").returncode == 0
    log = tmp_path_factory.mktemp("notes") / f"gateway-{backend.name}.log"
    srv = start_server(
        backend, log, PYTHONPATH=str(ROOT), GATEWAY_LIMITS__MAX_BODY_BYTES=str(BODY_LIMIT), **REGISTER
    )
    yield srv
    stop_server(srv)


@pytest.fixture
async def admin(notes_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=notes_server.url, headers=headers, timeout=30) as client:
        yield client


def test_one_setting_registers_it() -> None:
    assert [c.name for c in load(json.loads(REGISTER["GATEWAY_EXTRA_CAPABILITIES"]))] == [
        *(c.name for c in BUILTIN), "notes",
    ]
    with pytest.raises(ValueError, match="two capabilities"):
        load(["tests.notes_capability:CAPABILITY", "tests.notes_capability:CAPABILITY"])
    with pytest.raises(TypeError, match="not a Capability"):
        load(["tests.notes_capability:router"])


async def test_auth_scopes(admin: httpx.AsyncClient, notes_server: Server, namespace: str, server: Server) -> None:
    assert (await admin.put(f"/v1/{namespace}/notes/n1", json={"text": "hello"})).status_code == 204
    reader = await make_key(admin, namespace, "notes:read")
    writer = await make_key(admin, namespace, "notes:write")
    kv_only = await make_key(admin, namespace, "kv:*")
    async with httpx.AsyncClient(base_url=notes_server.url) as anyone:
        def as_(key: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {key}"}

        url = f"/v1/{namespace}/notes/n1"
        assert (await anyone.get(url, headers=as_(reader))).json() == {"text": "hello"}
        search = f"/v1/{namespace}/notes/search"
        assert (await anyone.post(search, json={"contains": "ell"}, headers=as_(reader))).json() == ["n1"]
        assert (await anyone.put(url, json={"text": "x"}, headers=as_(reader))).status_code == 403
        assert (await anyone.delete(url, headers=as_(reader))).status_code == 403
        assert (await anyone.put(url, json={"text": "bye"}, headers=as_(writer))).status_code == 204
        assert (await anyone.get(url, headers=as_(kv_only))).status_code == 403
        assert (await anyone.get(url)).status_code == 401
    # The gateway that does not serve it refuses its scopes.
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as plain:
        r = await plain.post("/v1/admin/keys", json={"namespace": namespace, "scopes": ["notes:read"]})
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["loc"] == ["scopes", "0"], r.text


async def test_isolation_matrix(admin: httpx.AsyncClient, notes_server: Server, namespace: str, backend: Backend) -> None:
    async def seed_notes(ns: str) -> None:
        assert (await admin.put(f"/v1/{ns}/notes/x1", json={"text": f"note of {ns}"})).status_code == 204

    await isolation_matrix(notes_server, admin, namespace, backend, (*BUILTIN, NOTES), seed_more=seed_notes)


async def test_scoping_check(backend: Backend, server: Server, namespace: str, tmp_path: Path) -> None:
    async def work(client: httpx.AsyncClient) -> None:
        for note in ("a1", "b2"):
            assert (await client.put(f"/v1/{namespace}/notes/{note}", json={"text": note})).status_code == 204
        assert (await client.get(f"/v1/{namespace}/notes/a1")).status_code == 200
        assert (await client.get(f"/v1/{namespace}/notes")).json() == ["a1", "b2"]
        assert (await client.post(f"/v1/{namespace}/notes/search", json={"contains": "b"})).json() == ["b2"]
        assert (await client.delete(f"/v1/{namespace}/notes/a1")).status_code == 204

    settings = in_process_settings(backend, tmp_path, extra_capabilities=["tests.notes_capability:CAPABILITY"])
    captured, _ = await capture_statements(settings, work)
    assert_scoped(captured, [t.name for t in NOTES.tables], namespace, at_least=5)


async def test_metrics(admin: httpx.AsyncClient, namespace: str) -> None:
    await admin.put(f"/v1/{namespace}/notes/m1", json={"text": "m"})
    await admin.get(f"/v1/{namespace}/notes/m1")
    exposition = (await admin.get("/metrics")).text
    series = [line for line in exposition.splitlines() if line.startswith("gateway_http_requests_total{")]
    assert any('route="/v1/{namespace}/notes/{note_id}"' in s and 'method="GET"' in s for s in series), series
    assert any('route="/v1/{namespace}/notes/{note_id}"' in s and 'method="PUT"' in s for s in series), series


async def test_body_limits(notes_server: Server, admin: httpx.AsyncClient, namespace: str) -> None:
    url = f"/v1/{namespace}/notes/big"
    r = await admin.put(url, content=b'{"text": "' + b"x" * BODY_LIMIT + b'"}', headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    # Without a key, a body that claims to be huge is refused from the headers alone: nothing read.
    host, port = notes_server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"PUT {url} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {10**9}\r\n\r\n".encode()
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 401"), head
    writer.close()
    assert (await admin.get(url)).status_code == 404


async def test_openapi_entries(admin: httpx.AsyncClient) -> None:
    spec = (await admin.get("/openapi.json")).json()
    notes = {path: item for path, item in spec["paths"].items() if path.startswith("/v1/{namespace}/notes")}
    assert set(notes) == {"/v1/{namespace}/notes", "/v1/{namespace}/notes/{note_id}", "/v1/{namespace}/notes/search"}
    assert notes["/v1/{namespace}/notes/{note_id}"]["put"]["x-required-scope"] == "notes:write"
    assert notes["/v1/{namespace}/notes/search"]["post"]["x-required-scope"] == "notes:read"
    assert notes["/v1/{namespace}/notes"]["get"]["security"] == [{"bearerKey": []}]
    assert notes["/v1/{namespace}/notes/{note_id}"]["put"]["tags"] == ["notes"]
    assert {"name": "notes", "description": NOTES.summary} in spec["tags"]
