"""Sample store items and requests for the shared tests (``app.core.samples``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.core.samples import Samples

if TYPE_CHECKING:
    from httpx import AsyncClient

PUT = {"op": "put", "namespace": ["m"], "key": "k1", "value": {"v": "store"}, "vectors": [{"field": "$", "vector": [1, 0]}]}
READS = [{"op": "get", "namespace": ["m"], "key": "k1"}, {"op": "search", "query_vector": [1, 0]}, {"op": "list_namespaces"}]
PLATFORM = "store/langgraph/store"  # LangGraph Platform's API, under the store's own path


class StoreSamples(Samples):
    # the store's limits are settings (labels per namespace, bytes per label and namespace, operations
    # per batch, vectors per item, dimensions, a page's limit and offset), its filter keys a rule on
    # the keys of an open object, and an item's vectors all of one dimension
    cross_checked = (
        "POST /v1/{namespace}/store/batch",
        "POST /v1/{namespace}/store/read",
        "POST /v1/{namespace}/store/get",
        "POST /v1/{namespace}/store/namespaces/delete",
        f"PUT /v1/{{namespace}}/{PLATFORM}/items",
        f"GET /v1/{{namespace}}/{PLATFORM}/items",
        f"DELETE /v1/{{namespace}}/{PLATFORM}/items",
        f"POST /v1/{{namespace}}/{PLATFORM}/items/search",
        f"POST /v1/{{namespace}}/{PLATFORM}/namespaces",
    )

    async def seed(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.post(f"/v1/{ns}/store/batch", json={"ops": [PUT]}))

    async def snapshot(self, http: AsyncClient, ns: str) -> Any:
        return self.ok(await http.post(f"/v1/{ns}/store/read", json={"ops": READS})).json()

    async def same_names(self, http: AsyncClient, a: str, b: str) -> None:
        before = await self.snapshot(http, b)
        self.ok(await http.post(f"/v1/{a}/store/batch", json={"ops": [{**PUT, "value": {"v": "only-a"}}]}))
        self.ok(await http.post(f"/v1/{a}/store/namespaces/delete", json={"prefix": []}))
        gone = await self.snapshot(http, a)
        self.expect(gone["results"][0] is None, "a's item deleted", gone)
        self.ok(await http.put(f"/v1/{a}/{PLATFORM}/items", json={"namespace": ["m"], "key": "k1", "value": {}}))
        self.ok(await http.request("DELETE", f"/v1/{a}/{PLATFORM}/items", json={"namespace": ["m"], "key": "k1"}))
        self.ok(await http.post(f"/v1/{a}/store/sweep"))
        after = await self.snapshot(http, b)
        self.expect(after == before, "b's items unchanged", before, after)

    async def workload(self, http: AsyncClient, ns: str) -> None:
        put = {"op": "put", "namespace": ["m", "n"], "key": "k", "value": {"a": 1}, "ttl": 5,
               "vectors": [{"field": "a", "vector": [1, 0]}]}
        self.ok(await http.post(f"/v1/{ns}/store/batch", json={
            "ops": [put, {"op": "put", "namespace": ["m"], "key": "x", "value": None}],
        }))
        reads = [
            {"op": "get", "namespace": ["m", "n"], "key": "k", "refresh_ttl": True},
            {"op": "search", "namespace_prefix": ["m"], "filter": {"a": {"$gte": 1}}, "query_vector": [1, 0]},
            {"op": "search", "namespace_prefix": ["m"], "filter": {"a": 1}, "refresh_ttl": True},
            {"op": "list_namespaces", "match_conditions": [{"match_type": "suffix", "path": ["*"]}], "max_depth": 1},
        ]
        self.ok(await http.post(f"/v1/{ns}/store/batch", json={"ops": reads, "omit_expired": True}))
        self.ok(await http.post(f"/v1/{ns}/store/read", json={"ops": reads}))
        self.ok(await http.post(f"/v1/{ns}/store/get", json={"ops": [reads[0]] * 2, "omit_expired": True}))
        self.ok(await http.get(f"/v1/{ns}/store/langgraph/ok"))
        self.ok(await http.put(f"/v1/{ns}/{PLATFORM}/items", json={"namespace": ["p"], "key": "k", "value": {"b": 2}}))
        self.ok(await http.get(f"/v1/{ns}/{PLATFORM}/items", params={"namespace": "p", "key": "k"}))
        self.ok(await http.post(f"/v1/{ns}/{PLATFORM}/items/search", json={"namespace_prefix": ["p"], "filter": {"b": 2}}))
        self.ok(await http.post(f"/v1/{ns}/{PLATFORM}/namespaces", json={"prefix": ["p"], "max_depth": 2}))
        self.ok(await http.request("DELETE", f"/v1/{ns}/{PLATFORM}/items", json={"namespace": ["p"], "key": "k"}))
        self.ok(await http.post(f"/v1/{ns}/store/sweep"))
        self.ok(await http.post(f"/v1/{ns}/store/namespaces/delete", json={"prefix": ["m"]}))

    async def cursors(self, http: AsyncClient, ns: str) -> dict[str, dict[str, str]]:
        return {}  # the store pages by limit and offset, as LangGraph's BaseStore does


SAMPLES = StoreSamples()
