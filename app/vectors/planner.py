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
  walking the graph until ``limit`` candidates pass the filter: when that takes at most
  ``ITERATIVE_SCAN_MAX`` points (pgvector's ``hnsw.max_scan_tuples``, where the walk gives up)
  and at most half the collection (``FILTER_MARGIN`` times ``limit / selectivity``); a rarer
  filter is compared exactly (``filter_first`` or ``exact_scan``). The walk's statement runs
  with sequential and bitmap scans off (``PgVectorIndex._walk_only``): PostgreSQL's fixed
  guess of a payload condition's share would otherwise have it sort every match.
- ``hnsw_subgraph``: a payload subgraph (``app.vectors.subgraphs``): a partial HNSW index of the
  points whose declared keyword field holds one value, for a filter that is that equality (alone
  or in an AND). Its ``ef_search`` is the unfiltered one of a collection of the subgraph's size;
  other conditions of the AND are applied to its candidates, with ``ef_search`` large enough that
  ``limit`` of them match (``FILTER_MARGIN``), and when that is more than ``EF_SEARCH_MAX`` the
  subgraph is not used. Chosen before the main graph when the ANN index is ready, unless the
  filter is narrowed to at most ``exact_threshold`` points (``filter_first`` is exact and cheap
  there). Measured at 500,000 points with a 2% value (~10,000 points): see docs/benchmarks.md.

A graph search that returns fewer than ``limit`` points is redone exactly (``fallback``), so a
filtered search always returns ``min(limit, matches)``; the planner's margins make that rare.

The unfiltered ``ef_search`` is ``vectors.ef_search``, scaled above ``EF_REFERENCE_ROWS`` points
by ``sqrt(rows / EF_REFERENCE_ROWS)`` (HNSW's recall at a fixed ``ef_search`` falls as the graph
grows: measured in docs/benchmarks.md), or the one measured on the collection's own graph when
that is larger (``app.vectors.recall``: the smallest that reaches ``vectors.target_recall`` on
sampled points, scaled with ``limit`` and the collection's growth since). It is never below
``limit``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from app.vectors import recall
from app.vectors.recall import Calibration

PlanKind = Literal["exact_scan", "filter_first", "hnsw", "hnsw_iterative", "hnsw_subgraph"]
PLAN_KINDS: tuple[PlanKind, ...] = get_args(PlanKind)
GRAPH_PLANS: tuple[PlanKind, ...] = ("hnsw", "hnsw_iterative", "hnsw_subgraph")

EF_SEARCH_MAX = 1000  # pgvector's upper bound of hnsw.ef_search
EF_REFERENCE_ROWS = 100_000
FILTER_MARGIN = 2.0
MIN_FILTER_MARGIN = 1.5
ITERATIVE_SCAN_MAX = 20_000  # hnsw.max_scan_tuples (pgvector 0.8's default), set with hnsw.iterative_scan


@dataclass
class Plan:
    kind: PlanKind
    reason: str
    ef_search: int | None = None
    rows: int | None = None
    estimated_matches: int | None = None
    fallback: bool = False
    candidates: int | None = None  # graph candidates the filter is applied to (0: the graph's own LIMIT)
    subgraph: str | None = None  # the partial index a ``hnsw_subgraph`` plan searches

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["candidates"], out["subgraph"]  # how the backend runs it, not part of the answer
        return out


@dataclass(frozen=True)
class Subgraph:
    """A valid payload subgraph that serves a search's filter: its index, and the estimated
    share of the collection's points it holds."""

    index: str
    share: float


def ef_for(rows: int, limit: int, base: int, calibration: Calibration | None = None) -> int:
    """The ``ef_search`` of an unfiltered graph search of ``limit`` in ``rows`` points: ``base``
    grown with ``rows``, or the calibrated one when the graph measured that it needs more (a
    calibration only raises it: see ``app.vectors.recall``)."""
    grown = base * math.sqrt(rows / EF_REFERENCE_ROWS) if rows > EF_REFERENCE_ROWS else base
    ef = max(base, limit, math.ceil(grown))
    if calibration is not None:
        ef = max(ef, recall.ef_for(calibration, rows, limit))
    return min(EF_SEARCH_MAX, ef)


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
    subgraph: Subgraph | None = None,
    calibration: Calibration | None = None,
) -> Plan:
    """The plan of one search.

    ``narrowed``: an index can narrow the filter's rows; ``selectivity``: the estimated share of
    points the filter keeps (None: unfiltered or unknown); ``fixed_ef``: the request's own
    ``ef_search`` (the planner still raises it to ``limit``); ``subgraph``: a valid payload
    subgraph of a string equality the filter requires; ``calibration``: what the graph's
    recall calibration measured (None: not calibrated).
    """
    if not index_ready:
        if filtered and narrowed:
            return Plan("filter_first", "no ready ANN index; an index narrows the filter", rows=rows)
        return Plan("exact_scan", "no ready ANN index: every point is compared", rows=rows)
    ef = ef_for(rows, limit, base_ef, calibration) if fixed_ef is None else max(fixed_ef, limit)
    ef = min(EF_SEARCH_MAX, ef)
    if not filtered:
        return Plan("hnsw", "unfiltered", ef_search=ef, rows=rows)
    s = 1.0 if selectivity is None else max(selectivity, 0.0)
    matches = round(s * rows)
    if narrowed and matches <= exact_threshold:
        return Plan("filter_first", f"an index narrows the filter to ~{matches} points", rows=rows,
                    estimated_matches=matches)
    if subgraph is not None:
        plan = _subgraph_plan(subgraph, rows=rows, limit=limit, base_ef=base_ef, selectivity=s, matches=matches,
                              fixed_ef=fixed_ef, calibration=calibration)
        if plan is not None:
            return plan
    needed = math.ceil(FILTER_MARGIN * limit / s) if s > 0 else rows + ITERATIVE_SCAN_MAX + 1
    if iterative:
        # The walk visits about ``needed`` points: past hnsw.max_scan_tuples it stops short of
        # ``limit`` matches (and is redone exactly); past half the collection it is taken to cost
        # more than comparing every point in table order (a bound for small collections, where
        # either is cheap: not measured).
        if needed <= min(ITERATIVE_SCAN_MAX, rows // 2):
            return Plan("hnsw_iterative", "iterative index scan", ef_search=ef, rows=rows, estimated_matches=matches)
    else:
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


def _subgraph_plan(
    subgraph: Subgraph, *, rows: int, limit: int, base_ef: int, selectivity: float, matches: int, fixed_ef: int | None,
    calibration: Calibration | None,
) -> Plan | None:
    """The search of ``subgraph``, or None when the filter's other conditions keep too few of its
    points for ``EF_SEARCH_MAX`` candidates to hold ``limit`` of them."""
    points = max(1, round(subgraph.share * rows))
    # The main graph's calibration: a subgraph is smaller, and recalls at least as well.
    ef = ef_for(points, limit, base_ef, calibration) if fixed_ef is None else max(fixed_ef, limit)
    # The share of the subgraph's points the whole filter keeps (1: the equality alone).
    inner = min(1.0, selectivity / subgraph.share) if subgraph.share > 0 else 1.0
    candidates = 0
    if inner < 1.0:
        needed = math.ceil(FILTER_MARGIN * limit / inner) if inner > 0 else EF_SEARCH_MAX + 1
        if needed > EF_SEARCH_MAX:
            return None
        ef = max(ef, needed)
        candidates = ef
    return Plan("hnsw_subgraph", f"the payload subgraph of ~{points} points holds the filter's matches",
                ef_search=min(EF_SEARCH_MAX, ef), rows=rows, estimated_matches=matches, candidates=candidates,
                subgraph=subgraph.index)
