"""FastAPI internals used to plan route handlers once (``app.core.fast.plans``) and to read body models.

FastAPI has no public API to inspect a route's dependency tree or to validate request
parameters outside its own ``solve_dependencies``; planning needs both. What is relied on:

- ``fastapi.dependencies.models.Dependant``: a dataclass whose fields are exactly
  ``DEPENDANT_FIELDS`` (a plan only supports the ones in ``app.core.fast.plans``; a new field
  makes planning refuse every ``@fast`` route, so start-up fails until it is looked at).
- ``fastapi.dependencies.utils``: ``request_params_to_args(fields, received)``, and the private
  ``_get_param_model(field)``, ``_is_json_field(field)``, ``_get_param_aliases(field)`` (the
  request keys a field is read from, in preference order), with ``field_annotation_is_sequence``
  and ``get_missing_field_error(loc)`` as that module re-exports them.
- ``ModelField`` (``fastapi._compat``): ``name``, ``default``, ``field_info`` (pydantic's
  ``FieldInfo`` with FastAPI's ``in_``) and ``validate(value, values, *, loc)``.
- ``fastapi.dependencies.utils._should_embed_body_fields(body_params)``: whether FastAPI reads
  a route's body as an object holding each body parameter (else the body is the one parameter),
  for ``single_body_model`` (``app.core.http.routing``, ``app.core.fast.plans``).
"""

from __future__ import annotations

from typing import Any

from fastapi.dependencies import utils as _utils
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import request_params_to_args
from pydantic import BaseModel

__all__ = [
    "DEPENDANT_FIELDS",
    "Dependant",
    "annotation_is_sequence",
    "is_json_field",
    "missing_field_error",
    "param_model",
    "request_keys",
    "request_params_to_args",
]

DEPENDANT_FIELDS = frozenset({
    "path_params", "query_params", "header_params", "cookie_params", "body_params", "dependencies",
    "name", "call", "request_param_name", "websocket_param_name", "http_connection_param_name",
    "response_param_name", "background_tasks_param_name", "security_scopes_param_name",
    "own_oauth_scopes", "parent_oauth_scopes", "use_cache", "path", "scope", "concurrency",
})
"""The fields of ``Dependant`` as of the FastAPI version checked (``tests/test_fences.py``)."""


def param_model(field: Any) -> type | None:
    """The pydantic model a parameter is read into (``Query()`` of a model), or None."""
    return _utils._get_param_model(field)


def is_json_field(field: Any) -> bool:
    """Whether the parameter is declared ``Json[...]`` (parsed before validation)."""
    return _utils._is_json_field(field)


def request_keys(field: Any) -> list[str]:
    """The request keys (query name, header name...) a parameter is read from, in preference order."""
    return [key for _validation_alias, key in _utils._get_param_aliases(field)]


def annotation_is_sequence(annotation: Any) -> bool:
    return bool(_utils.field_annotation_is_sequence(annotation))  # type: ignore[attr-defined]  # not in its __all__; pinned by tests/test_fences.py


def missing_field_error(loc: tuple[int | str, ...]) -> dict[str, Any]:
    """The error FastAPI reports for a required parameter that is missing at ``loc``."""
    error: dict[str, Any] = _utils.get_missing_field_error(loc=loc)  # type: ignore[attr-defined]  # not in its __all__; pinned
    return error


def single_body_model(route: Any) -> type | None:
    """The pydantic model that is a route's whole JSON body (one body parameter, not embedded,
    not a form), or None. FastAPI validates the parsed body with the parameter's field, and a
    model instance passes that check as itself (``revalidate_instances='never'``, the default)."""
    params = route.dependant.body_params
    if len(params) != 1 or _utils._should_embed_body_fields(params):
        return None
    annotation = params[0].field_info.annotation
    if not isinstance(annotation, type) or not issubclass(annotation, BaseModel):
        return None
    if annotation.model_config.get("revalidate_instances", "never") != "never":
        return None
    return annotation
