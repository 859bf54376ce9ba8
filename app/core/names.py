"""Names (CONTRACT section 2): one place that says what a namespace, collection or key may be."""

from __future__ import annotations

import re

from app.core.errors import InvalidInput

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
NAME_MAX_LENGTH = 128
KEY_MAX_BYTES = 1024

_NAME_RE = re.compile(NAME_PATTERN)
# C0 controls, DEL and C1 controls.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def validate_name(field: str, value: str) -> str:
    """A namespace or collection name, or ``InvalidInput`` naming ``field``."""
    if not _NAME_RE.fullmatch(value):
        raise InvalidInput(
            field,
            "must be 1-128 characters of A-Z a-z 0-9 _ . - starting with a letter or digit",
        )
    return value


def key_problem(value: str) -> str | None:
    """Why ``value`` is not a valid key, or None."""
    if not value:
        return "must not be empty"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "must be valid UTF-8"
    if size > KEY_MAX_BYTES:
        return f"must be at most {KEY_MAX_BYTES} bytes of UTF-8 (got {size})"
    if _CONTROL_RE.search(value):
        return "must not contain control characters"
    return None


def validate_key(field: str, value: str) -> str:
    """A key, record key, file id or vector id, or ``InvalidInput`` naming ``field``."""
    problem = key_problem(value)
    if problem:
        raise InvalidInput(field, problem)
    return value
