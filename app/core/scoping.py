"""Namespace scoping: every statement on a namespaced table starts from ``in_scope``.

Isolation (CONTRACT section 4) holds because no query names a namespaced table without this
condition; ``tests/test_isolation`` checks the SQL the gateway actually sends.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Table, and_


def in_scope(table: Table, namespace: str, collection: str | None = None) -> ColumnElement[bool]:
    """``namespace = :ns [AND collection = :c]`` for ``table``."""
    condition = table.c.namespace == namespace
    if collection is not None:
        condition = and_(condition, table.c.collection == collection)
    return condition
