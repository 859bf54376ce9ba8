"""Sample kv data and requests for the shared tests (``app.core.samples``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from app.core.samples import Samples

if TYPE_CHECKING:
    from httpx import AsyncClient


class KvSamples(Samples):
    path_params: ClassVar[dict[str, str]] = {"collection": "c1", "key": "k1"}
    cross_checked = (
        "GET /v1/{namespace}/kv/{collection}",  # a cursor continues the list it was made for (same prefix)
        "POST /v1/{namespace}/kv/{collection}",  # each key once in a batch (unique by a member)
    )
    ambiguous_allow = (  # POST routes whose path is also a {key} resource
        "/v1/{namespace}/kv/{collection}/get",
        "/v1/{namespace}/kv/{collection}/delete",
    )

    async def seed(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.put(f"/v1/{ns}/kv/c1/k1", json={"v": "kv"}))

    async def snapshot(self, http: AsyncClient, ns: str) -> Any:
        item = await http.get(f"/v1/{ns}/kv/c1/k1")
        listed = await http.get(f"/v1/{ns}/kv/c1")
        return item.status_code, item.json(), item.headers.get("etag"), listed.status_code, listed.json()

    async def same_names(self, http: AsyncClient, a: str, b: str) -> None:
        self.ok(await http.put(f"/v1/{a}/kv/c1/k1", json="only-a"))
        self.expect((await http.get(f"/v1/{b}/kv/c1/k1")).json() == {"v": "kv"}, "b's k1 unchanged")
        self.ok(await http.delete(f"/v1/{a}/kv/c1/k1"))
        self.ok(await http.get(f"/v1/{b}/kv/c1/k1"))

    async def workload(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.put(f"/v1/{ns}/kv/c/k", json={"a": 1}))
        etag = self.ok(await http.get(f"/v1/{ns}/kv/c/k")).headers["etag"]
        self.ok(await http.put(f"/v1/{ns}/kv/c/k", json={"a": 2}, headers={"If-Match": etag}))
        self.ok(await http.put(f"/v1/{ns}/kv/c/t", json=1, params={"ttl_seconds": 60}))
        self.ok(await http.get(f"/v1/{ns}/kv/c", params={"prefix": "k", "limit": 1}))
        self.ok(await http.delete(f"/v1/{ns}/kv/c/k"))
        self.ok(await http.post(f"/v1/{ns}/kv/c", json={"items": [{"key": "m1", "value": 1}, {"key": "m2", "value": 2}]}))
        self.ok(await http.post(f"/v1/{ns}/kv/c/get", json={"keys": ["m1", "m2", "t"]}))
        self.ok(await http.post(f"/v1/{ns}/kv/c/delete", json={"keys": ["m1", "m2"]}))

    async def cursors(self, http: AsyncClient, ns: str) -> dict[str, dict[str, str]]:
        for key in ("a", "b"):
            self.ok(await http.put(f"/v1/{ns}/kv/c/{key}", json=1))
        page = self.ok(await http.get(f"/v1/{ns}/kv/c", params={"limit": 1})).json()
        return {"GET /v1/{namespace}/kv/{collection}": {"query.cursor": page["next_cursor"]}}


SAMPLES = KvSamples()
