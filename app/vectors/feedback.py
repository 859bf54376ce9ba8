"""What each collection's searches found, kept per process so that the planner learns from its
own mistakes (``app.vectors.planner``): per collection, not a global constant.

- **Costs.** Every plan's statements are timed. An exact plan's time per compared point (its
  matches, counted by the statement) and a graph plan's per ``ef_search`` candidate update the
  collection's ``planner.Costs`` (an exponential average, ``ALPHA``), so that the choice between
  comparing a filter's matches and searching a graph follows this collection's data, vectors and
  server, not the numbers measured once. Statements with few units say more about the
  statement's fixed cost than about a unit and are not taken (``MIN_UNITS``).
- **Corrections.** A filter's estimated share (``ANALYZE``'s statistics or a block sample) can
  be wrong for a collection: values stored in runs defeat a block sample, and a filter whose
  matches lie away from where the queries land keeps fewer of a graph's candidates than of the
  collection. Per collection and filter *shape* (its fields and operators, not its values), the
  log of found / estimated is averaged: ``global`` from exact plans, which count every match,
  and ``local`` from graph plans, whose candidates show the share near the query (a fallback
  counts as half a match found among them). The next search of that shape multiplies its
  estimate by them.

Kept in memory, per process (at most ``MAX_COLLECTIONS`` collections; a restart relearns within a
few searches), forgotten with the collection's registry row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.vectors.filters import And, Compare, Eq, Exists, Node, Not
from app.vectors.planner import EXACT_FIXED, GRAPH_FIXED, SCAN_SHARE, Costs

ALPHA = 0.25
MIN_UNITS = 64
MAX_LOG = math.log(1000.0)  # corrections stay within 1/1000 .. 1000
MAX_COLLECTIONS = 4096
MAX_SHAPES = 64  # per collection


def shape(node: Node | None) -> str:
    """A filter's fields, operators and value types, without its values."""
    if node is None:
        return ""
    if isinstance(node, Eq):
        return f"{node.key}={type(node.value).__name__}"
    if isinstance(node, Compare):
        return f"{node.key}{node.op}{type(node.value).__name__}"
    if isinstance(node, Exists):
        return f"{node.key}?"
    if isinstance(node, Not):
        return f"!({shape(node.node)})"
    joined = ",".join(sorted({shape(n) for n in node.nodes}))
    return f"{'&' if isinstance(node, And) else '|'}({joined})"


@dataclass
class Correction:
    """The learned factors of one filter shape (logs; 0: as estimated)."""

    log_global: float = 0.0
    log_local: float = 0.0

    @property
    def matches(self) -> float:
        return math.exp(self.log_global)

    @property
    def local(self) -> float:
        return math.exp(self.log_local)


def _towards(current: float, seen: float) -> float:
    return max(-MAX_LOG, min(MAX_LOG, current + ALPHA * (seen - current)))


class Feedback:
    """The costs and corrections of this process's collections."""

    def __init__(self) -> None:
        self._costs: dict[int, Costs] = {}
        self._corrections: dict[int, dict[str, Correction]] = {}

    def costs(self, coll_id: int) -> Costs:
        found = self._costs.get(coll_id)
        if found is None:
            if len(self._costs) >= MAX_COLLECTIONS:
                self._costs.clear()
            found = self._costs[coll_id] = Costs()
        return found

    def correction(self, coll_id: int, key: str) -> Correction:
        shapes = self._corrections.get(coll_id)
        if shapes is None:
            if len(self._corrections) >= MAX_COLLECTIONS:
                self._corrections.clear()
            shapes = self._corrections[coll_id] = {}
        found = shapes.get(key)
        if found is None:
            if len(shapes) >= MAX_SHAPES:
                shapes.clear()
            found = shapes[key] = Correction()
        return found

    def forget(self, coll_id: int) -> None:
        self._costs.pop(coll_id, None)
        self._corrections.pop(coll_id, None)

    def exact(self, coll_id: int, key: str | None, estimated: float | None, matches: int, ms: float, scanned: int) -> None:
        """An exact plan compared ``matches`` points (filtering ``scanned`` rows without an index)
        in ``ms``; ``estimated``: the matches the planner expected before its correction."""
        costs = self.costs(coll_id)
        units = matches + SCAN_SHARE * scanned
        if units >= MIN_UNITS:
            costs.exact_unit = costs.exact_unit + ALPHA * (ms / (units + EXACT_FIXED) - costs.exact_unit)
        if key is not None and estimated is not None:
            c = self.correction(coll_id, key)
            c.log_global = _towards(c.log_global, math.log(max(matches, 0.5) / max(estimated, 0.5)))

    def graph(self, coll_id: int, key: str | None, share: float | None, candidates: int, matched: int | None,
              ef: int, ms: float) -> None:
        """A graph plan walked ``ef`` candidates in ``ms``; with ``candidates`` > 0 the filter kept
        ``matched`` of that many, where the planner expected ``share`` of them."""
        costs = self.costs(coll_id)
        if ef >= MIN_UNITS:
            costs.graph_unit = costs.graph_unit + ALPHA * (ms / (ef + GRAPH_FIXED) - costs.graph_unit)
        if key is not None and share and candidates > 0 and matched is not None:
            c = self.correction(coll_id, key)
            seen = max(matched, 0.5) / candidates
            c.log_local = _towards(c.log_local, math.log(seen / share) + c.log_local)
