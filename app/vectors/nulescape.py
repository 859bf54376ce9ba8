"""U+0000 in PostgreSQL: JSONB and text cannot hold it, so pgvector payloads use an escape.

The escape is reversible and keeps code point order (so ``$gt`` on strings still compares as
the API says): U+0001 becomes U+0001 U+0002 and U+0000 becomes U+0001 U+0001, in every string
of a stored payload (keys too), in every filter operand compared with one, and in full-text
input. Payloads are escaped and unescaped on their JSON text, where a NUL is always written
``\\u0000`` (and U+0001 ``\\u0001``, by Python's encoder and PostgreSQL's alike); text without
either escape (nearly all of it) is passed after one substring test.
"""

from __future__ import annotations

import re

_TO_STORED = re.compile(r"\\\\|\\u000[01]")
_FROM_STORED = re.compile(r"\\\\|\\u0001\\u000[12]")
_STORED = {"\\u0000": "\\u0001\\u0001", "\\u0001": "\\u0001\\u0002"}
_SENT = {"\\u0001\\u0001": "\\u0000", "\\u0001\\u0002": "\\u0001"}
_FROM_STORED_TEXT = re.compile("\x01[\x01\x02]")


def escape_text(value: str) -> str:
    """A string as PostgreSQL stores it (a filter operand, a full-text input)."""
    if "\x00" not in value and "\x01" not in value:
        return value
    return value.replace("\x01", "\x01\x02").replace("\x00", "\x01\x01")


def unescape_text(value: str) -> str:
    """A string PostgreSQL stores (a value in its statistics) as it was sent."""
    if "\x01" not in value:
        return value
    return _FROM_STORED_TEXT.sub(lambda m: "\x00" if m.group() == "\x01\x01" else "\x01", value)


def escape_json(text: str) -> str:
    """Compact JSON text as PostgreSQL stores it: each string escaped as ``escape_text`` does."""
    if "\\u000" not in text:
        return text
    return _TO_STORED.sub(lambda m: _STORED.get(m.group(), m.group()), text)


def unescape_json(text: str) -> str:
    """The JSON text of a stored payload as it was sent (the inverse of ``escape_json``)."""
    if "\\u0001" not in text:
        return text
    return _FROM_STORED.sub(lambda m: _SENT.get(m.group(), m.group()), text)
