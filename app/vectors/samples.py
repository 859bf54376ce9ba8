"""Sample vector collections and requests for the shared tests (``app.core.samples``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from app.core.samples import Samples

if TYPE_CHECKING:
    from httpx import AsyncClient


class VectorsSamples(Samples):
    path_params: ClassVar[dict[str, str]] = {"collection": "c1", "point_id": "p1"}
    cross_checked = (
        "POST /v1/{namespace}/vectors/{collection}/points",  # vectors must have the collection's dimension
        "PATCH /v1/{namespace}/vectors/{collection}/points/{point_id}",  # the same
        "POST /v1/{namespace}/vectors/{collection}/search",  # the same, for the query vector
        "PUT /v1/{namespace}/vectors/{collection}",  # each payload field indexed once (unique by a member)
    )
    # POST .../points/delete and .../points/list are also the points `delete` and `list` ({point_id})
    ambiguous_allow = (
        "/v1/{namespace}/vectors/{collection}/points/delete",
        "/v1/{namespace}/vectors/{collection}/points/list",
    )

    async def seed(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.put(f"/v1/{ns}/vectors/c1", json={"vector_size": 3, "distance": "cosine"}))
        self.ok(await http.post(
            f"/v1/{ns}/vectors/c1/points", headers={"Idempotency-Key": "seed"},
            json={"points": [{"id": "p1", "vector": [1, 0, 0], "payload": {"a": 1}}]},
        ))

    async def snapshot(self, http: AsyncClient, ns: str) -> Any:
        collection = await http.get(f"/v1/{ns}/vectors/c1")
        point = await http.get(f"/v1/{ns}/vectors/c1/points/p1", params={"with_vector": "true"})
        collections = await http.get(f"/v1/{ns}/vectors")
        return collection.status_code, collection.json(), point.status_code, point.json(), collections.json()

    async def same_names(self, http: AsyncClient, a: str, b: str) -> None:
        def hits(r: Any) -> list[str]:
            return [h["id"] for h in self.ok(r).json()["results"]]

        self.ok(await http.post(f"/v1/{a}/vectors/c1/points", json={"points": [{"id": "p1", "vector": [0, 1, 0]}]}))
        self.ok(await http.patch(f"/v1/{a}/vectors/c1/points/p1", json={"payload": {"a": 2}}))
        self.ok(await http.post(f"/v1/{a}/vectors/c1/reset"))
        found = hits(await http.post(f"/v1/{b}/vectors/c1/search", json={"vector": [1, 0, 0], "limit": 5}))
        self.expect(found == ["p1"], "b's point still found", found)
        deleted = self.ok(await http.post(f"/v1/{a}/vectors/c1/points/delete", json={"filters": {"a": 1}})).json()
        self.expect(deleted["deleted"] == 0, "a's filtered delete deletes nothing of b's", deleted)
        self.ok(await http.delete(f"/v1/{a}/vectors/c1/points/p1"), 404)
        self.ok(await http.delete(f"/v1/{a}/vectors/c1"))
        point = self.ok(await http.get(f"/v1/{b}/vectors/c1/points/p1")).json()
        self.expect(point["payload"] == {"a": 1}, "b's point unchanged", point)

    async def workload(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.put(f"/v1/{ns}/vectors/v", json={"vector_size": 2, "distance": "cosine", "text_field": "text"}))
        self.ok(await http.post(
            f"/v1/{ns}/vectors/v/points", headers={"Idempotency-Key": "i1"},
            json={"points": [
                {"id": "p", "vector": [1, 0], "payload": {"u": 1, "text": "tea"}},
                {"id": "q", "vector": [0, 1], "payload": {"u": 3}},
            ]},
        ))
        self.ok(await http.post(f"/v1/{ns}/vectors/v/search", json={"vector": [1, 0], "query": "tea", "filters": {"u": 1}}))
        self.ok(await http.post(f"/v1/{ns}/vectors/v/search", json={"vector": [1, 0], "with_vectors": True, "filters": {"u": 1}}))
        self.ok(await http.patch(f"/v1/{ns}/vectors/v/points/p", json={"payload": {"u": 2}}))
        self.ok(await http.get(f"/v1/{ns}/vectors/v/points/p"))
        self.ok(await http.post(f"/v1/{ns}/vectors/v/points/list", json={"filters": {"u": 2}}))
        self.ok(await http.post(f"/v1/{ns}/vectors/v/points/delete", json={"ids": ["p"]}))
        self.ok(await http.delete(f"/v1/{ns}/vectors/v/points/q"))
        self.ok(await http.get(f"/v1/{ns}/vectors"))
        self.ok(await http.get(f"/v1/{ns}/vectors/v"))
        self.ok(await http.post(f"/v1/{ns}/vectors/v/reset"))
        self.ok(await http.delete(f"/v1/{ns}/vectors/v"))

    async def cursors(self, http: AsyncClient, ns: str) -> dict[str, dict[str, str]]:
        for name in ("ca", "cb"):
            self.ok(await http.put(f"/v1/{ns}/vectors/{name}", json={"vector_size": 2, "distance": "l2"}))
        self.ok(await http.post(
            f"/v1/{ns}/vectors/ca/points", json={"points": [{"id": i, "vector": [1.0, 0.0]} for i in "ab"]}
        ))
        collections = self.ok(await http.get(f"/v1/{ns}/vectors", params={"limit": 1})).json()
        points = self.ok(await http.post(f"/v1/{ns}/vectors/ca/points/list", json={"limit": 1})).json()
        return {
            "GET /v1/{namespace}/vectors": {"query.cursor": collections["next_cursor"]},
            "POST /v1/{namespace}/vectors/{collection}/points/list": {"body.cursor": points["next_cursor"]},
        }


SAMPLES = VectorsSamples()
