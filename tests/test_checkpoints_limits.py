"""Bad checkpoint requests are answered 4xx problem+json naming what is wrong, never 500: sizes
over the limits (413), malformed names, bytes, filters and cursors (422), missing checkpoints (404)."""

from __future__ import annotations

import asyncio
import contextlib
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.core.config import Settings
from app.main import create_app
from tests.conftest import Backend, Server, in_process_settings

PROBLEM = "application/problem+json"


def checkpoint(**extra: object) -> dict:
    return {"thread_id": "t", "checkpoint_id": "c1", "checkpoint": {"type": "bytes", "data": "AA=="}, **extra}


@pytest.fixture
async def small(backend: Backend, server: Server, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app in-process on the test databases, with small checkpoint limits."""
    settings = Settings(
        databases={db: {"url": url} for db, url in backend.urls.items()}, data_dir=tmp_path,
        auth={"mode": "disabled"}, auto_migrate=False,
        limits={"max_body_bytes": 64 * 1024, "max_batch_items": 3, "max_page_size": 10, "default_page_size": 5},
        checkpoints={"max_blob_bytes": 1024, "max_metadata_bytes": 256},
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield client


def assert_problem(r: httpx.Response, status: int, field: str | None = None) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    if field is not None:
        assert field in r.json()["detail"], r.json()


async def test_sizes_over_the_limits_are_413(small: httpx.AsyncClient, namespace: str) -> None:
    url = f"/v1/{namespace}/checkpoints/put"
    big = base64.b64encode(b"x" * 1025).decode()
    assert_problem(await small.post(url, json=checkpoint(checkpoint={"type": "bytes", "data": big})), 413, "checkpoint.data")
    blob = {"channel": "m", "version": "1", "type": "bytes", "data": big}
    assert_problem(await small.post(url, json=checkpoint(blobs=[blob])), 413, "blobs.0.data")
    few = {"channel": "m", "version": "1", "type": "bytes", "data": "AA=="}
    assert_problem(await small.post(url, json=checkpoint(blobs=[few] * 4)), 413, "blobs")
    assert_problem(await small.post(url, json=checkpoint(metadata={"k": "v" * 300})), 413, "metadata")
    # 9 bytes sent, 327 as PostgreSQL's jsonb answers it (5e-324 written out): counted on both backends
    assert_problem(await small.post(url, json=checkpoint(metadata={"x": [5e-324]})), 413, "metadata")
    # bytes, not characters: 100 characters of 4 bytes each (found by attack: 260 KB passed a 64 KiB limit)
    assert_problem(await small.post(url, json=checkpoint(metadata={"k": "\U0001f600" * 100})), 413, "metadata")
    writes = {"thread_id": "t", "checkpoint_id": "c1", "task_id": "k",
              "writes": [{"idx": 0, "channel": "m", "type": "bytes", "data": big}]}
    assert_problem(await small.post(f"/v1/{namespace}/checkpoints/writes", json=writes), 413, "writes.0.data")
    huge = base64.b64encode(b"x" * 70 * 1024).decode()
    assert_problem(await small.post(url, json=checkpoint(checkpoint={"type": "bytes", "data": huge})), 413)
    assert_problem(await small.post(f"/v1/{namespace}/checkpoints/prune", json={"thread_ids": list("abcd")}), 413, "thread_ids")
    # nothing was stored
    assert_problem(await small.get(f"/v1/{namespace}/checkpoints/tuple", params={"thread_id": "t"}), 404)


async def test_malformed_requests_are_422_naming_the_field(small: httpx.AsyncClient, namespace: str) -> None:
    url = f"/v1/{namespace}/checkpoints/put"
    assert_problem(await small.post(url, json=checkpoint(thread_id="bad\x01id")), 422, "thread_id")
    assert_problem(await small.post(url, json=checkpoint(thread_id="")), 422, "thread_id")
    assert_problem(await small.post(url, json=checkpoint(checkpoint={"type": "bytes", "data": "@@not base64@@"})), 422, "checkpoint")
    assert_problem(await small.post(url, json=checkpoint(metadata={"k": "nul\u0000"})), 422, "metadata")
    assert_problem(await small.post(url, json=checkpoint(checkpoint_ns="a\nb")), 422, "checkpoint_ns")
    search = f"/v1/{namespace}/checkpoints/search"
    assert_problem(await small.post(search, json={"filter": {"parents": {"": "x"}}}), 422, "filter")
    assert_problem(await small.post(search, json={"filter": {"s": "a\u0000b"}}), 422, "filter")  # was a 500 on PostgreSQL
    assert_problem(await small.post(search, json={"filter": {"a\u0000": 1}}), 422, "filter")
    assert_problem(await small.post(search, json={"cursor": "garbage"}), 422, "cursor")
    assert_problem(await small.post(search, json={"limit": 11}), 422, "limit")
    assert_problem(await small.get(f"/v1/{namespace}/checkpoints/tuple", params={"thread_id": "t", "checkpoint_id": "a\x00"}), 422, "checkpoint_id")
    assert_problem(await small.get(f"/v1/{namespace}/checkpoints/tuple"), 422, "thread_id")
    assert_problem(await small.put(f"/v1/{namespace}/checkpoints/retention", json={"keep_latest": -1}), 422, "keep_latest")
    copy = {"source_thread_id": "t", "target_thread_id": "t"}
    assert_problem(await small.post(f"/v1/{namespace}/checkpoints/threads/copy", json=copy), 422, "target_thread_id")
    assert_problem(await small.post(f"/v1/{namespace}/checkpoints/prune", json={"thread_ids": ["t"], "strategy": "all"}), 422, "strategy")


async def test_pages_follow_the_cursor_to_the_end(small: httpx.AsyncClient, namespace: str) -> None:
    url = f"/v1/{namespace}/checkpoints/put"
    for i in range(12):
        assert (await small.post(url, json=checkpoint(thread_id=f"t{i % 3}", checkpoint_id=f"c{i:02}", metadata={"i": i}))).is_success
    seen, cursor = [], None
    while True:
        page = (await small.post(f"/v1/{namespace}/checkpoints/search", json={"cursor": cursor} if cursor else {})).json()
        assert len(page["items"]) <= 5
        seen += [(p["checkpoint_id"], p["thread_id"]) for p in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == [(f"c{i:02}", f"t{i % 3}") for i in reversed(range(12))]
    only = (await small.post(f"/v1/{namespace}/checkpoints/search", json={"filter": {"i": 7.0}})).json()["items"]
    assert [p["checkpoint_id"] for p in only] == ["c07"]
    # An integer beyond 64 bits filters as it was written, on both backends (a 500 on PostgreSQL before).
    big = 10**20
    assert (await small.post(url, json=checkpoint(thread_id="big", checkpoint_id="c99", metadata={"i": big}))).is_success
    found = (await small.post(f"/v1/{namespace}/checkpoints/search", json={"filter": {"i": big}})).json()["items"]
    assert [p["checkpoint_id"] for p in found] == ["c99"]
    none = (await small.post(f"/v1/{namespace}/checkpoints/search", json={"filter": {"i": big + 1}})).json()["items"]
    assert none == []


async def test_metadata_numbers_read_back_and_filter_alike_on_both_backends(http: httpx.AsyncClient, namespace: str) -> None:
    """PostgreSQL keeps metadata as jsonb, whose numbers are the decimals written: 2.0**70, as
    orjson writes it (``1.1805916207174113e21``), read back there as the integer
    1180591620717411300000 (another number, and not a float), so a filter on 2**70 found it on
    SQLite only; ``-0.0`` read back as ``0.0``. Floats are now stored as jsonb answers them back,
    on both backends (``app.core.jsonvalue.jsonb_text``)."""
    base = f"/v1/{namespace}/checkpoints"
    floats = {"big": 2.0**70, "e16": 1e16, "neg": -3.4e20, "zero": -0.0, "tiny": 5e-324, "huge": 1e300,
              "deep": [1e20, {"z": -0.0}], "wide": 2**70}
    r = await http.post(f"{base}/put", json=checkpoint(thread_id="nums", metadata=floats))
    assert r.status_code == 200, r.text
    got = (await http.get(f"{base}/tuple", params={"thread_id": "nums"})).json()["metadata"]
    want = {**floats, "zero": 0.0, "deep": [1e20, {"z": 0.0}]}
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)  # an int is not a float here

    async def found(flt: dict) -> list[str]:
        r = await http.post(f"{base}/search", json={"thread_id": "nums", "filter": flt})
        assert r.status_code == 200, r.text
        return [p["checkpoint_id"] for p in r.json()["items"]]

    assert await found({"big": 2**70}) == ["c1"]  # was none on PostgreSQL
    assert await found({"big": 2.0**70}) == ["c1"]
    assert await found({"big": 1180591620717411300000}) == []  # the decimal PostgreSQL answered
    assert await found({"wide": 2.0**70}) == ["c1"]
    assert await found({"e16": 10**16}) == ["c1"]
    assert await found({"zero": 0}) == ["c1"]
    assert await found({"huge": 1e300, "neg": -3.4e20, "tiny": 5e-324}) == ["c1"]


async def test_metadata_numbers_no_float_holds_are_422_naming_the_field(http: httpx.AsyncClient, namespace: str) -> None:
    """Found by attack (issue 44): metadata ``1e400`` and ``-1e400`` were stored and read back as
    null, ``1e-400`` as ``0.0``. Each is now a 422 naming its place, as a vector payload's
    infinity is, and nothing is stored; numbers a float holds (``5e-324``, ``0e-500``) still pass."""
    base = f"/v1/{namespace}/checkpoints"
    head = '{"thread_id":"t","checkpoint_id":"c1","checkpoint":{"type":"bytes","data":"AA=="},'
    j = {"Content-Type": "application/json"}
    for number in ("1e400", "-1e400", "1e-400", "0.5E-99999"):
        r = await http.post(f"{base}/put", content=head + '"metadata":{"a":{"b":[1,' + number + "]}}}", headers=j)
        assert_problem(r, 422, "metadata.a.b.1")
        assert number in r.json()["detail"]
    r = await http.post(f"{base}/put", content=head + '"channel_versions":{"v":1e-400}}', headers=j)
    assert_problem(r, 422, "channel_versions.v")
    assert_problem(await http.post(f"{base}/search", content='{"filter":{"a":-1e-400}}', headers=j), 422, "filter.a")
    assert_problem(await http.get(f"{base}/tuple", params={"thread_id": "t"}), 404)
    r = await http.post(f"{base}/put", content=head + '"metadata":{"s":"1e400, in a string","n":[5e-324,0e-500,1e-300]}}', headers=j)
    assert r.status_code == 200, r.text
    got = (await http.get(f"{base}/tuple", params={"thread_id": "t"})).json()["metadata"]
    assert got == {"s": "1e400, in a string", "n": [5e-324, 0.0, 1e-300]}


async def test_copies_in_opposite_directions_at_once_all_succeed(http: httpx.AsyncClient, namespace: str) -> None:
    """Copies of a into b and of b into a, 20 pairs at once against the real server (two at a
    time: ``fairness.heavy_per_namespace``): each locks both threads in thread_id order, so none
    waits on the other in a cycle. Before, each held its source and waited for its target:
    PostgreSQL broke the deadlock by failing one (a 500)."""
    base = f"/v1/{namespace}/checkpoints"
    for thread in ("a", "b"):
        for i in range(3):
            put = checkpoint(thread_id=thread, checkpoint_id=f"c{i}", metadata={"i": i})
            assert (await http.post(f"{base}/put", json=put)).status_code == 200
    answers = []
    for _ in range(20):
        answers += await asyncio.gather(*(
            http.post(f"{base}/threads/copy", json={"source_thread_id": s, "target_thread_id": t}) for s, t in (("a", "b"), ("b", "a"))
        ))
    pairs = answers
    assert [r.status_code for r in answers] == [200] * len(pairs), [r.text for r in answers if r.status_code != 200][:2]
    missing = await http.post(f"{base}/threads/copy", json={"source_thread_id": "zz", "target_thread_id": "a0"})
    assert missing.status_code == 200 and missing.json()["copied"] == 0
    page = (await http.post(f"{base}/search", json={"thread_id": "a0"})).json()
    assert page["items"] == []  # nothing made for a missing source


async def test_a_backslash_before_u0000_is_text_not_a_nul(small: httpx.AsyncClient, namespace: str) -> None:
    """Metadata holding a backslash then ``u0000`` (six characters) is JSON ``"\\\\u0000"``, no
    NUL: stored and found by a filter on both backends. Before, the NUL check read the escape
    inside it and answered 422; a real NUL still is one."""
    url = f"/v1/{namespace}/checkpoints"
    text = "\\u0000"
    assert len(text) == 6
    r = await small.post(f"{url}/put", json=checkpoint(thread_id="bs", metadata={"k": text}))
    assert r.status_code == 200, r.text
    found = (await small.post(f"{url}/search", json={"filter": {"k": text}})).json()["items"]
    assert [(p["thread_id"], p["metadata"]) for p in found] == [("bs", {"k": text})]
    assert_problem(await small.post(f"{url}/put", json=checkpoint(metadata={"k": "a\\\u0000"})), 422, "metadata")


async def test_a_page_stops_at_its_byte_budget(backend: Backend, server: Server, namespace: str, tmp_path: Path) -> None:
    """A search page ends before the checkpoint that would make it weigh more than
    ``checkpoints.max_page_bytes`` (checkpoints with their channel values and pending writes; the
    first always comes), and its ``next_cursor`` goes on: every checkpoint comes once, in order.
    Before, a page was ``limit`` checkpoints whatever they held: up to 1,000 of 8 MB each, with
    their values and writes, built whole in the gateway's memory for one request."""
    budget = 15_000
    settings = Settings(
        databases={db: {"url": url} for db, url in backend.urls.items()}, data_dir=tmp_path,
        auth={"mode": "disabled"}, auto_migrate=False,
        checkpoints={"max_blob_bytes": 4096, "max_page_bytes": budget, "max_checkpoint_bytes": 8000,
                     "max_pending_bytes": 7000},
    )
    app = create_app(settings)
    put, search = f"/v1/{namespace}/checkpoints/put", f"/v1/{namespace}/checkpoints/search"

    def data(n: int) -> dict:
        return {"type": "bytes", "data": base64.b64encode(b"x" * n).decode()}

    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            for i in range(9):  # ~3 KB each; c04 holds a 4 KB value too, c06 two 3 KB pending writes
                body = checkpoint(thread_id="b", checkpoint_id=f"c{i:02}", checkpoint=data(3000))
                if i == 4:
                    body |= {"channel_versions": {"m": "1"}, "blobs": [{"channel": "m", "version": "1", **data(4000)}]}
                assert (await http.post(put, json=body)).is_success
                if i == 6:
                    writes = {"thread_id": "b", "checkpoint_id": "c06", "task_id": "k",
                              "writes": [{"idx": j, "channel": "w", **data(3000)} for j in range(2)]}
                    assert (await http.post(f"/v1/{namespace}/checkpoints/writes", json=writes)).is_success
            pages, cursor = [], None
            while True:
                r = await http.post(search, json={"thread_id": "b", "limit": 100} | ({"cursor": cursor} if cursor else {}))
                assert r.status_code == 200, r.text
                page = r.json()
                pages.append([p["checkpoint_id"] for p in page["items"]])
                cursor = page["next_cursor"]
                if not cursor:
                    break
            # each ~3.3 KB (3 KB and 256 for its row), c06 9.8 KB with its writes, c04 7.5 KB with its value;
            # newest first: c08 c07 | c06 c05 | c04 c03 c02 | c01 c00
            assert pages == [["c08", "c07"], ["c06", "c05"], ["c04", "c03", "c02"], ["c01", "c00"]], pages
            heavy = (await http.post(search, json={"thread_id": "b", "checkpoint_id": "c06"})).json()["items"]
            assert len(heavy[0]["pending_writes"]) == 2
            # A page under the budget is as before: full pages have a cursor, the last none.
            r = (await http.post(search, json={"thread_id": "b", "limit": 2})).json()
            assert [p["checkpoint_id"] for p in r["items"]] == ["c08", "c07"] and r["next_cursor"]


async def test_filter_keys_are_found_alike_on_both_backends(http: httpx.AsyncClient, namespace: str) -> None:
    """A filter key of up to 256 characters (1,024 bytes of UTF-8 at most) finds its checkpoint on
    both backends; a longer one is a 422 naming the filter. Before, a key over 1,024 bytes was
    found on PostgreSQL (jsonb containment) and never on SQLite (no metadata term for it)."""
    url = f"/v1/{namespace}/checkpoints/put"
    wide, long = "\U0001d11e" * 256, "a" * 1025  # 1,024 bytes in 256 characters; 1,025 bytes
    for cid, key in (("c1", wide), ("c2", long)):
        r = await http.post(url, json=checkpoint(thread_id="keys", checkpoint_id=cid, metadata={key: None, "n": cid}))
        assert r.is_success, r.text
    search = f"/v1/{namespace}/checkpoints/search"
    found = (await http.post(search, json={"filter": {wide: None}})).json()["items"]
    assert [p["checkpoint_id"] for p in found] == ["c1"]
    assert_problem(await http.post(search, json={"filter": {long: None}}), 422, "filter")
    assert_problem(await http.post(search, json={"filter": {"a" * 257: 1}}), 422, "filter")
    both = (await http.post(search, json={"thread_id": "keys"})).json()["items"]
    assert [p["checkpoint_id"] for p in both] == ["c2", "c1"]  # stored whatever their keys


async def test_a_page_budget_beyond_32_bits_is_taken(backend: Backend, server: Server, namespace: str, tmp_path: Path) -> None:
    """``checkpoints.max_page_bytes`` of 2**31 or more: found in review, every search of more than
    one checkpoint was a 500 on PostgreSQL (the budget was bound as a 32-bit integer)."""
    settings = Settings(
        databases={db: {"url": url} for db, url in backend.urls.items()}, data_dir=tmp_path,
        auth={"mode": "disabled"}, auto_migrate=False, checkpoints={"max_page_bytes": 2**40},
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            for cid in ("c1", "c2", "c3"):
                r = await http.post(f"/v1/{namespace}/checkpoints/put", json=checkpoint(thread_id="huge", checkpoint_id=cid))
                assert r.is_success, r.text
            r = await http.post(f"/v1/{namespace}/checkpoints/search", json={"thread_id": "huge", "limit": 2})
            assert r.status_code == 200, r.text
            assert [p["checkpoint_id"] for p in r.json()["items"]] == ["c3", "c2"] and r.json()["next_cursor"]


@contextlib.asynccontextmanager
async def gateway(backend: Backend, tmp_path: Path, **checkpoints: int) -> AsyncIterator[httpx.AsyncClient]:
    """The app in-process on the test databases with these ``checkpoints`` settings."""
    settings = Settings(
        databases={db: {"url": url} for db, url in backend.urls.items()}, data_dir=tmp_path,
        auth={"mode": "disabled"}, auto_migrate=False, checkpoints=checkpoints,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            yield http


def typed(n: int, fill: bytes = b"x") -> dict:
    return {"type": "bytes", "data": base64.b64encode(fill * n).decode()}


async def test_a_checkpoint_may_weigh_at_most_max_checkpoint_bytes(
    backend: Backend, server: Server, namespace: str, tmp_path: Path
) -> None:
    """A put is a 413 when the checkpoint with its metadata, versions and the channel values they
    reference (stored before, or brought by the put) would weigh more than
    ``checkpoints.max_checkpoint_bytes``, and stores nothing: not the checkpoint, not its new
    values, not the thread. Before, a checkpoint could reference any number of stored values,
    each up to ``max_blob_bytes``, and a read built them all in memory."""
    put = f"/v1/{namespace}/checkpoints/put"
    limits = {"max_blob_bytes": 4000, "max_checkpoint_bytes": 6000, "max_pending_bytes": 6000, "max_page_bytes": 12000}
    async with gateway(backend, tmp_path, **limits) as http:
        # 4 KB brought by the put: 1 KB + 4 KB + JSON fits
        c1 = checkpoint(thread_id="w", checkpoint_id="c1", checkpoint=typed(1000),
                        channel_versions={"a": "1"}, blobs=[{"channel": "a", "version": "1", **typed(4000)}])
        assert (await http.post(put, json=c1)).status_code == 200
        # c2 brings 3 KB of b and references the stored 4 KB of a: over
        c2 = checkpoint(thread_id="w", checkpoint_id="c2", checkpoint=typed(100), channel_versions={"a": "1", "b": "1"},
                        blobs=[{"channel": "b", "version": "1", **typed(3000)}])
        assert_problem(await http.post(put, json=c2), 413, "max_checkpoint_bytes")
        # nothing of it was stored: c2 is missing, and b's value at version 1 too (a checkpoint
        # referencing it alone would weigh 3 KB more if it were, and would carry it)
        assert_problem(await http.get(f"/v1/{namespace}/checkpoints/tuple", params={"thread_id": "w", "checkpoint_id": "c2"}), 404)
        c3 = checkpoint(thread_id="w", checkpoint_id="c3", checkpoint=typed(2990), channel_versions={"b": "1"})
        assert (await http.post(put, json=c3)).status_code == 200
        got = (await http.get(f"/v1/{namespace}/checkpoints/tuple", params={"thread_id": "w"})).json()
        assert got["checkpoint_id"] == "c3" and got["values"] == {}
        # a value brought twice at a version already stored counts once, as stored
        again = c1 | {"checkpoint_id": "c4"}
        assert (await http.post(put, json=again)).status_code == 200
        # a new thread is not even registered by a refused put
        big = checkpoint(thread_id="new", checkpoint_id="c1", checkpoint=typed(4000), metadata={"k": "v" * 2100})
        assert_problem(await http.post(put, json=big), 413, "max_checkpoint_bytes")
        found = (await http.post(f"/v1/{namespace}/checkpoints/search", json={"thread_id": "new"})).json()
        assert found["items"] == []
        assert (await http.delete(f"/v1/{namespace}/checkpoints/threads", params={"thread_id": "new"})).json() == {"deleted": 0}


async def test_the_pending_writes_of_a_checkpoint_may_weigh_at_most_max_pending_bytes(
    backend: Backend, server: Server, namespace: str, tmp_path: Path
) -> None:
    """Pending writes add up over every ``put_writes`` of a checkpoint; one that would make them
    weigh more than ``checkpoints.max_pending_bytes`` is a 413 and stores none of its writes.
    Writes sent again (a retry) or replaced (special writes) count once. Before, any number of
    tasks could each add writes of up to ``max_blob_bytes`` to one checkpoint."""
    put, writes = f"/v1/{namespace}/checkpoints/put", f"/v1/{namespace}/checkpoints/writes"
    limits = {"max_blob_bytes": 4000, "max_checkpoint_bytes": 6000, "max_pending_bytes": 8000, "max_page_bytes": 14000}

    def task(task_id: str, *sizes: int, idx: int = 0, fill: bytes = b"x") -> dict:
        return {"thread_id": "p", "checkpoint_id": "c1", "task_id": task_id,
                "writes": [{"idx": idx + i, "channel": "w", **typed(n, fill)} for i, n in enumerate(sizes)]}

    async with gateway(backend, tmp_path, **limits) as http:
        assert (await http.post(put, json=checkpoint(thread_id="p", checkpoint_id="c1"))).status_code == 200
        # a write weighs its bytes, its task id, channel, type and path, and 256 for its row
        assert (await http.post(writes, json=task("a", 2000, 1000))).status_code == 204  # 3,526
        assert (await http.post(writes, json=task("a", 2000, 1000))).status_code == 204  # a retry: kept once
        assert (await http.post(writes, json=task("b", 2500))).status_code == 204  # 6,289
        assert_problem(await http.post(writes, json=task("c", 1200, 600)), 413, "max_pending_bytes")  # 8,601
        # a retried write counts as stored, ids and row included: a's idx 0 again (2,263) with a
        # new idx 2 (1,863) makes 8,152 (PostgreSQL counted the retried one by its bytes: 7,889)
        retry = task("a", 2000, 1600)
        retry["writes"][1]["idx"] = 2
        assert_problem(await http.post(writes, json=retry), 413, "max_pending_bytes")
        # special writes replace: 400 -> 500 -> 300 at the same idx stays within 8,000
        for n in (400, 500, 300):
            assert (await http.post(writes, json=task("d", n, idx=-1))).status_code == 204, n
        assert_problem(await http.post(writes, json=task("d", 1500, idx=-1)), 413, "max_pending_bytes")  # 8,045
        got = (await http.get(f"/v1/{namespace}/checkpoints/tuple", params={"thread_id": "p"})).json()
        stored = sorted((w["task_id"], w["idx"], len(base64.b64decode(w["data"]))) for w in got["pending_writes"])
        assert stored == [("a", 0, 2000), ("a", 1, 1000), ("b", 0, 2500), ("d", -1, 300)]
        # writes of another checkpoint have their own budget
        other = task("a", 4000) | {"checkpoint_id": "c0"}
        assert (await http.post(writes, json=other)).status_code == 204


async def test_a_checkpoint_heavier_than_a_read_is_refused_not_loaded(
    backend: Backend, server: Server, namespace: str, tmp_path: Path
) -> None:
    """A checkpoint stored under larger limits than the gateway now has (or by writes sent at the
    same moment, each checked against what was stored before it) weighs more than
    ``checkpoints.max_page_bytes``: a read of it is a 409 naming the setting, and its values and
    writes are not loaded. A search page ends before it; the page that would start with it is the
    409. Before, a single tuple had no bound: ``get`` built it whole in memory."""
    put, writes = f"/v1/{namespace}/checkpoints/put", f"/v1/{namespace}/checkpoints/writes"
    roomy = {"max_blob_bytes": 8000, "max_checkpoint_bytes": 20000, "max_pending_bytes": 20000, "max_page_bytes": 40000}
    async with gateway(backend, tmp_path, **roomy) as http:
        for cid in ("c1", "c2", "c3"):
            body = checkpoint(thread_id="h", checkpoint_id=cid, checkpoint=typed(100))
            if cid == "c2":  # 2 x 8 KB of values, 8 KB of writes
                body |= {"channel_versions": {"a": "1", "b": "1"},
                         "blobs": [{"channel": c, "version": "1", **typed(8000)} for c in "ab"]}
            assert (await http.post(put, json=body)).status_code == 200
        w = {"thread_id": "h", "checkpoint_id": "c2", "task_id": "t", "writes": [{"idx": 0, "channel": "w", **typed(8000)}]}
        assert (await http.post(writes, json=w)).status_code == 204
    tight = {"max_blob_bytes": 4000, "max_checkpoint_bytes": 5000, "max_pending_bytes": 5000, "max_page_bytes": 10000}
    async with gateway(backend, tmp_path, **tight) as http:
        tuple_ = f"/v1/{namespace}/checkpoints/tuple"
        r = await http.get(tuple_, params={"thread_id": "h", "checkpoint_id": "c2"})
        assert_problem(r, 409, "max_page_bytes")
        assert r.json()["code"] == "checkpoint_too_large"
        assert (await http.get(tuple_, params={"thread_id": "h", "checkpoint_id": "c1"})).status_code == 200
        assert (await http.get(tuple_, params={"thread_id": "h"})).json()["checkpoint_id"] == "c3"
        search = f"/v1/{namespace}/checkpoints/search"
        first = (await http.post(search, json={"thread_id": "h", "limit": 10})).json()
        assert [p["checkpoint_id"] for p in first["items"]] == ["c3"] and first["next_cursor"]
        assert_problem(await http.post(search, json={"thread_id": "h", "cursor": first["next_cursor"]}), 409, "max_page_bytes")
        # the thread can still be pruned to what a read answers
        assert (await http.post(f"/v1/{namespace}/checkpoints/prune", json={"thread_ids": ["h"]})).json() == {"deleted": 2}


def test_every_checkpoint_written_fits_a_read() -> None:
    """A setting that would let a write store a checkpoint no read answers stops start-up."""
    with pytest.raises(ValueError, match="max_page_bytes"):
        Settings(checkpoints={"max_checkpoint_bytes": 20, "max_pending_bytes": 20, "max_page_bytes": 39})
    assert Settings(checkpoints={"max_checkpoint_bytes": 20, "max_pending_bytes": 20, "max_page_bytes": 40})
    # write limits left unset fit a smaller page (a deployment that lowered only the page starts as before)
    fitted = Settings(checkpoints={"max_page_bytes": 10_000}).checkpoints
    assert (fitted.max_checkpoint_bytes, fitted.max_pending_bytes) == (5_000, 5_000)
    with pytest.raises(ValueError, match="max_page_bytes"):  # a limit set explicitly is kept as set
        Settings(checkpoints={"max_page_bytes": 10_000, "max_checkpoint_bytes": 8_000})


async def test_what_a_write_accepts_a_read_answers(
    backend: Backend, server: Server, namespace: str, tmp_path: Path
) -> None:
    """Found in review: three ways a write was accepted that a read then refused, or answered far
    beyond the budget. JSON was weighed as sent, where PostgreSQL stores ``1e300`` as 301 digits;
    values a put brought that its own versions do not reference were stored unweighed (and weigh
    on the checkpoint that references them); a pending write weighed its bytes only, so a
    checkpoint of empty writes with long ids answered 3 MB under a 12 KB budget."""
    put, writes = f"/v1/{namespace}/checkpoints/put", f"/v1/{namespace}/checkpoints/writes"
    tuple_ = f"/v1/{namespace}/checkpoints/tuple"
    limits = {"max_blob_bytes": 4000, "max_checkpoint_bytes": 6000, "max_pending_bytes": 6000, "max_page_bytes": 12000}
    async with gateway(backend, tmp_path, **limits) as http:
        huge = checkpoint(thread_id="j", checkpoint_id="c1", metadata={f"k{i}": 1e300 for i in range(45)})
        r = await http.post(put, json=huge)
        assert r.status_code in (200, 413), r.text  # 413 on PostgreSQL (13 KB stored), 200 on SQLite (~0.5 KB)
        if r.status_code == 200:
            assert (await http.get(tuple_, params={"thread_id": "j", "checkpoint_id": "c1"})).status_code == 200

        ahead = checkpoint(thread_id="u", checkpoint_id="c1", channel_versions={c: "1" for c in "abcd"})
        assert (await http.post(put, json=ahead)).status_code == 200
        unreferenced = checkpoint(thread_id="u", checkpoint_id="c2", blobs=[
            {"channel": c, "version": "1", **typed(4000)} for c in "abcd"
        ])
        assert_problem(await http.post(put, json=unreferenced), 413, "max_checkpoint_bytes")
        assert (await http.get(tuple_, params={"thread_id": "u", "checkpoint_id": "c1"})).json()["values"] == {}

        ids = {"task_id": "t" * 1000, "task_path": "p" * 1000}
        many = {"thread_id": "u", "checkpoint_id": "c1", **ids,
                "writes": [{"idx": i, "channel": "c" * 1000, "type": "bytes", "data": ""} for i in range(100)]}
        assert_problem(await http.post(writes, json=many), 413, "max_pending_bytes")
        one = many | {"writes": many["writes"][:1]}  # 3,261 bytes: two would pass 6,000
        assert (await http.post(writes, json=one)).status_code == 204
        assert_problem(await http.post(writes, json=one | {"task_id": "s" * 1000}), 413, "max_pending_bytes")
        r = await http.get(tuple_, params={"thread_id": "u", "checkpoint_id": "c1"})
        assert r.status_code == 200 and len(r.json()["pending_writes"]) == 1 and len(r.content) < 12000


@pytest.mark.parametrize(("path", "body", "refused_at"), [
    ("prune", {"thread_ids": ["t"] * 100_001}, "ceiling"),
    ("prune", {"thread_ids": [""] * 100_001}, "first item"),
    ("runs/delete", {"run_ids": ["r"] * 100_001}, "ceiling"),
    ("runs/delete", {"run_ids": [1] * 100_001}, "first item"),
    ("writes", {"thread_id": "t", "checkpoint_id": "c", "task_id": "k", "writes": [1] * 100_001}, "first item"),
    ("put", checkpoint(blobs=[1] * 100_001), "first item"),
    ("put", checkpoint(channel_versions={str(i): True for i in range(100_001)}), "ceiling"),
])
async def test_a_list_past_its_ceiling_is_refused_at_its_first_item_past_it(
    http: httpx.AsyncClient, namespace: str, path: str, body: dict, refused_at: str
) -> None:
    """Found by attack: these lists had no ceiling in their schemas, so validation collected one
    error per invalid item before the service's count check: a 3 MB body of a million empty
    thread ids held the event loop 13 s and took 1.7 GB. Validation now stops past
    ``MAX_LIST_ITEMS`` (a dict's size is checked before its items), or at its first invalid item
    (``tests/test_request_bounds.py``): one error either way."""
    r = await http.post(f"/v1/{namespace}/checkpoints/{path}", json=body)
    assert_problem(r, 422)
    [error] = r.json()["errors"]
    if refused_at == "ceiling":
        assert "at most 100000" in error["msg"], error
    else:
        assert error["loc"][2] == "0", error


async def test_a_search_cursor_names_its_thread_not_a_number_shared_by_namespaces(http: httpx.AsyncClient, namespace: str) -> None:
    """Found by attack: a search cursor carried the thread's internal key, numbered across every
    namespace, so a namespace saw how many threads the others made between two of its writes. It
    now names the thread by its thread_id; pages still go through checkpoints of one id in
    several threads in order."""
    url = f"/v1/{namespace}/checkpoints"
    for thread in ("a", "b", "c"):
        for cid in ("c1", "c2"):
            assert (await http.post(f"{url}/put", json=checkpoint(thread_id=thread, checkpoint_id=cid))).is_success
    seen, cursor, cursors = [], None, []
    while True:
        page = (await http.post(f"{url}/search", json={"limit": 2} | ({"cursor": cursor} if cursor else {}))).json()
        seen += [(p["checkpoint_id"], p["thread_id"]) for p in page["items"]]
        if not (cursor := page["next_cursor"]):
            break
        cursors.append(json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))))
    assert seen == [("c2", "c"), ("c2", "b"), ("c2", "a"), ("c1", "c"), ("c1", "b"), ("c1", "a")]
    assert cursors == [{"v": 1, "c": c, "t": t, "n": ""} for c, t in (("c2", "b"), ("c1", "c"), ("c1", "a"))]


@pytest.mark.backends("sqlite")
async def test_a_page_weighs_only_the_checkpoints_it_answers(backend: Backend, server: Server, tmp_path: Path, namespace: str) -> None:
    """SQLite computes a select's columns before it sorts: a page whose order needs a sort (a
    thread's history across checkpoint_ns, a namespace's checkpoints) weighed every checkpoint
    it sorted, each with its channel versions' values, to answer ``limit`` of them (0.6 s a page
    at 50,000 checkpoints, growing with the thread). The page's keys are now found first. The
    weighing's ``octet_length`` calls are counted (a Python function in its place)."""
    from sqlalchemy import insert, select

    from app.checkpoints.models import checkpoint_threads, checkpoints
    from app.core.config import Database
    from app.core.state import gateway_state

    app = create_app(in_process_settings(backend, tmp_path))
    n = 2000
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            body = checkpoint(checkpoint_id="a0", channel_versions={f"ch{k}": "1" for k in range(20)})
            assert (await http.post(f"/v1/{namespace}/checkpoints/put", json=body)).status_code == 200
        engine = gateway_state(app).databases.engine(Database.checkpoints)
        # IMMEDIATE (SQLite): a transaction that has read cannot wait for the write lock (SQLITE_BUSY at
        # once), and the gateway's background work (a WAL checkpoint, a new pooled connection) takes it now and then
        async with engine.execution_options(sqlite_begin="IMMEDIATE").begin() as conn:
            t = checkpoint_threads
            mine = select(t.c.pk).where(t.c.namespace == namespace, t.c.thread_id == "t").scalar_subquery()
            row = (await conn.execute(select(checkpoints).where(checkpoints.c.thread_pk == mine))).mappings().one()
            await conn.execute(insert(checkpoints), [
                {**row, "checkpoint_ns": f"n{i % 2}", "checkpoint_id": f"c{i:05}"} for i in range(n)
            ])
        reader = app.state.gateway.services["checkpoints"].reader
        calls = 0

        def octet_length(value: object) -> int | None:
            nonlocal calls
            calls += 1
            return None if value is None else len(value.encode() if isinstance(value, str) else value)  # type: ignore[arg-type]

        for thread_id in ("t", None):  # a thread's history across its checkpoint_ns; the namespace's
            async with engine.connect() as conn:
                raw = await conn.get_raw_connection()
                await raw.driver_connection.create_function("octet_length", 1, octet_length)  # type: ignore[union-attr]
                calls = 0
                rows, _ = await reader.page(conn, namespace, thread_id=thread_id, checkpoint_ns=None, limit=5, budget=1 << 30)
                assert [r.checkpoint_id for r in rows] == ["c01999", "c01998", "c01997", "c01996", "c01995"]
                assert 0 < calls < 200, calls  # a few a checkpoint answered (thousands when all were weighed)


async def test_a_thread_larger_than_a_copy_may_write_is_413_and_copies_nothing(
    backend: Backend, server: Server, tmp_path: Path, namespace: str
) -> None:
    """Found by attack: a copy wrote the whole source thread again whatever its size, from one
    small request (and on SQLite held the write lock of every namespace's checkpoints while it
    did). A copy now writes at most ``checkpoints.max_copy_bytes``."""
    app = create_app(in_process_settings(backend, tmp_path, checkpoints={"max_copy_bytes": 10_000}))
    data = base64.b64encode(b"x" * 3000).decode()
    base = f"/v1/{namespace}/checkpoints"
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            for i in range(3):  # 3 x (3,000 bytes, their JSON and ids, 256 a row): under 10,000
                body = checkpoint(checkpoint_id=f"c{i}", checkpoint={"type": "bytes", "data": data})
                assert (await http.post(f"{base}/put", json=body)).status_code == 200
            r = await http.post(f"{base}/threads/copy", json={"source_thread_id": "t", "target_thread_id": "u"})
            assert r.status_code == 200 and r.json() == {"copied": 3}, r.text
            body = checkpoint(checkpoint_id="c3", checkpoint={"type": "bytes", "data": data})
            assert (await http.post(f"{base}/put", json=body)).status_code == 200
            r = await http.post(f"{base}/threads/copy", json={"source_thread_id": "t", "target_thread_id": "v"})
            assert_problem(r, 413, "max_copy_bytes")
            r = await http.post(f"{base}/search", json={"thread_id": "v"})
            assert r.status_code == 200 and r.json()["items"] == []


@pytest.mark.parametrize(
    "where", ["values", "writes", pytest.param("terms", marks=pytest.mark.sqlite_only)]  # SQLite's filter rows
)
async def test_a_thread_whose_bytes_are_in_its_keys_is_weighed_whole_by_a_copy(
    backend: Backend, server: Server, tmp_path: Path, namespace: str, where: str
) -> None:
    """Found by attack: the copy limit weighed a thread's values and pending writes by their bytes
    alone, so a thread whose weight was in its keys (a 1,024-character checkpoint_ns, channels,
    versions, task ids and paths, with empty bytes) weighed a few bytes: five checkpoints with
    1,000 such values and 1,000 such writes each copied 128 MiB under a ``max_copy_bytes`` of
    1 MiB. A copy now weighs every stored byte of every row it writes (keys, identifiers and the
    metadata terms SQLite keeps for filters included) and refuses the thread, writing nothing."""
    from sqlalchemy import func, select

    from app.checkpoints.models import checkpoint_threads
    from app.core.config import Database
    from app.core.state import gateway_state

    app = create_app(in_process_settings(backend, tmp_path, checkpoints={"max_copy_bytes": 100_000}))
    base = f"/v1/{namespace}/checkpoints"
    cns = "n" * 1000
    body = checkpoint(thread_id="keys", checkpoint_ns=cns, checkpoint={"type": "bytes", "data": ""})
    if where == "values":  # 60 x (1,000 + 1,003 + 128 + 5) key bytes, no value bytes
        body["blobs"] = [{"channel": f"{i:03}" + "c" * 1000, "version": "v" * 128, "type": "bytes", "data": ""} for i in range(60)]
    elif where == "terms":  # 1,000 terms that each repeat the 1,000-byte checkpoint_ns; ~11 KB of JSON
        body["metadata"] = {f"k{i:03}": 0 for i in range(1000)}
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            assert (await http.post(f"{base}/put", json=body)).status_code == 200
            if where == "writes":  # 30 x (1,000 + 4,000 + 1,000 + 1,000 + 5) key bytes, no write bytes
                writes = {"thread_id": "keys", "checkpoint_ns": cns, "checkpoint_id": "c1", "task_id": "T" * 1000,
                          "task_path": "P" * 4000,
                          "writes": [{"idx": i, "channel": "c" * 1000, "type": "bytes", "data": ""} for i in range(30)]}
                r = await http.post(f"{base}/writes", json=writes)
                assert r.status_code == 204, r.text
            r = await http.post(f"{base}/threads/copy", json={"source_thread_id": "keys", "target_thread_id": "keys-copy"})
            assert_problem(r, 413, "max_copy_bytes")
            r = await http.post(f"{base}/search", json={"thread_id": "keys-copy"})
            assert r.status_code == 200 and r.json()["items"] == []
            t = checkpoint_threads
            async with gateway_state(app).databases.engine(Database.checkpoints).connect() as conn:
                made = select(func.count()).where(t.c.namespace == namespace, t.c.thread_id == "keys-copy")
                assert (await conn.execute(made)).scalar_one() == 0
