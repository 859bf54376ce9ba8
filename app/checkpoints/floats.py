"""Numbers no 64-bit float holds, refused where checkpoints keep numbers as floats.

Checkpoint metadata, channel versions and filters are stored as floats (kv and records keep every
number as written instead). ``1e400`` parsed as infinity was written back as ``null``, and
``1e-400`` as ``0.0`` (issue 44): such a number is a 422 naming its place, as vector payloads are.
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.core.errors import InvalidInput


class _Unholdable:
    """A number literal no float holds, where the range check's parser found one."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _float_or_unholdable(literal: str) -> Any:
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        return _Unholdable(literal)
    if value == 0.0 and any(c in "123456789" for c in literal.lower().partition("e")[0]):
        return _Unholdable(literal)  # not zero, but nearer zero than the smallest float (5e-324)
    return value


_range_decoder = json.JSONDecoder(parse_float=_float_or_unholdable, parse_constant=lambda _name: None)  # NaN and Infinity: check_json_text's
# Where a body may hold a number no float holds: an exponent of three digits or more ending a
# number (a JSON number is followed by a delimiter, base64 and other text never are), or 200
# digits and dots in a row (10**210 or 1e-225 written out). Anything else is a float's range.
_RANGE_LOOK = re.compile(rb"[0-9][eE][-+]?[0-9]{3,}(?=[\s,\]}]|\Z)|[0-9.]{200}")
UNHOLDABLE = "must be a number a 64-bit float holds (at most 1.8e308 in size and, unless 0, at least 5e-324)"


def check_float_range(body: bytes) -> None:
    """422 naming the place of a number in a JSON request body that no float holds: ``1e400``
    (the parser's infinity, written back as ``null``) or ``1e-400`` (its ``0.0``), for values kept
    as floats (checkpoint metadata, channel versions and filters; kv and records keep every
    number as written instead). A regular expression finds a body that may hold one (a base64
    string never matches); only such a body is parsed again, with the stdlib parser."""
    if _RANGE_LOOK.search(body) is None:
        return
    try:
        value = _range_decoder.decode(body.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):
        return  # the route's parser answers malformed JSON
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, here = stack.pop()
        if isinstance(item, _Unholdable):
            raise InvalidInput(here or "body", f"{UNHOLDABLE}: {item.literal[:40]} is not")
        if isinstance(item, dict):
            stack.extend((child, f"{here}.{key}" if here else str(key)) for key, child in item.items())
        elif isinstance(item, list):
            stack.extend((child, f"{here}.{i}" if here else str(i)) for i, child in enumerate(item))
