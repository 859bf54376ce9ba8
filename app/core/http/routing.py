"""Routing of the capabilities: each one's routes behind a gate that checks its name first.

Paths under ``/v1`` name their capability in the third segment (``/v1/{namespace}/<capability>/...``;
a namespace cannot contain ``/``), so ``CapabilityRoutes`` tells from that one segment whether any
of its routes could match, and only then tries them. A capability is declared on a
``CapabilityRouter`` and added to the app with ``include_capability``: its routes are copied
with the ``/v1/{namespace}`` prefix and the app's dependencies (as FastAPI's ``include_router``
did before 0.16x), not included as a nested router. FastAPI 0.165 matches a request against a
nested router twice and keeps per-router bookkeeping in the scope: about 20 us of a kv read's
~185 us of CPU (measured in-process).

Every route solves its dependencies from a plan built once (``app.core.http.planning``).

The gate is also where a request's pipeline runs, in this order and the same for every route:
the route is matched; the caller is authenticated and authorized from the headers alone (the
gate's ``guard``); only then is the body read, within the matched route's declared limit and
deadlines (``app.core.http.limits``); only then does the route run, so its database connection and
locks are taken once the body is complete.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.routing import APIRoute
from starlette.datastructures import URLPath
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Receive, Scope, Send

from app.core.config import LimitsSettings
from app.core.fences.fastapi_ import included_route, single_body_model
from app.core.fences.starlette_ import route_path
from app.core.http.bodies import model_body_handler
from app.core.http.planning import compile_handler, opted_out, unplannable_because
from app.core.jsonvalue import check_json_encoding
from app.core.state import gateway_state
from app.core.http.limits import (
    Body,
    BodyClock,
    BodySpec,
    body_spec,
    check_json_shape,
    declared_length,
    has_body,
    read_body,
    replay,
    streamed,
    too_large,
)
from app.core.http.paths import check_path_utf8


class UnplannedRoute(RuntimeError):
    """A ``PlannedRoute`` that cannot be planned and does not say it opts out (or opts out needlessly)."""


class PlannedRoute(APIRoute):
    """An ``APIRoute`` whose handler is planned (``compile_handler``).

    A route that cannot be planned raises ``UnplannedRoute`` when it is declared, unless its
    endpoint is marked ``@served_by_fastapi("why")``; a marked route that could be planned
    raises too, so the mark goes when its reason does.
    """

    planned: bool = False

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        # When FastAPI builds an included route's handler, plan that one (its router's prefix
        # and dependencies included).
        route: Any = included_route(self) or self
        fastapis = super().get_route_handler()
        reason = unplannable_because(route.dependant)
        opt_out = opted_out(self.endpoint)
        where = f"{sorted(self.methods or ())} {route.path_format}"
        if reason is None and opt_out is not None:
            raise UnplannedRoute(
                f"{where} is marked @served_by_fastapi({opt_out!r}) but can be planned: remove the mark"
            )
        if reason is not None:
            if opt_out is None:
                raise UnplannedRoute(
                    f"{where} cannot be planned: {reason}. Make it plannable (app.core.http.planning) "
                    f"or mark {self.endpoint.__qualname__} @served_by_fastapi(\"why\")"
                )
            if not route.dependant.body_params:
                return fastapis
            model = single_body_model(route)
            if model is None:
                raise UnplannedRoute(
                    f"{where}: a request body must be one pydantic model (app.core.http.bodies reads it)"
                )
            return model_body_handler(model, fastapis)
        handler = compile_handler(route.dependant, fastapis, route.dependency_overrides_provider)
        assert handler is not None
        route.planned = True
        return handler


class CapabilityRouter(APIRouter):
    """Where a capability declares its routes (``prefix="/<capability>"``); see ``include_capability``."""

    def __init__(self, capability: str, **kwargs: Any) -> None:
        super().__init__(prefix=f"/{capability}", route_class=PlannedRoute, **kwargs)
        self.capability = capability


_MATCHED = "gateway.capability_route"
_ALLOWED = "gateway.allowed_methods"

# What an APIRoute is built from, copied as declared (FastAPI resolves defaults the same way again).
_ROUTE_FIELDS = (
    "response_model", "status_code", "tags", "summary", "description", "response_description",
    "responses", "deprecated", "methods", "operation_id", "response_model_include",
    "response_model_exclude", "response_model_by_alias", "response_model_exclude_unset",
    "response_model_exclude_defaults", "response_model_exclude_none", "include_in_schema",
    "response_class", "name", "callbacks", "openapi_extra", "generate_unique_id_function",
)


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# Authenticates and authorizes a request from its headers: (request, gate name, reads only) -> None
# or a ProblemError (401, 403, 429).
Guard = Callable[[Request, str, bool], Awaitable[None]]


@dataclass(frozen=True)
class RoutePolicy:
    """What the gate enforces for one route before it runs."""

    body: BodySpec
    limit: int  # bytes of body, from the settings
    reads: bool  # for scopes: GET/HEAD, or a POST declared read-only


def route_policy(route: APIRoute, limits: LimitsSettings) -> RoutePolicy:
    methods = set(route.methods or ())
    spec = body_spec(route.endpoint, methods, route.body_field is not None, route.path)
    return RoutePolicy(spec, spec.limit(limits), methods <= READ_METHODS or spec.read_only)


class GatedRoutes(BaseRoute):
    """Routes tried only for paths under their gate, each run behind the request pipeline."""

    def __init__(self, name: str, routes: list[APIRoute], guard: Guard, limits: LimitsSettings) -> None:
        self.name = name
        self.routes = routes
        self.guard = guard
        self.limits = limits
        self.policies = {id(route): route_policy(route, limits) for route in routes}

    def selects(self, parts: list[str]) -> bool:  # parts: "", "v1", namespace, capability, rest
        raise NotImplementedError

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if not self.selects(route_path(scope).split("/", 4)):
            return Match.NONE, {}
        partial: Scope | None = None
        for route in self.routes:
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                child_scope[_MATCHED] = route
                return match, child_scope
            if match is Match.PARTIAL:  # the path matches, the method does not
                if partial is None:
                    partial = child_scope
                    partial[_MATCHED] = route
                    partial[_ALLOWED] = set()
                partial[_ALLOWED] |= route.methods or set()
        return (Match.PARTIAL, partial) if partial is not None else (Match.NONE, {})

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        allowed = scope.get(_ALLOWED)
        if allowed is not None and scope["method"] not in allowed:
            # Every method the path supports, not only the first route's (RFC 9110 section 15.5.6).
            raise HTTPException(status_code=405, headers={"Allow": ", ".join(sorted(allowed))})
        route: APIRoute = scope[_MATCHED]
        policy = self.policies[id(route)]
        await self.guard(Request(scope), self.name, policy.reads)
        check_path_utf8(scope)
        if has_body(scope):
            spec, limit = policy.body, policy.limit
            clock = BodyClock(self.limits)
            if spec.kind is Body.STREAM:
                declared = declared_length(scope)
                if declared is not None and declared > limit:
                    raise too_large(spec, limit)
                receive = streamed(receive, spec, limit, clock)
            else:
                body = await read_body(scope, receive, spec, limit, clock)
                if body is None:
                    return  # the client went away before the end of its body: nothing to answer
                if spec.kind is Body.JSON:
                    check_json_shape(body, self.limits)
                    check_json_encoding(body)  # UTF-8; the rest of the text rule is the parser's (bodies.py)
                receive = replay(body, receive)
                del body
        await route.handle(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        for route in self.routes:
            try:
                return route.url_path_for(name, **path_params)
            except NoMatchFound:
                pass
        raise NoMatchFound(name, path_params)


class CapabilityRoutes(GatedRoutes):
    """The routes of one capability, under ``/v1/{namespace}/<capability>``."""

    def selects(self, parts: list[str]) -> bool:
        return len(parts) > 3 and parts[3] == self.name


class PrefixRoutes(GatedRoutes):
    """Routes under a fixed path prefix (``/v1/admin/keys``)."""

    def __init__(self, prefix: str, routes: list[APIRoute], guard: Guard, limits: LimitsSettings) -> None:
        super().__init__(prefix, routes, guard, limits)
        self._parts = prefix.split("/")

    def selects(self, parts: list[str]) -> bool:
        return parts[: len(self._parts)] == self._parts


def _copy_routes(app: FastAPI, router: APIRouter, prefix: str) -> list[APIRoute]:
    return [
        PlannedRoute(
            prefix + route.path,
            route.endpoint,
            dependencies=list(route.dependencies),
            dependency_overrides_provider=app,
            **{name: getattr(route, name) for name in _ROUTE_FIELDS},
        )
        for route in router.routes
        if isinstance(route, APIRoute)
    ]


def include_capability(app: FastAPI, router: CapabilityRouter, prefix: str, guard: Guard) -> None:
    """Add ``router``'s routes to ``app`` under ``prefix``, behind one gate that runs ``guard``."""
    routes = _copy_routes(app, router, prefix)
    app.router.routes.append(CapabilityRoutes(router.capability, routes, guard, gateway_state(app).settings.limits))


def include_guarded(app: FastAPI, router: APIRouter, guard: Guard) -> None:
    """Add ``router``'s routes (already under their full ``prefix``) behind a gate on that prefix."""
    routes = _copy_routes(app, router, "")
    app.router.routes.append(PrefixRoutes(router.prefix, routes, guard, gateway_state(app).settings.limits))


def api_routes(routes: list[BaseRoute]) -> list[BaseRoute]:
    """``routes`` with each capability's gate replaced by its routes (what OpenAPI documents)."""
    out: list[BaseRoute] = []
    for route in routes:
        out.extend(route.routes if isinstance(route, GatedRoutes) else [route])
    return out
