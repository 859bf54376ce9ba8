"""Client-side models mirroring the gateway's schemas for records, kv and vector collections."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field


class SortOrder(str, Enum):
    """Record order by key (the seed's ``SortOrder``)."""

    ASCENDING = "asc"
    DESCENDING = "desc"


class KvEntry(BaseModel):
    """A kv entry: its key, JSON value and ETag (pass the ETag as ``if_match`` to compare-and-swap)."""

    key: str
    value: Any = None
    etag: str


class Record(BaseModel):
    """A record: its key and JSON value."""

    key: str
    value: Any = None


class PayloadIndex(BaseModel):
    """A payload field a vector collection indexes for filtered search (``payload_indexes``)."""

    field: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
    kind: Literal["keyword", "integer", "float", "bool"]


class TrimResult(BaseModel):
    deleted: int = Field(ge=0)


_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


_ascii_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def dump_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; NaN and Infinity raise ``ValueError`` here rather than at the gateway.
    A string that is not valid Unicode (a lone surrogate) is sent escaped, for the gateway to
    refuse with a 422 naming it."""
    try:
        return _encoder.encode(value).encode("utf-8")
    except UnicodeEncodeError:
        return _ascii_encoder.encode(value).encode("ascii")
