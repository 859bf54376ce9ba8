"""Vectors in and out: checked float32 arrays from JSON numbers or base64, and fast JSON answers.

Every vector is converted to float32 once (values beyond float32's range become infinite and are
refused with the rest of the non-finite values), so both backends store and compare the same
numbers.
"""

from __future__ import annotations

import base64
import binascii
import math
import sys
from array import array
from typing import Any

import orjson
from fastapi import Response

from app.core.errors import InvalidInput

_LITTLE = sys.byteorder == "little"


# Both backends compute distances in float32 (sqlite-vec; pgvector's accumulators): the squared
# distance of two vectors of norm at most MAX_NORM is at most (2 MAX_NORM)^2 = 4e36, far under
# float32's largest number (3.4e38, with room for rounding), and a cosine needs a squared norm
# float32 does not flush to zero. Past either, a distance came back NULL or NaN: a 500 for the
# search, or a point ranked first with no score in every search of its collection.
MAX_NORM = 1e18
MIN_COSINE_NORM = math.sqrt(1.1754943508222875e-38)  # the square root of float32's smallest normal, 1.1e-19


def _checked(vec: array[float], dim: int, where: str, nonzero: bool) -> array[float]:
    if len(vec) != dim:
        raise InvalidInput(where, f"has {len(vec)} dimensions; the collection's vectors have {dim}")
    size = math.hypot(*vec)  # NaN or infinity with any NaN or infinite number
    if not size <= MAX_NORM:
        if not math.isfinite(sum(vec)):
            raise InvalidInput(where, "must hold finite float32 numbers (no NaN or infinity)")
        raise InvalidInput(where, f"must have a norm of at most {MAX_NORM:g} (float32 distances overflow past it)")
    if nonzero and not size >= MIN_COSINE_NORM:
        raise InvalidInput(
            where, f"must not be the zero vector, nor have a norm under {MIN_COSINE_NORM:.3g} (cosine distance is undefined for it)"
        )
    return vec


def from_numbers(values: list[float], dim: int, where: str, *, nonzero: bool = False) -> array[float]:
    try:
        vec = array("f", values)
    except OverflowError:
        raise InvalidInput(where, "must hold finite float32 numbers (no NaN or infinity)") from None
    return _checked(vec, dim, where, nonzero)


def _decode_b64(data: str, where: str) -> array[float]:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(where, "is not valid base64") from None
    if len(raw) % 4:
        raise InvalidInput(where, "must decode to a whole number of float32 values")
    vec = array("f")
    vec.frombytes(raw)
    if not _LITTLE:  # pragma: no cover
        vec.byteswap()
    return vec


def from_b64(data: str, dim: int, where: str, *, nonzero: bool = False) -> array[float]:
    return _checked(_decode_b64(data, where), dim, where, nonzero)


def to_b64(vec: array[float]) -> str:
    if not _LITTLE:  # pragma: no cover
        vec = array("f", vec)
        vec.byteswap()
    return base64.b64encode(vec.tobytes()).decode("ascii")


def norm(vec: array[float]) -> float:
    return math.hypot(*vec)


def raw_json(text: str) -> orjson.Fragment:
    """Stored payload JSON, embedded in an answer without parsing it again."""
    return orjson.Fragment(text)


def json_response(content: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")
