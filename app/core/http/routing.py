"""Routing of the capabilities: each one's routes behind a gate that checks its name first.

Paths under ``/v1`` name their capability in the third segment (``/v1/{namespace}/<capability>/...``;
a namespace cannot contain ``/``), so ``CapabilityRoutes`` tells from that one segment whether any
of its routes could match, and only then tries them. A capability declares its routes on a
``CapabilityRouter``; ``include_capability`` copies them into the app with the
``/v1/{namespace}`` prefix as ``GatewayRoute``s (not a nested router, which FastAPI matches twice).

The rule, the same for every route: the route is matched; the caller is authenticated and
authorized from the headers alone (the gate's ``guard``); only then is the body read, within the
matched route's declared limit and deadlines (``app.core.http.limits``), and parsed by
``app.core.http.bodies``; only then does the route run, so its database connection and locks are
taken once the body is complete. A ``@fast`` route (``app.core.fast``) is served by a planned
handler; one that cannot be planned fails here, at start-up.
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

from app.core.config import FastPathSettings, Settings
from app.core.fast import OneStatement, promise_of
from app.core.fast.plans import planned_handler
from app.core.fences.fastapi_ import single_body_model
from app.core.fences.starlette_ import route_path
from app.core.http.bodies import model_body_handler
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


class GatewayRoute(APIRoute):
    """A route as a gate serves it: FastAPI's handler, its body model parsed and validated by
    ``app.core.http.bodies``; a ``@fast`` route's handler planned (``app.core.fast.plans``)."""

    planned: bool = False

    def __init__(self, *args: Any, fast_paths: FastPathSettings, **kwargs: Any) -> None:
        self.fast_paths = fast_paths
        super().__init__(*args, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        fastapis = super().get_route_handler()
        if promise_of(self.endpoint) is not None:
            planned = planned_handler(self, fastapis)  # checked whether used or not: FastPathRefused
            if self.fast_paths.plans:
                self.planned = True
                return planned
        if not self.dependant.body_params:
            return fastapis
        model = single_body_model(self)
        if model is None:
            raise RuntimeError(
                f"{sorted(self.methods or ())} {self.path_format}: a request body must be one pydantic "
                "model (app.core.http.bodies reads it)"
            )
        return model_body_handler(model, fastapis)


class CapabilityRouter(APIRouter):
    """Where a capability declares its routes (``prefix="/<capability>"``); see ``include_capability``."""

    def __init__(self, capability: str, **kwargs: Any) -> None:
        super().__init__(prefix=f"/{capability}", **kwargs)
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


ROUTE_POLICY = "gateway.route_policy"


@dataclass(frozen=True)
class RoutePolicy:
    """What the gate enforces for one route before it runs, and what its connections are."""

    body: BodySpec
    limit: int  # bytes of body, from the settings
    reads: bool  # for scopes and transactions: GET/HEAD, or a POST declared read-only
    one_statement: OneStatement  # @fast(one_statement=...), when fast_paths.one_statement is on


def route_policy(route: APIRoute, settings: Settings) -> RoutePolicy:
    methods = set(route.methods or ())
    spec = body_spec(route.endpoint, methods, route.body_field is not None, route.path)
    promise = promise_of(route.endpoint)
    one_statement = promise.one_statement if promise is not None and settings.fast_paths.one_statement else False
    return RoutePolicy(spec, spec.limit(settings.limits), methods <= READ_METHODS or spec.read_only, one_statement)


def route_policy_of(scope: Scope) -> RoutePolicy | None:
    """The policy of the route a gate matched for this request (None outside the gates)."""
    policy: RoutePolicy | None = scope.get(ROUTE_POLICY)
    return policy


class GatedRoutes(BaseRoute):
    """Routes tried only for paths under their gate, each run behind the request pipeline."""

    def __init__(self, name: str, routes: list[APIRoute], guard: Guard, settings: Settings) -> None:
        self.name = name
        self.routes = routes
        self.guard = guard
        self.limits = settings.limits
        self.policies = {id(route): route_policy(route, settings) for route in routes}

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
        policy = scope[ROUTE_POLICY] = self.policies[id(route)]
        await self.guard(Request(scope), self.name, policy.reads)
        check_path_utf8(scope)
        if has_body(scope):
            spec, limit = policy.body, policy.limit
            clock = BodyClock(self.limits)
            if spec.kind in (Body.STREAM, Body.ARCHIVE):
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

    def __init__(self, prefix: str, routes: list[APIRoute], guard: Guard, settings: Settings) -> None:
        super().__init__(prefix, routes, guard, settings)
        self._parts = prefix.split("/")

    def selects(self, parts: list[str]) -> bool:
        return parts[: len(self._parts)] == self._parts


def copy_routes(app: FastAPI, router: APIRouter, prefix: str) -> list[APIRoute]:
    return [
        GatewayRoute(
            prefix + route.path,
            route.endpoint,
            dependencies=list(route.dependencies),
            dependency_overrides_provider=app,
            fast_paths=gateway_state(app).settings.fast_paths,
            **{name: getattr(route, name) for name in _ROUTE_FIELDS},
        )
        for route in router.routes
        if isinstance(route, APIRoute)
    ]


def include_capability(app: FastAPI, router: CapabilityRouter, prefix: str, guard: Guard) -> None:
    """Add ``router``'s routes to ``app`` under ``prefix``, behind one gate that runs ``guard``."""
    routes = copy_routes(app, router, prefix)
    app.router.routes.append(CapabilityRoutes(router.capability, routes, guard, gateway_state(app).settings))


def include_guarded(app: FastAPI, router: APIRouter, guard: Guard) -> None:
    """Add ``router``'s routes (already under their full ``prefix``) behind a gate on that prefix."""
    routes = copy_routes(app, router, "")
    app.router.routes.append(PrefixRoutes(router.prefix, routes, guard, gateway_state(app).settings))


def api_routes(routes: list[BaseRoute]) -> list[BaseRoute]:
    """``routes`` with each capability's gate replaced by its routes (what OpenAPI documents)."""
    out: list[BaseRoute] = []
    for route in routes:
        out.extend(route.routes if isinstance(route, GatedRoutes) else [route])
    return out
