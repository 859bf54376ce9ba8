"""HTTP shapes of the kv capability. Values are any JSON; they travel as raw JSON text."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.names import DocumentedKey
from app.core.numbers import MAX_LIST_ITEMS, FiniteFloat

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


# --- batches: many keys of one collection in one request ---------------------------------------


class KvKeys(BaseModel):
    """Keys of one collection (at most `limits.max_batch_items`; a key named twice counts once)."""

    model_config = ConfigDict(extra="forbid")

    keys: list[DocumentedKey] = Field(  # a hard ceiling; limits.max_batch_items is checked by the service
        min_length=1, max_length=MAX_LIST_ITEMS, fail_fast=True, examples=[["theme", "font_size"]]
    )


class KvItemWrite(BaseModel):
    """One entry of a batch write."""

    model_config = ConfigDict(extra="forbid")

    key: DocumentedKey = Field(examples=["theme"])
    value: Any = Field(description="Any JSON value (null included).", examples=["dark"])

    @model_validator(mode="before")
    @classmethod
    def _value_required(cls, data: Any) -> Any:
        # `value: null` is a value; a missing `value` is an error.
        if isinstance(data, dict) and "value" not in data:
            raise ValueError("each item needs a `value` (use null for none)")
        return data


class KvBatchWrite(BaseModel):
    """Entries to set together: all of them or (on any error) none. Each key at most once."""

    model_config = ConfigDict(extra="forbid")

    items: list[KvItemWrite] = Field(
        min_length=1, max_length=MAX_LIST_ITEMS, fail_fast=True, examples=[[{"key": "theme", "value": "dark"}]]
    )
    ttl_seconds: FiniteFloat | None = Field(
        default=None, gt=0, description="Expire every entry of the batch this many seconds from now (omit: never)."
    )


class KvEtag(BaseModel):
    key: str = Field(examples=["theme"])
    etag: str = Field(description="Strong ETag of the version written.", examples=['"4503599627370497"'])


class KvBatchWritten(BaseModel):
    """The ETag of every entry written, in request order."""

    items: list[KvEtag]


class KvBatchRead(BaseModel):
    """What a batch read found. An answer carries at most `limits.max_page_bytes` of values (and
    always the first entry in key order, whatever it weighs): the keys past that are `unread`."""

    items: list[KvEntryRead] = Field(description="The live entries found, in the order their keys were asked for.")
    missing: list[str] = Field(description="Keys without a live entry.")
    unread: list[str] = Field(
        description="Keys not read because the answer's values reached `limits.max_page_bytes`: ask for them again."
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
