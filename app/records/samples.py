"""Sample records data and requests for the shared tests (``app.core.samples``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from app.core.samples import Samples

if TYPE_CHECKING:
    from httpx import AsyncClient


class RecordsSamples(Samples):
    path_params: ClassVar[dict[str, str]] = {"collection": "c1", "key": "k1"}
    cross_checked = (
        "GET /v1/{namespace}/records/{collection}",  # a cursor continues the list it was made for (same order)
    )
    # POST .../trim is also the record `trim` (GET/PUT/DELETE): its Allow header lists both
    ambiguous_allow = ("/v1/{namespace}/records/{collection}/trim",)

    async def seed(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.put(f"/v1/{ns}/records/c1/k1", json={"v": "record"}))

    async def snapshot(self, http: AsyncClient, ns: str) -> Any:
        item = await http.get(f"/v1/{ns}/records/c1/k1")
        listed = await http.get(f"/v1/{ns}/records/c1")
        return item.status_code, item.json(), listed.status_code, listed.json()

    async def same_names(self, http: AsyncClient, a: str, b: str) -> None:
        self.ok(await http.put(f"/v1/{a}/records/c1/k1", json="only-a"))
        self.ok(await http.post(f"/v1/{a}/records/c1", json={"records": [{"key": "k1", "value": 1}]}))
        self.ok(await http.post(f"/v1/{a}/records/c1/trim", json={"before": "zzzz"}))
        self.ok(await http.delete(f"/v1/{a}/records/c1/k1"))
        listed = (await http.get(f"/v1/{b}/records/c1")).json()["items"]
        self.expect([(i["key"], i["value"]) for i in listed] == [("k1", {"v": "record"})], "b's records unchanged", listed)

    async def workload(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.put(f"/v1/{ns}/records/h/001", json={"m": 1}))
        self.ok(await http.post(
            f"/v1/{ns}/records/h", json={"records": [{"key": "002", "value": 2}, {"key": "003", "value": 3}]}
        ))
        self.ok(await http.get(f"/v1/{ns}/records/h", params={"order": "desc", "limit": 2}))
        self.ok(await http.get(f"/v1/{ns}/records/h/002"))
        self.ok(await http.post(f"/v1/{ns}/records/h/trim", json={"before": "002"}))
        self.ok(await http.post(f"/v1/{ns}/records/h/trim", json={"keep_last": 1}))
        self.ok(await http.delete(f"/v1/{ns}/records/h/003"))

    async def cursors(self, http: AsyncClient, ns: str) -> dict[str, dict[str, str]]:
        for key in ("a", "b"):
            self.ok(await http.put(f"/v1/{ns}/records/c/{key}", json=1))
        page = self.ok(await http.get(f"/v1/{ns}/records/c", params={"limit": 1})).json()
        return {"GET /v1/{namespace}/records/{collection}": {"query.cursor": page["next_cursor"]}}


SAMPLES = RecordsSamples()
