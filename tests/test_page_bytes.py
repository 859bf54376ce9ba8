"""A list of kv entries, records or points ends at a byte budget (``limits.max_page_bytes``) as well as at
its ``limit``, and its ``next_cursor`` goes on: every item comes once, in order. Before, a page
was ``limit`` items whatever they held: up to 1,000 values of up to ``limits.max_value_bytes``
(1 MiB) each, fetched whole and built whole in the gateway's memory for one request, so a few
concurrent lists of a namespace's own large values could take the process's memory."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.core.config import Settings
from app.main import create_app
from storage_gateway_client import GatewayClient, SortOrder
from tests.conftest import Backend, Server, start_server, stop_server

BUDGET = 10_000
SIZES = [3000, 3000, 3000, 3000, 9000, 500, 500, 9500, 3000, 3000]  # value i: a string of SIZES[i] - 2 characters
# key order k0..k9: 3+3+3 | 3 (9 would pass) | 9+0.5+0.5 (exactly the budget) | 9.5 | 3+3 (KB)
ASCENDING = [["k0", "k1", "k2"], ["k3"], ["k4", "k5", "k6"], ["k7"], ["k8", "k9"]]


@contextlib.asynccontextmanager
async def gateway(backend: Backend, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        databases={db: {"url": url} for db, url in backend.urls.items()}, data_dir=tmp_path,
        auth={"mode": "disabled"}, auto_migrate=False,
        limits={"max_value_bytes": 12_000, "max_page_bytes": BUDGET, "max_body_bytes": 64 * 1024},
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            yield http


def value(i: int) -> str:
    return "x" * (SIZES[i] - 2)  # its JSON text is SIZES[i] bytes


async def pages(http: httpx.AsyncClient, url: str, **params: str | int) -> list[list[str]]:
    out, cursor = [], None
    while True:
        r = await http.get(url, params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        out.append([item["key"] for item in body["items"]])
        cursor = body["next_cursor"]
        if not cursor:
            return out


async def test_kv_and_records_pages_end_at_their_byte_budget(
    backend: Backend, server: Server, namespace: str, tmp_path: Path
) -> None:
    async with gateway(backend, tmp_path) as http:
        for i in range(10):
            assert (await http.put(f"/v1/{namespace}/kv/c/k{i}", json=value(i))).is_success
            assert (await http.put(f"/v1/{namespace}/records/c/k{i}", json=value(i))).is_success
        kv, records = f"/v1/{namespace}/kv/c", f"/v1/{namespace}/records/c"
        assert await pages(http, kv, limit=100) == ASCENDING
        assert await pages(http, records, limit=100) == ASCENDING
        # descending: 3+3 | 9.5+0.5 (exactly the budget) | 0.5+9 | 3+3+3 | 3
        descending = [["k9", "k8"], ["k7", "k6"], ["k5", "k4"], ["k3", "k2", "k1"], ["k0"]]
        assert await pages(http, records, limit=100, order="desc") == descending
        # pages of two stay under the budget: the limit alone ends them, as before
        assert await pages(http, kv, limit=2) == [[f"k{i}", f"k{i + 1}"] for i in range(0, 10, 2)]
        # keys alone weigh nothing: one page
        assert await pages(http, kv, limit=100, keys_only="true") == [[f"k{i}" for i in range(10)]]
        # values come whole
        got = (await http.get(kv, params={"limit": 100})).json()["items"]
        assert [(item["key"], item["value"]) for item in got] == [(f"k{i}", value(i)) for i in range(3)]


async def test_the_client_follows_pages_cut_at_the_byte_budget(
    server: Server, backend: Backend, namespace: str, tmp_path: Path, api_key: str | None, client_transport: str,
) -> None:
    """Through a gateway process and the client: ``get_all``, ``iter_records`` and
    ``get_ordered_records`` with a ``limit`` read across short pages as across full ones."""
    srv = start_server(
        backend, tmp_path / "budget.log", **({"GATEWAY_AUTH__ADMIN_KEY": api_key} if api_key else {}),
        GATEWAY_LIMITS__MAX_VALUE_BYTES="12000", GATEWAY_LIMITS__MAX_PAGE_BYTES=str(BUDGET),
    )
    try:
        async with GatewayClient(srv.url, namespace, api_key, transport=client_transport) as gw:
            for i in range(10):
                await gw.kv.set("c", f"k{i}", value(i))
            await gw.records.upsert_records("c", {f"k{i}": value(i) for i in range(10)})
            assert await gw.kv.get_all("c") == [value(i) for i in range(10)]
            assert [k async for k, _ in gw.records.iter_records("c")] == [f"k{i}" for i in range(10)]
            largest = await gw.records.get_ordered_records("c", limit=5, order=SortOrder.DESCENDING)
            assert largest == [(f"k{i}", value(i)) for i in (9, 8, 7, 6, 5)]
            page, cursor = await gw.kv.list("c", limit=100)
            assert [e.key for e in page] == ["k0", "k1", "k2"] and cursor
            await gw.vectors.setup_collection("v", 2)
            await gw.vectors.insert_vectors("v", [{"id": f"p{i}", "embedding": [1.0, float(i)], "t": value(i)} for i in range(10)])
            points = [p async for p in gw.vectors.iter_points("v", page_size=100)]
            assert [(p["id"], p["payload"]["t"]) for p in points] == [(f"p{i}", value(i)) for i in range(10)]
            assert len((await gw.vectors.list_points("v", None, 100))["items"]) == 3  # 3 x (3 KB + 265): a fourth passes 10,000
    finally:
        stop_server(srv)


@pytest.mark.parametrize("budget", [2**40])
async def test_a_page_budget_beyond_32_bits_is_taken(
    backend: Backend, server: Server, namespace: str, tmp_path: Path, budget: int
) -> None:
    settings = Settings(
        databases={db: {"url": url} for db, url in backend.urls.items()}, data_dir=tmp_path,
        auth={"mode": "disabled"}, auto_migrate=False, limits={"max_page_bytes": budget},
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            for i in range(3):
                assert (await http.put(f"/v1/{namespace}/kv/big/k{i}", json=i)).is_success
                assert (await http.put(f"/v1/{namespace}/records/big/k{i}", json=i)).is_success
            for cap in ("kv", "records"):
                r = await http.get(f"/v1/{namespace}/{cap}/big", params={"limit": 2})
                assert r.status_code == 200, r.text
                assert [item["key"] for item in r.json()["items"]] == ["k0", "k1"] and r.json()["next_cursor"]


async def test_a_points_list_ends_at_its_byte_budget(
    backend: Backend, server: Server, namespace: str, tmp_path: Path
) -> None:
    """``points/list`` ends at ``limits.max_page_bytes`` too: payloads as JSON, 256 bytes a point
    and 16 a dimension with vectors. Before, a list took up to 1,000 payloads of up to 1 MiB."""
    async with gateway(backend, tmp_path) as http:
        base = f"/v1/{namespace}/vectors/v"
        assert (await http.put(base, json={"vector_size": 2})).is_success
        sizes = [3000, 3000, 3000, 6000, 500, 9500]  # ~265 more each with their row: 3 | 2 | 1 a page
        points = [{"id": f"p{i}", "vector": [1.0, float(i)], "payload": {"t": "x" * n}} for i, n in enumerate(sizes)]
        r = await http.post(f"{base}/points", json={"points": points})
        assert r.is_success, r.text

        async def pages(**body: object) -> list[list[str]]:
            out, cursor = [], None
            while True:
                r = await http.post(f"{base}/points/list", json={"limit": 100, **body} | ({"cursor": cursor} if cursor else {}))
                assert r.status_code == 200, r.text
                out.append([p["id"] for p in r.json()["items"]])
                if r.json()["items"]:
                    assert all(len(p["payload"]["t"]) == sizes[int(p["id"][1:])] for p in r.json()["items"])
                cursor = r.json()["next_cursor"]
                if not cursor:
                    return out

        assert await pages() == [["p0", "p1", "p2"], ["p3", "p4"], ["p5"]]
        assert await pages(with_vectors=True) == [["p0", "p1", "p2"], ["p3", "p4"], ["p5"]]
        assert await pages(limit=2) == [["p0", "p1"], ["p2", "p3"], ["p4"], ["p5"]]  # p4 + p5 pass the budget


async def test_items_heavier_than_the_budget_come_one_a_page(
    backend: Backend, server: Server, namespace: str, tmp_path: Path
) -> None:
    """Found in review: when the first item of a page weighed more than the budget alone (a
    budget below ``max_value_bytes``, values stored under larger limits, a point with its vector),
    the list answered it with no ``next_cursor``: every item after it was never listed."""
    settings = Settings(
        databases={db: {"url": url} for db, url in backend.urls.items()}, data_dir=tmp_path,
        auth={"mode": "disabled"}, auto_migrate=False,
        limits={"max_value_bytes": 12_000, "max_page_bytes": 1000, "max_body_bytes": 64 * 1024},
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            for i in range(3):
                assert (await http.put(f"/v1/{namespace}/kv/h/k{i}", json=value(i))).is_success
                assert (await http.put(f"/v1/{namespace}/records/h/k{i}", json=value(i))).is_success
            one_each = [["k0"], ["k1"], ["k2"]]
            assert await pages(http, f"/v1/{namespace}/kv/h", limit=100) == one_each
            assert await pages(http, f"/v1/{namespace}/records/h", limit=100) == one_each
            assert await pages(http, f"/v1/{namespace}/records/h", limit=100, order="desc") == one_each[::-1]
            base = f"/v1/{namespace}/vectors/h"
            assert (await http.put(base, json={"vector_size": 2})).is_success
            points = [{"id": f"p{i}", "vector": [1.0, float(i)], "payload": {"t": "x" * 900}} for i in range(3)]
            assert (await http.post(f"{base}/points", json={"points": points})).is_success
            got, cursor, one_each_point = [], None, [["p0"], ["p1"], ["p2"]]
            while True:  # each point weighs 256 + its ~910-byte payload: more than 1,000 alone
                r = await http.post(f"{base}/points/list", json={"limit": 100, "with_vectors": True} | ({"cursor": cursor} if cursor else {}))
                got.append([p["id"] for p in r.json()["items"]])
                if not (cursor := r.json()["next_cursor"]):
                    break
            assert got == one_each_point


def test_byte_length_before_sqlite_3_43(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite before 3.43 has no ``octet_length``: a Debian bookworm Python (SQLite 3.40, whose
    ``sqlite3`` loads extensions, so the gateway takes it) answered every list with a 500. The
    fallback, run on this interpreter's own SQLite, counts bytes as ``octet_length`` does."""
    import sqlite3

    from sqlalchemy import column, select, text
    from sqlalchemy.dialects import sqlite

    import app.core.db.pages as pages_module

    monkeypatch.setattr(pages_module, "SQLITE_OCTET_LENGTH", False)
    stmt = select(pages_module.byte_length(column("v"))).select_from(text("(SELECT 'héllo €' AS v)"))
    sql = str(stmt.compile(dialect=sqlite.dialect()))
    assert "octet_length" not in sql
    assert sqlite3.connect(":memory:").execute(sql).fetchone() == (len("héllo €".encode()),)
    assert pages_module.byte_length_sql("payload", "sqlite") == "length(CAST(payload AS BLOB))"
    assert pages_module.byte_length_sql("payload", "postgresql") == "octet_length(payload)"
