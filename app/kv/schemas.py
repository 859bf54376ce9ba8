"""HTTP shapes of the kv capability. Values are any JSON; they travel as raw JSON text."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

VALUE_EXAMPLE = {"theme": "dark", "font_size": 14}


class KvEntryRead(BaseModel):
    """One entry in a list answer."""

    key: str = Field(examples=["theme"])
    value: Any = Field(default=None, description="The JSON value exactly as stored (absent with `keys_only`).", examples=[VALUE_EXAMPLE])
    etag: str = Field(description="Strong ETag of this version (use in `If-Match`).", examples=['"4503599627370497"'])


class KvPage(BaseModel):
    """A page of entries sorted by key (UTF-8 byte order)."""

    items: list[KvEntryRead]
    next_cursor: str | None = Field(
        default=None,
        description="Pass as `cursor` for the next page (a page may hold fewer than `limit` entries and still have one: "
        "it also ends at `limits.max_page_bytes` of values).",
    )


# The PUT body is the value itself (any JSON), documented here because the route reads it raw.
VALUE_REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "The value: any JSON document (object, array, string, number, boolean, null).",
        "content": {"application/json": {"schema": {}, "example": VALUE_EXAMPLE}},
    }
}

VALUE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The stored value, byte for byte as stored; `ETag` names its version.",
        "content": {"application/json": {"schema": {}, "example": VALUE_EXAMPLE}},
        "headers": {"ETag": {"schema": {"type": "string"}, "description": "Strong ETag of this version."}},
    }
}
