"""Route handlers that solve their dependencies from a plan built once, not per request.

FastAPI's ``solve_dependencies`` re-derives, on every request, facts about each dependency that
never change: whether it is a generator, its cache key, whether it uses security scopes, which
parameter lists are empty. For a kv read that was about a third of the gateway's CPU per request
(measured in-process, ``docs/benchmarks.md``). ``compile_handler`` walks a route's dependency
tree once and returns a handler that does only the per-request part: validate the path, query
and header parameters as FastAPI's ``request_params_to_args`` does (with each field's own
validator, so the values, and the errors behind a 422, are FastAPI's), call each dependency
once per request, call the endpoint.

Planning is an allow-list: a plan supports async functions (no generators, no threads),
``Request`` parameters, path/query/header/cookie parameters, and an endpoint that returns a
``Response`` itself; any other ``Dependant`` field in use (a body, security scopes, a field a
newer FastAPI adds) makes the route unplannable (``unplannable_because`` says why). A
``PlannedRoute`` that cannot be planned fails when it is declared, at start-up, unless its
endpoint opts out with ``@served_by_fastapi("why")``; then FastAPI's own handler serves it.
While ``app.dependency_overrides`` is set, FastAPI's handler serves planned routes too.
(FastAPI 0.165's own telemetry hooks around dependency solving are not called for planned routes.)

FastAPI's internals used here live in ``app.core.fences.fastapi_``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from copy import deepcopy
from functools import partial
from typing import Any, get_type_hints

from fastapi.exceptions import RequestValidationError
from fastapi.security.base import SecurityBase
from starlette.requests import Request
from starlette.responses import Response

from app.core.fences import fastapi_ as fence
from app.core.fences.fastapi_ import Dependant, request_params_to_args

Handler = Callable[[Request], Coroutine[Any, Any, Response]]  # as APIRoute.get_route_handler returns
Solver = Callable[[Request, dict[Any, Any], list[Any]], Awaitable[dict[str, Any]]]
Reader = Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[Any]]]
Endpoint = Callable[..., Any]
_IMMUTABLE = (type(None), bool, int, float, str, bytes, tuple, frozenset)
_OPT_OUT = "__gateway_served_by_fastapi__"

# What a plan does with each field of FastAPI's ``Dependant`` (``fence.DEPENDANT_FIELDS``, pinned):
_PLANNED_FIELDS = frozenset({
    "path_params", "query_params", "header_params", "cookie_params", "dependencies", "name",
    "call", "request_param_name", "http_connection_param_name", "use_cache",
})
# No behaviour for a plain async function: ``path`` is descriptive, ``scope`` ("function" or
# "request", set on every dependant) only says when a generator dependency's exit code runs.
_DESCRIPTIVE_FIELDS = frozenset({"path", "scope"})
# Every other field must be empty (None, False, []): body_params, websocket_param_name,
# response_param_name, background_tasks_param_name, security_scopes_param_name,
# own_oauth_scopes, parent_oauth_scopes, concurrency, and any field not listed here.


def served_by_fastapi(reason: str) -> Callable[[Endpoint], Endpoint]:
    """Opt the decorated endpoint's route out of planning: FastAPI's own handler serves it.

    ``reason`` says why (it shows in the start-up error of a route that opts out but could be
    planned, so the mark cannot outlive its cause).
    """
    if not reason:
        raise ValueError("say why the route is served by FastAPI")

    def mark(endpoint: Endpoint) -> Endpoint:
        setattr(endpoint, _OPT_OUT, reason)
        return endpoint

    return mark


def opted_out(endpoint: Endpoint | None) -> str | None:
    """The reason ``endpoint`` gave with ``@served_by_fastapi``, or None."""
    return getattr(endpoint, _OPT_OUT, None)


def unplannable_because(dependant: Dependant, *, top: bool = True) -> str | None:
    """Why ``dependant`` (its whole tree) cannot be planned, or None when it can."""
    call: Any = dependant.call  # None for a parameter-only sub-dependant
    label = getattr(call, "__qualname__", repr(call))
    if isinstance(call, SecurityBase) or not inspect.iscoroutinefunction(call):
        return f"{label} is not an async function"  # sync functions, classes, generators, security schemes
    for name in (f.name for f in dataclasses.fields(dependant)):
        if name in _PLANNED_FIELDS or name in _DESCRIPTIVE_FIELDS:
            continue
        if getattr(dependant, name):
            return f"{label} uses {name}"
    if top and not _returns_response(call):
        return f"{label} does not return a Response (FastAPI serializes its return value)"
    for sub in dependant.dependencies:
        reason = unplannable_because(sub, top=False)
        if reason is not None:
            return reason
    return None


def _returns_response(call: Callable[..., Any]) -> bool:
    try:
        hint = get_type_hints(call).get("return")
    except Exception:  # noqa: BLE001 (an annotation that cannot be resolved: not planned)
        return False
    return isinstance(hint, type) and issubclass(hint, Response)


def _scalar_reader(fields: Sequence[Any]) -> Reader:
    """``request_params_to_args(fields, ...)`` for fields that each take one plain value.

    FastAPI works out per request, per field, which request keys to look under and whether the
    field is a sequence or a model; here that is done once. Missing values, defaults and
    validation (``field.validate``) follow ``request_params_to_args`` exactly. Fields of any
    other kind (lists, models, ``Json``) keep ``request_params_to_args`` itself.
    """
    plans = []
    for field in fields:
        info = field.field_info
        if fence.param_model(field) is not None or fence.is_json_field(field) or fence.annotation_is_sequence(info.annotation):
            return partial(request_params_to_args, fields)
        keys = fence.request_keys(field)
        loc = (info.in_.value, keys[0])
        plans.append((field, field.name, keys, {key: (info.in_.value, key) for key in keys}, loc,
                      info.is_required(), field.default, bool(info.validate_default)))
    missing_error = fence.missing_field_error

    def read(received: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        values: dict[str, Any] = {}
        errors: list[Any] = []
        for field, name, keys, locs, loc, required, default, validate_default in plans:
            value = None
            for key in keys:
                value = received.get(key)
                if value is not None:
                    loc = locs[key]
                    break
            if value is None:
                if required:
                    errors.append(missing_error(loc=loc))
                    continue
                value = default if isinstance(default, _IMMUTABLE) else deepcopy(default)
                if not validate_default:
                    values[name] = value
                    continue
            valid, invalid = field.validate(value, values, loc=loc)
            if invalid:
                errors.extend(invalid)
            else:
                values[name] = valid
        return values, errors

    return read


def _solver(dependant: Dependant) -> Solver:
    """The per-request part of ``solve_dependencies`` for ``dependant``: its keyword arguments.

    Semantics follow FastAPI's: sub-dependencies are solved in declaration order, a dependency
    whose own parameters failed validation is not called, each callable runs at most once per
    request (``use_cache``), and every validation error is collected for one 422.
    """
    subs = [(sub.name, sub.call, sub.use_cache, _solver(sub)) for sub in dependant.dependencies]
    sources: list[tuple[Reader, Callable[[Request], Any]]] = [
        (_scalar_reader(fields), source)
        for fields, source in (
            (dependant.path_params, lambda r: r.path_params),
            (dependant.query_params, lambda r: r.query_params),
            (dependant.header_params, lambda r: r.headers),
            (dependant.cookie_params, lambda r: r.cookies),
        )
        if fields
    ]
    request_names = [n for n in (dependant.request_param_name, dependant.http_connection_param_name) if n]

    async def solve(request: Request, cache: dict[Any, Any], errors: list[Any]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, call, use_cache, solve_sub in subs:
            if use_cache and call in cache:
                result = cache[call]
            else:
                failed = len(errors)
                arguments = await solve_sub(request, cache, errors)
                if len(errors) > failed:
                    continue
                assert call is not None  # _plannable planned only dependencies with one
                result = await call(**arguments)
                cache.setdefault(call, result)
            if name is not None:
                values[name] = result
        for read, source in sources:
            found, invalid = read(source(request))
            values.update(found)
            errors.extend(invalid)
        for name in request_names:
            values[name] = request
        return values

    return solve


def compile_handler(dependant: Dependant, fastapis: Handler, overrides_provider: Any = None) -> Handler | None:
    """A handler for the route whose full dependency tree is ``dependant``, or None when the
    route uses something a plan does not support (then FastAPI's own handler serves it).

    ``fastapis`` (FastAPI's handler for the route) serves the requests made while
    ``overrides_provider.dependency_overrides`` replaces dependencies (tests), which a plan
    built at start-up cannot know about.
    """
    endpoint = dependant.call
    if endpoint is None or unplannable_because(dependant) is not None:
        return None
    solve = _solver(dependant)

    async def handler(request: Request) -> Response:
        if overrides_provider is not None and overrides_provider.dependency_overrides:
            return await fastapis(request)
        errors: list[Any] = []
        values = await solve(request, {}, errors)
        if errors:
            raise RequestValidationError(errors)
        response = await endpoint(**values)
        if not isinstance(response, Response):
            raise TypeError(f"{endpoint.__qualname__} is annotated to return a Response, returned {type(response)}")
        return response

    handler.__qualname__ = f"planned({endpoint.__qualname__})"
    return handler
