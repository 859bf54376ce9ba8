"""How one search runs: the plan chosen from the collection's size, the filter's estimated
matches and the index's state (pure decisions; each backend gathers the numbers).

Plans:

- ``exact_scan``: every point (or every point the filter keeps) is compared; the answer is exact.
  Chosen when there is no ready ANN index (SQLite, ``exact`` collections, an HNSW index still
  pending or building) and no index narrows the filter, or when a filter no index can narrow
  keeps too few points for the graph.
- ``filter_first``: an index (the payload GIN index's containment, or a declared payload index)
  narrows the rows to the filter's matches, which are compared exactly: for filters that keep
  few points (at most ``exact_threshold`` estimated), or too few for the graph to find.
- ``hnsw``: the HNSW graph with ``ef_search`` candidates; a filter is applied to them, so a
  filtered search gets ``ef_search`` large enough that ``limit`` of them match
  (``FILTER_MARGIN`` times ``limit / selectivity``), or the largest ``ef_search`` when that
  still holds ``MIN_FILTER_MARGIN`` times ``limit`` matches (a filter an index narrows to at most
  ``exact_threshold`` points is compared exactly before this is asked). Measured at 500,000 points with a 2% filter (~10,000 matches):
  the exact search of the matches took 48 ms, the graph at ``ef_search`` 1000 22-25 ms, so the
  graph is cheaper even with its occasional exact fallback (about 7% of searches at 1.5x).
- ``hnsw_iterative``: pgvector 0.8's iterative index scan (``hnsw.iterative_scan``), which keeps
  walking the graph until ``limit`` candidates pass the filter.

A graph search that returns fewer than ``limit`` points is redone exactly (``fallback``), so a
filtered search always returns ``min(limit, matches)``; the planner's margins make that rare.

``ef_search`` grows with the collection: HNSW's recall at a fixed ``ef_search`` falls as the
graph grows (measured in docs/benchmarks.md), so above ``EF_REFERENCE_ROWS`` points the base
``ef_search`` is scaled by ``sqrt(rows / EF_REFERENCE_ROWS)``, and it is never below ``limit``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

PlanKind = Literal["exact_scan", "filter_first", "hnsw", "hnsw_iterative"]
PLAN_KINDS: tuple[PlanKind, ...] = ("exact_scan", "filter_first", "hnsw", "hnsw_iterative")

EF_SEARCH_MAX = 1000  # pgvector's upper bound of hnsw.ef_search
EF_REFERENCE_ROWS = 100_000
FILTER_MARGIN = 2.0
MIN_FILTER_MARGIN = 1.5


@dataclass
class Plan:
    kind: PlanKind
    reason: str
    ef_search: int | None = None
    rows: int | None = None
    estimated_matches: int | None = None
    fallback: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def ef_for(rows: int, limit: int, base: int) -> int:
    """The ``ef_search`` of an unfiltered graph search of ``limit`` in ``rows`` points."""
    grown = base * math.sqrt(rows / EF_REFERENCE_ROWS) if rows > EF_REFERENCE_ROWS else base
    return min(EF_SEARCH_MAX, max(base, limit, math.ceil(grown)))


def choose(
    *,
    rows: int,
    limit: int,
    base_ef: int,
    index_ready: bool,
    filtered: bool,
    narrowed: bool,
    selectivity: float | None,
    exact_threshold: int,
    iterative: bool,
    fixed_ef: int | None = None,
) -> Plan:
    """The plan of one search.

    ``narrowed``: an index can narrow the filter's rows; ``selectivity``: the estimated share of
    points the filter keeps (None: unfiltered or unknown); ``fixed_ef``: the request's own
    ``ef_search`` (the planner still raises it to ``limit``).
    """
    if not index_ready:
        if filtered and narrowed:
            return Plan("filter_first", "no ready ANN index; an index narrows the filter", rows=rows)
        return Plan("exact_scan", "no ready ANN index: every point is compared", rows=rows)
    ef = ef_for(rows, limit, base_ef) if fixed_ef is None else max(fixed_ef, limit)
    ef = min(EF_SEARCH_MAX, ef)
    if not filtered:
        return Plan("hnsw", "unfiltered", ef_search=ef, rows=rows)
    s = 1.0 if selectivity is None else max(selectivity, 0.0)
    matches = round(s * rows)
    if narrowed and matches <= exact_threshold:
        return Plan("filter_first", f"an index narrows the filter to ~{matches} points", rows=rows,
                    estimated_matches=matches)
    if iterative:
        return Plan("hnsw_iterative", "iterative index scan", ef_search=ef, rows=rows, estimated_matches=matches)
    needed = math.ceil(FILTER_MARGIN * limit / s) if s > 0 else EF_SEARCH_MAX + 1
    if needed > EF_SEARCH_MAX and s * EF_SEARCH_MAX >= MIN_FILTER_MARGIN * limit:
        needed = EF_SEARCH_MAX  # the matches are too many to compare exactly (see above)
    if needed <= EF_SEARCH_MAX:
        return Plan("hnsw", "the graph's candidates hold enough matches", ef_search=max(ef, needed),
                    rows=rows, estimated_matches=matches)
    if narrowed:
        return Plan("filter_first", "too few matches for the graph; an index narrows them", rows=rows,
                    estimated_matches=matches)
    return Plan("exact_scan", "too few matches for the graph and no index narrows the filter", rows=rows,
                estimated_matches=matches)
