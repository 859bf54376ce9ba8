"""HTTP shapes of the records capability."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.names import DocumentedKey
from app.core.numbers import MAX_LIST_ITEMS, StrictInt

VALUE_EXAMPLE = {"role": "user", "content": "hello"}


class SortOrder(StrEnum):
    asc = "asc"
    desc = "desc"


class RecordRead(BaseModel):
    """One record: its key and its JSON value exactly as stored."""

    key: str = Field(examples=["00000000001700000000"])
    value: Any = Field(examples=[VALUE_EXAMPLE])


class RecordPage(BaseModel):
    """A page of records in key order (UTF-8 byte order)."""

    items: list[RecordRead]
    next_cursor: str | None = Field(
        default=None,
        description="Pass as `cursor` for the next page (a page may hold fewer than `limit` records and still have one: "
        "it also ends at `limits.max_page_bytes` of values).",
    )


class RecordCreate(BaseModel):
    """One record of a batch."""

    model_config = ConfigDict(extra="forbid")

    key: DocumentedKey = Field(examples=["00000000001700000000"])
    value: Any = Field(examples=[VALUE_EXAMPLE])

    @model_validator(mode="before")
    @classmethod
    def _value_required(cls, data: Any) -> Any:
        # `value: null` is a value; a missing `value` is an error.
        if isinstance(data, dict) and "value" not in data:
            raise ValueError("each record needs a `value` (use null for none)")
        return data


class RecordBatchCreate(BaseModel):
    """Records to upsert together: all of them or none."""

    model_config = ConfigDict(extra="forbid")

    records: list[RecordCreate] = Field(  # a hard ceiling; limits.max_batch_items is checked by the service
        min_length=1, max_length=MAX_LIST_ITEMS, fail_fast=True, examples=[[{"key": "00000000001700000000", "value": VALUE_EXAMPLE}]]
    )


class RecordBatchResult(BaseModel):
    upserted: int = Field(examples=[1])


class TrimRequest(BaseModel):
    """`before`: delete keys strictly below it. `keep_last`: keep only the n largest keys.
    Given both, a record goes only when both say so."""

    model_config = ConfigDict(
        extra="forbid",  # and at least one of the two, as _one_needed checks:
        json_schema_extra={"anyOf": [
            {"required": ["before"], "properties": {"before": {"type": "string"}}},
            {"required": ["keep_last"], "properties": {"keep_last": {"type": "integer"}}},
        ]},
    )

    before: DocumentedKey | None = Field(
        default=None, min_length=1, examples=["00000000001700000000"],
        description="A key: records whose keys sort strictly below it go.",
    )
    keep_last: StrictInt | None = Field(default=None, ge=0, examples=[100])

    @model_validator(mode="after")
    def _one_needed(self) -> TrimRequest:
        if self.before is None and self.keep_last is None:
            raise ValueError("give `before`, `keep_last` or both")
        return self


class TrimResult(BaseModel):
    deleted: int = Field(examples=[42])


VALUE_REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "The record's value: any JSON document.",
        "content": {"application/json": {"schema": {}, "example": VALUE_EXAMPLE}},
    }
}
