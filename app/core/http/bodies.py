"""JSON request bodies: parsed and validated in one place, in turns of the event loop of their own.

Every ``Body.JSON`` route's body goes through ``parse_and_validate``: a route with a body model
(``body: Model``, served by FastAPI's handler) through ``model_body_handler``, which hands FastAPI
the validated model (FastAPI's own check of a model instance is an ``isinstance``), and a planned
route through the ``json_body(Model)`` dependency. FastAPI reads a body model itself, and a route
with one is served by FastAPI's own handler, whose per-request dependency solving was about a
fifth of a vector search's gateway CPU (``docs/benchmarks.md``); ``json_body`` is the planned
equivalent. Both answer as FastAPI does: the body is parsed as JSON when the content type says
JSON (a strict content type: a missing or other one leaves the bytes, which a model refuses),
validated with the model as FastAPI validates a body field (``validate_python``, so a value is
valid exactly when it was), and a 422 (``RequestValidationError``) carries pydantic's errors,
``loc`` starting with ``body``.

Parsing is pydantic-core's (``from_json``), not ``json.loads``: about 5x faster on a body of
numbers (a 9.4 MiB batch of 1,000 x 1,000 floats: 45-60 against 230-290 ms), with the same values
(integers of any size up to 4,300 digits, floats rounded alike, the last of duplicate keys, U+0000
kept). It refuses what the gateway refuses anyway (NaN/Infinity, lone surrogates, bytes that are
not UTF-8), and its own limits are answered as such: JSON nested deeper than ``MAX_JSON_DEPTH``
levels, a number of more than ``MAX_NUMBER_DIGITS`` digits (422 naming the limit, where the
stdlib's RecursionError and ValueError were a bare 400).

The event loop runs one request's parse or validation at a time, each one C call that nothing
interrupts, so a large body's parse and its validation each get a turn of their own: the loop
serves the other requests that arrived meanwhile before each (a stall is the longer of the two,
not their sum; ``tests/test_request_bounds.py`` measures it). A worker thread would not help:
both calls hold the GIL throughout, and each of the several times a waiting request needs the
GIL it waits for the call in progress (measured: a longer stall than on the loop itself).
``model_validate_json`` (one call) is about 20% faster but validates in JSON mode, which is
not the same (a 400-digit integer is a valid strict float there: infinity; NaN is a float).

The model's schema goes into the OpenAPI document as FastAPI would put it there
(``request_body``, ``build_openapi``).
"""
from __future__ import annotations

import asyncio
import email.message
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import from_json
from starlette.requests import Request
from starlette.responses import Response

from app.core.errors import InvalidInput
from app.core.fences.starlette_ import set_parsed_json
from app.core.jsonvalue import check_json_text

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[Request], Coroutine[Any, Any, Response]]

MAX_JSON_DEPTH = 200
"""Deepest nesting of objects and arrays in a JSON request body (pydantic-core's parser; the
stdlib's stopped at about 1,000 with a RecursionError, answered as a bare 400)."""
MAX_NUMBER_DIGITS = 4300
"""Most digits of a number in a JSON request body (Python's limit on converting an integer)."""
YIELD_BYTES = 64 * 1024
"""From this size up (about 1 ms of parsing), a body's parse and its validation are turns of the
event loop of their own, with other requests served before each."""
YIELD_SECONDS = 0.001
"""How long a large body waits before its parse and before its validation: a timer rather than
``sleep(0)``, whose single turn resumes this task before the requests that arrived meanwhile."""
NAMED_BYTES = 1024 * 1024
"""A body the parser refused as not UTF-8, NaN/Infinity or a lone surrogate is parsed again by
``check_json_text`` to name where (a field path) when it is at most this big (about 30 ms);
a larger one is answered with the parser's line and column."""

_DEPTH = "recursion limit exceeded"
_DIGITS = "number out of range"
_WHERE = re.compile(r" at line \d+ column \d+$")

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


def parse_json(raw: bytes) -> Any:
    """``raw`` parsed as JSON, or a 422 saying why not (``InvalidInput`` for a limit or a value
    the gateway refuses, else a ``RequestValidationError`` of type ``json_invalid``)."""
    try:
        return from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        message = str(exc)
    if message.startswith(_DEPTH):
        raise InvalidInput("body", f"must be JSON nested at most {MAX_JSON_DEPTH} levels deep "
                                   f"({message.replace(_DEPTH, 'nested deeper', 1)})")
    if message.startswith(_DIGITS):
        raise InvalidInput("body", f"must not hold a number of more than {MAX_NUMBER_DIGITS} digits "
                                   f"({message.replace(_DIGITS, 'a longer one', 1)})")
    if len(raw) <= NAMED_BYTES:
        check_json_text(raw)  # 422 naming the field of a lone surrogate or NaN/Infinity
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidInput("body", f"must be JSON encoded as UTF-8 (byte {e.start} is not)") from None
    where = _WHERE.search(message)
    raise RequestValidationError(
        [{"type": "json_invalid", "loc": ("body",), "msg": f"JSON decode error: {message}", "input": {},
          "ctx": {"error": message[: where.start()] if where else message}}],
    )


def validate(adapter: TypeAdapter[Any], value: Any) -> Any:
    """``value`` validated as a body field is, or a 422 whose errors' ``loc`` start with ``body``."""
    try:
        return adapter.validate_python(value, from_attributes=True)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None


async def parse_and_validate(adapter: TypeAdapter[Any], raw: bytes) -> Any:
    """A JSON body parsed, then validated. From ``YIELD_BYTES`` up, the event loop serves what
    arrived meanwhile before each of the two (each is one C call that nothing interrupts, and
    the gate's scans of the body come just before)."""
    large = len(raw) >= YIELD_BYTES
    if large:
        await asyncio.sleep(YIELD_SECONDS)
    value = parse_json(raw)
    if large:
        await asyncio.sleep(YIELD_SECONDS)
    return validate(adapter, value)


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency returning the request's body as ``model``, validated as FastAPI does."""
    adapter: TypeAdapter[M] = TypeAdapter(model)
    body_models[model.__name__] = model

    async def read(request: Request) -> M:
        raw = await request.body()
        if not raw:
            raise RequestValidationError(
                [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
            )
        if not _is_json(request.headers.get("content-type")):
            return validate(adapter, raw)  # type: ignore[no-any-return]  # bytes: a model refuses them
        return await parse_and_validate(adapter, raw)  # type: ignore[no-any-return]

    read.__name__ = f"{model.__name__}_body"
    return read


def model_body_handler(model: type[BaseModel], handler: Handler) -> Handler:
    """FastAPI's ``handler`` of a route whose body is ``model``, given the body parsed and
    validated here (FastAPI would parse it with ``json.loads`` and validate it on the event loop).
    An empty or non-JSON body is left to FastAPI, which answers it as before (a 422)."""
    adapter: TypeAdapter[BaseModel] = TypeAdapter(model)

    async def parsed(request: Request) -> Response:
        raw = await request.body()
        if raw and _is_json(request.headers.get("content-type")):
            set_parsed_json(request, await parse_and_validate(adapter, raw))
        return await handler(request)

    parsed.__qualname__ = getattr(handler, "__qualname__", "handler")
    return parsed


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route whose body ``json_body(model)`` reads: a required JSON
    body of the model's component schema, as FastAPI documents a body model."""
    return {"requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
    }}
