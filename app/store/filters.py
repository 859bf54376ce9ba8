"""The store's filter language, parsed once into a small tree, compiled to each backend's SQL.

A filter is LangGraph's: AND-ed conditions on fields of an item's value, a dotted key addressing
a nested field (``{"user.age": {"$gte": 18}}``)::

    {"kind": "note", "score": {"$gt": 3.2}, "tags": ["a", "b"], "$or": [{"x": 1}, {"y": 2}]}

Operators: ``$eq $ne $gt $gte $lt $lte`` (LangGraph's) and ``$in $nin $exists $and $or`` (the
vectors filter language's). Equality is JSON equality: numbers as numbers (``1`` equals ``1.0``;
``true`` is not ``1``), objects and arrays member by member (key order does not matter), ``null``
only a field present with null. ``$gt``-style comparisons take a number or a string (strings in
code point order) and only match values of the same kind: numbers are never compared as text
(LangGraph issue 7684). ``$ne``/``$nin`` also match items without the field.

A key is 1-256 characters of letters, digits, ``_`` and ``-`` in segments joined by ``.``; any
other key is refused with ``invalid_filter_key`` (LangGraph's ``Invalid filter key``). Member
names inside an object compared by equality must not hold ``"`` or control characters. Every key
and value reaches SQL as a bound parameter. An integer beyond 64 bits (stored values hold none)
compares as the nearest float and equals nothing.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from app.core.errors import InvalidInput
from app.core.jsonvalue import is_wide, jsonb_float
from app.vectors.filters import COMPARE_SQL, SqlBuilder
from app.vectors.nulescape import escape_json, escape_text

Path = tuple[str | int, ...]
CompareOp = Literal["gt", "gte", "lt", "lte"]
INVALID_KEY = "invalid_filter_key"

_KEY = re.compile(r"[\w-]+(?:\.[\w-]+)*")
_MAX_KEY_CHARS = 256
_MAX_SEGMENTS = 32
_COMPARE: dict[str, CompareOp] = {"$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}
_OPERATORS = {"$eq", "$ne", "$in", "$nin", "$exists", *_COMPARE}


@dataclass(frozen=True)
class Eq:
    path: Path
    value: Any  # a JSON value: objects and arrays compare member by member


@dataclass(frozen=True)
class Compare:
    path: Path
    op: CompareOp
    value: str | int | float


@dataclass(frozen=True)
class Exists:
    path: Path


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
NOTHING = Or(())


class _Budget:
    def __init__(self, max_terms: int) -> None:
        self.max_terms = max_terms
        self.terms = 0

    def spend(self, where: str, n: int = 1) -> None:
        self.terms += n
        if self.terms > self.max_terms:
            raise InvalidInput(where, f"a filter may hold at most {self.max_terms} conditions")


def parse_filter(raw: Any, *, field: str = "filter", max_depth: int = 8, max_terms: int = 128) -> Node | None:
    """The tree of a ``filter`` (None or ``{}``: everything), or a 422 naming the offending part."""
    if raw is None:
        return None
    return _object(raw, field, 1, max_depth, _Budget(max_terms))


def check_key(where: str, key: str) -> Path:
    """A filter key's path, or 422 ``invalid_filter_key``."""
    if len(key) > _MAX_KEY_CHARS or not _KEY.fullmatch(key) or key.count(".") >= _MAX_SEGMENTS:
        raise InvalidInput(
            where,
            f"Invalid filter key: {key[:100]!r}. Filter keys are letters, digits, '_' and '-' in segments "
            f"joined by '.' (at most {_MAX_KEY_CHARS} characters)",
            code=INVALID_KEY,
        )
    return tuple(key.split("."))


def _depth(where: str, depth: int, max_depth: int) -> None:
    if depth > max_depth:
        raise InvalidInput(where, f"filters may nest at most {max_depth} levels deep")


def _object(raw: Any, where: str, depth: int, max_depth: int, budget: _Budget) -> Node | None:
    _depth(where, depth, max_depth)
    if not isinstance(raw, dict):
        raise InvalidInput(where, "must be an object of conditions")
    nodes: list[Node] = []
    for key, value in raw.items():
        here = f"{where}.{key}"
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise InvalidInput(here, "must be a non-empty list of filter objects")
            parts = [_object(item, f"{here}.{i}", depth + 1, max_depth, budget) for i, item in enumerate(value)]
            if key == "$and":
                nodes.append(And(tuple(p for p in parts if p is not None)))
            elif all(p is not None for p in parts):  # an empty alternative matches everything
                nodes.append(Or(tuple(p for p in parts if p is not None)))
        elif key.startswith("$"):
            raise InvalidInput(here, "unknown operator; top-level keys are value fields, $and or $or")
        else:
            nodes.append(_field(check_key(here, key), value, here, depth, max_depth, budget))
    if not nodes:
        return None
    return nodes[0] if len(nodes) == 1 else And(tuple(nodes))


def _field(path: Path, value: Any, where: str, depth: int, max_depth: int, budget: _Budget) -> Node:
    if not (isinstance(value, dict) and value and all(isinstance(k, str) and k.startswith("$") for k in value)):
        if isinstance(value, dict) and any(isinstance(k, str) and k.startswith("$") for k in value):
            raise InvalidInput(where, "mixes operators and plain keys")
        return _eq(path, value, where, budget)
    _depth(where, depth + 1, max_depth)
    nodes: list[Node] = []
    for op, operand in value.items():
        here = f"{where}.{op}"
        if op not in _OPERATORS:
            raise InvalidInput(here, f"unknown operator; use one of {', '.join(sorted(_OPERATORS))}")
        if op in ("$eq", "$ne"):
            eq = _eq(path, operand, here, budget)
            nodes.append(eq if op == "$eq" else Not(eq))
        elif op in ("$in", "$nin"):
            if not isinstance(operand, list):
                raise InvalidInput(here, "must be a list of values")
            any_of = Or(tuple(_eq(path, v, f"{here}.{i}", budget) for i, v in enumerate(operand)))
            budget.spend(here)
            nodes.append(any_of if op == "$in" else Not(any_of))
        elif op == "$exists":
            if not isinstance(operand, bool):
                raise InvalidInput(here, "must be true or false")
            budget.spend(here)
            nodes.append(Exists(path) if operand else Not(Exists(path)))
        else:
            if isinstance(operand, bool) or not isinstance(operand, (int, float, str)):
                raise InvalidInput(here, "must be a number or a string")
            budget.spend(here)
            nodes.append(Compare(path, _COMPARE[op], float(operand) if is_wide(operand) else operand))
    return nodes[0] if len(nodes) == 1 else And(tuple(nodes))


def _eq(path: Path, value: Any, where: str, budget: _Budget) -> Node:
    """Equality with a JSON value (an integer beyond 64 bits equals nothing stored)."""
    stack = [(value, where)]
    while stack:  # count every member compared, and check the member names a path can name
        item, here = stack.pop()
        budget.spend(here)
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidInput(here, "must be a finite number")
        if isinstance(item, dict):
            for k, v in item.items():
                if '"' in k or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in k):
                    raise InvalidInput(here, 'member names compared in filters must not contain " or control characters')
                stack.append((v, f"{here}.{k}"))
        elif isinstance(item, list):
            stack.extend((v, f"{here}.{i}") for i, v in enumerate(item))
        elif is_wide(item):
            return NOTHING
    return Eq(path, value)


def json_text(value: Any) -> str:
    """A JSON value as ``jsonb_text`` writes it (floats that read back as themselves)."""

    def walk(item: Any) -> Any:
        if isinstance(item, float):
            return orjson.Fragment(jsonb_float(item))
        if isinstance(item, dict):
            return {k: walk(v) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v) for v in item]
        return item

    return orjson.dumps(walk(value)).decode()


class FilterSql(ABC):
    """A filter tree as SQL on the item value column ``column``; the walk both backends share."""

    true = "TRUE"
    false = "FALSE"

    def __init__(self, sql: SqlBuilder, column: str) -> None:
        self.sql = sql
        self.column = column

    def compile(self, node: Node | None) -> str:
        if node is None:
            return self.true
        if isinstance(node, Eq):
            return self.eq(node.path, node.value)
        if isinstance(node, Compare):
            return self.compare(node)
        if isinstance(node, Exists):
            return self.exists(node.path)
        if isinstance(node, Not):
            return self.negate(self.compile(node.node))
        if isinstance(node, And):
            return "(" + " AND ".join(self.compile(n) for n in node.nodes) + ")" if node.nodes else self.true
        if isinstance(node, Or):
            return "(" + " OR ".join(self.compile(n) for n in node.nodes) + ")" if node.nodes else self.false
        raise TypeError(f"unknown filter node {node!r}")  # pragma: no cover

    @abstractmethod
    def eq(self, path: Path, value: Any) -> str: ...

    @abstractmethod
    def compare(self, node: Compare) -> str: ...

    @abstractmethod
    def exists(self, path: Path) -> str: ...

    def negate(self, condition: str) -> str:
        """``NOT condition``, true where ``condition`` is NULL (a missing field)."""
        return f"(NOT COALESCE({condition}, {self.false}))"


def sqlite_path(path: Path) -> str:
    """SQLite's JSON path of ``path`` (member names hold no ``"``: checked by the parser)."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f'."{p}"' for p in path)


class SqliteFilter(FilterSql):
    """Conditions on the value's JSON text: ``json_extract``/``json_type`` at a bound path."""

    true = "1"
    false = "0"

    def _at(self, path: Path) -> tuple[str, str]:
        p = self.sql.bind(sqlite_path(path))
        return f"json_extract({self.column}, {p})", f"json_type({self.column}, {p})"

    def _number(self, v: int | float) -> str:
        # a float is read by the JSON parser that reads the stored value's (SQLite's own parser is
        # one unit in the last place off on some floats, and the stored ones went through it)
        return f"json_extract({self.sql.bind(jsonb_float(v))}, '$')" if isinstance(v, float) else self.sql.bind(v)

    def eq(self, path: Path, value: Any) -> str:
        extract, kind = self._at(path)
        if value is None:
            return f"({kind} = 'null')"
        if isinstance(value, bool):
            return f"({kind} = '{'true' if value else 'false'}')"
        if isinstance(value, str):
            return f"({extract} = {self.sql.bind(value)} AND {kind} = 'text')"
        if isinstance(value, (int, float)):
            return f"({extract} = {self._number(value)} AND {kind} IN ('integer', 'real'))"
        if isinstance(value, list):
            members = [f"{kind} = 'array'", f"json_array_length({self.column}, {self.sql.bind(sqlite_path(path))}) = {len(value)}"]
            members += [self.eq((*path, i), v) for i, v in enumerate(value)]
            return "(" + " AND ".join(members) + ")"
        if isinstance(value, dict):
            count = f"(SELECT count(*) FROM json_each({self.column}, {self.sql.bind(sqlite_path(path))}))"
            members = [f"{kind} = 'object'", f"{count} = {len(value)}"]
            members += [self.eq((*path, k), v) for k, v in value.items()]
            return "(" + " AND ".join(members) + ")"
        raise TypeError(f"not a JSON value: {value!r}")  # pragma: no cover

    def compare(self, node: Compare) -> str:
        extract, kind = self._at(node.path)
        if isinstance(node.value, str):
            return f"({extract} {COMPARE_SQL[node.op]} {self.sql.bind(node.value)} AND {kind} = 'text')"
        return f"({extract} {COMPARE_SQL[node.op]} {self._number(node.value)} AND {kind} IN ('integer', 'real'))"

    def exists(self, path: Path) -> str:
        return f"({self._at(path)[1]} IS NOT NULL)"


class PostgresFilter(FilterSql):
    """Conditions on the jsonb value: ``->`` steps with typed parameters (a member name never
    indexes an array, as on SQLite), jsonb equality, numbers compared as numbers; strings as
    stored (U+0000 escaped: ``app.vectors.nulescape``)."""

    def _at(self, path: Path) -> str:
        steps = "".join(
            f" -> CAST({self.sql.bind(p)} AS integer)" if isinstance(p, int) else f" -> CAST({self.sql.bind(p)} AS text)"
            for p in path
        )
        return f"({self.column}{steps})"

    def eq(self, path: Path, value: Any) -> str:
        return f"({self._at(path)} = CAST({self.sql.bind(escape_json(json_text(value)))} AS jsonb))"

    def compare(self, node: Compare) -> str:
        at = self._at(node.path)
        if isinstance(node.value, str):
            return (
                f"(jsonb_typeof({at}) = 'string' AND "
                f"({at} #>> '{{}}') COLLATE \"C\" {COMPARE_SQL[node.op]} CAST({self.sql.bind(escape_text(node.value))} AS text))"
            )
        return (
            f"(jsonb_typeof({at}) = 'number' AND "
            f"{at} {COMPARE_SQL[node.op]} CAST({self.sql.bind(json_text(node.value))} AS jsonb))"
        )

    def exists(self, path: Path) -> str:
        return f"({self._at(path)} IS NOT NULL)"


FILTERS: Mapping[str, type[FilterSql]] = {"sqlite": SqliteFilter, "postgresql": PostgresFilter}
