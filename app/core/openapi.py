"""The OpenAPI document as the gateway really answers: every error is problem+json.

FastAPI documents its own 422 shape as ``application/json``; the gateway answers every error,
422 included, as RFC 9457 ``application/problem+json``. This rewrites each operation's error
responses to say so, adds a ``default`` error response (401, 403, 413, 429 and 503 can answer
any route), and declares the bearer key scheme so ``/docs`` can send it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.core.errors import PROBLEM_JSON, Problem
from app.core.routing import CapabilityRoutes, api_routes

_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
_PROBLEM_CONTENT = {PROBLEM_JSON: {"schema": _PROBLEM_REF}}
_UNUSED = ("HTTPValidationError", "ValidationError")


def _rewrite_errors(operation: dict[str, Any]) -> None:
    responses = operation.setdefault("responses", {})
    for status, response in list(responses.items()):
        if status != "default" and int(status) >= 400:
            response["content"] = dict(_PROBLEM_CONTENT)
            if status == "422":
                response["description"] = "Invalid input; `errors` names each field"
    responses["default"] = {"description": "An error (problem+json)", "content": dict(_PROBLEM_CONTENT)}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=api_routes(app.routes),
        servers=app.servers, tags=app.openapi_tags,
    )
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    for name in _UNUSED:
        schemas.pop(name, None)
    components["securitySchemes"] = {
        "bearerKey": {"type": "http", "scheme": "bearer", "description": "An API key: `sgw_...`"}
    }
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            if not isinstance(operation, dict) or method.startswith("x-"):
                continue
            _rewrite_errors(operation)
            if path.startswith("/v1/"):
                operation["security"] = [{"bearerKey": []}]
    _document_scopes(app, schema)
    app.openapi_schema = schema
    return schema


def _document_scopes(app: FastAPI, schema: dict[str, Any]) -> None:
    """``x-required-scope`` on each capability operation: the key scope its gate checks
    (``<capability>:read`` or ``<capability>:write``; a write scope includes reading)."""
    paths = schema.get("paths", {})
    for gate in app.routes:
        if not isinstance(gate, CapabilityRoutes):
            continue
        for route in gate.routes:
            action = "read" if gate.policies[id(route)].reads else "write"
            for method in route.methods or ():
                operation = paths.get(route.path_format, {}).get(method.lower())
                if operation is not None:
                    operation["x-required-scope"] = f"{gate.name}:{action}"


def install_openapi(app: FastAPI) -> None:
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]
