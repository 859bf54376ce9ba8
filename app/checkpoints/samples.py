"""Sample checkpoint threads and requests for the shared tests (``app.core.samples``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.core.samples import Samples

if TYPE_CHECKING:
    from httpx import AsyncClient

CHECKPOINT = {
    "thread_id": "t1", "checkpoint_id": "c1", "checkpoint": {"type": "bytes", "data": "AA=="},
    "channel_versions": {"m": "1"}, "metadata": {"run_id": "r1", "step": 1},
    "blobs": [{"channel": "m", "version": "1", "type": "bytes", "data": "AQ=="}],
}
WRITES = {
    "thread_id": "t1", "checkpoint_id": "c1", "task_id": "task1",
    "writes": [{"idx": 0, "channel": "m", "type": "bytes", "data": "Ag=="}],
}


class CheckpointsSamples(Samples):
    cross_checked = (
        "POST /v1/{namespace}/checkpoints/threads/copy",  # the target thread differs from the source
        "POST /v1/{namespace}/checkpoints/search",  # a cursor continues the list it was made for (thread, filter)
    )
    # Checkpoint metadata is free-form JSON that no string in may hold U+0000 (PostgreSQL's JSONB
    # cannot store it; both backends refuse it with a 422 naming the field).
    nul_refused = ("POST /v1/{namespace}/checkpoints/put",)

    async def seed(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.post(f"/v1/{ns}/checkpoints/put", json=CHECKPOINT))
        self.ok(await http.post(f"/v1/{ns}/checkpoints/writes", json=WRITES))
        # A retention row that is off (0): with keep_latest > 0 the background sweep (every 60 s)
        # could stamp the thread's pruned_at while a test compares every stored row.
        self.ok(await http.put(f"/v1/{ns}/checkpoints/retention", json={"keep_latest": 0}))

    async def snapshot(self, http: AsyncClient, ns: str) -> Any:
        latest = await http.get(f"/v1/{ns}/checkpoints/tuple", params={"thread_id": "t1"})
        listed = await http.post(f"/v1/{ns}/checkpoints/search", json={})
        retention = await http.get(f"/v1/{ns}/checkpoints/retention")
        return latest.status_code, latest.json(), listed.status_code, listed.json(), retention.json()

    async def same_names(self, http: AsyncClient, a: str, b: str) -> None:
        before = self.ok(await http.get(f"/v1/{b}/checkpoints/tuple", params={"thread_id": "t1"})).json()
        self.ok(await http.post(
            f"/v1/{a}/checkpoints/put", json={**CHECKPOINT, "checkpoint_id": "c2", "parent_checkpoint_id": "c1"}
        ))
        self.ok(await http.post(f"/v1/{a}/checkpoints/writes", json={**WRITES, "task_id": "task2"}))
        self.ok(await http.put(f"/v1/{a}/checkpoints/retention", json={"thread_id": "t1", "keep_latest": 1}))
        self.ok(await http.post(f"/v1/{a}/checkpoints/prune", json={"thread_ids": ["t1"], "strategy": "keep_latest"}))
        self.ok(await http.post(f"/v1/{a}/checkpoints/runs/delete", json={"run_ids": ["r1"]}))
        self.ok(await http.post(
            f"/v1/{a}/checkpoints/threads/copy", json={"source_thread_id": "t1", "target_thread_id": "t2"}
        ))
        self.ok(await http.delete(f"/v1/{a}/checkpoints/threads", params={"thread_id": "t1"}))
        gone = await http.get(f"/v1/{a}/checkpoints/tuple", params={"thread_id": "t1"})
        self.expect(gone.status_code == 404, "a's thread deleted", gone.status_code)
        after = self.ok(await http.get(f"/v1/{b}/checkpoints/tuple", params={"thread_id": "t1"})).json()
        self.expect(after == before, "b's thread unchanged", after)
        listed = self.ok(await http.post(f"/v1/{b}/checkpoints/search", json={"filter": {"run_id": "r1"}})).json()
        found = [(i["thread_id"], i["checkpoint_id"]) for i in listed["items"]]
        self.expect(found == [("t1", "c1")], "b's checkpoints unchanged", found)
        copied = await http.get(f"/v1/{b}/checkpoints/tuple", params={"thread_id": "t2"})
        self.expect(copied.status_code == 404, "a's copy is not in b", copied.status_code)
        retention = self.ok(await http.get(f"/v1/{b}/checkpoints/retention", params={"thread_id": "t1"})).json()
        self.expect(retention.get("keep_latest") is None, "b's thread has no retention of its own", retention)

    async def workload(self, http: AsyncClient, ns: str) -> None:
        blob = {"channel": "m", "version": "1", "type": "bytes", "data": "AQ=="}
        for cid, parent in (("c1", None), ("c2", "c1")):
            self.ok(await http.post(f"/v1/{ns}/checkpoints/put", json={
                "thread_id": "t", "checkpoint_id": cid, "parent_checkpoint_id": parent,
                "checkpoint": {"type": "bytes", "data": "AA=="}, "channel_versions": {"m": "1"},
                "metadata": {"run_id": cid, "step": 1}, "blobs": [blob],
            }))
        self.ok(await http.post(f"/v1/{ns}/checkpoints/writes", json={
            "thread_id": "t", "checkpoint_id": "c2", "task_id": "k",
            "writes": [{"idx": 0, "channel": "m", "type": "b", "data": "AA=="}],
        }))
        self.ok(await http.get(f"/v1/{ns}/checkpoints/tuple", params={"thread_id": "t"}))
        self.ok(await http.post(f"/v1/{ns}/checkpoints/search", json={"thread_id": "t", "filter": {"step": 1}, "limit": 1}))
        self.ok(await http.post(f"/v1/{ns}/checkpoints/search", json={"filter": {"run_id": "c1"}}))
        self.ok(await http.post(
            f"/v1/{ns}/checkpoints/threads/copy", json={"source_thread_id": "t", "target_thread_id": "u"}
        ))
        self.ok(await http.post(f"/v1/{ns}/checkpoints/prune", json={"thread_ids": ["t"], "strategy": "keep_latest"}))
        self.ok(await http.post(f"/v1/{ns}/checkpoints/runs/delete", json={"run_ids": ["c2"]}))
        self.ok(await http.put(f"/v1/{ns}/checkpoints/retention", json={"keep_latest": 3}))
        self.ok(await http.put(f"/v1/{ns}/checkpoints/retention", json={"thread_id": "t", "idle_ttl_seconds": 60}))
        self.ok(await http.get(f"/v1/{ns}/checkpoints/retention"))
        self.ok(await http.get(f"/v1/{ns}/checkpoints/retention", params={"thread_id": "t"}))
        self.ok(await http.post(f"/v1/{ns}/checkpoints/prune", json={"thread_ids": ["u"], "strategy": "delete"}))
        self.ok(await http.delete(f"/v1/{ns}/checkpoints/threads", params={"thread_id": "t"}))

    async def cursors(self, http: AsyncClient, ns: str) -> dict[str, dict[str, str]]:
        for checkpoint_id in ("1ef4f797-8335-6428-8001-8a1503f9b875", "1ef4f797-8335-6428-8002-8a1503f9b875"):
            self.ok(await http.post(f"/v1/{ns}/checkpoints/put", json={
                "thread_id": "t", "checkpoint_id": checkpoint_id,
                "checkpoint": {"type": "msgpack", "data": "kqNmb28="},
            }))
        page = self.ok(await http.post(f"/v1/{ns}/checkpoints/search", json={"thread_id": "t", "limit": 1})).json()
        return {"POST /v1/{namespace}/checkpoints/search": {"body.cursor": page["next_cursor"]}}


SAMPLES = CheckpointsSamples()
