"""API keys: issuing, scoping, revoking; 401 and 403 answers; the keys CLI; the modes."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from app.auth.settings import AuthSettings
from tests.conftest import (
    ADMIN_KEY, Backend, Server, free_port, in_process_settings, run_cli, start_server, stop_server,
)


async def create_key(http: httpx.AsyncClient, namespace: str, *scopes: str) -> str:
    r = await http.post("/v1/admin/keys", json={"namespace": namespace, "scopes": list(scopes)})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["key"].startswith(f"sgw_{body['key_id']}_")
    return body["key"]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_no_key_is_401_with_a_challenge(server: Server, namespace: str) -> None:
    async with httpx.AsyncClient(base_url=server.url) as anon:
        for method, path in [("GET", f"/v1/{namespace}/kv/c/k"), ("PUT", f"/v1/{namespace}/kv/c/k"),
                             ("GET", "/v1/admin/keys")]:
            r = await anon.request(method, path, json=1)
            assert r.status_code == 401, (method, path, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["code"] == "unauthorized"


@pytest.mark.parametrize("token", ["nonsense", "sgw_0123456789abcdef_" + "x" * 43, ADMIN_KEY + "x"])
async def test_unknown_keys_are_401(server: Server, namespace: str, token: str) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=bearer(token)) as client:
        r = await client.get(f"/v1/{namespace}/kv/c/k")
        assert r.status_code == 401
        assert 'error="invalid_token"' in r.headers["www-authenticate"]


async def test_key_is_limited_to_its_namespace_and_scopes(http: httpx.AsyncClient, server: Server, namespace: str) -> None:
    key = await create_key(http, namespace, "kv:write")
    async with httpx.AsyncClient(base_url=server.url, headers=bearer(key)) as client:
        assert (await client.put(f"/v1/{namespace}/kv/c/k", json={"v": 1})).is_success
        assert (await client.get(f"/v1/{namespace}/kv/c/k")).json() == {"v": 1}  # write includes read
        other = await client.get(f"/v1/{namespace}x/kv/c/k")
        assert other.status_code == 403 and other.json()["code"] == "forbidden"
        assert (await client.get(f"/v1/{namespace}/records/c")).status_code == 403
        assert (await client.get("/v1/admin/keys")).status_code == 403


async def test_read_only_key_cannot_write(http: httpx.AsyncClient, server: Server, namespace: str) -> None:
    await http.put(f"/v1/{namespace}/kv/c/k", json="before")
    key = await create_key(http, namespace, "*:read")
    async with httpx.AsyncClient(base_url=server.url, headers=bearer(key)) as client:
        assert (await client.get(f"/v1/{namespace}/kv/c/k")).json() == "before"
        assert (await client.put(f"/v1/{namespace}/kv/c/k", json="after")).status_code == 403
        assert (await client.delete(f"/v1/{namespace}/kv/c/k")).status_code == 403
    assert (await http.get(f"/v1/{namespace}/kv/c/k")).json() == "before"


async def test_prefix_patterns(http: httpx.AsyncClient, server: Server, namespace: str) -> None:
    key = await create_key(http, f"{namespace}-*", "kv:*")
    async with httpx.AsyncClient(base_url=server.url, headers=bearer(key)) as client:
        assert (await client.put(f"/v1/{namespace}-a/kv/c/k", json=1)).is_success
        assert (await client.put(f"/v1/{namespace}/kv/c/k", json=1)).status_code == 403


async def test_revocation_is_immediate(http: httpx.AsyncClient, server: Server, namespace: str) -> None:
    r = await http.post("/v1/admin/keys", json={"namespace": namespace, "scopes": ["kv:read"]})
    key, key_id = r.json()["key"], r.json()["key_id"]
    async with httpx.AsyncClient(base_url=server.url, headers=bearer(key)) as client:
        assert (await client.get(f"/v1/{namespace}/kv/c/missing")).status_code == 404
        assert (await http.delete(f"/v1/admin/keys/{key_id}")).status_code == 204
        assert (await client.get(f"/v1/{namespace}/kv/c/missing")).status_code == 401
    assert (await http.delete(f"/v1/admin/keys/{key_id}")).status_code == 204  # twice is fine
    listed = (await http.get("/v1/admin/keys", params={"limit": 1000})).json()["items"]
    mine = [k for k in listed if k["key_id"] == key_id]
    assert mine and mine[0]["revoked_at"] is not None and "key" not in mine[0]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"namespace": "bad ns", "scopes": ["kv:read"]}, "namespace"),
        ({"namespace": "ns", "scopes": ["kv:destroy"]}, "scopes"),
        ({"namespace": "ns", "scopes": ["blobs:read"]}, "scopes"),
        ({"namespace": "ns", "scopes": []}, "scopes"),
        # a 500 on PostgreSQL (its text has no NUL), stored on SQLite
        ({"namespace": "ns", "scopes": ["kv:read"], "description": "a\u0000b"}, "description"),
        ({"namespace": "ns", "scopes": ["kv:read"], "description": "two\nlines"}, "description"),
    ],
)
async def test_bad_key_requests_are_422(http: httpx.AsyncClient, body: dict, field: str) -> None:
    r = await http.post("/v1/admin/keys", json=body)
    assert r.status_code == 422
    assert field in r.json()["detail"]


async def test_keys_list_paginates(http: httpx.AsyncClient, namespace: str) -> None:
    for _ in range(3):
        await create_key(http, namespace, "kv:read")
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await http.get("/v1/admin/keys", params=params)).json()
        seen += [k["key_id"] for k in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == len(set(seen)) >= 3
    assert seen == sorted(seen)


def wait_for_status(client: httpx.Client, path: str, status: int, within: float) -> bool:
    """Whether ``path`` answers ``status`` before ``within`` seconds have passed."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if client.get(path).status_code == status:
            return True
        time.sleep(0.05)
    return False


def test_keys_cli_create_list_revoke(server: Server) -> None:
    backend = server.backend
    created = run_cli(backend, "keys", "create", "--namespace", "cli-ns", "--scope", "kv:write",
                      "--description", "from the cli")
    assert created.returncode == 0, created.stderr
    fields = dict(line.split(": ", 1) for line in created.stdout.splitlines() if ": " in line)
    key, key_id = fields["key"], fields["key_id"]
    with httpx.Client(base_url=server.url, headers=bearer(key)) as client:
        assert client.put("/v1/cli-ns/kv/c/k", json=[1]).is_success
        listed = run_cli(backend, "keys", "list")
        assert key_id in listed.stdout and "from the cli" in listed.stdout and key not in listed.stdout
        revoked = run_cli(backend, "keys", "revoke", key_id)
        assert revoked.returncode == 0, revoked.stderr
        # Revoked by another process: refused within 2 x auth.revocation_check_seconds (1 s).
        assert wait_for_status(client, "/v1/cli-ns/kv/c/k", 401, within=2.0 + 0.5)
    bad = run_cli(backend, "keys", "create", "--namespace", "cli-ns", "--scope", "nope")
    assert bad.returncode != 0 and "scopes" in bad.stderr


def test_auth_disabled_on_loopback_says_so(tmp_path: Path) -> None:
    backend = Backend("sqlite", {"GATEWAY_DATA_DIR": str(tmp_path)})
    server = start_server(backend, tmp_path / "log", GATEWAY_AUTH__MODE="disabled")
    try:
        assert httpx.get(f"{server.url}/readyz").json()["auth"] == "disabled"
        assert httpx.put(f"{server.url}/v1/ns/kv/c/k", json=1).is_success
    finally:
        stop_server(server)
    assert "auth is DISABLED" in server.log()


def test_auth_disabled_on_public_address_refuses_unless_forced(tmp_path: Path) -> None:
    backend = Backend("sqlite", {"GATEWAY_DATA_DIR": str(tmp_path)})
    result = run_cli(backend, "serve", "--host", "0.0.0.0", "--port", str(free_port()), GATEWAY_AUTH__MODE="disabled")
    assert result.returncode == 2 and "auth.mode" in result.stderr
    server = start_server(backend, tmp_path / "log", "--host", "0.0.0.0",
                          GATEWAY_AUTH__MODE="disabled", GATEWAY_AUTH__FORCE_DISABLED_ON_PUBLIC_ADDRESS="true")
    stop_server(server)


def test_rate_limit_answers_429_with_retry_after(tmp_path: Path) -> None:
    backend = Backend("sqlite", {"GATEWAY_DATA_DIR": str(tmp_path)})
    server = start_server(backend, tmp_path / "log",
                          GATEWAY_AUTH__RATE_LIMIT_PER_SECOND="1", GATEWAY_AUTH__RATE_LIMIT_BURST="3")
    try:
        with httpx.Client(base_url=server.url, headers=bearer(ADMIN_KEY)) as admin:
            key = admin.post("/v1/admin/keys", json={"namespace": "ns", "scopes": ["kv:read"]}).json()["key"]
        with httpx.Client(base_url=server.url, headers=bearer(key)) as client:
            statuses = [client.get("/v1/ns/kv/c/k") for _ in range(6)]
        limited = [r for r in statuses if r.status_code == 429]
        assert limited, [r.status_code for r in statuses]
        assert int(limited[0].headers["retry-after"]) >= 1
        assert limited[0].json()["code"] == "rate_limited"
    finally:
        stop_server(server)


async def test_a_namespace_rate_limit_is_shared_by_its_keys(backend: Backend, server: Server, tmp_path: Path, namespace: str) -> None:
    """Issue 44: with ``auth.namespace_rate_limit_*`` a namespace's requests draw from one bucket
    whatever key sends them (a tenant cannot multiply its share by minting keys); another
    namespace, and the admin key, keep theirs. (An app in the test's process: a bucket is per
    process, and the ``server`` fixture migrated the backend's databases.)"""
    from app.main import create_app

    other = f"{namespace}-other"
    app = create_app(in_process_settings(backend, tmp_path).model_copy(update={"auth": AuthSettings(
        admin_key=ADMIN_KEY, namespace_rate_limit_per_second=0.05, namespace_rate_limit_burst=4,
    )}))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            admin = bearer(ADMIN_KEY)
            keys = [(await http.post("/v1/admin/keys", headers=admin, json={"namespace": ns, "scopes": ["kv:read"]})).json()["key"]
                    for ns in (namespace, namespace, other)]
            statuses = [(await http.get(f"/v1/{namespace}/kv/c/k", headers=bearer(keys[i % 2]))).status_code for i in range(6)]
            assert statuses == [404] * 4 + [429] * 2, statuses  # both keys drew from one bucket of 4
            r = await http.get(f"/v1/{namespace}/kv/c/k", headers=bearer(keys[0]))
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and r.json()["code"] == "rate_limited"
            assert namespace in r.json()["detail"]
            assert (await http.get(f"/v1/{other}/kv/c/k", headers=bearer(keys[2]))).status_code == 404
            assert (await http.get(f"/v1/{namespace}/kv/c/k", headers=admin)).status_code == 404  # no namespace bucket
