"""Routing of the capabilities: a router per capability, and routes with planned handlers.

FastAPI matches a request by trying every route of every included router in turn, twice; a
route in the last capability paid for regex checks of all the others' routes first (about
0.7 ms per vector search, measured in-process). Paths under ``/v1`` name their capability in
the third segment (``/v1/{namespace}/<capability>/...``; a namespace cannot contain ``/``), so a
router can tell from that one segment whether any of its routes could match.

Its routes solve their dependencies from a plan built once (``app.core.handlers``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter
from fastapi import routing as fastapi_routing
from fastapi.routing import APIRoute
from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import Scope

from app.core.handlers import compile_handler

# FastAPI builds the handler of an included route while this names the route as included (with
# the router's prefix and dependencies); without it (another FastAPI), routes keep FastAPI's.
_INCLUDED_ROUTE = getattr(fastapi_routing, "_effective_route_context_var", None)


class PlannedRoute(APIRoute):
    """An ``APIRoute`` whose handler is planned when its dependencies allow (``compile_handler``)."""

    planned: bool = False

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        route: Any = self
        included = _INCLUDED_ROUTE.get() if _INCLUDED_ROUTE is not None else None
        if included is not None and getattr(included, "original_route", None) is self:
            route = included
        elif _INCLUDED_ROUTE is None:
            return super().get_route_handler()
        fastapis = super().get_route_handler()
        handler = compile_handler(route.dependant, fastapis, route.dependency_overrides_provider)
        if handler is None:
            return fastapis
        route.planned = True
        return handler


class CapabilityRouter(APIRouter):
    """``APIRouter(prefix="/<capability>")`` that answers ``Match.NONE`` for other capabilities."""

    def __init__(self, capability: str, **kwargs: Any) -> None:
        super().__init__(prefix=f"/{capability}", route_class=PlannedRoute, **kwargs)
        self.capability = capability

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        parts = get_route_path(scope).split("/", 4)  # "", "v1", namespace, capability, rest
        if len(parts) < 4 or parts[3] != self.capability:
            return Match.NONE, {}
        return super().matches(scope)
