"""Payload subgraphs (PostgreSQL): a partial HNSW index per common value of a declared field, the
way Qdrant builds a graph per payload value.

A filter ``{"user": "u7"}`` (or ``{"kind": 7}``) on a declared field is served three ways: ``filter_first``
(the field's B-tree narrows the rows, which are compared exactly) when the value holds few
points, the main graph with the filter applied to its candidates when it holds many, and, in
between, neither is cheap: at 500,000 points a value holding 2% (~10,000 points) took 38-48 ms
to compare exactly and 22-25 ms through the main graph at ``ef_search`` 1000, against 12.5 ms
for an unfiltered search. A subgraph of those ~10,000 points is searched like a collection of
that size.

Which values: the background builder (``app.vectors.builder``) reads ``ANALYZE``'s most common
values of each declared field's index expression (the statistics ``app.vectors.estimate``
reads) and picks those holding more than ``vectors.exact_search_threshold`` points (fewer are
compared exactly, cheaply) and at most ``vectors.subgraph_max_share`` of the collection (more are
found cheaply by the main graph), the largest first, at most ``vectors.subgraph_max_count`` per
collection. A value outside PostgreSQL's most-common list is not common enough to need one.

Each is ``CREATE INDEX CONCURRENTLY ... USING hnsw (...) WHERE <the field's expression> = '<value>'``
with the main index's ``m`` and ``ef_construction`` (a keyword field's text; another kind's jsonb
value, ``CAST('7' AS jsonb)``, as the statistics spell it). Its name comes from the collection's table,
the declaration's position and a hash of the value (never user text); the value is in the
predicate as an escaped literal, and a search spells the same literal, which is what lets
PostgreSQL use a partial index at all: a name that collides with another value's names an index
whose predicate the search's literal does not match, so PostgreSQL cannot use it there (the
search stays correct, only slower). PostgreSQL keeps partial indexes up to date on every write,
so a subgraph chosen from older statistics is still correct.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from app.vectors.estimate import FieldStats
from app.vectors.payload_index import PayloadIndex, sql_index_name

HASH_HEX = 12


def index_name(data_table: str, index: PayloadIndex, stored_value: str) -> str:
    """The subgraph of ``stored_value`` (the field's value as stored, NUL-escaped)."""
    digest = hashlib.sha256(stored_value.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_HEX]
    return f"{sql_index_name(data_table, index)}_g{digest}"


def name_prefix(data_table: str) -> str:
    """What every subgraph index name of a table starts with (a ``LIKE`` pattern's prefix)."""
    return f"{data_table}_p"


def is_subgraph_name(data_table: str, name: str) -> bool:
    rest = name[len(name_prefix(data_table)):] if name.startswith(name_prefix(data_table)) else ""
    position, _, digest = rest.partition("_g")
    return position.isdigit() and len(digest) == HASH_HEX and all(c in "0123456789abcdef" for c in digest)


def position_of(data_table: str, name: str) -> int:
    """The declaration position a subgraph index name was made for."""
    return int(name[len(name_prefix(data_table)):].partition("_g")[0])


def sql_literal(value: str) -> str:
    """``value`` as a PostgreSQL string constant, whatever ``standard_conforming_strings`` says
    (an ``E''`` string: backslashes and quotes doubled). PostgreSQL text holds no NUL, nor do
    stored values (``app.vectors.nulescape``)."""
    if "\x00" in value:
        raise ValueError("PostgreSQL text cannot hold NUL")
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


@dataclass(frozen=True)
class Wanted:
    """A subgraph the builder should have: the declaration, the stored value, its index name and
    the estimated points."""

    index: PayloadIndex
    value: str
    name: str
    points: int


def wanted(
    data_table: str,
    declared: Iterable[PayloadIndex],
    stats: Mapping[int, FieldStats],
    rows: int,
    *,
    min_points: int,
    max_share: float,
    max_count: int,
) -> list[Wanted]:
    """The subgraphs a table of ``rows`` points should have, largest first: from the most common
    values (``stats``: the statistics of each declared field, by position, with values as
    stored), those holding more than ``min_points`` points and at most ``max_share`` of them."""
    out: list[Wanted] = []
    for p in declared:
        s = stats.get(p.position)
        if s is None:
            continue
        for key, share in s.common.items():
            value = s.literal.get(key, str(key))
            points = round(share * rows)
            if points > min_points and share <= max_share and "\x00" not in value:
                out.append(Wanted(p, value, index_name(data_table, p, value), points))
    out.sort(key=lambda w: (-w.points, w.index.position, w.value))
    return out[: max(0, max_count)]
