"""The isolation matrix: every /v1 endpoint, with keys for the wrong namespace, read-only keys and none.

Namespace B is seeded with data in every capability; every operation the OpenAPI document lists
is then sent at B with (1) a key for namespace A, (2) a read-only key for B, (3) no key. B's data
must be exactly the same afterwards: as the API answers it, and row for row in every table the
capabilities declare (``Capability.tables``). Which operations only read is the document's
``x-required-scope``; which capabilities exist is the registry's (``app.capabilities``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.capabilities import BUILTIN
from app.core.capability import Capability
from app.core.db.databases import Databases
from tests.conftest import Backend, Server
from tests.test_migrations import settings_for

CHECKPOINT = {
    "thread_id": "t1", "checkpoint_id": "c1", "checkpoint": {"type": "bytes", "data": "AA=="},
    "channel_versions": {"m": "1"}, "metadata": {"run_id": "r1", "step": 1},
    "blobs": [{"channel": "m", "version": "1", "type": "bytes", "data": "AQ=="}],
}
WRITES = {
    "thread_id": "t1", "checkpoint_id": "c1", "task_id": "task1",
    "writes": [{"idx": 0, "channel": "m", "type": "bytes", "data": "Ag=="}],
}
PARAMS = {"collection": "c1", "key": "k1", "file_id": "f1", "point_id": "p1"}


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    ops = []
    for path, item in spec["paths"].items():
        if not path.startswith("/v1/{namespace}/"):
            continue
        for method, op in item.items():
            if method in ("get", "put", "post", "patch", "delete", "head"):
                ops.append((method.upper(), path, op))
    return ops


def is_read(op: dict[str, Any]) -> bool:
    scope = op["x-required-scope"]
    assert scope.endswith((":read", ":write")), scope
    return scope.endswith(":read")


def request_for(method: str, template: str, op: dict[str, Any], namespace: str) -> dict[str, Any]:
    path = template.replace("{namespace}", namespace)
    for name, value in PARAMS.items():
        path = path.replace("{" + name + "}", value)
    path = re.sub(r"\{[a-z_]+\}", "x1", path)  # a capability's own parameters
    kwargs: dict[str, Any] = {"method": method, "url": path}
    content = op.get("requestBody", {}).get("content", {})
    if "multipart/form-data" in content:
        kwargs["files"] = {"file": ("x.bin", b"evil", "application/octet-stream")}
    elif "application/json" in content:
        kwargs["json"] = {}
    elif method in ("PUT", "POST", "PATCH"):
        kwargs["content"] = b"evil"
    return kwargs


async def seed(http: httpx.AsyncClient, ns: str) -> None:
    assert (await http.put(f"/v1/{ns}/kv/c1/k1", json={"v": "kv"})).is_success
    assert (await http.put(f"/v1/{ns}/records/c1/k1", json={"v": "record"})).is_success
    assert (await http.put(f"/v1/{ns}/files/c1/f1", content=b"file-bytes")).is_success
    assert (await http.put(f"/v1/{ns}/vectors/c1", json={"vector_size": 3, "distance": "cosine"})).is_success
    r = await http.post(
        f"/v1/{ns}/vectors/c1/points", headers={"Idempotency-Key": "seed"},
        json={"points": [{"id": "p1", "vector": [1, 0, 0], "payload": {"a": 1}}]},
    )
    assert r.is_success, r.text
    assert (await http.post(f"/v1/{ns}/checkpoints/put", json=CHECKPOINT)).is_success
    assert (await http.post(f"/v1/{ns}/checkpoints/writes", json=WRITES)).is_success
    # A retention row that is off (0): with keep_latest > 0 the background sweep (every 60 s) could
    # stamp the thread's pruned_at in the middle of the matrix, which compares every stored row.
    assert (await http.put(f"/v1/{ns}/checkpoints/retention", json={"keep_latest": 0})).is_success


async def snapshot(http: httpx.AsyncClient, ns: str) -> dict[str, Any]:
    async def get(url: str, raw: bool = False) -> Any:
        r = await http.get(url)
        return (r.status_code, r.content if raw else r.json())

    async def get_post(url: str, body: dict[str, Any]) -> Any:
        r = await http.post(url, json=body)
        return (r.status_code, r.json())

    return {
        "kv": await get(f"/v1/{ns}/kv/c1"),
        "records": await get(f"/v1/{ns}/records/c1"),
        "file": await get(f"/v1/{ns}/files/c1/f1", raw=True),
        "files": (await http.get(f"/v1/{ns}/files/c1")).json()["items"],
        "collection": await get(f"/v1/{ns}/vectors/c1"),
        "points": await get(f"/v1/{ns}/vectors/c1/points/p1"),
        "checkpoint": await get(f"/v1/{ns}/checkpoints/tuple?thread_id=t1"),
        "checkpoints": await get_post(f"/v1/{ns}/checkpoints/search", {}),
        "retention": await get(f"/v1/{ns}/checkpoints/retention"),
    }


async def make_key(http: httpx.AsyncClient, namespace: str, *scopes: str) -> str:
    r = await http.post("/v1/admin/keys", json={"namespace": namespace, "scopes": list(scopes)})
    assert r.status_code == 201, r.text
    return r.json()["key"]


async def stored_rows(backend: Backend, capabilities: tuple[Capability[Any], ...], ns: str) -> dict[str, list[Any]]:
    """Every row of ``ns`` in every table the capabilities declare, as stored."""
    databases = Databases.open(settings_for(backend))
    out: dict[str, list[Any]] = {}
    try:
        for capability in capabilities:
            async with databases.engine(capability.database).connect() as conn:
                for table in capability.tables:
                    query = select(table).where(table.c.namespace == ns).order_by(*table.primary_key.columns)
                    out[table.name] = [tuple(row) for row in await conn.execute(query)]
    finally:
        await databases.close()
    return out


async def test_isolation_matrix(server: Server, http: httpx.AsyncClient, namespace: str, backend: Backend) -> None:
    await isolation_matrix(server, http, namespace, backend, BUILTIN)


async def isolation_matrix(
    server: Server, http: httpx.AsyncClient, namespace: str, backend: Backend,
    capabilities: tuple[Capability[Any], ...], seed_more: Callable[[str], Awaitable[None]] | None = None,
) -> None:
    """Run the matrix against ``server``, which serves ``capabilities``."""
    ns_a, ns_b = f"{namespace}a", f"{namespace}b"
    for ns in (ns_a, ns_b):
        await seed(http, ns)
        if seed_more is not None:
            await seed_more(ns)
    before = await snapshot(http, ns_b)
    rows_before = await stored_rows(backend, capabilities, ns_b)
    assert all(rows_before.values()), {t: len(r) for t, r in rows_before.items()}  # B has data everywhere
    spec = (await http.get("/openapi.json")).json()
    ops = operations(spec)
    served = {template.split("/")[3] for _, template, _ in ops}
    assert served == {c.name for c in capabilities}, served

    key_a = await make_key(http, ns_a, "*:*")
    reader_b = await make_key(http, ns_b, "*:read")
    outcomes = []
    async with (
        httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {key_a}"}) as as_a,
        httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {reader_b}"}) as as_reader,
        httpx.AsyncClient(base_url=server.url) as anonymous,
    ):
        for method, template, op in ops:
            req = request_for(method, template, op, ns_b)
            r = await as_a.request(**req)
            outcomes.append((method, template, "A-key", r.status_code))
            assert r.status_code == 403, (method, template, r.status_code, r.text)
            assert ns_b not in r.text.replace(req["url"], ""), "a refusal must not describe B's data"

            r = await anonymous.request(**req)
            assert r.status_code == 401, (method, template, r.status_code)

            r = await as_reader.request(**req)
            if is_read(op):
                assert r.status_code != 403, (method, template, r.text)
                assert r.status_code < 500
            else:
                assert r.status_code == 403, (method, template, r.status_code, r.text)
    assert await snapshot(http, ns_b) == before
    assert await stored_rows(backend, capabilities, ns_b) == rows_before
    assert len(outcomes) == len(ops) >= 20


@pytest.mark.parametrize("capability", [c.name for c in BUILTIN])
async def test_same_names_in_two_namespaces_never_meet(http: httpx.AsyncClient, namespace: str, capability: str) -> None:
    """Admin writes the same names in two namespaces; each reads back only its own."""
    a, b = f"{namespace}a", f"{namespace}b"
    await seed(http, a)
    await seed(http, b)
    if capability == "kv":
        await http.put(f"/v1/{a}/kv/c1/k1", json="only-a")
        assert (await http.get(f"/v1/{b}/kv/c1/k1")).json() == {"v": "kv"}
        await http.delete(f"/v1/{a}/kv/c1/k1")
        assert (await http.get(f"/v1/{b}/kv/c1/k1")).status_code == 200
    elif capability == "records":
        await http.post(f"/v1/{a}/records/c1/trim", json={"before": "zzzz"})
        assert [i["key"] for i in (await http.get(f"/v1/{b}/records/c1")).json()["items"]] == ["k1"]
    elif capability == "files":
        await http.put(f"/v1/{a}/files/c1/f1", content=b"only-a")
        assert (await http.get(f"/v1/{b}/files/c1/f1")).content == b"file-bytes"
    elif capability == "checkpoints":
        before = (await http.get(f"/v1/{b}/checkpoints/tuple?thread_id=t1")).json()
        await http.post(f"/v1/{a}/checkpoints/put", json={**CHECKPOINT, "checkpoint_id": "c2", "parent_checkpoint_id": "c1"})
        await http.post(f"/v1/{a}/checkpoints/prune", json={"thread_ids": ["t1"], "strategy": "keep_latest"})
        await http.post(f"/v1/{a}/checkpoints/runs/delete", json={"run_ids": ["r1"]})
        await http.post(f"/v1/{a}/checkpoints/threads/copy", json={"source_thread_id": "t1", "target_thread_id": "t2"})
        await http.delete(f"/v1/{a}/checkpoints/threads", params={"thread_id": "t1"})
        assert (await http.get(f"/v1/{a}/checkpoints/tuple?thread_id=t1")).status_code == 404
        assert (await http.get(f"/v1/{b}/checkpoints/tuple?thread_id=t1")).json() == before
        listed = (await http.post(f"/v1/{b}/checkpoints/search", json={"filter": {"run_id": "r1"}})).json()
        assert [(i["thread_id"], i["checkpoint_id"]) for i in listed["items"]] == [("t1", "c1")]
        assert (await http.get(f"/v1/{b}/checkpoints/tuple?thread_id=t2")).status_code == 404
    elif capability == "vectors":
        await http.post(f"/v1/{a}/vectors/c1/reset")
        hits = (await http.post(f"/v1/{b}/vectors/c1/search", json={"vector": [1, 0, 0], "limit": 5})).json()
        assert [h["id"] for h in hits["results"]] == ["p1"]
        deleted = (await http.post(f"/v1/{a}/vectors/c1/points/delete", json={"filters": {"a": 1}})).json()
        assert deleted["deleted"] == 0
        assert (await http.get(f"/v1/{b}/vectors/c1/points/p1")).status_code == 200
    else:
        pytest.fail(f"write a same-names check for the {capability} capability here")
