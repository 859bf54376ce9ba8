"""Fast paths: one opt-in decorator, ``@fast(...)``, for the routes measured to need them.

A route is plain unless its endpoint says otherwise: FastAPI solves its dependencies, and its
``MetadataConnection`` (or ``VectorsConnection``, ``CheckpointsConnection``) is a SQLAlchemy
connection in the request's transaction. ``@fast(...)`` states what the route promises, and
each promise buys one piece (``fast_paths`` in the settings turns each off):

- every ``@fast`` route is served from a plan of its dependencies built once (``plans``); it
  must return a ``Response`` and take only what a plan supports, or start-up fails saying so;
- ``one_statement=True`` (``"postgresql"``: only there) promises at most one statement per
  request, run through fixed statements (``fixed_statements``): its connection is then a
  pooled driver connection in autocommit (``one_statement``), on SQLite run on the event loop's
  thread when it can (``inline_sqlite``).

The rule: with every piece off, the same route answers the same (``tests/test_fast_paths.py``);
each piece keeps a benchmark against the plain path (``bench/bench_fast_paths.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
OneStatement = bool | Literal["postgresql"]
_ATTRIBUTE = "__gateway_fast__"


@dataclass(frozen=True)
class Promise:
    """What a ``@fast`` route promises."""

    one_statement: OneStatement = False

    def one_statement_on(self, dialect: str) -> bool:
        """Whether every request runs at most one statement on ``dialect`` (``sqlite``, ``postgresql``)."""
        return self.one_statement is True or self.one_statement == dialect


def fast(*, one_statement: OneStatement = False) -> Callable[[F], F]:
    """Serve the decorated endpoint's route on the fast paths its promises allow (see the module)."""
    if one_statement not in (True, False, "postgresql"):
        raise ValueError("one_statement is True, False or 'postgresql'")
    promise = Promise(one_statement)

    def mark(endpoint: F) -> F:
        setattr(endpoint, _ATTRIBUTE, promise)
        return endpoint

    return mark


def promise_of(endpoint: Callable[..., Any] | None) -> Promise | None:
    """What ``endpoint`` promised with ``@fast``, or None for a plain route."""
    return getattr(endpoint, _ATTRIBUTE, None)
