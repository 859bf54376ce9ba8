"""Planned route handlers (``app.core.http.planning``) answer exactly as FastAPI's own would.

The same endpoints are served twice, by a router of ``PlannedRoute``s and by a plain FastAPI
router, and every answer (values, 422 problem details, headers) must be identical; then the
gateway's own hot routes must really be planned, since that is what the kv/records benchmark
relies on.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from app.core.errors import InvalidInput, install_error_handlers
from app.core.http.planning import served_by_fastapi
from app.core.http.routing import CapabilityRouter, PlannedRoute, UnplannedRoute
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
    @router.get("/items/{ns}/{key}")
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

    class Body(BaseModel):
        n: int

    @router.post("/bodies/{ns}")
    @served_by_fastapi("a body")
    async def with_body(ns: str, body: Body) -> Response:  # a body: FastAPI's handler serves it
        return JSONResponse({"ns": ns, "n": body.n})

    @router.get("/models/{ns}")
    @served_by_fastapi("returns a model")
    async def returns_model(ns: str) -> dict:  # not a Response: FastAPI's handler serves it
        return {"ns": ns}


def make_app(route_class: type) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    router = APIRouter(route_class=route_class)
    endpoints(router)
    app.include_router(router, prefix="/v1", dependencies=[Depends(counted)])
    return app


REQUESTS = [
    ("GET", "/v1/items/abc/key1", {}),
    ("GET", "/v1/items/abc/key1?limit=10&color=blue&flag=yes&ratio=0.5", {"x-tag": "t1"}),
    ("GET", "/v1/items/abc/key1?limit=0", {}),
    ("GET", "/v1/items/abc/key1?limit=11&color=green&flag=maybe&ratio=-1", {}),
    ("GET", "/v1/items/ABC/k", {}),
    ("GET", "/v1/items/abc/forbidden", {}),
    ("GET", "/v1/items/abc/key1?limit=abc", {}),
    ("POST", "/v1/items/abc/key1", {}),
    ("POST", "/v1/bodies/abc", {"content-type": "application/json"}),
    ("GET", "/v1/models/abc", {}),
]


@pytest.mark.parametrize(("method", "url", "headers"), REQUESTS)
async def test_planned_answers_equal_fastapis(method: str, url: str, headers: dict) -> None:
    answers = []
    for route_class in (PlannedRoute, APIRouter().route_class):
        app = make_app(route_class)
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
    """(method, path) of every planned route: included ones (FastAPI's effective route
    contexts) and the capabilities' own (``CapabilityRoutes``)."""
    found = set()
    for route in app.router.routes:
        candidates = [*getattr(route, "effective_route_contexts", list)(), *getattr(route, "routes", [])]
        for context in candidates:
            if getattr(context, "planned", False):
                found |= {(m, context.path_format) for m in context.methods}
    return found


def test_the_test_app_plans_only_what_it_supports() -> None:
    assert planned_paths(make_app(PlannedRoute)) == {("GET", "/v1/items/{ns}/{key}")}
    assert planned_paths(make_app(APIRouter().route_class)) == set()


def test_the_gateways_kv_and_records_routes_are_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_AUTH__MODE", "disabled")
    planned = planned_paths(create_app())
    for method in ("GET", "PUT", "DELETE"):
        assert (method, "/v1/{namespace}/kv/{collection}/{key}") in planned
        assert (method, "/v1/{namespace}/records/{collection}/{key}") in planned
    assert ("GET", "/v1/{namespace}/kv/{collection}") in planned
    assert ("GET", "/v1/{namespace}/records/{collection}") in planned
    assert isinstance(CapabilityRouter("kv").route_class(path="/x", endpoint=plain), PlannedRoute)


async def plain() -> Response:
    return Response(b"ok")


class TBody(BaseModel):
    n: int


def sync_dependency() -> int:
    return 1


def test_a_route_that_cannot_be_planned_fails_when_declared_unless_it_opts_out() -> None:
    router = CapabilityRouter("t")

    with pytest.raises(UnplannedRoute, match=r"\['POST'\] /t/a cannot be planned: .*body_params.*@served_by_fastapi"):
        @router.post("/a")
        async def takes_a_body(body: TBody) -> Response:
            return Response()

    with pytest.raises(UnplannedRoute, match=r"/t/b cannot be planned: .*does not return a Response"):
        @router.get("/b")
        async def returns_a_dict() -> dict:
            return {}

    with pytest.raises(UnplannedRoute, match=r"/t/c cannot be planned: .*sync_dependency is not an async function"):
        @router.get("/c")
        async def uses_a_sync_dependency(n: Annotated[int, Depends(sync_dependency)]) -> Response:
            return Response()

    @router.post("/d")
    @served_by_fastapi("a body")
    async def opts_out(body: TBody) -> Response:
        return Response()

    with pytest.raises(UnplannedRoute, match=r"/t/e is marked @served_by_fastapi\('stale'\) but can be planned"):
        @router.get("/e")
        @served_by_fastapi("stale")
        async def could_be_planned() -> Response:
            return Response()

    served = {r.path: r.planned for r in router.routes if isinstance(r, PlannedRoute)}
    assert served == {"/t/d": False}


def test_planning_is_an_allow_list_of_dependant_fields() -> None:
    """A field FastAPI's ``Dependant`` gains (here, ``extra``) makes a route unplannable."""
    import dataclasses

    from app.core.fences.fastapi_ import Dependant
    from app.core.http.planning import unplannable_because

    assert unplannable_because(Dependant(call=plain)) is None
    Newer = dataclasses.make_dataclass("Newer", [("extra", list, dataclasses.field(default_factory=list))], bases=(Dependant,))
    assert unplannable_because(Newer(call=plain)) is None  # empty: nothing the plan would skip
    assert unplannable_because(Newer(call=plain, extra=[1])) == "plain uses extra"


def test_every_gateway_route_is_planned_or_opts_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """create_app() succeeding is the check; here, which ones opt out (each says why)."""
    from app.core.http.planning import opted_out
    from app.core.http.routing import api_routes

    monkeypatch.setenv("GATEWAY_AUTH__MODE", "disabled")
    routes = [r for r in api_routes(create_app().router.routes) if isinstance(r, PlannedRoute)]
    assert routes and all(r.planned != bool(opted_out(r.endpoint)) for r in routes)
    planned = planned_paths(create_app())
    for method in ("GET", "HEAD", "PUT", "DELETE"):  # files routes too, now that their service dependency is async
        assert (method, "/v1/{namespace}/files/{collection}/{file_id}") in planned


def test_a_dependency_runs_once_per_request_and_not_after_its_parameters_failed() -> None:
    import asyncio

    async def run() -> list[str]:
        app = make_app(PlannedRoute)
        CALLS.clear()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            ok = await http.get("/v1/items/abc/key1")
            assert ok.status_code == 200 and ok.json()["both"] == "counted:KEY1"
            calls = list(CALLS)
            bad = await http.get("/v1/items/abc/k")  # key too short: uses_counted_and_key is not called
            assert bad.status_code == 422
        return calls

    assert asyncio.run(run()) == ["/v1/items/abc/key1"]  # router-level, endpoint and nested uses: one call


def test_dependency_overrides_are_honoured_on_planned_routes() -> None:
    import asyncio

    async def fake_key() -> str:
        return "FAKE"

    async def run() -> tuple[dict, dict]:
        app = make_app(PlannedRoute)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            app.dependency_overrides[key] = fake_key
            overridden = (await http.get("/v1/items/abc/key1")).json()
            app.dependency_overrides.clear()
            planned = (await http.get("/v1/items/abc/key1")).json()
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
