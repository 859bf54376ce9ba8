"""How one search runs: the plan chosen from the collection's size, the filter's estimated
matches, the index's state and what this collection's searches measured (pure decisions; each
backend gathers the numbers, ``app.vectors.feedback`` keeps what searches found).

Plans:

- ``exact_scan``: every point (or every point the filter keeps) is compared; the answer is exact.
  Chosen when there is no ready ANN index (SQLite, ``exact`` collections, an HNSW index still
  pending or building) and no index narrows the filter, or when it costs least (below).
- ``filter_first``: an index (the payload GIN index's containment, or a declared payload index)
  narrows the rows to the filter's matches, which are compared exactly.
- ``hnsw``: the HNSW graph with ``ef_search`` candidates; a filter is applied to them, so a
  filtered search gets ``ef_search`` large enough that ``limit`` of them match
  (``FILTER_MARGIN`` times ``limit / share``), or the largest ``ef_search`` when that still holds
  ``MIN_FILTER_MARGIN`` times ``limit`` matches.
- ``hnsw_iterative``: pgvector 0.8's iterative index scan (``hnsw.iterative_scan``), which keeps
  walking the graph until ``limit`` candidates pass the filter, bounded by
  ``hnsw.max_scan_tuples`` = ``SCAN_BOUND`` times the walk the estimate expects (at most
  ``ITERATIVE_SCAN_MAX``, pgvector's default): a filter rarer than estimated ends the walk early
  and is answered exactly (``fallback``) instead of walking 20,000 points, and the fallback
  teaches the collection's correction (below). Its ``ef_search`` is raised to the candidates that
  hold ``limit`` matches (``limit / share``, at most ``EF_SEARCH_MAX``): the walk's first pass is
  then as accurate as an unfiltered search of them, where pgvector's later passes are
  approximate. The walk runs
  in ``relaxed_order`` and the backend re-sorts its rows (pgvector's recommendation: better
  recall), with sequential and bitmap scans off (``PgVectorIndex._walk_only``).
- ``hnsw_subgraph``: a payload subgraph (``app.vectors.subgraphs``): a partial HNSW index of the
  points whose declared field holds one value, for a filter that is that equality (alone or in an
  AND). Its ``ef_search`` is the unfiltered one of a collection of the subgraph's size; other
  conditions of the AND are applied to its candidates, with ``ef_search`` large enough that
  ``limit`` of them match (``FILTER_MARGIN``), and when that is more than ``EF_SEARCH_MAX`` the
  subgraph is not used.

The choice between them is by predicted cost, the model (``Costs``) being measured on each
collection: an exact plan costs ``exact_unit`` per compared point (``EXACT_FIXED`` points' worth
more for the statement; a plan no index narrows also reads ``SCAN_SHARE`` of a point's cost for
every row it filters), a graph plan ``graph_unit`` per ``ef_search`` candidate (plus
``GRAPH_FIXED``: the walk down the graph's upper layers). The units start from what was measured
at 500,000 points on PostgreSQL 16 + pgvector (``EXACT_UNIT_MS``, ``GRAPH_UNIT_MS``) and follow
each collection's own statements (``app.vectors.feedback``). An exact plan is a candidate when
at most ``exact_threshold`` points are expected to match (``vectors.exact_search_threshold``),
or when no graph plan can hold ``limit`` matches; every graph plan that can is a candidate; the
cheapest runs, and the answer's ``plan.costs`` shows each candidate's predicted milliseconds.

The estimate is corrected by what this collection's searches of the same filter shape found
(``feedback.Correction``): ``matches`` by exact plans' counts of the matches (``global``), the
share among a graph's candidates by what the candidates held (``local``: a filter whose matches
lie away from the queries' neighbourhood keeps fewer of them than of the collection).

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
ITERATIVE_SCAN_MAX = 20_000  # pgvector 0.8's default hnsw.max_scan_tuples: the most a walk is let visit
SCAN_BOUND = 4.0  # an iterative walk may visit this many times the points its estimate expects
MIN_SCAN_TUPLES = 1000
# The cost model's starting units (ms), measured at 500,000 points (384-d, PostgreSQL 16 +
# pgvector 0.6.2, c1): 10,000 matches compared exactly in 48 ms, the graph at ef_search 1,000
# in 22-25 ms and at 224 in 6.3 ms (docs/benchmarks.md).
EXACT_UNIT_MS = 0.0045
GRAPH_UNIT_MS = 0.024
EXACT_FIXED = 32.0  # points' worth of an exact statement's own cost
GRAPH_FIXED = 64.0  # candidates' worth of a graph walk's descent through the upper layers
SCAN_SHARE = 0.25  # a row a plan without an index filters, against one it compares
FALLBACK_RISK = 0.25  # the share of searches at the largest ef_search below FILTER_MARGIN that redo exactly


@dataclass
class Costs:
    """A collection's cost model (ms): one compared point for exact plans, one ``ef_search``
    candidate for graph plans (``app.vectors.feedback`` measures both)."""

    exact_unit: float = EXACT_UNIT_MS
    graph_unit: float = GRAPH_UNIT_MS

    def exact(self, compared: float, scanned: float = 0.0) -> float:
        return self.exact_unit * (compared + EXACT_FIXED + SCAN_SHARE * scanned)

    def graph(self, ef: float) -> float:
        return self.graph_unit * (ef + GRAPH_FIXED)


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
    estimate: str | None = None  # how the filter's share was estimated: statistics, sample
    correction: float | None = None  # the learned factor applied to the estimated matches
    graph_share: float | None = None  # the share of graph candidates expected to match
    max_scan_tuples: int | None = None  # an iterative walk's bound
    costs: dict[str, float] | None = None  # predicted ms of each candidate plan
    found_matches: int | None = None  # matches the plan saw: all of them (exact), or among its candidates (graph)
    ms: float | None = None  # the plan's statements, as measured by the gateway (the fallback's included)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["subgraph"]  # how the backend runs it, not part of the answer
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
    costs: Costs | None = None,
    correction: float = 1.0,
    local: float = 1.0,
) -> Plan:
    """The plan of one search.

    ``narrowed``: an index can narrow the filter's rows; ``selectivity``: the estimated share of
    points the filter keeps (None: unfiltered or unknown); ``fixed_ef``: the request's own
    ``ef_search`` (the planner still raises it to ``limit``); ``subgraph``: a valid payload
    subgraph of an equality the filter requires; ``calibration``: what the graph's recall
    calibration measured (None: not calibrated); ``costs``: the collection's measured cost
    model; ``correction``: the learned factor of the estimated matches, ``local``: of the share
    among graph candidates against the corrected share (``app.vectors.feedback``).
    """
    if not index_ready:
        if filtered and narrowed:
            return Plan("filter_first", "no ready ANN index; an index narrows the filter", rows=rows)
        return Plan("exact_scan", "no ready ANN index: every point is compared", rows=rows)
    ef = ef_for(rows, limit, base_ef, calibration) if fixed_ef is None else max(fixed_ef, limit)
    ef = min(EF_SEARCH_MAX, ef)
    if not filtered:
        return Plan("hnsw", "unfiltered", ef_search=ef, rows=rows)
    model = costs or Costs()
    s = min(1.0, (1.0 if selectivity is None else max(selectivity, 0.0)) * correction)
    matches = round(s * rows)
    share = min(1.0, s * local)  # among graph candidates

    def noted(plan: Plan) -> Plan:
        """``plan`` with what the choice was made from."""
        plan.rows, plan.estimated_matches, plan.graph_share = rows, matches, round(share, 6)
        plan.correction = round(correction, 4) if correction != 1.0 else None
        return plan

    options: list[tuple[float, Plan]] = []
    if subgraph is not None:
        plan = _subgraph_plan(subgraph, rows=rows, limit=limit, base_ef=base_ef, selectivity=s, fixed_ef=fixed_ef,
                              calibration=calibration)
        if plan is not None:
            options.append((model.graph(plan.ef_search or ef), noted(plan)))
    needed = math.ceil(FILTER_MARGIN * limit / share) if share > 0 else rows + ITERATIVE_SCAN_MAX + 1
    if iterative:
        # The walk visits about ``needed`` points: past hnsw.max_scan_tuples it stops short of
        # ``limit`` matches (and is redone exactly); past half the collection it is taken to cost
        # more than comparing every point in table order.
        if needed <= min(ITERATIVE_SCAN_MAX, rows // 2):
            # The first pass holds about ``limit`` matches: it is as accurate as an unfiltered
            # search of those candidates, the walk's later passes less so.
            walk_ef = min(EF_SEARCH_MAX, max(ef, math.ceil(limit / share)))
            bound = min(ITERATIVE_SCAN_MAX, max(MIN_SCAN_TUPLES, math.ceil(SCAN_BOUND * needed)))
            plan = Plan("hnsw_iterative", f"iterative index scan: ~{needed} points walked for {limit} matches",
                        ef_search=walk_ef, max_scan_tuples=bound)
            options.append((model.graph(max(walk_ef, needed)), noted(plan)))
    else:
        risk = 0.0
        if needed > EF_SEARCH_MAX and share * EF_SEARCH_MAX >= MIN_FILTER_MARGIN * limit:
            needed, risk = EF_SEARCH_MAX, FALLBACK_RISK  # more often short of limit matches
        if needed <= EF_SEARCH_MAX:
            graph_ef = max(ef, needed)
            plan = Plan("hnsw", f"the graph's {graph_ef} candidates hold ~{share * graph_ef:.0f} matches",
                        ef_search=graph_ef, candidates=graph_ef)
            options.append((model.graph(graph_ef) + risk * model.exact(matches, 0 if narrowed else rows), noted(plan)))
    if matches <= exact_threshold or not options:
        kind: PlanKind = "filter_first" if narrowed else "exact_scan"
        how = "an index narrows the filter to" if narrowed else "every point is filtered, and the"
        plan = Plan(kind, f"{how} ~{matches} points compared exactly")
        options.append((model.exact(matches, 0 if narrowed else rows), noted(plan)))
    best = min(options, key=lambda o: o[0])[1]
    best.costs = {p.kind: round(c, 3) for c, p in options}
    if len(options) > 1:
        best.reason += " (the cheapest by this collection's costs)"
    return best


def _subgraph_plan(
    subgraph: Subgraph, *, rows: int, limit: int, base_ef: int, selectivity: float, fixed_ef: int | None,
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
                ef_search=min(EF_SEARCH_MAX, ef), rows=rows, estimated_matches=round(selectivity * rows),
                candidates=candidates, subgraph=subgraph.index)
