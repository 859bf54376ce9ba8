"""Per-request telemetry: one access log line and the request metrics, plus wiring into the app.

``install(app)`` registers the middlewares (request id outermost, so even a refused body or a
500 carries the id) and the ``/metrics`` route. The telemetry middleware is pure ASGI so that
streamed uploads and downloads pass through untouched.
"""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.ops import metrics
from app.core.errors import app_error_response
from app.core.http.requestid import RequestIdMiddleware

access_log = logging.getLogger("app.access")
log = logging.getLogger("app.errors")


def route_template(scope: Scope) -> str:
    """The matched route's path template, never the concrete path (bounded label values)."""
    # FastAPI >= 0.16x keeps included routers nested: the route in scope has only its own
    # path, and the full one (with the /v1/{namespace} prefix) is on the effective context.
    effective = scope.get("fastapi", {}).get("effective_route_context")
    if getattr(effective, "path_format", None):
        path: str = effective.path_format
        return path
    route = scope.get("route")  # FastAPI routes put themselves here
    if route is None and "endpoint" in scope:  # plain Starlette routes (/docs, /openapi.json)
        for candidate in getattr(scope.get("app"), "routes", ()):
            if getattr(candidate, "endpoint", None) is scope["endpoint"]:
                route = candidate
                break
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    return template or metrics.UNMATCHED_ROUTE


class TelemetryMiddleware:
    """Measures each request: in-flight gauge, count and latency by route, one access log line.

    An exception that escapes the app before an answer started is answered here by the app's
    own exception handlers (problem+json), so the answer still carries the request id and is
    counted; Starlette would otherwise answer it outside every user middleware.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        started = False

        async def send_and_watch(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status = message["status"]
                started = True
            await send(message)

        metrics.IN_FLIGHT.inc()
        try:
            try:
                await self.app(scope, receive, send_and_watch)
            except Exception as exc:
                if started:
                    raise
                response = await app_error_response(scope, exc)
                if response is None:
                    raise
                await response(scope, receive, send_and_watch)
        finally:
            metrics.IN_FLIGHT.dec()
            seconds = time.perf_counter() - start
            route = route_template(scope)
            method = scope.get("method", "")
            metrics.observe_request(method, route, status, seconds)
            if access_log.isEnabledFor(logging.INFO):
                _log_access(scope, method, route, status, seconds)


def _log_access(scope: Scope, method: str, route: str, status: int, seconds: float) -> None:
    client = scope.get("client")
    access_log.info(
        "%s %s %d %.1fms", method, route, status, seconds * 1000,
        extra={
            "method": method,
            "route": route,
            "namespace": scope.get("path_params", {}).get("namespace"),
            "status": status,
            "duration_ms": round(seconds * 1000, 3),
            "client": client[0] if client else None,
        },
    )


def install(app: FastAPI) -> None:
    """Add the telemetry and request id middlewares (call last: the last added runs first) and /metrics."""
    app.add_middleware(TelemetryMiddleware)
    app.add_middleware(RequestIdMiddleware)
    app.add_api_route(
        "/metrics", metrics.metrics_endpoint, methods=["GET"], include_in_schema=False,
        summary="Prometheus metrics of this process",
    )
