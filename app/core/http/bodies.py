"""JSON request bodies: parsed and validated in one place, in turns of the event loop of their own.

Every route's body model goes through ``parse_and_validate``: a plain route's through
``model_body_handler`` (FastAPI is handed the validated model, which it accepts as itself), a
``@fast`` route's through ``json_model_reader`` (``app.core.fast.plans``). Both answer as FastAPI
does: a body is parsed as JSON when its content type says JSON (else the bytes, which a model
refuses), validated as FastAPI validates a body field (``validate_python``), and a 422 carries
pydantic's errors with ``loc`` starting at ``body``.

The rules: parsing is pydantic-core's (``from_json``), which refuses what the gateway refuses
(NaN/Infinity, lone surrogates, bytes that are not UTF-8) and answers its own limits
(``MAX_JSON_DEPTH``, ``MAX_NUMBER_DIGITS``) as 422s naming them; a large body's parse and its
validation each get a turn of the event loop of their own, so other requests are served before
each (``tests/test_request_bounds.py`` measures the stall). Why not a thread, and why not
``model_validate_json``: ``docs/benchmarks.md`` ("JSON bodies").
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


def json_model_reader(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """What reads a request's body as ``model``, validated as FastAPI validates a body model."""
    adapter: TypeAdapter[M] = TypeAdapter(model)

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
    """FastAPI's ``handler`` of a route whose body is ``model``, handed the body read by
    ``json_model_reader`` (FastAPI would parse it with ``json.loads`` and validate it again)."""
    read = json_model_reader(model)

    async def parsed(request: Request) -> Response:
        set_parsed_json(request, await read(request))
        return await handler(request)

    parsed.__qualname__ = getattr(handler, "__qualname__", "handler")
    return parsed
