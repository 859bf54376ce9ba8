"""Prometheus metrics: what is counted, and the ``/metrics`` answer.

Labels are bounded on purpose: the route *template* (``/v1/{namespace}/kv/{collection}/{key}``),
never the concrete path, namespace, key or id. Numbers are per process: with ``--workers N``
each worker keeps its own, and a scrape reports the worker that answered it (run one worker
per replica and scrape each replica when exact totals matter; see docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    GCCollector,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from app.core.state import gateway_state

if TYPE_CHECKING:
    from app.core.db.databases import Databases

UNMATCHED_ROUTE = "unmatched"

# One registry for the traffic metrics of this process (several apps in one test process share it).
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

REQUESTS = Counter(
    "gateway_http_requests",
    "HTTP requests answered, by route template, method and status.",
    ("method", "route", "status"),
    registry=REGISTRY,
)
LATENCY = Histogram(
    "gateway_http_request_duration_seconds",
    "Time from the request's arrival to the end of its answer, by route template, method and status.",
    ("method", "route", "status"),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "gateway_http_requests_in_flight",
    "HTTP requests being served right now.",
    registry=REGISTRY,
)
ERRORS = Counter(
    "gateway_errors",
    "problem+json answers, by their stable problem `code`.",
    ("code", "status"),
    registry=REGISTRY,
)

DB_CONNECTIONS_OPENED = Counter(
    "gateway_db_connections_opened",
    "New database connections opened, by database (a steady climb under load means the pool is too small).",
    ("database",),
    registry=REGISTRY,
)

SQLITE_INLINE_READS = Counter(
    "gateway_sqlite_inline_reads",
    "One-statement SQLite reads tried on the event loop's thread (app.core.fast.inline_sqlite), by outcome: "
    "inline (answered there), or over_budget / skipped (its SQL ran past the budget lately) / busy / "
    "error (sent through the pool instead).",
    ("database", "outcome"),
    registry=REGISTRY,
)

SQLITE_INLINE_WRITES = Counter(
    "gateway_sqlite_inline_writes",
    "One-statement SQLite writes tried on the event loop's thread (app.core.fast.inline_sqlite), by outcome: "
    "inline (committed there), or over_budget / skipped / busy (the write lock was held elsewhere) / "
    "error (sent through the pool instead, where it waits for the lock as before).",
    ("database", "outcome"),
    registry=REGISTRY,
)

SQLITE_CHECKPOINTS = Counter(
    "gateway_sqlite_checkpoints",
    "WAL checkpoints run through the pool (PASSIVE), in the background: no commit runs one.",
    ("database",),
    registry=REGISTRY,
)


def count_problem(code: str, status: int) -> None:
    """Called by the problem renderer for every error it answers."""
    ERRORS.labels(code=code, status=str(status)).inc()


# The labelled series of each (method, route template, status), looked up once: ``labels()`` costs
# a lock and a dict build per call, on every request.
_SERIES: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    series = _SERIES.get((method, route, status))
    if series is None:
        labels = {"method": method, "route": route, "status": str(status)}
        series = _SERIES[(method, route, status)] = (REQUESTS.labels(**labels), LATENCY.labels(**labels))
    series[0].inc()
    series[1].observe(seconds)


class PoolCollector(Collector):
    """Connection pool use of each database, read from the engines when scraped."""

    def __init__(self, databases: Databases) -> None:
        self.databases = databases

    def collect(self) -> Iterable[GaugeMetricFamily]:
        checked_out = GaugeMetricFamily(
            "gateway_db_pool_checked_out", "Connections lent out of the pool now.", labels=["database"]
        )
        size = GaugeMetricFamily(
            "gateway_db_pool_size", "Connections the pool keeps open at most (without overflow).",
            labels=["database"],
        )
        limit = GaugeMetricFamily(
            "gateway_db_pool_limit", "Most connections the pool lends at once (size + overflow).",
            labels=["database"],
        )
        for db, engine in self.databases.engines.items():
            pool = engine.pool
            conf = self.databases.settings.databases.get(db)
            out = getattr(pool, "checkedout", None)
            checked_out.add_metric([db.value], float(out()) if callable(out) else 0.0)
            pool_size = getattr(pool, "size", None)
            size.add_metric([db.value], float(pool_size()) if callable(pool_size) else float(conf.pool_size))
            limit.add_metric([db.value], float(conf.pool_size + conf.max_overflow))
        yield checked_out
        yield size
        yield limit


async def metrics_endpoint(request: Request) -> Response:
    """The Prometheus text exposition of this process."""
    body = generate_latest(REGISTRY)
    databases = gateway_state(request.app).open_databases
    if databases is not None:
        pools = CollectorRegistry(auto_describe=False)
        pools.register(PoolCollector(databases))
        body += generate_latest(pools)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
