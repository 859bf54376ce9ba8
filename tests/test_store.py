"""The store capability on both backends, through the HTTP API and ``GatewayStore``: what
LangGraph's own tests (``tests/test_store_upstream.py``) do not cover, and the three defects
LangGraph's stores have that this one must not (numbers filtered as text, langgraph issue 7684;
``omit_expired`` ignored by SqliteStore, 8902; no way to delete a namespace subtree, 3917)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from langgraph.store.base import InvalidNamespaceError
from sqlalchemy import event, text

from app.core.config import Database
from app.main import create_app
from app.store.capability import CAPABILITY
from storage_gateway_client import GatewayClient
from tests.conftest import Backend, Server, in_process_settings
from tests.test_isolation import make_key
from tests.test_ops_telemetry import parse_metrics, value


def put(ns: list[str], key: str, value: Any, **extra: Any) -> dict[str, Any]:
    return {"op": "put", "namespace": ns, "key": key, "value": value, **extra}


async def batch(http: httpx.AsyncClient, namespace: str, *ops: dict[str, Any], path: str = "batch", **extra: Any) -> Any:
    r = await http.post(f"/v1/{namespace}/store/{path}", json={"ops": list(ops), **extra})
    assert r.status_code == 200, r.text
    return r.json()["results"]


async def test_numbers_compare_as_numbers_and_objects_by_json_equality(
    server: Server, namespace: str, api_key: str | None
) -> None:
    """langgraph issue 7684: PostgresStore compares `$gt` operands as text ("10" < "9.5")."""
    async with GatewayClient(server.url, namespace, api_key) as gw:
        store = gw.store()
        values = {
            "nine": {"n": 9, "meta": {"a": 1, "b": [1, 2]}}, "ten": {"n": 10, "meta": {"b": [1, 2.0], "a": 1.0}},
            "hundred": {"n": 100, "meta": {"a": 1, "b": [2, 1]}}, "half": {"n": 9.5}, "text": {"n": "10"},
            "true": {"n": True}, "big": {"n": 2**62, "meta": {"a": 1}},
        }
        for key, value in values.items():
            await store.aput(("docs",), key, value)

        async def keys(flt: dict[str, Any]) -> set[str]:
            return {item.key for item in await store.asearch(("docs",), filter=flt, limit=100)}

        assert await keys({"n": {"$gt": 9.5}}) == {"ten", "hundred", "big"}
        assert await keys({"n": {"$lte": 10}}) == {"nine", "ten", "half"}
        assert await keys({"n": {"$lt": float("inf")}}) == {"nine", "ten", "hundred", "half", "big"}
        assert await keys({"n": {"$eq": float("nan")}}) == set()
        assert await keys({"n": {"$lt": 10**100}}) == {"nine", "ten", "hundred", "half", "big"}
        assert await keys({"n": 10}) == {"ten"} and await keys({"n": 10.0}) == {"ten"}  # never the string or true
        assert await keys({"n": {"$gt": "1"}}) == {"text"}  # strings with strings
        assert await keys({"n": True}) == {"true"}
        # objects and arrays by JSON equality: key order aside, 1 == 1.0, array order counts
        assert await keys({"meta": {"a": 1, "b": [1, 2]}}) == {"nine", "ten"}
        assert await keys({"meta.b": [1, 2]}) == {"nine", "ten"}
        assert await keys({"meta.a": {"$gte": 1}, "n": {"$ne": 9}}) == {"ten", "hundred", "big"}
        assert await keys({"$or": [{"n": 9}, {"n": "10"}]}) == {"nine", "text"}
        assert await keys({"meta.a": {"$exists": False}}) == {"half", "text", "true"}
        with pytest.raises(ValueError, match="Invalid filter key"):
            await store.asearch(("docs",), filter={"n') OR 1=1 --": 1})


async def test_omit_expired_is_honoured(http: httpx.AsyncClient, namespace: str) -> None:
    """langgraph issue 8902: SqliteStore answers expired items whatever `omit_expired` says."""
    await batch(http, namespace, put(["a", "b"], "gone", {"v": 1}, ttl=0.004), put(["a", "c"], "kept", {"v": 2}))
    await asyncio.sleep(0.5)
    reads = [
        {"op": "get", "namespace": ["a", "b"], "key": "gone"},
        {"op": "search", "namespace_prefix": ["a"]},
        {"op": "list_namespaces"},
    ]
    got, found, listed = await batch(http, namespace, *reads, path="read", omit_expired=True)
    assert got is None and [i["key"] for i in found] == ["kept"] and listed == [["a", "c"]]
    got, found, listed = await batch(http, namespace, *reads, path="read")  # until swept, as LangGraph's default
    assert got is not None and len(found) == 2 and listed == [["a", "b"], ["a", "c"]]
    assert (await http.post(f"/v1/{namespace}/store/sweep")).json() == {"deleted": 1, "done": True}
    got, found, _ = await batch(http, namespace, *reads, path="read")
    assert got is None and [i["key"] for i in found] == ["kept"]


async def test_a_namespace_subtree_is_deleted_whole(server: Server, namespace: str, api_key: str | None) -> None:
    """langgraph issue 3917: no store can delete a namespace and everything under it."""
    embed = {"dims": 2, "embed": lambda texts: [[1.0, float(len(t))] for t in texts], "fields": ["text"]}
    async with GatewayClient(server.url, namespace, api_key) as gw:
        store = gw.store(index=embed)  # type: ignore[arg-type]
        for ns in [("a",), ("a", "b"), ("a", "b", "c"), ("ab",), ("a_",), ("b", "a")]:
            await store.aput(ns, "k", {"text": "x"})
        assert await store.adelete_namespace(("a",)) == 3
        left = {item.namespace for item in await store.asearch((), query="x", limit=100)}
        assert left == {("ab",), ("a_",), ("b", "a")}
        assert await store.alist_namespaces() == [("a_",), ("ab",), ("b", "a")]
        assert await store.adelete_namespace(()) == 3
        assert await store.asearch(()) == []


async def test_a_batch_answers_in_order_and_each_op_sees_the_writes_before_it(
    http: httpx.AsyncClient, namespace: str
) -> None:
    results = await batch(
        http, namespace,
        {"op": "get", "namespace": ["u"], "key": "k"},
        put(["u"], "k", {"v": 1}),
        {"op": "get", "namespace": ["u"], "key": "k"},
        put(["u"], "k", {"v": 2}),
        {"op": "search", "namespace_prefix": ["u"]},
        put(["u"], "k", None),
        {"op": "get", "namespace": ["u"], "key": "k"},
        {"op": "list_namespaces"},
    )
    assert results[0] is None and results[1] is None and results[2]["value"] == {"v": 1}
    assert [i["value"] for i in results[4]] == [{"v": 2}]
    assert results[5:] == [None, None, []]


@pytest.mark.parametrize(
    ("op", "status", "where"),
    [
        (put(["u"], "k", {"s": "x" * (1024 * 1024)}), 413, "value"),
        (put(["l"] * 17, "k", {}), 422, "namespace"),
        (put(["x" * 257], "k", {}), 422, "namespace.0"),
        (put(["a.b"], "k", {}), 422, "namespace.0"),
        (put(["u"], "k", {"n": 2**64}), 422, "value"),
        (put(["u"], "k", {}, vectors=[{"field": f"f{i}", "vector": [1.0]} for i in range(65)]), 413, "vectors"),
        (put(["u"], "k", {}, vectors=[{"field": "a", "vector": [1.0]}, {"field": "b", "vector": [1.0, 2.0]}]), 422, "vector"),
        ({"op": "search", "filter": {"a b": 1}}, 422, "filter"),
        ({"op": "search", "filter": {"a": {"$regex": "x"}}}, 422, "filter"),
        ({"op": "search", "limit": 1001}, 422, "limit"),
    ],
)
async def test_limits_refuse_the_whole_batch(
    http: httpx.AsyncClient, namespace: str, op: dict[str, Any], status: int, where: str
) -> None:
    r = await http.post(f"/v1/{namespace}/store/batch", json={"ops": [put(["u"], "first", {"v": 1}), op]})
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json" and where in r.json()["detail"]
    assert await batch(http, namespace, {"op": "get", "namespace": ["u"], "key": "first"}) == [None]


async def test_too_many_ops_and_a_bad_namespace_raise_as_langgraph_does(
    http: httpx.AsyncClient, server: Server, namespace: str, api_key: str | None
) -> None:
    r = await http.post(f"/v1/{namespace}/store/read", json={"ops": [{"op": "search"}] * 1001})
    assert r.status_code == 413, r.text
    async with GatewayClient(server.url, namespace, api_key) as gw:
        with pytest.raises(InvalidNamespaceError):
            await gw.store().aput(tuple(["l"] * 17), "k", {})
        store = gw.store()
        many = [store.aget(("u",), f"k{i}") for i in range(1200)]  # one tick: several requests
        assert await asyncio.gather(*many) == [None] * 1200


async def test_gets_alone_answer_as_in_a_batch_and_the_client_sends_them_to_get(
    server: Server, http: httpx.AsyncClient, namespace: str
) -> None:
    """`/get` (one statement, the fast path) answers exactly as the same gets in `/read`, timestamps
    included; a key with `store:read` may send it, anything but gets is refused; a tick of
    `GatewayStore` gets goes there."""
    await batch(http, namespace, put(["a", "b"], "k1", {"v": 1}), put(["a"], "k2", {"v": [2]}, ttl=5),
                put(["a"], "gone", {"v": 3}, ttl=0.004))
    await asyncio.sleep(0.5)
    gets = [{"op": "get", "namespace": ["a", "b"], "key": "k1"}, {"op": "get", "namespace": ["a"], "key": "no"},
            {"op": "get", "namespace": ["a"], "key": "k2", "refresh_ttl": True}, {"op": "get", "namespace": ["a", "b"], "key": "k1"}]
    for omit in (False, True):
        for ops in (gets, gets[:1], gets[1:2], [{"op": "get", "namespace": ["a"], "key": "gone"}]):
            assert await batch(http, namespace, *ops, path="get", omit_expired=omit) == await batch(
                http, namespace, *ops, path="read", omit_expired=omit)
    got = await batch(http, namespace, *gets, path="get")
    assert [g and g["value"] for g in got] == [{"v": 1}, None, {"v": [2]}, {"v": 1}]
    assert got[0]["created_at"].endswith("+00:00") and got[0]["updated_at"] >= got[0]["created_at"]
    reader = await make_key(http, namespace, "store:read")
    r = await http.post(f"/v1/{namespace}/store/get", json={"ops": gets[:1]}, headers={"Authorization": f"Bearer {reader}"})
    assert r.status_code == 200 and r.json()["results"][0]["value"] == {"v": 1}
    r = await http.post(f"/v1/{namespace}/store/get", json={"ops": [put(["a"], "x", {})]})
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"

    def sent() -> float:
        return value(parse_metrics(httpx.get(f"{server.url}/metrics", headers=http.headers).text),
                     "gateway_http_requests_total", route="/v1/{namespace}/store/get")

    before = sent()
    async with GatewayClient(server.url, namespace, reader) as gw:
        store = gw.store()
        found = await asyncio.gather(store.aget(("a", "b"), "k1"), store.aget(("a",), "no"))
        assert [f and f.value for f in found] == [{"v": 1}, None]
    assert sent() == before + 1  # both gets in one request to /get


async def test_the_platform_api_takes_x_api_key_and_a_query_vector(
    server: Server, http: httpx.AsyncClient, namespace: str
) -> None:
    writer = await make_key(http, namespace, "store:write")
    reader = await make_key(http, namespace, "store:read")
    base = f"{server.url}/v1/{namespace}/store/langgraph"
    async with httpx.AsyncClient(base_url=base, headers={"x-api-key": writer}) as lg:
        for key, vector in (("tea", [1.0, 0.0]), ("car", [0.0, 1.0])):
            body = {"namespace": ["m"], "key": key, "value": {"k": key}, "vectors": [{"field": "$", "vector": vector}]}
            assert (await lg.put("/store/items", json=body)).status_code == 204
        assert (await lg.put("/store/items", json={"namespace": ["m"], "key": "plain", "value": {}})).status_code == 204
        r = await lg.post("/store/items/search", json={"namespace_prefix": ["m"], "query": "drink", "query_vector": [0.9, 0.1]})
        scored = [(i["key"], i["score"] and round(i["score"], 3)) for i in r.json()["items"]]
        assert scored == [("tea", 0.994), ("car", 0.11), ("plain", None)]  # no vector: last, no score
        r = await lg.post("/store/items/search", json={"namespace_prefix": ["m"], "query": "drink"})
        assert r.status_code == 422 and "query_vector" in r.json()["detail"]
        assert (await lg.get("/ok")).json() == {"ok": True}
    async with httpx.AsyncClient(base_url=base, headers={"x-api-key": reader}) as lg:
        assert (await lg.get("/store/items", params={"namespace": "m", "key": "tea"})).json()["value"] == {"k": "tea"}
        assert (await lg.put("/store/items", json={"namespace": ["m"], "key": "x", "value": {}})).status_code == 403
        assert (await lg.request("DELETE", "/store/items", json={"namespace": ["m"], "key": "tea"})).status_code == 403


async def test_background_sweep_and_subtree_delete_work_in_bounded_batches(backend: Backend, server: Server, tmp_path: Path) -> None:
    settings = in_process_settings(backend, tmp_path, store={"sweep_batch": 2, "delete_batch": 2})
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        state = app.state.gateway
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as http:
            ns = f"sweep{tmp_path.name[-8:]}"
            await batch(http, ns, *[put(["t"], f"k{i}", {}, ttl=0.002) for i in range(5)], put(["t"], "kept", {}))
            await asyncio.sleep(0.3)
            sweep = next(job for job in CAPABILITY.periodic(state.services["store"], state) if job.name == "store-sweep")
            await sweep.run()  # three statements of at most two items
            assert [i["key"] for i in (await batch(http, ns, {"op": "search"}))[0]] == ["kept"]
            await batch(http, ns, *[put(["d", str(i)], "k", {}) for i in range(3)])
            first = (await http.post(f"/v1/{ns}/store/namespaces/delete", json={"prefix": ["d"]})).json()
            second = (await http.post(f"/v1/{ns}/store/namespaces/delete", json={"prefix": ["d"]})).json()
            assert (first, second) == ({"deleted": 2, "done": False}, {"deleted": 1, "done": True})
        assert state.databases.dialect(Database.vectors) in ("sqlite", "postgresql")


@pytest.mark.postgres_only
async def test_hnsw_search_of_a_large_scope_finds_the_exact_nearest(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    """Above `exact_search_threshold` items a query search walks the size's HNSW index (built in
    the background, for longer than a request's statement timeout may run), then compares exactly
    when the graph finds too few that pass the filter. Reads run in autocommit (a plain route's read
    transaction would begin lazily), a graph walk in a transaction."""
    # 200 vectors: the lifespan's own first round finds no size of other tests' to build (one build
    # at a time: it would hold the lock this test's build needs)
    settings = in_process_settings(backend, tmp_path, store={"index_min_vectors": 200, "exact_search_threshold": 10})
    settings.databases.vectors.statement_timeout = 1.0
    app = create_app(settings)
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(200, 12)).astype(np.float32)
    async with app.router.lifespan_context(app):
        state = app.state.gateway
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as http:
            ns = f"hnsw{tmp_path.name[-8:]}"
            await batch(http, ns, *[
                put(["p"], f"k{i}", {"odd": i % 2, "rare": i == 7}, vectors=[{"field": "$", "vector": v.tolist()}])
                for i, v in enumerate(vectors)
            ])
            builder = next(job for job in CAPABILITY.periodic(state.services["store"], state) if job.name == "store-indexes")
            async with state.databases.engine(Database.vectors).connect() as writer:  # an open write: the build waits
                await writer.execute(text("LOCK TABLE store_vectors IN ROW EXCLUSIVE MODE"))
                building = asyncio.create_task(builder.run())
                await asyncio.sleep(1.5)  # longer than the statement timeout
                await writer.rollback()
            await building
            assert 12 in state.services["store"].sql.indexed
            async with state.databases.engine(Database.vectors).connect() as conn:  # built with 128, inserts link from 64
                options = (await conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'store_hnsw_12'"))).scalar()
            assert sorted(options) == ["ef_construction=64", "m=16"]
            q = rng.normal(size=12).astype(np.float32)
            cos = vectors @ q / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(q))
            in_transaction: list[bool] = []  # after each statement of a read (PostgreSQL's own view)
            event.listen(
                state.databases.engine(Database.vectors).sync_engine, "after_cursor_execute",
                lambda conn, *_: in_transaction.append(conn.connection.driver_connection.is_in_transaction()),
            )
            await batch(http, ns, {"op": "get", "namespace": ["p"], "key": "k1"}, {"op": "search", "filter": {"odd": 1}}, path="read")
            assert in_transaction and not any(in_transaction)  # autocommit: no BEGIN and COMMIT round trips
            in_transaction.clear()
            found = (await batch(http, ns, {"op": "search", "namespace_prefix": ["p"], "query_vector": q.tolist()}, path="read"))[0]
            assert [i["key"] for i in found] == [f"k{i}" for i in np.argsort(-cos)[:10]]
            assert in_transaction and all(in_transaction)  # a graph walk's SET LOCAL needs its transaction
            rare = {"op": "search", "namespace_prefix": ["p"], "query_vector": q.tolist(), "filter": {"rare": True}}
            assert [i["key"] for i in (await batch(http, ns, rare, path="read"))[0]] == ["k7"]


@pytest.mark.postgres_only
async def test_puts_alone_are_one_statement_in_autocommit_and_replace_vectors_by_field(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    """A batch of puts whose items and vectors one statement writes runs in autocommit (no BEGIN
    and COMMIT round trips), a replaced item's vectors updated by field and the others deleted in
    that statement; a batch that deletes, or registers a new embedding size, keeps its transaction."""
    app = create_app(in_process_settings(backend, tmp_path))
    async with app.router.lifespan_context(app):
        engine = app.state.gateway.databases.engine(Database.vectors)
        seen: list[tuple[str, bool]] = []
        # the requests' statements, which bind the namespace (not the background jobs')
        event.listen(engine.sync_engine, "after_cursor_execute", lambda conn, cursor, statement, parameters, *_: seen.append(
            (statement.split()[0], conn.connection.driver_connection.is_in_transaction())) if ns in (parameters or ()) else None)

        async def vectors(key: str) -> dict[str, list[float]]:
            async with engine.connect() as conn:
                rows = await conn.execute(text(
                    "SELECT v.field, CAST(v.embedding AS text) FROM store_vectors v JOIN store_items i ON i.id = v.item_id "
                    "WHERE i.namespace = :ns AND i.key = :k"), {"ns": ns, "k": key})
                return {f: [float(x) for x in e.strip("[]").split(",")] for f, e in rows}

        ns = f"one{tmp_path.name[-8:]}"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as http:
            await batch(http, ns, put(["m"], "first", {}, vectors=[{"field": "a", "vector": [1, 0]}]))  # registers size 2
            assert any(in_tx for _, in_tx in seen)
            seen.clear()
            await batch(http, ns, put(["m"], "k", {"x": 1}, vectors=[{"field": "a", "vector": [1, 0]}, {"field": "b", "vector": [0, 1]}]),
                        put(["m"], "k2", {"x": 2}))
            assert [kind for kind, _ in seen] == ["WITH"] and not seen[0][1]
            seen.clear()
            await batch(http, ns, put(["m"], "k", {"x": 3}, vectors=[{"field": "b", "vector": [2, 2]}, {"field": "c", "vector": [3, 0]}]))
            assert [kind for kind, _ in seen] == ["WITH"] and not seen[0][1]
            assert await vectors("k") == {"b": [2.0, 2.0], "c": [3.0, 0.0]}
            await batch(http, ns, put(["m"], "k", {"x": 4}))
            assert await vectors("k") == {}
            seen.clear()
            await batch(http, ns, put(["m"], "k2", None), put(["m"], "k", {"x": 5}, vectors=[{"field": "a", "vector": [1, 1]}]))
            assert len(seen) > 1 and all(in_tx for _, in_tx in seen)  # a delete and a put: one transaction
            assert await vectors("k") == {"a": [1.0, 1.0]}


async def test_the_langgraph_json_factories_keep_memory_and_threads_in_the_gateway(
    server: Server, namespace: str, api_key: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage_gateway_client import make_checkpointer, make_store

    monkeypatch.setenv("STORAGE_GATEWAY_URL", server.url)
    monkeypatch.setenv("STORAGE_GATEWAY_NAMESPACE", namespace)
    monkeypatch.setenv("STORAGE_GATEWAY_API_KEY", api_key or "")
    async with make_store() as store, make_checkpointer() as saver:
        await store.aput(("m",), "k", {"v": 1})
        assert await saver.aget_tuple({"configurable": {"thread_id": "none"}}) is None
    async with GatewayClient(server.url, namespace, api_key) as gw:
        assert (await gw.store().aget(("m",), "k")).value == {"v": 1}  # type: ignore[union-attr]
