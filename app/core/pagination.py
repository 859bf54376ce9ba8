"""Opaque cursors: what a list answer hands back as ``next_cursor`` and takes again as ``cursor``."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field

from app.core.errors import InvalidInput

T = TypeVar("T")

_VERSION = 1


def encode_cursor(position: dict[str, Any]) -> str:
    raw = json.dumps({"v": _VERSION, **position}, separators=(",", ":"), ensure_ascii=False)
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, *required: str) -> dict[str, Any]:
    """The position in ``cursor``, or a 422 naming ``cursor`` when it is not one of ours."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8"))
    except (ValueError, UnicodeError, binascii.Error):
        raise InvalidInput("cursor", "is not a cursor returned by this list") from None
    if not isinstance(data, dict) or data.get("v") != _VERSION or any(k not in data for k in required):
        raise InvalidInput("cursor", "is not a cursor returned by this list")
    return data


class Page(BaseModel, Generic[T]):
    """A page of a list: the items, and the cursor for the next page (null on the last)."""

    items: list[T]
    next_cursor: str | None = Field(default=None, description="Pass as `cursor` for the next page.")
