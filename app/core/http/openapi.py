"""The OpenAPI document as the gateway really answers: every error is problem+json.

FastAPI documents its own 422 shape as ``application/json``; the gateway answers every error,
422 included, as RFC 9457 ``application/problem+json``. This rewrites each operation's error
responses to say so, adds a ``default`` error response (401, 403, 413, 429 and 503 can answer
any route), and declares the bearer key scheme so ``/docs`` can send it. Bounds that come from the
settings (a page's ``limit``, ``limits.max_page_size``) are written in from the running ones.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.auth.schemas import SCOPE_PATTERN
from app.core.errors import PROBLEM_JSON, Problem
from app.core.http.routing import CapabilityRoutes, api_routes
from app.core.state import gateway_state

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


# The payload filter language (app.vectors.filters) as JSON Schema, for every `filters` field: what
# the parser accepts, so generated filters are ones the server takes. (Not said here: the nesting
# depth and term budget from the settings, and integers beyond 64 bits.)
_SCALAR = {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]}
_COMPARABLE = {"anyOf": [{"type": "string"}, {"type": "number"}]}
_FIELD_NAME = r'^(\$and|\$or|[^$"\\\u0000-\u001f\u007f-\u009f][^"\\\u0000-\u001f\u007f-\u009f]{0,255})$'
FILTER_SCHEMAS: dict[str, dict[str, Any]] = {
    "Filter": {
        "type": "object",
        "description": "AND-ed conditions on top-level payload fields (a scalar: equal to it; an object of "
        "operators), and `$and` / `$or` lists of filters.",
        "propertyNames": {"pattern": _FIELD_NAME},
        "properties": {
            "$and": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Filter"}},
            "$or": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Filter"}},
        },
        "additionalProperties": {"anyOf": [_SCALAR, {"$ref": "#/components/schemas/FilterOperators"}]},
        "examples": [{"user_id": "u1", "n": {"$gte": 3}}],
    },
    "FilterOperators": {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {
            "$eq": _SCALAR, "$ne": _SCALAR,
            "$in": {"type": "array", "items": _SCALAR}, "$nin": {"type": "array", "items": _SCALAR},
            "$exists": {"type": "boolean"},
            **{op: _COMPARABLE for op in ("$gt", "$gte", "$lt", "$lte")},
        },
    },
}


def _filters(schema: dict[str, Any]) -> None:
    """Every body's ``filters`` (a free-form object in the models) refers to the ``Filter`` schema."""
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    used = False
    for component in list(schemas.values()):
        field = component.get("properties", {}).get("filters")
        if field is not None:
            keep = {k: field[k] for k in ("title", "description", "examples") if k in field}
            component["properties"]["filters"] = {
                "anyOf": [{"$ref": "#/components/schemas/Filter"}, {"type": "null"}], **keep,
            }
            used = True
    if used:
        schemas.update(FILTER_SCHEMAS)


def _bound_integer(schema: dict[str, Any], maximum: int) -> None:
    """Give ``schema`` (an integer, or an anyOf with one) a ``maximum``."""
    for branch in [schema, *schema.get("anyOf", [])]:
        if branch.get("type") == "integer":
            branch["maximum"] = maximum


def _page_limits(schema: dict[str, Any], max_page_size: int) -> None:
    """Every ``limit`` (query parameter or body field) is a page size: at most ``max_page_size``."""
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if parameter.get("name") == "limit" and parameter.get("in") == "query":
                    _bound_integer(parameter["schema"], max_page_size)
    for component in schema.get("components", {}).get("schemas", {}).values():
        if "limit" in component.get("properties", {}):
            _bound_integer(component["properties"]["limit"], max_page_size)


def _query_maximum(schema: dict[str, Any], name: str, maximum: int) -> None:
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if parameter.get("name") == name and parameter.get("in") == "query":
                    for branch in [parameter["schema"], *parameter["schema"].get("anyOf", [])]:
                        if branch.get("type") in ("integer", "number"):
                            branch["maximum"] = maximum


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
    _page_limits(schema, gateway_state(app).settings.limits.max_page_size)
    _query_maximum(schema, "ttl_seconds", gateway_state(app).settings.kv.max_ttl_seconds)
    _filters(schema)
    _standard_bounds(schema)
    _document_scopes(app, schema)
    _scope_names(schema, gateway_state(app).capability_names)
    app.openapi_schema = schema
    return schema


_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _standard_bounds(node: Any) -> None:
    """JSON Schema's names for numeric bounds. Pydantic writes its own (``ge``, ``lt``) where a
    bound sits outside a before-validator (``app.core.numbers.StrictInt`` with ``Field(ge=...)``);
    the validation is the same, the document must say it in JSON Schema."""
    if isinstance(node, dict):
        if node.get("type") in ("integer", "number"):
            for ours, standard in _BOUNDS.items():
                if ours in node and not isinstance(node[ours], (dict, list)):
                    node[standard] = node.pop(ours)
        for value in node.values():
            _standard_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _standard_bounds(value)


def _scope_names(schema: dict[str, Any], names: tuple[str, ...]) -> None:
    """The key scopes' pattern names the capabilities this gateway serves (``app.capabilities``)."""
    scopes = schema.get("components", {}).get("schemas", {}).get("KeyCreate", {}).get("properties", {}).get("scopes")
    if scopes is not None:
        scopes["items"]["pattern"] = SCOPE_PATTERN.replace("CAPABILITY", "|".join(names))


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
