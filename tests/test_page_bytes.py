"""A list of kv entries, records or points ends at a byte budget (``limits.max_page_bytes``) as well as at
its ``limit``, and its ``next_cursor`` goes on: every item comes once, in order. Before, a page
was ``limit`` items whatever they held: up to 1,000 values of up to ``limits.max_value_bytes``
(1 MiB) each, fetched whole and built whole in the gateway's memory for one request, so a few
concurrent lists of a namespace's own large values could take the process's memory."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.core.config import Settings
from app.main import create_app
from storage_gateway_client import GatewayClient, SortOrder
from tests.conftest import Backend, Server, start_server, stop_server
from app.core.jsonvalue import jsonb_text
from tests.test_vectors_index import pg_connect, wait_until_indexed

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


async def test_a_search_answer_carries_its_budget_of_payloads(
    server: Server, backend: Backend, namespace: str, tmp_path: Path, api_key: str | None, client_transport: str,
) -> None:
    """A search answers every hit, nearest first, but the payloads of only as many as weigh
    ``limits.max_page_bytes`` together (their JSON and 256 bytes a hit); the hits past it come
    with ``payload_omitted``, and the client reads those points. Before, an answer took up to
    1,000 payloads of up to 1 MiB each into the gateway's memory (a hybrid search: its pool of up
    to 1,000, and the text ranking's points besides). Through a gateway process; on PostgreSQL
    through the HNSW graph (the session's gateway builds it: 1,012 points)."""
    srv = start_server(
        backend, tmp_path / "search.log", **({"GATEWAY_AUTH__ADMIN_KEY": api_key} if api_key else {}),
        GATEWAY_LIMITS__MAX_VALUE_BYTES="12000", GATEWAY_LIMITS__MAX_PAGE_BYTES=str(BUDGET),
    )
    try:
        async with GatewayClient(srv.url, namespace, api_key, transport=client_transport) as gw:
            await gw.vectors.setup_collection("s", 2, text_field="t")
            # p<i> at angle i degrees from the query: nearest first p0, p1, ...; ~3,270 bytes with its row each
            items = [
                {"id": f"p{i}", "embedding": [math.cos(math.radians(i)), math.sin(math.radians(i))], "t": f"word{i} " + "x" * 3000}
                for i in range(12)
            ]
            far = [  # between 90 and 180 degrees away
                {"id": f"f{j}", "embedding": [math.cos(math.radians(90 + j * 0.09)), math.sin(math.radians(90 + j * 0.09))], "t": "far"}
                for j in range(1000)
            ]
            await gw.vectors.insert_vectors("s", items + far)
            await wait_until_indexed(gw, server, "s")
            raw = await srv_search(srv, namespace, api_key, {"vector": [1.0, 0.0], "limit": 10, "explain": True})
            assert raw["plan"]["kind"] == ("hnsw" if backend.is_postgres else "exact_scan")
            assert [h["id"] for h in raw["results"]] == [f"p{i}" for i in range(10)]
            assert [h.get("payload_omitted", False) for h in raw["results"]] == [False] * 3 + [True] * 7
            assert [h["payload"] for h in raw["results"][3:]] == [None] * 7
            assert [h["payload"]["t"] for h in raw["results"][:3]] == [items[i]["t"] for i in range(3)]
            # the client reads the payloads left out
            hits = await gw.vectors.search("s", [1.0, 0.0], 10)
            assert [(h["id"], h["payload"]["t"]) for h in hits] == [(f"p{i}", items[i]["t"]) for i in range(10)]
            assert not any("payload_omitted" in h for h in hits)
            # hybrid: ranked without payloads, then the answer's payloads in its order up to the budget;
            # q<i> match the words but are too far for the vector ranking's pool (48 points)
            extra = [{"id": f"q{i}", "embedding": [-1.0, 0.001 * i], "t": "word11 far " + "y" * 2000} for i in range(3)]
            await gw.vectors.insert_vectors("s", extra)
            stored = {item["id"]: item for item in items + far + extra}
            body = {"vector": [1.0, 0.0], "query": "word11 word10 word9", "limit": 20}
            got = (await srv_search(srv, namespace, api_key, body))["results"]
            assert {f"p{i}" for i in range(12)} | {f"q{i}" for i in range(3)} <= {h["id"] for h in got} and len(got) == 20
            omitted = [bool(h.get("payload_omitted")) for h in got]
            carried = omitted.index(True)
            assert 0 < carried and omitted == [False] * carried + [True] * (20 - carried)  # a prefix, in the answer's order

            def weight(pid: str) -> int:  # as PostgreSQL answers it (`{"t": ...}`): SQLite's is a byte less
                return len(json.dumps({"t": stored[pid]["t"]})) + 256

            upto = [sum(weight(h["id"]) for h in got[:n]) for n in (carried, carried + 1)]
            assert upto[0] - carried <= BUDGET < upto[1]
            assert all(h["payload"]["t"] == stored[h["id"]]["t"] for h in got[:carried])
            hits = await gw.vectors.search("s", [1.0, 0.0], 20, query="word11 word10 word9")
            assert [h["id"] for h in hits] == [h["id"] for h in got]
            assert all(h["payload"]["t"] == stored[h["id"]]["t"] for h in hits)
            # a point deleted between the answer and the client's read of its payload is left out
            await gw.vectors.delete_point("s", got[-1]["id"])
            filled = await gw.vectors._with_payloads("s", [dict(h) for h in got])
            assert [h["id"] for h in filled] == [h["id"] for h in got[:-1]]
    finally:
        stop_server(srv)


async def srv_search(srv: Server, namespace: str, api_key: str | None, body: dict) -> dict:
    async with httpx.AsyncClient(base_url=srv.url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {}) as http:
        r = await http.post(f"/v1/{namespace}/vectors/s/search", json=body)
        assert r.status_code == 200, r.text
        return r.json()


# Floats whose JSON is shorter than what PostgreSQL's jsonb answers for them, and some that are not.
WRITTEN = [1e300, 1e-300, 1.5e-07, 1e16, 1.2345e16, 1e-05, 12345.678, -3.4e20, 5e-324, 1.7976931348623157e308,
           -2.5e-100, 0.0001, 123456789012345.6, 0.0, -0.0, 7e22]


async def test_a_payload_fits_its_limit_with_its_numbers_written_out(
    backend: Backend, server: Server, namespace: str, tmp_path: Path
) -> None:
    """PostgreSQL keeps a payload as jsonb, whose numbers are decimals written out in full: a
    payload of 1 MiB of ``1e300``s read back as 43 MiB there, on a get (a list or a search
    weighs what it reads, but one point is one point). A payload must now fit
    ``limits.max_value_bytes`` written out too, on both backends alike."""
    async with gateway(backend, tmp_path) as http:  # max_value_bytes 12,000
        base = f"/v1/{namespace}/vectors/w"
        assert (await http.put(base, json={"vector_size": 2})).is_success
        fits = {"a": [1e300] * 39}  # 39 x 301 = 11,739 written out
        passes = {"a": [1e300] * 40}  # 240 bytes as sent, 12,040 written out
        words = {"t": "1e+300 " * 1500}  # 10,500 bytes of a string that only looks like numbers
        r = await http.post(f"{base}/points", json={"points": [{"id": "f", "vector": [1, 0], "payload": fits}]})
        assert r.status_code == 200, r.text
        r = await http.post(f"{base}/points", json={"points": [{"id": "t", "vector": [1, 0], "payload": words}]})
        assert r.status_code == 200, r.text
        r = await http.post(f"{base}/points", json={"points": [{"id": "p", "vector": [1, 0], "payload": passes}]})
        assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", r.text
        assert "points.0.payload" in r.json()["detail"] and "written out" in r.json()["detail"]
        r = await http.patch(f"{base}/points/f", json={"payload": passes})
        assert r.status_code == 422 and "payload" in r.json()["detail"], r.text
        r = await http.post(f"{base}/points", json={"points": [{"id": "s", "vector": [1, 0], "payload": {"a": [1e-300] * 40}}]})
        assert r.status_code == 422, r.text
        assert (await http.get(base)).json()["count"] == 2
        got = await http.get(f"{base}/points/f")
        assert got.status_code == 200 and len(got.content) < 12_000 + 200, len(got.content)


@pytest.mark.postgres_only  # the rule is Python's, on both backends; PostgreSQL's jsonb is what it follows
async def test_numbers_written_out_are_what_postgresql_answers(backend: Backend, server: Server) -> None:
    """What a payload stores (``jsonb_text``) reads back from jsonb as the same float, and its
    length with the growth counted is what jsonb answers."""
    conn = await pg_connect(backend)
    try:
        for f in WRITTEN:
            stored = jsonb_text(json.dumps([f], separators=(",", ":")), [f])
            answered = await conn.fetchval("SELECT CAST(CAST($1 AS jsonb) AS text)", stored.text)
            back = json.loads(answered)
            assert back == [f] and type(back[0]) is float, (f, stored, answered)
            assert len(stored.text) + stored.growth == len(answered), (f, stored, answered)
    finally:
        await conn.close()
