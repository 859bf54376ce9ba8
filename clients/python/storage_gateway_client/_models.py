"""Client-side models mirroring the gateway's schemas for records and kv."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

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


class TrimResult(BaseModel):
    deleted: int = Field(ge=0)


_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dump_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; NaN and Infinity raise ``ValueError`` here rather than at the gateway."""
    return _encoder.encode(value).encode("utf-8")
