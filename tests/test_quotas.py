"""Quotas per namespace on both backends, through a real gateway process: a write that would pass
a quota is a 507 naming it and changes nothing (mid-batch too); a namespace at its quota still
reads and deletes; made-up retention threads are bounded by the checkpoints' items quota; usage
is exact after a SIGKILL during a write storm, and after reconciliation."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import LargeBinary, cast, func, select, text
from sqlalchemy.ext.asyncio import create_async_engine
from storage_gateway_client import GatewayClient, QuotaExceeded

from app.kv.models import kv_entries
from app.records.models import records
from tests.conftest import ADMIN_KEY, Backend, Server, run_cli, start_server, stop_server

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def ns() -> str:
    return f"q{uuid.uuid4().hex[:10]}"


async def set_quota(http: httpx.AsyncClient, namespace: str, capability: str, **limits: int) -> None:
    r = await http.put(f"/v1/admin/quotas/{namespace}/{capability}", json=limits, headers=ADMIN)
    assert r.status_code == 200, r.text


async def usage(http: httpx.AsyncClient, namespace: str) -> dict[str, Any]:
    r = await http.get(f"/v1/{namespace}/usage", headers=ADMIN)
    assert r.status_code == 200, r.text
    caps: dict[str, Any] = r.json()["capabilities"]
    return caps


def refused(r: httpx.Response, quota: str) -> None:
    assert r.status_code == 507, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["code"] == "quota_exceeded" and quota in body["detail"], body
    assert body["errors"][0]["quota"] == quota


@pytest.fixture
async def http(server: Server) -> Any:
    async with httpx.AsyncClient(base_url=server.url, headers=ADMIN, timeout=30) as client:
        yield client


async def test_quota_reached_mid_batch_changes_nothing(http: httpx.AsyncClient) -> None:
    a = ns()
    await set_quota(http, a, "kv", max_items=3)
    assert (await http.put(f"/v1/{a}/kv/c/k0", json="old")).status_code == 204
    items = [{"key": f"k{i}", "value": "new"} for i in range(5)]  # k0 is replaced, k1..k4 are new: 5 items
    refused(await http.post(f"/v1/{a}/kv/c", json={"items": items}), "kv.items")
    assert (await http.get(f"/v1/{a}/kv/c/k0")).json() == "old"
    assert (await http.get(f"/v1/{a}/kv/c/k1")).status_code == 404
    assert (await usage(http, a))["kv"] | {} == {"items": 1, "bytes": 5, "max_items": 3, "max_bytes": None}

    await set_quota(http, a, "records", max_bytes=100)
    batch = [{"key": f"r{i}", "value": "x" * 30} for i in range(4)]  # 32 bytes each: the 4th passes 100
    refused(await http.post(f"/v1/{a}/records/c", json={"records": batch}), "records.bytes")
    assert (await http.get(f"/v1/{a}/records/c")).json()["items"] == []
    assert (await http.post(f"/v1/{a}/records/c", json={"records": batch[:3]})).status_code == 200
    assert (await usage(http, a))["records"]["bytes"] == 96


async def test_at_quota_reads_and_deletes_still_work(http: httpx.AsyncClient) -> None:
    a = ns()
    await set_quota(http, a, "kv", max_items=2, max_bytes=1000)
    for k in ("a", "b"):
        assert (await http.put(f"/v1/{a}/kv/c/{k}", json="v" * 10)).status_code == 204
    refused(await http.put(f"/v1/{a}/kv/c/c", json="v"), "kv.items")
    refused(await http.put(f"/v1/{a}/kv/c/a", json="v" * 2000), "kv.bytes")  # a replacement that grows
    assert (await http.put(f"/v1/{a}/kv/c/a", json="v")).status_code == 204  # one that shrinks
    assert (await http.get(f"/v1/{a}/kv/c/b")).json() == "v" * 10
    assert len((await http.get(f"/v1/{a}/kv/c")).json()["items"]) == 2
    # a lowered quota below what is stored: reads and deletes still work, adding does not
    await set_quota(http, a, "kv", max_items=1)
    assert (await http.get(f"/v1/{a}/kv/c/a")).status_code == 200
    assert (await http.delete(f"/v1/{a}/kv/c/b")).status_code == 204
    assert (await usage(http, a))["kv"]["items"] == 1
    refused(await http.put(f"/v1/{a}/kv/c/d", json="v"), "kv.items")
    assert (await http.delete(f"/v1/admin/quotas/{a}/kv")).status_code == 204  # back to the default: none
    assert (await http.put(f"/v1/{a}/kv/c/d", json="v")).status_code == 204
    assert (await http.put(f"/v1/{ns()}/kv/c/x", json="v")).status_code == 204  # others are not limited by it
    # through the Python client: the refusal names its quota; the usage
    async with GatewayClient(str(http.base_url), namespace=a, api_key=ADMIN_KEY) as client:
        await set_quota(http, a, "kv", max_items=1)
        with pytest.raises(QuotaExceeded) as refusal:
            await client.kv.set("c", "e", "v")
        assert refusal.value.quota == "kv.items" and refusal.value.status_code == 507
        assert (await client.usage())["kv"] == {"items": 2, "bytes": 6, "max_items": 1, "max_bytes": None}


async def test_usage_is_read_with_any_read_scope_of_the_namespace(server: Server, http: httpx.AsyncClient) -> None:
    a, b = ns(), ns()
    keys = {}
    for name, namespace, scope in (("reader", a, "files:read"), ("other", b, "*:*")):
        r = await http.post("/v1/admin/keys", json={"namespace": namespace, "scopes": [scope]})
        keys[name] = {"Authorization": f"Bearer {r.json()['key']}"}
    assert (await http.put(f"/v1/{a}/kv/c/x", json="v")).status_code == 204
    r = await http.get(f"/v1/{a}/usage", headers=keys["reader"])
    assert r.status_code == 200 and r.json()["capabilities"]["kv"]["items"] == 1
    assert (await http.get(f"/v1/{a}/usage", headers=keys["other"])).status_code == 403
    assert (await http.get(f"/v1/{a}/usage", headers={"Authorization": "Bearer nope"})).status_code == 401
    assert (await http.put(f"/v1/admin/quotas/{a}/kv", json={}, headers=keys["reader"])).status_code == 403


async def test_made_up_retention_threads_are_bounded(http: httpx.AsyncClient) -> None:
    a = ns()
    await set_quota(http, a, "checkpoints", max_items=5)
    answers = [
        (await http.put(f"/v1/{a}/checkpoints/retention", json={"thread_id": f"made-up-{i}", "keep_latest": 1})).status_code
        for i in range(8)
    ]
    assert answers == [200] * 5 + [507] * 3
    assert (await usage(http, a))["checkpoints"]["items"] == 5
    # an existing thread's retention is no new item; a thread deleted at the quota (its rows go
    # through the gateway's own ~trash, never refused) makes room for another
    assert (await http.put(f"/v1/{a}/checkpoints/retention", json={"thread_id": "made-up-0", "keep_latest": 2})).status_code == 200
    assert (await http.delete(f"/v1/{a}/checkpoints/threads", params={"thread_id": "made-up-0"})).status_code == 200
    assert (await usage(http, a))["checkpoints"]["items"] == 4
    assert (await http.put(f"/v1/{a}/checkpoints/retention", json={"thread_id": "made-up-9", "keep_latest": 1})).status_code == 200


async def _storm(url: str, namespace: str, stop: asyncio.Event) -> None:
    async def one(worker: int) -> None:
        async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=10) as c:
            i = 0
            while not stop.is_set():
                i += 1
                k = f"w{worker}-{i % 40}"
                try:
                    if i % 7 == 0:
                        await c.delete(f"/v1/{namespace}/kv/c/{k}")
                    elif i % 5 == 0:
                        batch = [{"key": f"{k}-{j}", "value": "y" * (i % 50)} for j in range(20)]
                        await c.post(f"/v1/{namespace}/records/c", json={"records": batch})
                    else:
                        await c.put(f"/v1/{namespace}/kv/c/{k}", json="x" * (i % 300))
                except httpx.TransportError:
                    return  # the gateway was killed

    await asyncio.gather(*(one(w) for w in range(8)))


async def _counted(backend: Backend, namespace: str) -> dict[str, tuple[int, int]]:
    """What the tables hold, counted directly."""
    out = {}
    for cap, db, table in (("kv", "metadata", kv_entries), ("records", "checkpoints", records)):
        engine = create_async_engine(backend.urls[db])
        try:
            length = func.octet_length(table.c.value) if backend.is_postgres else func.length(cast(table.c.value, LargeBinary))
            size = func.coalesce(func.sum(length), 0)
            async with engine.connect() as conn:
                row = (await conn.execute(select(func.count(), size).where(table.c.namespace == namespace))).one()
            out[cap] = (int(row[0]), int(row[1]))
        finally:
            await engine.dispose()
    return out


async def test_usage_exact_after_sigkill_in_a_write_storm(server: Server, backend: Backend, tmp_path: Path) -> None:
    a = ns()
    victim = start_server(backend, tmp_path / "victim.log")
    try:
        stop = asyncio.Event()
        storm = asyncio.create_task(_storm(victim.url, a, stop))
        await asyncio.sleep(1.5)
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.wait()
        stop.set()
        await storm
    finally:
        if victim.process.poll() is None:
            stop_server(victim)
    async with httpx.AsyncClient(base_url=server.url, headers=ADMIN, timeout=30) as http:
        # a COMMIT the killed process had already sent can still land (PostgreSQL's backend for it
        # finishes it): compare once the tables hold still across the usage read
        for _ in range(50):
            counted = await _counted(backend, a)
            before = await usage(http, a)
            if await _counted(backend, a) == counted:
                break
            await asyncio.sleep(0.1)
        assert counted["kv"][0] > 0 and counted["records"][0] > 0
        assert {cap: (before[cap]["items"], before[cap]["bytes"]) for cap in counted} == counted
        # the reconciliation's recount (a page of 7 rows at a time) agrees, and leaves usage as
        # it was; usage made wrong (as writes made with accounting off would) it corrects
        for drift in (0, 5):
            await _drift(backend, a, drift)
            r = await http.post(f"/v1/admin/quotas/{a}", params={"batch": 7})
            assert r.status_code == 200, r.text
            after = await usage(http, a)
            assert {cap: (after[cap]["items"], after[cap]["bytes"]) for cap in counted} == counted


async def _drift(backend: Backend, namespace: str, by: int) -> None:
    engine = create_async_engine(backend.urls["metadata"])
    try:
        async with engine.begin() as conn:
            await conn.execute(text(
                "UPDATE namespace_usage SET items = items + :by, bytes = bytes - :by WHERE namespace = :ns AND shard = "
                "(SELECT min(shard) FROM namespace_usage WHERE namespace = :ns AND capability = 'kv') AND capability = 'kv'"
            ), {"by": by, "ns": namespace})
    finally:
        await engine.dispose()


async def test_quotas_set_by_the_cli_and_files_bytes(server: Server, backend: Backend, http: httpx.AsyncClient) -> None:
    a = ns()
    result = run_cli(backend, "quotas", "set", a, "files", "--max-bytes", "1000", "--max-items", "2")
    assert result.returncode == 0, result.stderr
    assert "files" in result.stdout and "1000" in result.stdout
    assert (await http.put(f"/v1/{a}/files/c/small", content=b"x" * 600)).status_code == 201
    refused(await http.put(f"/v1/{a}/files/c/big", content=b"y" * 600), "files.bytes")
    assert (await http.put(f"/v1/{a}/files/c/small", content=b"z" * 900)).status_code == 200  # replaced: 900 in all
    assert (await http.get(f"/v1/{a}/files/c/small")).content == b"z" * 900
    assert [f["id"] for f in (await http.get(f"/v1/{a}/files/c")).json()["items"]] == ["small"]
    assert (await usage(http, a))["files"] == {"items": 1, "bytes": 900, "max_items": 2, "max_bytes": 1000}
    r = await http.put(f"/v1/{a}/files/c/huge", content=b"h" * 1001)  # larger than the whole quota: before its body
    assert r.status_code == 413 and r.json()["errors"][0]["quota"] == "files.bytes", r.text


async def test_accounting_off_then_on_again_recounts(fresh_backend: Backend, tmp_path: Path) -> None:
    """Off drops the triggers (writes are not counted, no quota holds); on again, the start
    recounts what is stored."""
    from app.core.config import Settings
    from app.main import create_app

    async def gateway(accounting: bool, *keys: str) -> dict[str, Any]:
        settings = Settings(
            databases={db: {"url": url} for db, url in fresh_backend.urls.items()}, data_dir=tmp_path,
            auth={"mode": "disabled"}, auto_migrate=True,
            quotas={"accounting": accounting, "capabilities": {"kv": {"max_items": 2}}},
        )
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as h:
                answers = [(await h.put(f"/v1/a/kv/c/{k}", json="v")).status_code for k in keys]
                return {"answers": answers, "kv": (await h.get("/v1/a/usage")).json()["capabilities"]["kv"]}

    on = await gateway(True, "k1", "k2", "k3")
    assert on["answers"] == [204, 204, 507] and on["kv"]["items"] == 2
    off = await gateway(False, "k3", "k4")
    assert off["answers"] == [204, 204] and off["kv"]["items"] == 2  # not counted while off
    again = await gateway(True, "k5")
    assert again["answers"] == [507] and again["kv"] == {"items": 4, "bytes": 12, "max_items": 2, "max_bytes": None}


async def test_store_items_and_checkpoint_bytes_are_counted_and_refused(backend: Backend, http: httpx.AsyncClient) -> None:
    """The store counts items and their values' bytes as stored (SQLite: compact JSON text;
    PostgreSQL: jsonb's text, a space after each ':' and ',');
    checkpoints count a thread's checkpoint, blob and pending-write bytes, which move with the
    thread (a copy is refused at the target's quota) and go with its delete."""
    a = ns()
    await set_quota(http, a, "store", max_items=2, max_bytes=100)

    def put(key: str, text: str) -> dict[str, Any]:
        return {"op": "put", "namespace": ["m"], "key": key, "value": {"t": text}}  # '{"t":"<text>"}': 8 + len

    assert (await http.post(f"/v1/{a}/store/batch", json={"ops": [put("k1", "x" * 20)]})).status_code == 200
    refused(await http.post(f"/v1/{a}/store/batch", json={"ops": [put("k2", "y"), put("k3", "z")]}), "store.items")
    refused(await http.post(f"/v1/{a}/store/batch", json={"ops": [put("k2", "y" * 80)]}), "store.bytes")
    read = {"ops": [{"op": "get", "namespace": ["m"], "key": k} for k in ("k2", "k3")]}
    assert (await http.post(f"/v1/{a}/store/read", json=read)).json()["results"] == [None, None]
    assert (await http.post(f"/v1/{a}/store/batch", json={"ops": [put("k2", "y")]})).status_code == 200
    stored = 28 + 9 + (2 if backend.is_postgres else 0)
    assert (await usage(http, a))["store"] == {"items": 2, "bytes": stored, "max_items": 2, "max_bytes": 100}

    await set_quota(http, a, "checkpoints", max_bytes=3000)
    put_url, writes_url = f"/v1/{a}/checkpoints/put", f"/v1/{a}/checkpoints/writes"

    def data(size: int) -> dict[str, Any]:
        return {"type": "bytes", "data": base64.b64encode(b"d" * size).decode()}

    def checkpoint(cid: str, size: int, blob: int) -> dict[str, Any]:
        blobs = [{"channel": "m", "version": cid, **data(blob)}]
        return {"thread_id": "t1", "checkpoint_id": cid, "checkpoint": data(size), "blobs": blobs}

    def writes(size: int) -> dict[str, Any]:
        return {"thread_id": "t1", "checkpoint_id": "c1", "task_id": "k", "writes": [{"idx": 0, "channel": "m", **data(size)}]}

    r = await http.post(put_url, json=checkpoint("c1", 1000, 1000))
    assert r.status_code == 200, r.text
    refused(await http.post(put_url, json=checkpoint("c2", 500, 1500)), "checkpoints.bytes")
    refused(await http.post(writes_url, json=writes(1001)), "checkpoints.bytes")
    assert (await http.post(writes_url, json=writes(900))).status_code == 204
    latest = (await http.get(f"/v1/{a}/checkpoints/tuple", params={"thread_id": "t1"})).json()
    assert latest["checkpoint_id"] == "c1" and len(latest["pending_writes"]) == 1
    assert (await usage(http, a))["checkpoints"] | {} == {"items": 1, "bytes": 2900, "max_items": None, "max_bytes": 3000}
    copy = {"source_thread_id": "t1", "target_thread_id": "t2"}
    refused(await http.post(f"/v1/{a}/checkpoints/threads/copy", json=copy), "checkpoints.bytes")
    assert (await http.get(f"/v1/{a}/checkpoints/tuple", params={"thread_id": "t2"})).status_code == 404
    assert (await http.post(f"/v1/admin/quotas/{a}", params={"batch": 7})).status_code == 200  # a recount agrees
    assert (await usage(http, a))["checkpoints"]["bytes"] == 2900
    await set_quota(http, a, "checkpoints", max_bytes=6000)
    assert (await http.post(f"/v1/{a}/checkpoints/threads/copy", json=copy)).status_code == 200
    assert (await usage(http, a))["checkpoints"] | {} == {"items": 2, "bytes": 5800, "max_items": None, "max_bytes": 6000}
    assert (await http.delete(f"/v1/{a}/checkpoints/threads", params={"thread_id": "t1"})).status_code == 200
    assert (await usage(http, a))["checkpoints"]["bytes"] == 2900


async def test_vector_points_and_their_bytes_are_counted(server: Server, backend: Backend, http: httpx.AsyncClient) -> None:
    """Points live in a table per collection (no namespace column): the service keeps their usage
    (payload JSON + 4 bytes a dimension). A batch that would pass the points quota changes
    nothing; usage is exact after upserts that replace, a patch, deletes by id and by filter, a
    reset, a collection delete and a namespace delete; the recount agrees. (A payload's bytes are
    its JSON text as the backend keeps it: PostgreSQL's jsonb text has a space after a colon.)"""
    a = ns()
    sp = int(backend.name == "postgres")
    base = f"/v1/{a}/vectors"
    for c in ("c", "d"):
        assert (await http.put(f"{base}/{c}", json={"vector_size": 2, "distance": "l2"})).status_code in (200, 201)
    await set_quota(http, a, "vectors", max_items=3)

    def point(i: int, payload: str = "p") -> dict[str, Any]:
        return {"id": f"p{i}", "vector": [1.0, float(i)], "payload": {"k": payload}}  # {"k":"p"}: 9 bytes (+ sp) + 8

    assert (await http.post(f"{base}/c/points", json={"points": [point(0)]})).status_code == 200
    refused(await http.post(f"{base}/c/points", json={"points": [point(i) for i in range(4)]}), "vectors.items")
    listed = (await http.post(f"{base}/c/points/list", json={"with_vectors": True})).json()["items"]
    assert [(p["id"], p["vector"]) for p in listed] == [("p0", [1.0, 0.0])]
    assert (await usage(http, a))["vectors"] | {} == {"items": 1, "bytes": 17 + sp, "max_items": 3, "max_bytes": None}

    await set_quota(http, a, "vectors", max_items=10, max_bytes=70 + 4 * sp)
    assert (await http.post(f"{base}/c/points", json={"points": [point(i) for i in range(3)]})).status_code == 200
    assert (await http.post(f"{base}/d/points", json={"points": [point(7, "ppp")]})).status_code == 200
    assert (await usage(http, a))["vectors"]["items"] == 4 and (await usage(http, a))["vectors"]["bytes"] == 3 * (17 + sp) + 19 + sp
    refused(await http.patch(f"{base}/c/points/p1", json={"payload": {"k": "p" * 20}}), "vectors.bytes")
    assert (await http.patch(f"{base}/c/points/p1", json={"payload": {"k": ""}})).status_code == 200
    assert (await http.delete(f"{base}/c/points/p0")).status_code == 204
    assert (await http.post(f"{base}/c/points/delete", json={"filters": {"k": "p"}})).json() == {"deleted": 1}
    assert (await usage(http, a))["vectors"]["items"] == 2 and (await usage(http, a))["vectors"]["bytes"] == 16 + 19 + 2 * sp
    assert (await http.post(f"/v1/admin/quotas/{a}")).status_code == 200  # the recount agrees
    assert (await usage(http, a))["vectors"]["items"] == 2 and (await usage(http, a))["vectors"]["bytes"] == 35 + 2 * sp
    assert (await http.post(f"{base}/c/reset")).status_code == 204
    assert (await usage(http, a))["vectors"]["items"] == 1
    assert (await http.delete(f"{base}/d")).status_code == 204
    assert (await usage(http, a))["vectors"]["items"] == 0 and (await usage(http, a))["vectors"]["bytes"] == 0
    assert (await http.post(f"{base}/c/points", json={"points": [point(i) for i in range(3)]})).status_code == 200
    assert run_cli(backend, "delete-namespace", a, GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY).returncode == 0
    assert (await usage(http, a))["vectors"]["items"] == 0 and (await usage(http, a))["vectors"]["bytes"] == 0


async def test_writers_racing_at_the_quota_never_end_above_it(http: httpx.AsyncClient) -> None:
    """16 writers at once, one item left: exactly one gets it (on PostgreSQL, where each transaction
    sees only committed usage, those near the limit take the namespace's lock and read it again)."""
    for _ in range(3):
        a = ns()
        await set_quota(http, a, "kv", max_items=20)
        r = await http.post(f"/v1/{a}/kv/c", json={"items": [{"key": f"k{i}", "value": 1} for i in range(19)]})
        assert r.status_code == 200, r.text
        answers = await asyncio.gather(*(http.put(f"/v1/{a}/kv/c/n{i}", json=1) for i in range(16)))
        assert sorted(r.status_code for r in answers) == [204] + [507] * 15
        assert (await usage(http, a))["kv"]["items"] == 20
        assert len((await http.get(f"/v1/{a}/kv/c", params={"limit": 100})).json()["items"]) == 20


async def test_at_quota_every_capability_still_reads_and_deletes(http: httpx.AsyncClient) -> None:
    """records, files and store at their items quota (kv, checkpoints and vectors are above): the
    next write is refused; what is stored reads back, deletes go through, and make room again."""
    a = ns()
    for cap in ("records", "files", "store"):
        await set_quota(http, a, cap, max_items=1)
    store = f"/v1/{a}/store/batch"

    def put(key: str, value: dict[str, Any] | None) -> dict[str, Any]:
        return {"ops": [{"op": "put", "namespace": ["m"], "key": key, "value": value}]}

    assert (await http.put(f"/v1/{a}/records/c/r1", json=1)).status_code == 204
    assert (await http.put(f"/v1/{a}/files/c/f1", content=b"f")).status_code == 201
    assert (await http.post(store, json=put("s1", {"v": 1}))).status_code == 200
    refused(await http.put(f"/v1/{a}/records/c/r2", json=1), "records.items")
    refused(await http.put(f"/v1/{a}/files/c/f2", content=b"f"), "files.items")
    refused(await http.post(store, json=put("s2", {"v": 1})), "store.items")
    assert (await http.get(f"/v1/{a}/records/c/r1")).json()["value"] == 1
    assert (await http.get(f"/v1/{a}/files/c/f1")).content == b"f"
    read = {"ops": [{"op": "get", "namespace": ["m"], "key": "s1"}]}
    assert (await http.post(f"/v1/{a}/store/read", json=read)).json()["results"][0]["value"] == {"v": 1}
    assert (await http.delete(f"/v1/{a}/records/c/r1")).status_code == 204
    assert (await http.delete(f"/v1/{a}/files/c/f1")).status_code == 204
    assert (await http.post(store, json=put("s1", None))).status_code == 200
    assert {c: u["items"] for c, u in (await usage(http, a)).items() if c in ("records", "files", "store")} == {
        "records": 0, "files": 0, "store": 0,
    }
    assert (await http.put(f"/v1/{a}/records/c/r2", json=1)).status_code == 204  # room again
