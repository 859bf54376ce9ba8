"""Sample counters and requests for the shared tests (``app.core.samples``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from app.core.samples import Samples

if TYPE_CHECKING:
    from httpx import AsyncClient


class CountersSamples(Samples):
    path_params: ClassVar[dict[str, str]] = {"name": "c1"}
    cross_checked = (
        "POST /v1/{namespace}/counters/{name}/increment",  # the sum must stay within 64 bits (stored state)
    )

    async def seed(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.post(f"/v1/{ns}/counters/c1/increment", json={"n": 2}))

    async def snapshot(self, http: AsyncClient, ns: str) -> Any:
        one = await http.get(f"/v1/{ns}/counters/c1")
        listed = await http.get(f"/v1/{ns}/counters")
        return one.status_code, one.json(), listed.status_code, listed.json()

    async def same_names(self, http: AsyncClient, a: str, b: str) -> None:
        self.ok(await http.post(f"/v1/{a}/counters/c1/increment", json={"n": 40}))
        self.expect((await http.get(f"/v1/{b}/counters/c1")).json()["value"] == 2, "b's c1 unchanged")
        self.ok(await http.delete(f"/v1/{a}/counters/c1"))
        self.expect((await http.get(f"/v1/{b}/counters/c1")).json()["value"] == 2, "b's c1 kept")

    async def workload(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.post(f"/v1/{ns}/counters/hits/increment", json={"n": 5}))
        self.ok(await http.post(f"/v1/{ns}/counters/misses/increment", json={}))
        self.ok(await http.get(f"/v1/{ns}/counters/hits"))
        self.ok(await http.get(f"/v1/{ns}/counters", params={"limit": 1}))
        self.ok(await http.delete(f"/v1/{ns}/counters/hits"))

    async def cursors(self, http: AsyncClient, ns: str) -> dict[str, dict[str, str]]:
        for name in ("a", "b"):
            self.ok(await http.post(f"/v1/{ns}/counters/{name}/increment", json={}))
        page = self.ok(await http.get(f"/v1/{ns}/counters", params={"limit": 1})).json()
        return {"GET /v1/{namespace}/counters": {"query.cursor": page["next_cursor"]}}


SAMPLES = CountersSamples()
