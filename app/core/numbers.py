"""Numeric types of the HTTP API: a boolean is not an integer, and NaN/Infinity are not numbers.

Request schemas use these for every numeric field (pydantic's lax mode would take ``false`` as
``0``, ``"0"`` and ``1.0`` as integers, and ``NaN`` as a float). Query parameters arrive as text
and are parsed from it, but only from the plain decimal spelling of an integer.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, Strict, StrictBool

__all__ = ["MAX_LIST_ITEMS", "FiniteFloat", "QueryInt", "StrictBool", "StrictInt", "at_most_items"]

MAX_LIST_ITEMS = 100_000
"""The hard ceiling on every list of a request body (``Field(max_length=MAX_LIST_ITEMS)``):
validation stops at the first element past it instead of collecting an error per element (a
million invalid items took 13 s of the event loop and 1.7 GB); the settings' own, lower limits
(``limits.max_batch_items``) are checked by the services. Each such container is also
``fail_fast`` (validation stops at its first invalid item, not one error per item: 100,000 invalid
pending writes were 400,000 errors and 4.4 s of the event loop), enforced for every request body
by ``tests/test_request_bounds.py``."""


def at_most_items(limit: int) -> BeforeValidator:
    """A dict of at most ``limit`` items, checked before its items are: pydantic checks a dict's
    ``max_length`` only after validating every item (one error each), where a list's stops at once."""

    def check(value: Any) -> Any:
        if isinstance(value, dict) and len(value) > limit:
            raise ValueError(f"should have at most {limit} items, not {len(value)}")
        return value

    return BeforeValidator(check)


def _json_integer(value: Any) -> Any:
    # JSON has one number type: ``1.0`` is the integer 1 (as JSON Schema's "integer" says, and so
    # the OpenAPI document); ``1.5``, ``true`` and ``"1"`` are not integers.
    if type(value) is float and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


StrictInt = Annotated[int, BeforeValidator(_json_integer), Strict()]
"""A JSON integer: a number with no fraction (``1`` or ``1.0``), never a bool or a string."""

FiniteFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]
"""A JSON number (an integer is taken as a float; a bool is not), finite."""

_INTEGER = re.compile(r"-?[0-9]{1,19}")


def _integer_text(value: Any) -> Any:
    if isinstance(value, str):
        if not _INTEGER.fullmatch(value):
            raise ValueError("must be an integer written in decimal digits")
        return int(value)
    return value


QueryInt = Annotated[int, BeforeValidator(_integer_text), Strict()]
PageSize = Annotated[int, Strict(), Field(ge=1), BeforeValidator(_integer_text)]
"""A page size in a query: a ``QueryInt`` of at least 1 (constraint first, so the schema says so)."""
"""An integer query parameter: ``-?[0-9]+`` only (``1.0``, `` 1``, ``1_0``, ``+1`` are refused)."""
