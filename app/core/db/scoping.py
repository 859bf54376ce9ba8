"""Namespace scoping: every statement on a namespaced table starts from ``in_scope``.

Isolation (CONTRACT section 4) holds because no query names a namespaced table without this
condition; ``tests/test_isolation`` checks the SQL the gateway actually sends.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, FromClause, and_

# A value, or a bound parameter (``bindparam("ns")``) for statements built once and run many times.
Scope = str | ColumnElement[Any]


def in_scope(table: FromClause, namespace: Scope, collection: Scope | None = None) -> ColumnElement[bool]:
    """``namespace = :ns [AND collection = :c]`` for ``table`` (a table or an alias of one)."""
    condition = table.c.namespace == namespace
    if collection is not None:
        condition = and_(condition, table.c.collection == collection)
    return condition
