"""Recall calibration: the ``ef_search`` a collection's HNSW graph needs, measured on its own points.

HNSW's recall at a given ``ef_search`` depends on the data, the graph's parameters and its size:
at 500,000 points issue 18 measured recall@10 0.907 at ``ef_search`` 100 on text embeddings,
where the clustered synthetic vectors of ``bench/bench_vectors_scale.py`` reach 0.987-0.998. A
rule of size alone cannot be right for every graph, so once a collection's graph is built (and
again when the collection has grown or shrunk by ``REGROW`` since), the index builder measures it
(``app.vectors.builder``):

- ``vectors.calibration_queries`` points sampled uniformly from the collection are the queries; each one's own id is left out of its answers, so a query is a point's neighbourhood,
  as a search for a stored memory's near duplicates or a text like a stored one is;
- each is searched exactly (the ground truth) and through the graph at each ``ef_search`` of
  ``LADDER``, from the smallest up, until the mean recall@``K`` reaches ``vectors.target_recall``,
  or until twice an ``ef_search`` recalled no more than it (``settled``: the graph's best);
- the first ``ef_search`` that reached the target is the collection's; when none did, the
  smallest that recalled the best measured. A graph can have regions its greedy search does not
  reach from the entry point (a 500,000-point build here answered one sampled point in 50 from
  another cluster at every ``ef_search`` up to 1,000): a larger ``ef_search`` only costs there.

Sampled points are easier queries than new ones: a stored point is a node of the graph, whose
edges are its nearest neighbours, so the search lands on it and reads them off. Measured at
500,000 points (``bench/bench_vectors_scale.py``): the points sampled by two calibrations
recalled 0.974 and 0.938 at ``ef_search`` 40 and no more at 80 (the misses were points the search
never reached, at any ``ef_search``), where 100 held-out queries from the same clusters recalled
0.949 at 40, 0.987 at 100 and 0.998 at 240. So a calibration only ever raises ``ef_search``: the
planner (``app.vectors.planner.ef_for``) takes the larger of its size rule and the calibrated
value (scaled by ``limit / K`` above ``K``, and by ``sqrt(points / calibrated points)`` while the
collection has grown since). A graph whose own points fall short at the rule's ``ef_search``
(sparse graphs, hard data) gets what it measured it needs; an easy one keeps the rule.

The result is kept as the HNSW index's comment (``COMMENT ON INDEX``): it lives and dies with the
graph it measured (a reset or a rebuild drops it), and every worker and replica reads it with the
index's validity (one catalog read, ``app.vectors.pgvector._STATS``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

K = 10
# pgvector's own default ef_search (40) is the floor: below it the measured recall of sampled
# points says little about queries unlike any stored point.
LADDER: tuple[int, ...] = (40, 48, 64, 80, 100, 128, 160, 200, 256, 320, 400, 512, 640, 800, 1000)
REGROW = 2.0
PLATEAU = 2.0  # no more recall from an ef_search to this many times it: the graph's best
MARK = "storage-gateway recall calibration"


@dataclass(frozen=True)
class Calibration:
    """What one calibration of a collection's graph measured."""

    ef_search: int
    recall: float  # the mean recall@K at ef_search
    target: float
    points: int  # the collection's size when measured
    queries: int
    seconds: float
    ladder: dict[int, float] = field(default_factory=dict)  # ef_search -> mean recall@K, as measured

    def comment(self) -> str:
        """The index comment that keeps it (numbers only: no quoting to get wrong)."""
        return json.dumps({
            "mark": MARK, "ef_search": self.ef_search, "recall": round(self.recall, 4), "target": self.target,
            "points": self.points, "queries": self.queries, "seconds": round(self.seconds, 2),
            "ladder": {str(ef): round(r, 4) for ef, r in self.ladder.items()},
        }, separators=(",", ":"))

    def as_read(self) -> dict[str, Any]:
        """Describe's ``index.calibration``."""
        return {"ef_search": self.ef_search, "recall": round(self.recall, 4), "target_recall": self.target,
                "points": self.points, "queries": self.queries, "k": K, "seconds": round(self.seconds, 2)}


def parse(comment: str | None) -> Calibration | None:
    """The calibration an index comment keeps; None for no comment or one that is not ours."""
    if not comment:
        return None
    try:
        data = json.loads(comment)
        if not isinstance(data, dict) or data.get("mark") != MARK:
            return None
        return Calibration(
            ef_search=int(data["ef_search"]), recall=float(data["recall"]), target=float(data["target"]),
            points=max(1, int(data["points"])), queries=int(data["queries"]), seconds=float(data["seconds"]),
            ladder={int(k): float(v) for k, v in dict(data.get("ladder") or {}).items()},
        )
    except (ValueError, TypeError, KeyError):
        return None


def due(current: Calibration | None, points: int, target: float) -> bool:
    """Whether a valid graph of ``points`` points should be (re)calibrated for ``target`` (not one
    of at most ``K`` points: an emptied collection has nothing to measure)."""
    if target <= 0 or points <= K:
        return False
    if current is None or current.target != target:
        return True
    return points >= current.points * REGROW or points * REGROW <= current.points


def recall_at_k(truth: Sequence[Any], found: Sequence[Any], query_id: Any) -> float:
    """One query's recall@K: the share of its true ``K`` nearest (itself left out) found."""
    true = [i for i in truth if i != query_id][:K]
    if not true:
        return 1.0
    got = {i for i in found if i != query_id}
    return sum(1 for i in true if i in got) / len(true)


def settled(ladder: dict[int, float]) -> bool:
    """Whether the largest ``ef_search`` measured recalled no more than one ``PLATEAU`` times
    smaller: measuring further would not find more."""
    top = max(ladder)
    below = [ef for ef in ladder if ef * PLATEAU <= top]
    return bool(below) and ladder[top] <= ladder[max(below)]


def pick(ladder: dict[int, float], target: float) -> int:
    """The smallest measured ``ef_search`` whose recall reaches ``target``, else the smallest
    that recalled the best measured."""
    for ef in sorted(ladder):
        if ladder[ef] >= target:
            return ef
    best = max(ladder.values())
    return min(ef for ef, r in ladder.items() if r >= best)


def ef_for(calibration: Calibration, points: int, limit: int) -> int:
    """The calibrated ``ef_search`` of a graph search of ``limit`` in ``points`` points (before
    the planner's cap): grown with the collection since the measurement, and with ``limit``."""
    ef = float(calibration.ef_search)
    if points > calibration.points:
        ef *= math.sqrt(points / calibration.points)
    if limit > K:
        ef *= limit / K
    return max(limit, math.ceil(ef))
