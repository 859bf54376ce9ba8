"""A filter's share of a collection, estimated from the database's statistics of the declared
fields, without reading a row.

PostgreSQL's ``ANALYZE`` keeps statistics of each expression index's expression: the share of
rows where it is NULL, the number of distinct values, and the most common values with their
frequencies. An equality on a declared field (a string on a ``keyword`` field; a value of the
field's kind on an ``integer``, ``float`` or ``bool`` one, whose index holds the jsonb value) is
estimated from them as PostgreSQL's own planner estimates ``=``: a common value's frequency,
otherwise the remaining rows spread evenly over the other distinct values. AND multiplies
(independent fields), OR and ``$in`` add (capped at 1). A filter with any other condition has no
estimate here (the backend samples it instead).

This replaces a block sample for the filters that a per-user or per-thread search sends most:
at 500,000 points the sample read ~2,000 points (about 7 ms) for each filter value not seen in
the last ``SELECTIVITY_TTL`` seconds (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from app.vectors.filters import And, Eq, Node, Or, Scalar


def value_key(value: Scalar) -> Hashable:
    """A jsonb value as jsonb's equality sees it: 7 and 7.0 alike, ``true`` never 1."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    return ("number", float(value))


@dataclass(frozen=True)
class FieldStats:
    """Statistics of one declared field's values. ``common`` is keyed by the value as searched:
    the string itself for a ``keyword`` field (its index holds the text), ``value_key`` of the
    jsonb value for the other kinds; ``literal`` gives each common value as the statistics
    spell it (a payload subgraph's predicate is written with it)."""

    null_frac: float  # the share of points without a value
    distinct: float  # the number of distinct values (absolute)
    common: Mapping[Hashable, float]  # the most common values, with the share of points each holds
    keyword: bool = True
    literal: Mapping[Hashable, str] = field(default_factory=dict)

    def key(self, value: Scalar) -> Hashable | None:
        """``value``'s key in ``common``; None for a value the field's index does not hold."""
        if self.keyword:
            return value if isinstance(value, str) else None
        return value_key(value)

    def eq(self, value: Scalar) -> float | None:
        """The share of points whose field equals ``value`` (None: not estimated here)."""
        key = self.key(value)
        if key is None:
            return None
        if key in self.common:
            return self.common[key]
        others = self.distinct - len(self.common)
        if others < 1:
            return 0.0
        return max(0.0, 1.0 - self.null_frac - sum(self.common.values())) / others


def field_stats(null_frac: float, n_distinct: float, rows: int, values: list[str], freqs: list[float],
                keyword: bool) -> FieldStats:
    """The statistics of a declared field's index expression as ``pg_stats`` gives them (its
    most common values as text: the string for a keyword field, jsonb's text otherwise)."""
    common: dict[Hashable, float] = {}
    literal: dict[Hashable, str] = {}
    for text, freq in zip(values, freqs, strict=True):
        key: Hashable = text if keyword else value_key(json.loads(text))
        common[key] = common.get(key, 0.0) + float(freq)
        literal.setdefault(key, text)
    return FieldStats(null_frac=null_frac, distinct=distinct_count(n_distinct, rows), common=common,
                      keyword=keyword, literal=literal)


def distinct_count(n_distinct: float, rows: int) -> float:
    """PostgreSQL's ``n_distinct``: a count when positive, minus a share of the rows when negative."""
    return n_distinct if n_distinct >= 0 else -n_distinct * max(rows, 0)


def estimate(node: Node | None, fields: Mapping[str, FieldStats]) -> float | None:
    """The share of points ``node`` keeps, or None when a condition is not an equality on a
    field in ``fields`` that its index holds."""
    if isinstance(node, Eq):
        stats = fields.get(node.key)
        return None if stats is None else stats.eq(node.value)
    if isinstance(node, (And, Or)) and node.nodes:
        parts = []
        for n in node.nodes:
            part = estimate(n, fields)
            if part is None:
                return None
            parts.append(part)
        return min(1.0, sum(parts)) if isinstance(node, Or) else math.prod(parts)
    return None
