"""``INSERT ... ON CONFLICT``: the one SQL construct whose builder differs between backends.

SQLite and PostgreSQL both accept ``ON CONFLICT (...) DO NOTHING / DO UPDATE ... WHERE`` and
``RETURNING``, but SQLAlchemy builds them from each dialect's own ``insert``. A capability picks
the builder once, at start-up, from ``Databases.dialect(db)``, and never looks at the dialect again.
"""

from __future__ import annotations

from typing import Any, Protocol, Self

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite


class UpsertInsert(Protocol):
    """What both dialects' ``Insert`` offer (the subset the capabilities use)."""

    excluded: Any

    def values(self, *args: Any, **kwargs: Any) -> Self: ...

    def from_select(self, names: Any, select: Any, include_defaults: bool = ...) -> Self: ...

    def on_conflict_do_nothing(self, index_elements: Any = ...) -> Any: ...

    def on_conflict_do_update(self, index_elements: Any = ..., set_: Any = ..., where: Any = ...) -> Any: ...


class InsertBuilder(Protocol):
    def __call__(self, table: Table) -> UpsertInsert: ...


_BUILDERS: dict[str, InsertBuilder] = {
    "sqlite": sqlite.insert,  # type: ignore[dict-item]
    "postgresql": postgresql.insert,  # type: ignore[dict-item]
}


def insert_builder(dialect: str) -> InsertBuilder:
    """The ``insert`` that supports ``ON CONFLICT`` on ``dialect`` (``sqlite`` or ``postgresql``)."""
    try:
        return _BUILDERS[dialect]
    except KeyError:
        raise ValueError(f"no upsert support for the {dialect!r} dialect") from None
