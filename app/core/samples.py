"""What the shared tests ask of a capability, kept with it: sample data and the requests that use it.

Each capability's ``samples.py`` subclasses ``Samples`` and its descriptor names an instance
(``Capability.samples``). The shared tests (``tests/capability_checks.py`` lists them) call it for
every capability a gateway serves, through a real HTTP client (httpx, a test dependency: typed
here only). Rule: a method a capability does not override fails those tests with what to write
(``MissingSample``), never skips them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from httpx import AsyncClient, Response


class MissingSample(NotImplementedError):
    """A shared test needs a part of a capability's samples that it does not define."""


class SampleFailed(AssertionError):
    """A sample request was not answered as the capability's samples expect."""


_WHAT = {
    "seed": "async def seed(self, http, ns) -> None: write sample data in namespace `ns`, at least one row "
    "in every table of Capability.tables, naming things as path_params says",
    "snapshot": "async def snapshot(self, http, ns) -> object: what the API answers about the seed of `ns` "
    "(read every item it wrote), comparable with ==",
    "same_names": "async def same_names(self, http, a, b) -> None: with both namespaces seeded, write and "
    "delete in `a` through every writing route, and check that `b`'s same names read back unchanged",
    "workload": "async def workload(self, http, ns) -> None: call every route of the capability in `ns` "
    "(each at least once, answered below 400 or 404) so that every table is touched",
    "cursors": "async def cursors(self, http, ns) -> dict[str, dict[str, str]]: for every list that takes "
    "a `cursor`, a real next_cursor of a second page in `ns`, by operation "
    '("GET /v1/{namespace}/...") and parameter ("query.cursor" or "body.cursor")',
}


class Samples:
    """A capability's sample data and requests, for the isolation matrix, the same-names check,
    the scoping check and schemathesis. Subclass it in the capability's ``samples.py``."""

    path_params: ClassVar[Mapping[str, str]] = {}
    """Path parameters naming what ``seed`` wrote (``{"collection": "c1", ...}``): the isolation
    matrix aims its refused requests at them, so each refusal is tried on data that exists."""

    cross_checked: ClassVar[tuple[str, ...]] = ()
    """Operations ("PUT /v1/{namespace}/...") where a body the schema allows can still be refused
    by a rule across fields or against stored state: schemathesis does not expect them to
    accept every schema-valid body (each entry says which rule, in a comment)."""

    nul_refused: ClassVar[tuple[str, ...]] = ()
    """Operations taking free-form JSON whose strings may not hold U+0000 (no JSON Schema can say
    so of an open object): schemathesis generates no NUL for them."""

    ambiguous_allow: ClassVar[tuple[str, ...]] = ()
    """Paths of routes that are also another route's resource (``.../trim`` is also a record
    ``{key}``): their ``Allow`` header lists both, which schemathesis is told to accept."""

    async def seed(self, http: AsyncClient, ns: str) -> None:
        raise self.missing("seed")

    async def snapshot(self, http: AsyncClient, ns: str) -> object:
        raise self.missing("snapshot")

    async def same_names(self, http: AsyncClient, a: str, b: str) -> None:
        raise self.missing("same_names")

    async def workload(self, http: AsyncClient, ns: str) -> None:
        raise self.missing("workload")

    async def cursors(self, http: AsyncClient, ns: str) -> dict[str, dict[str, str]]:
        raise self.missing("cursors")

    # --- for the shared tests ---------------------------------------------------------------

    def defines(self, name: str) -> bool:
        return getattr(type(self), name) is not getattr(Samples, name)

    def require(self, capability: str, *names: str) -> None:
        """Raise ``MissingSample`` naming what to write unless every one of ``names`` is defined."""
        missing = [name for name in names if not self.defines(name)]
        if missing:
            raise self.missing(*missing, capability=capability)

    def missing(self, *names: str, capability: str | None = None) -> MissingSample:
        where = type(self).__name__ if type(self) is not Samples else "a subclass of app.core.samples.Samples"
        lines = "\n".join(f"  {_WHAT[name]}" for name in names)
        whose = f"capability {capability!r}" if capability else type(self).__name__
        return MissingSample(
            f"{whose} has no {', '.join(names)} in its samples (Capability.samples): "
            f"write in {where}, in the capability's samples.py:\n{lines}"
        )

    # --- helpers for the samples themselves ---------------------------------------------------

    @staticmethod
    def ok(response: Response, *also: int) -> Response:
        """``response`` if it is a success (or one of the statuses ``also``), else ``SampleFailed``."""
        if not (response.is_success or response.status_code in also):
            request = response.request
            raise SampleFailed(f"{request.method} {request.url}: {response.status_code} {response.text[:500]}")
        return response

    @staticmethod
    def expect(condition: bool, what: str, *seen: Any) -> None:
        """``SampleFailed`` saying ``what`` was expected (and what was ``seen``) unless ``condition``."""
        if not condition:
            raise SampleFailed(f"{what}: {seen!r}" if seen else what)


NO_SAMPLES = Samples()
"""A capability's samples until it defines its own: every shared test fails saying what to write."""
