"""Route handlers that solve their dependencies from a plan built once, not per request.

FastAPI's ``solve_dependencies`` re-derives, on every request, facts about each dependency that
never change: whether it is a generator, its cache key, whether it uses security scopes, which
parameter lists are empty. For a kv read that was about a third of the gateway's CPU per request
(measured in-process, ``docs/benchmarks.md``). ``compile_handler`` walks a route's dependency
tree once and returns a handler that does only the per-request part: validate the path, query
and header parameters as FastAPI's ``request_params_to_args`` does (with each field's own
validator, so the values, and the errors behind a 422, are FastAPI's), call each dependency once per request, call the endpoint.

Only what the gateway's routes use is planned: async functions (no generators, no threads),
``Request`` parameters, path/query/header/cookie parameters, no request body, no security scopes,
and an endpoint that returns a ``Response`` itself. For anything else ``compile_handler`` returns
None and the route keeps FastAPI's own handler; while ``app.dependency_overrides`` is set, FastAPI's
handler serves the request too. (FastAPI 0.165's own telemetry hooks around dependency solving
are not called for planned routes.)
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from copy import deepcopy
from functools import partial
from typing import Any, get_type_hints

from fastapi.dependencies import utils as fastapi_utils
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import request_params_to_args
from fastapi.exceptions import RequestValidationError
from fastapi.security.base import SecurityBase
from starlette.requests import Request
from starlette.responses import Response

Handler = Callable[[Request], Coroutine[Any, Any, Response]]  # as APIRoute.get_route_handler returns
Solver = Callable[[Request, dict[Any, Any], list[Any]], Awaitable[dict[str, Any]]]
Reader = Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[Any]]]
_IMMUTABLE = (type(None), bool, int, float, str, bytes, tuple, frozenset)


def _plannable(dependant: Dependant) -> bool:
    """True when ``dependant`` (and everything below it) uses only what a plan supports."""
    call = dependant.call
    # (mypy finds no callable SecurityBase, as the base declares no __call__; its schemes do)
    if call is None or isinstance(call, SecurityBase) or not inspect.iscoroutinefunction(call):  # type: ignore[redundant-expr]
        return False  # sync functions, classes, generators and security schemes stay FastAPI's
    if (
        dependant.body_params
        or dependant.websocket_param_name
        or dependant.background_tasks_param_name
        or dependant.response_param_name
        or dependant.security_scopes_param_name
        or dependant.own_oauth_scopes
        or dependant.concurrency is not None
    ):
        return False
    return all(_plannable(sub) for sub in dependant.dependencies)


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
    u = fastapi_utils
    try:
        plans = []
        for field in fields:
            info = field.field_info
            if u._get_param_model(field) is not None or u._is_json_field(field) or u.field_annotation_is_sequence(info.annotation):  # type: ignore[attr-defined]  # not in its __all__ (a fenced internal)
                return partial(request_params_to_args, fields)
            keys = [key for _validation_alias, key in u._get_param_aliases(field)]
            loc = (info.in_.value, keys[0])
            plans.append((field, field.name, keys, {key: (info.in_.value, key) for key in keys}, loc,
                          info.is_required(), field.default, bool(info.validate_default)))
        missing_error = u.get_missing_field_error  # type: ignore[attr-defined]  # not in its __all__ (a fenced internal)
    except Exception:  # noqa: BLE001 (FastAPI's internals moved: let it do the work itself)
        return partial(request_params_to_args, fields)

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
    if endpoint is None or not _plannable(dependant) or not _returns_response(endpoint):
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
