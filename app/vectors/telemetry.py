"""Counts of search plans and index builds: Prometheus metrics and the numbers describe shows."""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import Counter, Gauge

from app.core.ops.metrics import REGISTRY
from app.vectors.planner import Plan

SEARCH_PLANS = Counter(
    "gateway_vector_search_plans",
    "Vector searches by the plan that ran (exact_scan, filter_first, hnsw, hnsw_iterative, hnsw_subgraph) and "
    "whether a graph search was redone exactly (fallback).",
    ("plan", "fallback"),
    registry=REGISTRY,
)
INDEX_BUILD_TUPLES = Gauge(
    "gateway_vector_index_build_tuples_done",
    "Tuples a running background index build has processed (0 when none runs), by index kind.",
    ("kind",),
    registry=REGISTRY,
)
INDEX_BUILD_TOTAL = Gauge(
    "gateway_vector_index_build_tuples_total",
    "Tuples the running background index build will process (0 when none runs), by index kind.",
    ("kind",),
    registry=REGISTRY,
)

MAX_COLLECTIONS = 10_000
_by_collection: dict[int, Tally[str]] = {}


def count_plan(collection_id: int, plan: Plan) -> None:
    SEARCH_PLANS.labels(plan.kind, "true" if plan.fallback else "false").inc()
    tally = _by_collection.get(collection_id)
    if tally is None:
        if len(_by_collection) >= MAX_COLLECTIONS:
            _by_collection.clear()
        tally = _by_collection[collection_id] = Tally()
    tally[plan.kind] += 1
    if plan.fallback:
        tally["fallback"] += 1


def plans_of(collection_id: int) -> dict[str, int]:
    """This process's searches of a collection by plan."""
    return dict(_by_collection.get(collection_id, {}))
