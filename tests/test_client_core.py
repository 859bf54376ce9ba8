"""The client's own contract: its public names, its lifecycle, its errors, its retries, and that
its models still match the server's OpenAPI document."""

from __future__ import annotations

import httpx
import pytest
from pydantic import BaseModel

import storage_gateway_client as sgc
from storage_gateway_client import (
    ClientClosed,
    Forbidden,
    GatewayClient,
    InvalidRequest,
    NotFound,
    Unauthorized,
    Unavailable,
)
from storage_gateway_client._exceptions import error_from_response
from tests.conftest import Server

PUBLIC = [
    "AsyncPersistStore", "ClientClosed", "Conflict", "FileDownload", "FileHead", "FileInfo", "FileList",
    "FilesUsage", "Forbidden", "GatewayByteStore", "GatewayChatMessageHistory", "GatewayCheckpointSaver",
    "GatewayClient", "GatewayError", "GatewayStore", "GatewayVectorStore", "HTTPStatusError",
    "InsufficientStorage", "IntegrityError", "InvalidRequest", "KvEntry", "NotFound", "PayloadIndex", "PreconditionFailed", "QuotaExceeded", "RateLimited", "Record",
    "RemotePersistStore", "RemoteVectorStore", "SortOrder", "TransportError", "Unauthorized", "Unavailable",
    "VectorRecord", "VectorStoreProtocol", "VectorsAPI", "create_persist_store", "create_vector_store",
    "make_checkpointer", "make_store",
]


def test_public_exports_are_pinned_and_sorted() -> None:
    assert sgc.__all__ == sorted(sgc.__all__)
    assert sgc.__all__ == PUBLIC
    for name in PUBLIC:
        assert getattr(sgc, name)


def test_errors_share_one_root() -> None:
    for name in ("ClientClosed", "Conflict", "Forbidden", "InvalidRequest", "NotFound", "PreconditionFailed",
                 "RateLimited", "TransportError", "Unauthorized", "Unavailable", "IntegrityError", "InsufficientStorage", "QuotaExceeded"):
        assert issubclass(getattr(sgc, name), sgc.GatewayError), name


async def test_close_is_safe_twice_and_use_after_close_is_clear(
    server: Server, namespace: str, client_transport: str
) -> None:
    gw = GatewayClient(server.url, namespace=namespace, api_key=None, transport=client_transport)
    await gw.close()  # never opened: nothing to release
    await gw.close()
    with pytest.raises(ClientClosed):
        await gw.kv.get("c", "k")


async def test_problem_json_becomes_typed_errors(
    server: Server, namespace: str, api_key: str, client_transport: str
) -> None:
    async with GatewayClient(server.url, namespace=namespace, transport=client_transport) as anon:
        with pytest.raises(Unauthorized) as unauthorized:
            await anon.kv.set("c", "k", 1)
        assert unauthorized.value.status_code == 401 and "API key" in str(unauthorized.value)
    async with GatewayClient(server.url, namespace=namespace, api_key=api_key, transport=client_transport) as gw:
        r = await gw._transport.client.post(
            "/v1/admin/keys", json={"namespace": f"{namespace}-other", "scopes": ["kv:read"]}
        )
        other_key = r.json()["key"]
        with pytest.raises(NotFound) as missing:
            await gw._transport.request("GET", f"/v1/{namespace}/kv/c/missing")
        assert missing.value.code == "not_found" and missing.value.request_id
        with pytest.raises(InvalidRequest) as invalid:
            await gw._transport.request("GET", f"/v1/{namespace}/kv/c?limit=0")
        assert invalid.value.status_code == 422 and "limit" in str(invalid.value)
    async with GatewayClient(server.url, namespace, other_key, transport=client_transport) as foreign:
        with pytest.raises(Forbidden) as forbidden:
            await foreign.kv.get("c", "k")
        assert "may not read kv" in str(forbidden.value)


@pytest.mark.parametrize("transport", ["default", "httpx"])
async def test_requests_do_not_search_for_modules(server: Server, namespace: str, api_key: str, transport: str) -> None:
    """No import is attempted per request once the client is warm, on the client's own
    transport or on httpx's (which it uses for https and proxies).

    httpcore asks for ``sniffio`` on every lock and event it sets up and falls back quietly
    when it is missing; a failed import is not cached, so each request scanned ``sys.path``
    several times: over half of the client's CPU per vector search (hence the dependency).
    """
    import sys

    looked_up: list[str] = []

    class Recorder:
        @staticmethod
        def find_spec(name, path=None, target=None):  # noqa: ANN001, ANN205
            looked_up.append(name)
            return None

    chosen = httpx.AsyncHTTPTransport() if transport == "httpx" else None
    async with GatewayClient(server.url, namespace=namespace, api_key=api_key, transport=chosen) as gw:
        await gw.kv.set("c", "k", 1)
        assert await gw.kv.get("c", "k") == 1  # warm: everything the client needs is imported
        sys.meta_path.insert(0, Recorder)
        try:
            for i in range(5):
                await gw.kv.set("c", "k", i)
                assert await gw.kv.get("c", "k") == i
        finally:
            sys.meta_path.remove(Recorder)
    assert looked_up == []


async def test_warm_requests_do_not_parse_urls(
    server: Server, namespace: str, api_key: str, monkeypatch: pytest.MonkeyPatch, client_transport: str
) -> None:
    """Each path is parsed into a URL once. (httpx parses a relative URL and merges it with the
    base URL on every request: a fifth of the client's CPU for a small call.)"""
    import httpx._urls

    parsed: list[str] = []
    real = httpx._urls.urlparse

    def counting(url: str = "", **kwargs):  # noqa: ANN003, ANN202
        parsed.append(url)
        return real(url, **kwargs)

    async with GatewayClient(server.url, namespace=namespace, api_key=api_key, transport=client_transport) as gw:
        await gw.kv.set("c", "k", 0)
        assert await gw.kv.get("c", "k") == 0
        monkeypatch.setattr(httpx._urls, "urlparse", counting)
        for i in range(5):
            await gw.kv.set("c", "k", i)
            assert await gw.kv.get("c", "k") == i
        await gw.kv.set("c", "other key/é", 1)  # a new path: parsed once, quoted as before
        assert await gw.kv.get("c", "other key/é") == 1
    assert parsed == [f"{server.url}/v1/{namespace}/kv/c/other%20key%2F%C3%A9"]


async def test_idempotent_calls_retry_503_429_and_connection_errors() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("refused", request=request)
        if calls["n"] == 2:
            return httpx.Response(503, headers={"Retry-After": "0", "content-type": "application/problem+json"},
                                  json={"status": 503, "code": "database_unavailable", "title": "Service Unavailable"})
        if calls["n"] == 3:  # a namespace's heavy operations at their limit (issue 44), a rate limit
            return httpx.Response(429, headers={"Retry-After": "0", "content-type": "application/problem+json"},
                                  json={"status": 429, "code": "rate_limited", "title": "Too Many Requests"})
        return httpx.Response(200, json={"ok": True})

    async with GatewayClient("http://gw.test", namespace="ns", transport=httpx.MockTransport(handler)) as gw:
        response = await gw._transport.request("GET", "/v1/ns/kv/c/k")
    assert response.json() == {"ok": True} and calls["n"] == 4


async def test_non_idempotent_calls_do_not_retry() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(503, headers={"Retry-After": "0"}, json={"status": 503, "code": "unavailable"})

    async with GatewayClient("http://gw.test", namespace="ns", transport=httpx.MockTransport(handler)) as gw:
        with pytest.raises(Unavailable) as exc:
            await gw._transport.request("POST", "/v1/ns/records/c/trim", json={"before": "a"})
    assert calls["n"] == 1 and exc.value.retry_after == 0


def test_error_mapping_keeps_retry_after_and_code() -> None:
    response = httpx.Response(429, headers={"Retry-After": "3"}, json={"status": 429, "code": "rate_limited",
                                                                       "detail": "slow down"})
    error = error_from_response(response)
    assert isinstance(error, sgc.RateLimited) and error.retry_after == 3 and error.code == "rate_limited"
    assert "slow down" in str(error)


# client model -> the server schema it mirrors
MIRRORS: dict[str, str] = {
    "KvEntry": "KvEntryRead",
    "Record": "RecordRead",
    "FileInfo": "FileRead",
    "FilesUsage": "FilesUsage",
    "PayloadIndex": "PayloadIndexCreate",
}


@pytest.mark.parametrize(("client_model", "server_schema"), sorted(MIRRORS.items()))
async def test_client_models_match_the_servers_openapi(
    http: httpx.AsyncClient, client_model: str, server_schema: str
) -> None:
    spec = (await http.get("/openapi.json")).json()
    schema = spec["components"]["schemas"][server_schema]
    model: type[BaseModel] = getattr(sgc, client_model)
    server_fields = set(schema["properties"])
    client_fields = set(model.model_fields)
    assert client_fields <= server_fields, f"{client_model} has fields the server does not send: {client_fields - server_fields}"
    required = set(schema.get("required", []))
    client_required = {n for n, f in model.model_fields.items() if f.is_required()}
    assert client_required <= required, f"{client_model} requires fields the server may omit"
    missing = required - client_fields
    assert not missing, f"{client_model} drops fields the server always sends: {missing}"
