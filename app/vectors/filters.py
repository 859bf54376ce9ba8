"""The payload filter language (CONTRACT section 4), parsed once into a small tree.

Filters are AND-ed JSON-typed conditions on top-level payload keys::

    {"user_id": "u1", "n": {"$gte": 3}, "$or": [{"kind": "a"}, {"ok": true}]}

Operators: ``$eq $ne $in $nin $gt $gte $lt $lte $exists`` and ``$and``/``$or``. Values are JSON
scalars; equality is typed (``true`` never equals ``1``; ``1`` equals ``1.0``); ``$gt``-style
comparisons take a number or a string (strings compare in code point order) and only match
values of the same kind. ``$ne``/``$nin`` also match points without the key; ``{"k": null}``
matches a key present with the value null. Each backend compiles the tree to SQL with every
value and key bound as a parameter: ``FilterSql`` walks the tree, a backend writes its leaves.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from app.core.errors import InvalidInput
from app.core.jsonvalue import is_wide
from app.vectors.payload_index import PayloadKind

Scalar = str | int | float | bool | None
CompareOp = Literal["gt", "gte", "lt", "lte"]


@dataclass(frozen=True)
class Eq:
    key: str
    value: Scalar


@dataclass(frozen=True)
class Compare:
    key: str
    op: CompareOp
    value: str | int | float


@dataclass(frozen=True)
class Exists:
    key: str


@dataclass(frozen=True)
class Not:
    node: Node


@dataclass(frozen=True)
class And:
    nodes: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    nodes: tuple[Node, ...]


Node = Eq | Compare | Exists | Not | And | Or

_COMPARE = {"$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}
_OPERATORS = {"$eq", "$ne", "$in", "$nin", "$exists", *_COMPARE}


class _Budget:
    def __init__(self, field: str, max_terms: int) -> None:
        self.field = field
        self.max_terms = max_terms
        self.terms = 0

    def spend(self, where: str, n: int = 1) -> None:
        self.terms += n
        if self.terms > self.max_terms:
            raise InvalidInput(where, f"a filter may hold at most {self.max_terms} conditions")


def parse_filter(
    raw: Any, *, field: str = "filters", max_depth: int = 8, max_terms: int = 128
) -> Node | None:
    """The tree of a request's ``filters`` (None or ``{}`` means everything), or a 422 naming it."""
    if raw is None:
        return None
    budget = _Budget(field, max_terms)
    node = _parse_object(raw, field, 1, max_depth, budget)
    return node


def _check_depth(where: str, depth: int, max_depth: int) -> None:
    if depth > max_depth:
        raise InvalidInput(where, f"filters may nest at most {max_depth} levels deep")


def _parse_object(raw: Any, where: str, depth: int, max_depth: int, budget: _Budget) -> Node | None:
    _check_depth(where, depth, max_depth)
    if not isinstance(raw, dict):
        raise InvalidInput(where, "must be an object of conditions")
    nodes: list[Node] = []
    for key, value in raw.items():
        here = f"{where}.{key}"
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise InvalidInput(here, "must be a non-empty list of filter objects")
            parts = [
                _parse_object(item, f"{here}.{i}", depth + 1, max_depth, budget)
                for i, item in enumerate(value)
            ]
            if key == "$and":
                nodes.append(And(tuple(p for p in parts if p is not None)))
            else:
                if any(p is None for p in parts):
                    continue  # an empty alternative matches everything
                nodes.append(Or(tuple(parts)))  # type: ignore[arg-type]
        elif key.startswith("$"):
            raise InvalidInput(here, "unknown operator; top-level keys are payload fields, $and or $or")
        else:
            _check_key(here, key)
            nodes.append(_parse_field(key, value, here, depth, max_depth, budget))
    if not nodes:
        return None
    return nodes[0] if len(nodes) == 1 else And(tuple(nodes))


def _check_key(where: str, key: str) -> None:
    if not key or len(key) > 256:
        raise InvalidInput(where, "payload field names in filters must be 1-256 characters")
    if any(c in key for c in '"\\') or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in key):
        raise InvalidInput(where, 'payload field names in filters must not contain ", \\ or control characters')


WIDE_INTEGER = "integers must fit in 64 bits"
"""Filters and payloads alike: no integer beyond 64 bits compares the same on both backends
(``app.core.jsonvalue.is_wide``)."""


def find_wide_integer(value: Any, where: str) -> str | None:
    """The place (``where.key.0``) of the first integer beyond 64 bits in a parsed JSON value."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, here = stack.pop()
        if is_wide(item):
            return here
        if isinstance(item, dict):
            stack.extend(reversed([(v, f"{here}.{k}") for k, v in item.items()]))
        elif isinstance(item, list):
            stack.extend(reversed([(v, f"{here}.{i}") for i, v in enumerate(item)]))
    return None


def _scalar(where: str, value: Any) -> Scalar:
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        if is_wide(value):
            raise InvalidInput(where, f"{WIDE_INTEGER} in filters")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(where, "must be a finite number")
        return value
    raise InvalidInput(where, "filters compare JSON scalars (string, number, boolean or null)")


def _parse_field(key: str, value: Any, where: str, depth: int, max_depth: int, budget: _Budget) -> Node:
    if not (isinstance(value, dict) and value and all(k.startswith("$") for k in value)):
        if isinstance(value, dict) and any(k.startswith("$") for k in value):
            raise InvalidInput(where, "mixes operators and plain keys")
        budget.spend(where)
        return Eq(key, _scalar(where, value))
    _check_depth(where, depth + 1, max_depth)
    nodes: list[Node] = []
    for op, operand in value.items():
        here = f"{where}.{op}"
        if op not in _OPERATORS:
            raise InvalidInput(here, f"unknown operator; use one of {', '.join(sorted(_OPERATORS))}")
        if op in ("$eq", "$ne"):
            budget.spend(here)
            eq = Eq(key, _scalar(here, operand))
            nodes.append(eq if op == "$eq" else Not(eq))
        elif op in ("$in", "$nin"):
            if not isinstance(operand, list):
                raise InvalidInput(here, "must be a list of values")
            budget.spend(here, max(1, len(operand)))
            alts = tuple(Eq(key, _scalar(f"{here}.{i}", v)) for i, v in enumerate(operand))
            any_of: Node = Or(alts)
            nodes.append(any_of if op == "$in" else Not(any_of))
        elif op == "$exists":
            if not isinstance(operand, bool):
                raise InvalidInput(here, "must be true or false")
            budget.spend(here)
            nodes.append(Exists(key) if operand else Not(Exists(key)))
        else:
            if isinstance(operand, bool) or not isinstance(operand, (int, float, str)):
                raise InvalidInput(here, "must be a number or a string")
            budget.spend(here)
            nodes.append(Compare(key, _COMPARE[op], _scalar(here, operand)))  # type: ignore[arg-type]
    return nodes[0] if len(nodes) == 1 else And(tuple(nodes))


def top_level_equalities(node: Node | None) -> list[Eq]:
    """The equalities every match must satisfy (used as index hints by a backend)."""
    if isinstance(node, Eq):
        return [node]
    if isinstance(node, And):
        return [e for n in node.nodes for e in top_level_equalities(n)]
    return []


class SqlBuilder:
    """Collects bound parameters while a backend renders a filter tree to SQL text."""

    def __init__(self, prefix: str = "f") -> None:
        self.params: dict[str, Any] = {}
        self._prefix = prefix

    def bind(self, value: Any) -> str:
        name = f"{self._prefix}{len(self.params)}"
        self.params[name] = value
        return f":{name}"


COMPARE_SQL: dict[CompareOp, str] = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


class FilterSql(ABC):
    """A filter tree as one dialect's SQL: the walk every backend shares (empty and/or,
    negation, nesting), around the leaves each backend writes, and whether an index narrows the
    rows a filter keeps (a top-level conjunct, or an ``$in`` of conditions, that it serves).

    No condition is wrapped (that would hide it from the planner): one on a missing key may be
    NULL, which WHERE treats as false, so ``negate`` must make NULL false too.
    """

    true = "TRUE"
    false = "FALSE"

    def __init__(self, sql: SqlBuilder, declared: Mapping[str, PayloadKind]) -> None:
        self.sql = sql
        self.declared = declared

    def compile(self, node: Node | None) -> str:
        if node is None:
            return self.true
        if isinstance(node, Eq):
            return self.eq(node)
        if isinstance(node, Compare):
            return self.compare(node)
        if isinstance(node, Exists):
            return self.exists(node)
        if isinstance(node, Not):
            return self.negate(self.compile(node.node))
        if isinstance(node, And):
            if not node.nodes:
                return self.true
            return "(" + " AND ".join(self.compile(n) for n in node.nodes) + ")"
        if isinstance(node, Or):
            if not node.nodes:
                return self.false
            return "(" + " OR ".join(self.compile(n) for n in node.nodes) + ")"
        raise TypeError(f"unknown filter node {node!r}")  # pragma: no cover

    def narrows(self, node: Node | None) -> bool:
        """Whether an index narrows the rows of ``node``."""
        if isinstance(node, (Eq, Compare)):
            return self.serves(node)
        if isinstance(node, Or):
            return bool(node.nodes) and all(self.narrows(n) for n in node.nodes)
        if isinstance(node, And):
            return any(self.narrows(n) for n in node.nodes)
        return False

    @abstractmethod
    def eq(self, node: Eq) -> str: ...

    @abstractmethod
    def compare(self, node: Compare) -> str: ...

    @abstractmethod
    def exists(self, node: Exists) -> str: ...

    @abstractmethod
    def negate(self, condition: str) -> str:
        """``NOT condition``, false when ``condition`` is NULL."""

    @abstractmethod
    def serves(self, node: Eq | Compare) -> bool:
        """Whether one of this backend's indexes narrows the rows of one condition."""
