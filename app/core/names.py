"""Names (CONTRACT section 2): one place that says what a namespace, collection or key may be."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from app.core.errors import InvalidInput

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
NAME_MAX_LENGTH = 128
KEY_MAX_BYTES = 1024

# C0 controls, DEL and C1 controls.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def key_problem(value: str, max_bytes: int = KEY_MAX_BYTES) -> str | None:
    """Why ``value`` is not a valid key (of at most ``max_bytes`` of UTF-8), or None."""
    if not value:
        return "must not be empty"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "must be valid UTF-8"
    if size > max_bytes:
        return f"must be at most {max_bytes} bytes of UTF-8 (got {size})"
    if _CONTROL_RE.search(value):
        return "must not contain control characters"
    return None


def validate_key(field: str, value: str) -> str:
    """A key, record key, file id or vector id, or ``InvalidInput`` naming ``field``."""
    problem = key_problem(value)
    if problem:
        raise InvalidInput(field, problem)
    return value


# What ``key_problem`` allows, as the OpenAPI document says it: no C0/C1 controls or DEL. (Lone
# surrogates are refused too, but a surrogate range is not a portable JSON Schema regex: validators
# built on Rust's regex reject the pattern.) JSON Schema lengths count characters, not bytes, so
# ``maxLength`` is the byte limit: that many characters outside ASCII are still refused by bytes.
KEY_PATTERN = r"^[^\u0000-\u001f\u007f-\u009f]*$"


def key_json_schema(max_bytes: int = KEY_MAX_BYTES, *, allow_empty: bool = False) -> dict[str, Any]:
    """The JSON Schema keywords of a key (or identifier text of at most ``max_bytes``)."""
    return {"minLength": 0 if allow_empty else 1, "maxLength": max_bytes, "pattern": KEY_PATTERN}


@dataclass(frozen=True)
class KeyText:
    """Annotation for identifier text: checked by ``key_problem`` (and ``max_bytes`` of UTF-8),
    documented by ``key_json_schema``. ``Annotated[str, KeyText(128)]``."""

    max_bytes: int = KEY_MAX_BYTES
    allow_empty: bool = False

    def check(self, value: str) -> str:
        if value == "" and self.allow_empty:
            return value
        problem = key_problem(value, self.max_bytes)
        if problem:
            raise ValueError(problem)
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema.update(key_json_schema(self.max_bytes, allow_empty=self.allow_empty))
        return json_schema


# A key as a body field documents itself so; the service checks it (``validate_key``), naming it.
DocumentedKey = Annotated[str, Field(json_schema_extra=key_json_schema())]
