"""Declared payload indexes: the payload fields a collection asks to be indexed, and how.

A collection may declare up to ``MAX_PAYLOAD_INDEXES`` top-level payload fields with a kind
(``keyword``, ``integer``, ``float``, ``bool``) at creation (``payload_indexes``). They are
stored with the collection's index options and never change while it exists. Each backend makes
one B-tree expression index per declaration (PostgreSQL: built in the background by
``app.vectors.builder``; SQLite: on ``json_extract``, with the table) and compiles conditions on
a declared field with the very expression its index is on, so that the database can use it.

Declared field names are restricted (``FIELD_PATTERN``) so that they can be written into SQL
as literals (an expression index only serves a query that spells the same expression).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

PayloadKind = Literal["keyword", "integer", "float", "bool"]
PAYLOAD_KINDS: tuple[PayloadKind, ...] = ("keyword", "integer", "float", "bool")
FIELD_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
MAX_PAYLOAD_INDEXES = 16
# A declared field's value is a B-tree key: PostgreSQL refuses one past about 2,700 bytes
# ("index row requires 10016 bytes, maximum size is 8191" was a 500, and a point stored before
# the index was built failed every build after). The same bound on both backends.
MAX_DECLARED_VALUE_BYTES = 1024
_FIELD = re.compile(FIELD_PATTERN)


@dataclass(frozen=True)
class PayloadIndex:
    """One declared payload index: its position in the declaration names its SQL index."""

    position: int
    field: str
    kind: PayloadKind

    def as_option(self) -> dict[str, str]:
        return {"field": self.field, "kind": self.kind}


def field_problem(field: str) -> str | None:
    """Why ``field`` cannot be declared, or None."""
    if not _FIELD.match(field):
        return "payload index fields are 1-64 characters: a letter or _, then letters, digits, _ or -"
    return None


def from_options(options: Mapping[str, Any]) -> tuple[PayloadIndex, ...]:
    """The declarations stored in a collection's index options (none for older collections)."""
    return tuple(
        PayloadIndex(i, str(d["field"]), d["kind"]) for i, d in enumerate(options.get("payload_indexes") or [])
    )


def declared_kinds(indexes: Iterable[PayloadIndex]) -> dict[str, PayloadKind]:
    return {p.field: p.kind for p in indexes}


def serves_value(kind: PayloadKind, value: Any) -> bool:
    """Whether an index of ``kind`` holds values like ``value`` (for equality and ranges)."""
    if kind == "keyword":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def declared_value_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a declared field's value, or None: a string, number, bool or null
    of at most ``MAX_DECLARED_VALUE_BYTES`` bytes as JSON (an array or object would be indexed
    as one jsonb key, several times its JSON's size)."""
    if value is None or isinstance(value, (bool, int, float)):
        size = len(json.dumps(value))
    elif isinstance(value, str):
        size = len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    else:
        return "is a declared payload index field: must be a string, number, bool or null"
    if size > MAX_DECLARED_VALUE_BYTES:
        return f"is a declared payload index field: must be at most {MAX_DECLARED_VALUE_BYTES} bytes of JSON"
    return None


def sql_index_name(data_table: str, index: PayloadIndex) -> str:
    return f"{data_table}_p{int(index.position)}"


def create_index_sql(data_table: str, index: PayloadIndex, expr: str, *, concurrently: bool = False) -> str:
    """``CREATE INDEX`` of a declared payload index: a B-tree on ``expr``, the backend's expression."""
    how = " CONCURRENTLY" if concurrently else ""
    return f"CREATE INDEX{how} IF NOT EXISTS {sql_index_name(data_table, index)} ON {data_table} ({expr})"
