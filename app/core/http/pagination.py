"""Opaque cursors: what a list answer hands back as ``next_cursor`` and takes again as ``cursor``.

A cursor is base64url of compact JSON ``{"v": 1, ...position}``. Decoding validates the
position against a schema (strict types: a bool is not an int, a float is not a string), so a
cursor that this gateway did not issue is a 422 with code ``invalid_cursor`` however it was
made, never a query with a value of the wrong type.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from functools import lru_cache
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, create_model

from app.core.errors import InvalidInput

T = TypeVar("T")

_VERSION = 1
MAX_CURSOR_CHARS = 8192  # what we issue is far shorter: a key of at most 1024 bytes, base64'd
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _position_text(value: str) -> str:
    # What a position holds is a key, id or name: valid Unicode without control characters.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("holds a lone surrogate") from None
    if _CONTROL.search(value):
        raise ValueError("holds a control character")
    return value


CursorText = Annotated[StrictStr, Field(max_length=4096), AfterValidator(_position_text)]
"""A key, id or name in a cursor position (the type of every position field not given one)."""


def invalid_cursor(message: str = "is not a cursor returned by this list") -> InvalidInput:
    return InvalidInput("cursor", message, code="invalid_cursor")


def encode_cursor(position: dict[str, Any]) -> str:
    raw = json.dumps({"v": _VERSION, **position}, separators=(",", ":"), ensure_ascii=False)
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii").rstrip("=")


@lru_cache(maxsize=64)
def _schema(fields: tuple[tuple[str, Any], ...]) -> type[BaseModel]:
    definitions: dict[str, Any] = {name: (kind, ...) for name, kind in fields}
    return create_model(
        "CursorPosition", __config__=ConfigDict(strict=True, extra="ignore"), v=(StrictInt, ...), **definitions
    )


def decode_cursor(cursor: str, *required: str, **typed: Any) -> dict[str, Any]:
    """The position in ``cursor``, validated: each name in ``required`` must hold ``CursorText``
    and each in ``typed`` the type given there; anything else is a 422 ``invalid_cursor``."""
    if len(cursor) > MAX_CURSOR_CHARS:
        raise invalid_cursor()
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8"))
    except (ValueError, UnicodeError, binascii.Error, RecursionError):
        raise invalid_cursor() from None
    if not isinstance(data, dict) or data.get("v") != _VERSION or type(data.get("v")) is not int:
        raise invalid_cursor()
    fields = tuple((name, CursorText) for name in required) + tuple(typed.items())
    try:
        position = _schema(fields).model_validate(data)
    except ValidationError:
        raise invalid_cursor() from None
    return {name: getattr(position, name) for name, _ in fields}


class Page(BaseModel, Generic[T]):
    """A page of a list: the items, and the cursor for the next page (null on the last)."""

    items: list[T]
    next_cursor: str | None = Field(default=None, description="Pass as `cursor` for the next page.")
