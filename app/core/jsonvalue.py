"""JSON values stored as compact text: parsed once on the way in, returned verbatim on the way out.

The stdlib parser is used on purpose: it keeps integers of any size exactly (orjson refuses those
over 64 bits). ``NaN``/``Infinity`` and floats that overflow are not JSON and are refused with a
422 naming the field; a value over ``limits.max_value_bytes`` is a 413.
"""

from __future__ import annotations

import json
from typing import Any

from app.core.errors import InvalidInput, PayloadTooLarge


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_decoder = json.JSONDecoder(parse_constant=_refuse_constant)
_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _too_large(field: str, message: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"{field}: {message}", errors=[{"loc": field.split("."), "msg": message}])


def encode_value(field: str, value: Any, max_bytes: int) -> str:
    """Compact JSON text of an already parsed value, or 422/413 naming ``field``."""
    try:
        text = _encoder.encode(value)
    except (ValueError, TypeError, RecursionError):
        raise InvalidInput(field, "must be JSON without NaN or Infinity (a float overflowed?)") from None
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise _too_large(field, f"{size} bytes of JSON exceed the limit of {max_bytes} bytes")
    return text


def parse_value(field: str, raw: bytes, max_bytes: int) -> str:
    """Compact JSON text of a raw request body, or 422/413 naming ``field``."""
    if len(raw) > max_bytes and len(raw.strip()) > max_bytes:
        raise _too_large(field, f"{len(raw)} bytes exceed the limit of {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(field, "must be UTF-8 encoded JSON") from None
    if not text.strip():
        raise InvalidInput(field, "must be a JSON value (the body is empty)")
    try:
        value, end = _decoder.raw_decode(text, len(text) - len(text.lstrip()))
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(field, f"is not valid JSON: {exc}") from None
    if text[end:].strip():
        raise InvalidInput(field, f"is not valid JSON: extra data at character {end}")
    return encode_value(field, value, max_bytes)
