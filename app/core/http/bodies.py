"""A JSON request body model read by a dependency, so that the route can be planned.

FastAPI reads a body model itself (``body: Model``), and a route with one is served by FastAPI's
own handler, whose per-request dependency solving was about a fifth of a vector search's gateway
CPU (``docs/benchmarks.md``). ``json_body(Model)`` is a dependency that does what FastAPI's
handler does with such a body: parse it as JSON when the content type says JSON (a strict
content type: a missing or other one leaves the bytes, which a model refuses; a body that cannot
be decoded is FastAPI's 400), validate it with
the model as FastAPI validates a body field, and answer a 422 (``RequestValidationError``) with
FastAPI's errors, ``loc`` starting with ``body``. The model's schema goes into the OpenAPI
document as FastAPI would put it there (``request_body``, ``build_openapi``).
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi.exceptions import HTTPException, RequestValidationError
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import Request

M = TypeVar("M", bound=BaseModel)
_NO_BODY = object()  # an empty body (JSON ``null`` is a body, validated as None)

body_models: dict[str, type[BaseModel]] = {}
"""Models read by ``json_body``, by name: their schemas are added to the OpenAPI components."""


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency returning the request's body as ``model``, validated as FastAPI does."""
    adapter: TypeAdapter[M] = TypeAdapter(model)
    body_models[model.__name__] = model

    async def read(request: Request) -> M:
        value: Any = _NO_BODY
        try:
            raw = await request.body()
            if raw:
                value = raw
                if _is_json(request.headers.get("content-type")):
                    value = json.loads(raw)
        except json.JSONDecodeError as e:
            raise RequestValidationError(
                [{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error", "input": {},
                  "ctx": {"error": e.msg}}],
                body=e.doc,
            ) from e
        except HTTPException:
            raise
        except Exception as e:  # e.g. bytes that are not UTF-8: FastAPI's 400
            raise HTTPException(status_code=400, detail="There was an error parsing the body") from e
        if value is _NO_BODY:
            raise RequestValidationError(
                [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
            )
        try:
            return adapter.validate_python(value, from_attributes=True)
        except ValidationError as exc:
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)], body=value
            ) from None

    read.__name__ = f"{model.__name__}_body"
    return read


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route whose body ``json_body(model)`` reads: a required JSON
    body of the model's component schema, as FastAPI documents a body model."""
    return {"requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
    }}
