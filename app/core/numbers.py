"""Numeric types of the HTTP API: a boolean is not an integer, and NaN/Infinity are not numbers.

Request schemas use these for every numeric field (pydantic's lax mode would take ``false`` as
``0``, ``"0"`` and ``1.0`` as integers, and ``NaN`` as a float). Query parameters arrive as text
and are parsed from it, but only from the plain decimal spelling of an integer.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, Strict, StrictBool, StrictInt

__all__ = ["FiniteFloat", "QueryInt", "StrictBool", "StrictInt"]

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
"""An integer query parameter: ``-?[0-9]+`` only (``1.0``, `` 1``, ``1_0``, ``+1`` are refused)."""
