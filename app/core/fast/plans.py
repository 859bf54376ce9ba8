"""Handlers of ``@fast`` routes: dependencies solved from a plan built once, not per request.

FastAPI's ``solve_dependencies`` re-derives on every request facts about each dependency that
never change (whether it is a generator, its cache key, its security scopes, which parameter
lists are empty). ``planned_handler`` walks a route's dependency tree once and returns a handler
that does only the per-request part: the body model parsed and validated by
``app.core.http.bodies`` (as every route's), path, query, header and cookie parameters validated
with each field's own validator (so values and 422s are FastAPI's), each dependency called once,
the endpoint called.

The rule: planning is an allow-list. A plan supports async functions (no generators, no
threads), ``Request`` parameters, path/query/header/cookie parameters, one body model, and an
endpoint that returns a ``Response``; anything else in a ``Dependant`` (security scopes,
background tasks, a field a newer FastAPI adds) refuses the route with ``FastPathRefused`` at
start-up. While ``app.dependency_overrides`` is set, FastAPI's own handler serves the route.
FastAPI's internals used here live in ``app.core.fences.fastapi_``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from copy import deepcopy
from functools import partial
from typing import Any

from fastapi.dependencies.utils import get_typed_return_annotation
from fastapi.exceptions import RequestValidationError
from fastapi.security.base import SecurityBase
from starlette.requests import Request
from starlette.responses import Response

from app.core.fences import fastapi_ as fence
from app.core.fences.fastapi_ import Dependant, request_params_to_args
from app.core.http.bodies import json_model_reader

Handler = Callable[[Request], Coroutine[Any, Any, Response]]  # as APIRoute.get_route_handler returns
Solver = Callable[[Request, dict[Any, Any], list[Any]], Awaitable[dict[str, Any]]]
Reader = Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[Any]]]
_IMMUTABLE = (type(None), bool, int, float, str, bytes, tuple, frozenset)

# What a plan does with each field of FastAPI's ``Dependant`` (``fence.DEPENDANT_FIELDS``, pinned):
_PLANNED_FIELDS = frozenset({
    "path_params", "query_params", "header_params", "cookie_params", "dependencies", "name",
    "call", "request_param_name", "http_connection_param_name", "use_cache",
})
# No behaviour for a plain async function: ``path`` is descriptive, ``scope`` ("function" or
# "request", set on every dependant) only says when a generator dependency's exit code runs.
_DESCRIPTIVE_FIELDS = frozenset({"path", "scope"})
# Every other field must be empty (None, False, []): websocket_param_name, response_param_name,
# background_tasks_param_name, security_scopes_param_name, own_oauth_scopes, parent_oauth_scopes,
# concurrency, and any field not listed here; ``body_params`` only on the route itself, as one
# model (``planned_handler``).


class FastPathRefused(RuntimeError):
    """A ``@fast`` route that cannot keep its promise (raised at start-up, naming the fix)."""


def unplannable_because(dependant: Dependant, *, top: bool = True) -> str | None:
    """Why ``dependant`` (its whole tree) cannot be planned, or None when it can (a body on
    ``top`` is the route's, checked by ``planned_handler``)."""
    call: Any = dependant.call  # None for a parameter-only sub-dependant
    label = getattr(call, "__qualname__", repr(call))
    if isinstance(call, SecurityBase) or not inspect.iscoroutinefunction(call):
        return f"{label} is not an async function"  # sync functions, classes, generators, security schemes
    for name in (f.name for f in dataclasses.fields(dependant)):
        if name in _PLANNED_FIELDS or name in _DESCRIPTIVE_FIELDS or (top and name == "body_params"):
            continue
        if getattr(dependant, name):
            return f"{label} uses {name}"
    if top and not _returns_response(call):
        return f"{label} does not return a Response (FastAPI would serialize its return value)"
    for sub in dependant.dependencies:
        reason = unplannable_because(sub, top=False)
        if reason is not None:
            return reason
    return None


def _returns_response(call: Callable[..., Any]) -> bool:
    try:
        hint = get_typed_return_annotation(call)  # the return annotation alone, as FastAPI resolves it
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


def planned_handler(route: Any, fastapis: Handler) -> Handler:
    """The planned handler of ``route`` (an ``APIRoute`` with its full dependency tree), or
    ``FastPathRefused`` saying why it cannot be planned.

    ``fastapis`` (FastAPI's handler for the route) serves the requests made while
    ``route.dependency_overrides_provider.dependency_overrides`` replaces dependencies (tests),
    which a plan built at start-up cannot know about.
    """
    dependant: Dependant = route.dependant
    endpoint = dependant.call
    where = f"{sorted(route.methods or ())} {route.path_format}"
    reason = "it has no endpoint" if endpoint is None else unplannable_because(dependant)
    model = fence.single_body_model(route) if dependant.body_params else None
    if reason is None and dependant.body_params and model is None:
        reason = "its request body is not one pydantic model"
    if reason is not None:
        raise FastPathRefused(
            f"{where} is marked @fast but cannot be planned: {reason}. Remove @fast (a plain route "
            "may do all of this), or make it plannable (app.core.fast.plans)"
        )
    assert endpoint is not None
    solve = _solver(dependant)
    body_name = dependant.body_params[0].name if model is not None else None
    read_body: Callable[[Request], Awaitable[Any]] | None = json_model_reader(model) if model is not None else None
    overrides_provider = route.dependency_overrides_provider

    async def handler(request: Request) -> Response:
        if overrides_provider is not None and overrides_provider.dependency_overrides:
            return await fastapis(request)
        body = await read_body(request) if read_body is not None else None
        errors: list[Any] = []
        values = await solve(request, {}, errors)
        if errors:
            raise RequestValidationError(errors)
        if body_name is not None:
            values[body_name] = body
        response = await endpoint(**values)
        if not isinstance(response, Response):
            raise TypeError(f"{endpoint.__qualname__} is annotated to return a Response, returned {type(response)}")
        return response

    handler.__qualname__ = f"planned({endpoint.__qualname__})"
    return handler
