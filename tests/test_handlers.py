"""Planned route handlers (``app.core.fast.plans``) answer exactly as FastAPI's own would.

The same endpoints are served twice, marked ``@fast`` behind a capability gate and by a plain
FastAPI router, and every answer (values, 422 problem details, headers) must be identical; then
the gateway's own hot routes must really be planned, and no other, since that is what the
benchmarks rely on and what a plain capability's author is promised.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from app.auth.ratelimit import RateLimiter
from app.core.config import Settings
from app.core.errors import InvalidInput, install_error_handlers
from app.core.fast import fast
from app.core.fast.plans import FastPathRefused
from app.core.http.limits import Body, accepts
from app.core.http.routing import CapabilityRouter, GatewayRoute, include_capability
from app.core.state import GatewayState
from app.main import create_app

CALLS: list[str] = []


class Color(str, Enum):
    red = "red"
    blue = "blue"


async def counted(request: Request) -> str:
    CALLS.append(request.url.path)
    return "counted"


async def key(key: Annotated[str, Path(min_length=2)]) -> str:
    if key == "forbidden":
        raise InvalidInput("key", "is forbidden")
    return key.upper()


async def uses_counted_and_key(c: Annotated[str, Depends(counted)], k: Annotated[str, Depends(key)]) -> str:
    return f"{c}:{k}"


async def tagged(x_tag: Annotated[str | None, Header()] = None) -> str | None:
    return x_tag


def endpoints(router: APIRouter) -> None:
    @router.get("/{ns}/{key}")
    @fast()
    async def get_item(
        ns: Annotated[str, Path(pattern=r"^[a-z]+$")],
        k: Annotated[str, Depends(key)],
        both: Annotated[str, Depends(uses_counted_and_key)],
        again: Annotated[str, Depends(counted)],
        tag: Annotated[str | None, Depends(tagged)],
        request: Request,
        limit: Annotated[int, Query(ge=1, le=10)] = 5,
        color: Color | None = None,
        flag: bool = False,
        ratio: Annotated[float | None, Query(gt=0)] = None,
    ) -> Response:
        return JSONResponse({
            "ns": ns, "k": k, "both": both, "again": again, "tag": tag, "limit": limit,
            "color": color, "flag": flag, "ratio": ratio, "method": request.method,
        })

    class Item(BaseModel):
        n: int

    @router.post("/bodies/{ns}")
    @accepts(Body.JSON)
    @fast()
    async def with_body(ns: str, body: Item, tag: Annotated[str | None, Depends(tagged)]) -> Response:
        return JSONResponse({"ns": ns, "n": body.n, "tag": tag})

    @router.get("/models/{ns}")
    async def returns_model(ns: str) -> dict:  # plain: FastAPI's handler serves it
        return {"ns": ns}


async def allow(request: Request, gate: str, reads: bool) -> None:
    return None


def make_app(gated: bool) -> FastAPI:
    """The endpoints behind a capability gate (``@fast`` routes planned), or on a plain FastAPI router."""
    app = FastAPI()
    install_error_handlers(app)
    if gated:
        app.state.gateway = GatewayState(settings=Settings(), capabilities=(), rate_limiter=RateLimiter(0, 1))
        router = CapabilityRouter("items", dependencies=[Depends(counted)])
        endpoints(router)
        include_capability(app, router, "/v1/{namespace}", allow)
    else:
        plain = APIRouter(prefix="/items", dependencies=[Depends(counted)])
        endpoints(plain)
        app.include_router(plain, prefix="/v1/{namespace}")
    return app


REQUESTS = [
    ("GET", "/v1/x/items/abc/key1", {}),
    ("GET", "/v1/x/items/abc/key1?limit=10&color=blue&flag=yes&ratio=0.5", {"x-tag": "t1"}),
    ("GET", "/v1/x/items/abc/key1?limit=0", {}),
    ("GET", "/v1/x/items/abc/key1?limit=11&color=green&flag=maybe&ratio=-1", {}),
    ("GET", "/v1/x/items/ABC/k", {}),
    ("GET", "/v1/x/items/abc/forbidden", {}),
    ("GET", "/v1/x/items/abc/key1?limit=abc", {}),
    ("POST", "/v1/x/items/bodies/abc", {"content-type": "application/json", "x-tag": "t2"}),
    ("GET", "/v1/x/items/models/abc", {}),
]


@pytest.mark.parametrize(("method", "url", "headers"), REQUESTS)
async def test_planned_answers_equal_fastapis(method: str, url: str, headers: dict) -> None:
    answers = []
    for gated in (True, False):
        app = make_app(gated)
        CALLS.clear()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            content = b'{"n": 3}' if method == "POST" else None
            r = await http.request(method, url, headers=headers, content=content)
        body = r.json()
        if isinstance(body, dict):
            body.pop("request_id", None)
        answers.append((r.status_code, body, r.headers.get("content-type"), list(CALLS)))
    assert answers[0] == answers[1]


def planned_paths(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path) of every planned route (the capabilities' gates hold them)."""
    found = set()
    for route in app.router.routes:
        for context in getattr(route, "routes", []):
            if getattr(context, "planned", False):
                found |= {(m, context.path_format) for m in context.methods}
    return found


def test_the_test_app_plans_only_what_is_marked() -> None:
    assert planned_paths(make_app(True)) == {
        ("GET", "/v1/{namespace}/items/{ns}/{key}"), ("POST", "/v1/{namespace}/items/bodies/{ns}"),
    }
    assert planned_paths(make_app(False)) == set()


HOT = {
    *{(m, "/v1/{namespace}/kv/{collection}/{key}") for m in ("GET", "PUT", "DELETE")},
    *{(m, "/v1/{namespace}/records/{collection}/{key}") for m in ("GET", "PUT", "DELETE")},
    ("GET", "/v1/{namespace}/kv/{collection}"),
    ("GET", "/v1/{namespace}/records/{collection}"),
    ("POST", "/v1/{namespace}/vectors/{collection}/search"),
    *{("POST", f"/v1/{{namespace}}/checkpoints/{p}") for p in ("put", "writes", "search")},
    ("GET", "/v1/{namespace}/checkpoints/tuple"),
    ("GET", "/v1/{namespace}/files/{collection}/{file_id}"),
    *{("POST", f"/v1/{{namespace}}/store/{p}") for p in ("batch", "read", "get")},
}


def test_the_gateways_hot_routes_are_planned_and_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_AUTH__MODE", "disabled")
    assert planned_paths(create_app()) == HOT
    monkeypatch.setenv("GATEWAY_FAST_PATHS__PLANS", "false")
    assert planned_paths(create_app(Settings())) == set()


async def plain() -> Response:
    return Response(b"ok")


class TBody(BaseModel):
    n: int


def sync_dependency() -> int:
    return 1


def test_a_fast_route_that_cannot_be_planned_fails_at_start_up_and_a_plain_one_is_served() -> None:
    def app_with(declare: object) -> FastAPI:
        app = FastAPI()
        app.state.gateway = GatewayState(settings=Settings(), capabilities=(), rate_limiter=RateLimiter(0, 1))
        router = CapabilityRouter("t")
        declare(router)  # type: ignore[operator]
        include_capability(app, router, "/v1/{namespace}", allow)
        return app

    def returns_a_dict(router: APIRouter) -> None:
        @router.get("/b")
        @fast()
        async def returns_a_dict() -> dict:
            return {}

    def uses_a_sync_dependency(router: APIRouter) -> None:
        @router.get("/c")
        @fast()
        async def uses_a_sync_dependency(n: Annotated[int, Depends(sync_dependency)]) -> Response:
            return Response()

    def plain_routes(router: APIRouter) -> None:
        @router.post("/d")
        @accepts(Body.JSON)
        async def takes_a_body(body: TBody) -> dict:
            return {"n": body.n}

        @router.get("/e")
        async def uses_a_sync_dependency(n: Annotated[int, Depends(sync_dependency)]) -> dict:
            return {"n": n}

    with pytest.raises(FastPathRefused, match=r"\['GET'\] /v1/\{namespace\}/t/b is marked @fast but cannot be planned: .*does not return a Response.*Remove @fast"):
        app_with(returns_a_dict)
    with pytest.raises(FastPathRefused, match=r"/t/c is marked @fast but cannot be planned: .*sync_dependency is not an async function"):
        app_with(uses_a_sync_dependency)
    app = app_with(plain_routes)
    served = {r.path: r.planned for gate in app.router.routes for r in getattr(gate, "routes", []) if isinstance(r, GatewayRoute)}
    assert served == {"/v1/{namespace}/t/d": False, "/v1/{namespace}/t/e": False}


def test_planning_is_an_allow_list_of_dependant_fields() -> None:
    """A field FastAPI's ``Dependant`` gains (here, ``extra``) makes a route unplannable."""
    import dataclasses

    from app.core.fences.fastapi_ import Dependant
    from app.core.fast.plans import unplannable_because

    assert unplannable_because(Dependant(call=plain)) is None
    Newer = dataclasses.make_dataclass("Newer", [("extra", list, dataclasses.field(default_factory=list))], bases=(Dependant,))
    assert unplannable_because(Newer(call=plain)) is None  # empty: nothing the plan would skip
    assert unplannable_because(Newer(call=plain, extra=[1])) == "plain uses extra"


def test_a_dependency_runs_once_per_request_and_not_after_its_parameters_failed() -> None:
    import asyncio

    async def run() -> list[str]:
        app = make_app(True)
        CALLS.clear()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            ok = await http.get("/v1/x/items/abc/key1")
            assert ok.status_code == 200 and ok.json()["both"] == "counted:KEY1"
            calls = list(CALLS)
            bad = await http.get("/v1/x/items/abc/k")  # key too short: uses_counted_and_key is not called
            assert bad.status_code == 422
        return calls

    assert asyncio.run(run()) == ["/v1/x/items/abc/key1"]  # router-level, endpoint and nested uses: one call


def test_dependency_overrides_are_honoured_on_planned_routes() -> None:
    import asyncio

    async def fake_key() -> str:
        return "FAKE"

    async def run() -> tuple[dict, dict]:
        app = make_app(True)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            app.dependency_overrides[key] = fake_key
            overridden = (await http.get("/v1/x/items/abc/key1")).json()
            app.dependency_overrides.clear()
            planned = (await http.get("/v1/x/items/abc/key1")).json()
        return overridden, planned

    overridden, planned = asyncio.run(run())
    assert overridden["k"] == "FAKE" and overridden["both"] == "counted:FAKE"
    assert planned["k"] == "KEY1"


async def test_a_wrong_method_is_405_listing_every_method_the_path_has(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_AUTH__MODE", "disabled")
    app = create_app()  # routing answers before any dependency: no lifespan (databases) needed
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        for method, path, allow in (
            ("POST", "/v1/ns/kv/c/k", "DELETE, GET, PUT"),
            ("PATCH", "/v1/ns/records/c/k", "DELETE, GET, PUT"),
            ("PUT", "/v1/ns/vectors/c/search", "POST"),
        ):
            r = await http.request(method, path)
            assert r.status_code == 405 and r.headers["allow"] == allow, (method, path, r.headers.get("allow"))
            assert r.headers["content-type"] == "application/problem+json"
        assert (await http.get("/v1/ns/nothing/x")).status_code == 404


def _runs_on_the_event_loop(call: object) -> bool:
    """An ``async def`` (or async generator) function, or an object whose ``__call__`` is one.
    A plain ``def`` (function, generator, or a class to instantiate) FastAPI runs in a thread."""
    import inspect

    target = call if inspect.isfunction(call) or inspect.ismethod(call) or inspect.isclass(call) else type(call).__call__
    return inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target)


def all_dependants(app: FastAPI) -> list[tuple[str, object]]:
    """(route, callable) for every endpoint and dependency (at any depth) of every route of ``app``."""
    from fastapi.routing import APIRoute

    from app.core.http.routing import api_routes

    found: list[tuple[str, object]] = []

    def walk(where: str, dependant: object) -> None:
        found.append((where, dependant.call))  # type: ignore[attr-defined]
        for sub in dependant.dependencies:  # type: ignore[attr-defined]
            walk(where, sub)

    for route in api_routes(app.router.routes):
        contexts = [route] if isinstance(route, APIRoute) else list(getattr(route, "effective_route_contexts", list)())
        for context in contexts:
            walk(f"{sorted(context.methods)} {context.path_format}", context.dependant)
    return found


def test_no_route_depends_on_a_plain_def(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain ``def`` dependency (or endpoint) costs every request a hop to the thread pool."""
    monkeypatch.setenv("GATEWAY_AUTH__MODE", "disabled")
    dependants = all_dependants(create_app())
    assert len({where for where, _ in dependants}) > 40  # every route, the health routes included
    assert any(getattr(call, "__name__", "") == "get_files_service" for _, call in dependants)
    sync = sorted({f"{where}: {getattr(call, '__qualname__', call)}" for where, call in dependants if not _runs_on_the_event_loop(call)})
    assert sync == []


def test_the_plain_def_check_sees_a_plain_def() -> None:
    app = FastAPI()

    @app.get("/x")
    async def endpoint(n: Annotated[int, Depends(sync_dependency)]) -> Response:
        return Response()

    assert [call for _, call in all_dependants(app) if not _runs_on_the_event_loop(call)] == [sync_dependency]
