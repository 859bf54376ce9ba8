"""The search hot path: a planned route whose body is read exactly as FastAPI reads a body model
(but for the parser's own errors), and no transaction around a search on PostgreSQL (issue 17)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from sqlalchemy import event

from app.core.config import Database
from app.core.errors import install_error_handlers
from app.core.http.bodies import json_model_reader
from app.core.state import gateway_state
from app.main import create_app
from app.vectors.schemas import SearchRequest
from tests.conftest import VECTOR_BACKENDS, Backend, Server
from tests.test_handlers import planned_paths
from tests.test_scoping import in_process_settings

pytestmark = pytest.mark.backends(*VECTOR_BACKENDS)

BODIES: list[tuple[bytes, str | None]] = [
    (b'{"vector": [0.1, 0.2], "limit": 3}', "application/json"),
    (b"{}", "application/json"),
    (b'{"limit": "x"}', "application/json"),
    (b'{"limit": 0, "extra": 1}', "application/json"),
    (b'{"vector": [1, "a", true], "filters": 3}', "application/json"),
    (b'{"vector": [1.5e400]}', "application/json"),
    (b"[1, 2]", "application/json"),
    (b"null", "application/json"),
    (b'"text"', "application/json"),
    (b"", "application/json"),
    (b'{"query": "\xc3\xa9t\xc3\xa9"}', "application/json"),
    (b'{"limit": 3}', "application/vnd.api+json; charset=utf-8"),
    (b'{"limit": 3}', "text/plain"),
    (b'{"limit": 3}', None),
    (b'{"limit": 3}', "application/x-www-form-urlencoded"),
]
# What the gateway's parser (pydantic-core's) answers with its own words: malformed JSON (422,
# its message and place rather than json.loads's), bytes that are not UTF-8 (422 rather than
# FastAPI's 400), the parser's limits (422 rather than 400).
PARSER_ERRORS: list[tuple[bytes, str]] = [
    (b"{not json", "JSON decode error: key must be a string at line 1 column 2"),
    (b'{"a": 1,}', "JSON decode error: trailing comma at line 1 column 9"),
    (b"\xff\xfe{", "must be JSON encoded as UTF-8"),
    (b'{"limit": "\xff"}', "must be JSON encoded as UTF-8 (byte 11 is not)"),
    (b"[" * 300 + b"]" * 300, "nested at most 200 levels deep"),
    (b'{"limit": ' + b"1" * 5000 + b"}", "more than 4300 digits"),
]


async def test_a_planned_routes_body_answers_as_fastapi_does() -> None:
    """The same status and answer (value, or 422 with FastAPI's own errors) as a ``body: Model``
    parameter, for valid, invalid, non-JSON, empty and wrongly typed bodies; a body the parser
    refuses is a 422 in the parser's words (FastAPI's: json.loads's words, or a bare 400)."""
    app = FastAPI()
    install_error_handlers(app)  # the gateway's problem+json, for FastAPI's errors and ours

    @app.post("/fastapi")
    async def by_fastapi(body: SearchRequest) -> Any:
        return body.model_dump()

    @app.post("/ours")
    async def by_dependency(body: SearchRequest = Depends(json_model_reader(SearchRequest))) -> Any:  # noqa: B008
        return body.model_dump()

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        for raw, content_type in BODIES:
            headers = {"content-type": content_type} if content_type else {}
            theirs = await client.post("/fastapi", content=raw, headers=headers)
            ours = await client.post("/ours", content=raw, headers=headers)
            assert (ours.status_code, _unidentified(ours)) == (theirs.status_code, _unidentified(theirs)), (raw, content_type)
        for raw, detail in PARSER_ERRORS:
            theirs = await client.post("/fastapi", content=raw, headers={"content-type": "application/json"})
            ours = await client.post("/ours", content=raw, headers={"content-type": "application/json"})
            assert theirs.status_code in (400, 422), raw[:40]
            assert ours.status_code == 422 and ours.json()["code"] == "invalid_input", (raw[:40], ours.text)
            assert detail in ours.json()["detail"], (raw[:40], ours.json()["detail"])


def _unidentified(r: httpx.Response) -> Any:
    """An answer without what differs per request (a problem's ``instance`` and ``request_id``)."""
    body = r.json()
    if isinstance(body, dict):
        body.pop("instance", None)
        body.pop("request_id", None)
    return body


def test_search_body_is_documented_as_fastapi_documents_a_body_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search operation's request body and the ``SearchRequest`` component are what FastAPI
    writes for ``body: SearchRequest``, once the gateway's own rewrites of the document apply."""
    from app.core.http.openapi import _filters, _page_limits, _standard_bounds

    app = FastAPI()

    @app.post("/s")
    async def s(body: SearchRequest) -> None: ...

    theirs = app.openapi()
    _page_limits(theirs, 1000)
    _filters(theirs)
    _standard_bounds(theirs)
    monkeypatch.setenv("GATEWAY_AUTH__MODE", "disabled")
    ours = create_app().openapi()
    operation = ours["paths"]["/v1/{namespace}/vectors/{collection}/search"]["post"]
    assert operation["requestBody"] == theirs["paths"]["/s"]["post"]["requestBody"]
    assert ours["components"]["schemas"]["SearchRequest"] == theirs["components"]["schemas"]["SearchRequest"]


def test_search_route_is_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_AUTH__MODE", "disabled")
    assert ("POST", "/v1/{namespace}/vectors/{collection}/search") in planned_paths(create_app())


async def test_a_search_begins_no_transaction_of_its_own(
    backend: Backend, server: Server, namespace: str, tmp_path: Path
) -> None:
    """A search's statements go to the driver (PostgreSQL) or through SQLAlchemy's own lazy
    transaction (SQLite): on PostgreSQL no BEGIN and no COMMIT, on SQLite one read transaction
    per search, begun by its first statement."""
    app = create_app(in_process_settings(backend, tmp_path))
    events: list[str] = []
    async with app.router.lifespan_context(app):
        engine = gateway_state(app).databases.engine(Database.vectors).sync_engine
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            base = f"/v1/{namespace}/vectors/c"
            assert (await client.put(base, json={"vector_size": 3, "distance": "cosine"})).status_code == 201
            points = [{"id": str(i), "vector": [1, i, 2], "payload": {"tag": i % 3}} for i in range(20)]
            assert (await client.post(f"{base}/points", json={"points": points})).status_code == 200
            body = {"vector": [1, 2, 2], "limit": 4}
            first = await client.post(f"{base}/search", json=body)  # fills the registry cache
            assert first.status_code == 200, first.text
            for name in ("begin", "commit"):
                event.listen(engine, name, lambda conn, name=name: events.append(name))
            again = await client.post(f"{base}/search", json=body)
            filtered = await client.post(f"{base}/search", json={**body, "filters": {"tag": 1}})
    assert again.json() == first.json()
    assert filtered.status_code == 200 and {h["payload"]["tag"] for h in filtered.json()["results"]} == {1}
    if backend.is_postgres:
        assert events == [], events
    else:
        assert events == ["begin", "commit"] * 2, events


@pytest.mark.parametrize("content_type", ["text/plain", None])
async def test_search_with_a_body_that_is_not_json_is_refused(
    backend: Backend, server: Server, namespace: str, tmp_path: Path, content_type: str | None
) -> None:
    app = create_app(in_process_settings(backend, tmp_path))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            headers = {"content-type": content_type} if content_type else {}
            answer = await client.post(f"/v1/{namespace}/vectors/c/search", content=b'{"limit": 3}', headers=headers)
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
