"""Bounded shares of a pool for one class of long requests, taken without waiting.

A download from the database backend holds a pooled connection for as long as its client reads.
``Slots`` caps how many such requests run at once in this process, and how many of them one
namespace may hold, so that slow or stuck readers of one namespace (or of all of them) never take
the connections every other request needs: past a cap the request is refused at once with 503 and
``Retry-After``, before it takes a connection.
"""

from __future__ import annotations

from app.core.errors import ProblemError, ServiceUnavailable


class Slots:
    def __init__(
        self, what: str, total: int, per_namespace: int, refusal: type[ProblemError] = ServiceUnavailable
    ) -> None:
        self.what = what
        self.total = max(1, total)
        self.per_namespace = max(1, min(per_namespace, self.total))
        self.held = 0
        self._by_namespace: dict[str, int] = {}
        self._refusal = refusal

    def take(self, namespace: str, what: str | None = None) -> Slot:
        """A slot for ``namespace``, or ``refusal`` (503 unless told) when this process or this
        namespace has none left."""
        mine = self._by_namespace.get(namespace, 0)
        if self.held >= self.total or mine >= self.per_namespace:
            scope = f"this namespace (at most {self.per_namespace} at once)" if mine >= self.per_namespace else "the server"
            raise self._refusal(
                f"too many {what or self.what} in progress for {scope}; retry shortly", headers={"Retry-After": "1"}
            )
        self.held += 1
        self._by_namespace[namespace] = mine + 1
        return Slot(self, namespace)

    def _give_back(self, namespace: str) -> None:
        self.held -= 1
        left = self._by_namespace[namespace] - 1
        if left:
            self._by_namespace[namespace] = left
        else:
            del self._by_namespace[namespace]


class Slot:
    """One taken slot; ``release()`` is idempotent."""

    __slots__ = ("_namespace", "_slots")

    def __init__(self, slots: Slots, namespace: str) -> None:
        self._slots: Slots | None = slots
        self._namespace = namespace

    def release(self) -> None:
        if self._slots is not None:
            self._slots._give_back(self._namespace)
            self._slots = None
