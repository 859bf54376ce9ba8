"""Key-value entries through the client and raw HTTP, against a real server on both backends."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from storage_gateway_client import GatewayClient, InvalidRequest, KvEntry, PreconditionFailed
from tests.conftest import Backend, Server, backend_env, run_cli, start_server, stop_server

ODD_KEYS = ["a/b", "a:b", "with space", "slash/at/end/", "%41 not decoded", "é", "🎉", "?q=1#frag"]
ORDERED_KEYS = ["10", "9", "B", "a", "a b", "a/b", "a:b", "é"]

VALUES = [
    {"nested": {"a": [1, 2, {"b": None}], "s": "x"}},
    [],
    {},
    "",
    "üñí©ødé 🎉 \u2028 \"quoted\" \\ back",
    "a\u0000b\nc",
    0,
    -1,
    2**64 + 1,
    -(2**100),
    12345678901234567890123456789012345678901234567890,
    1.5,
    0.1,
    -0.0,
    1e-300,
    1.7976931348623157e308,
    True,
    False,
    None,
]


def kv_url(namespace: str, collection: str, key: str | None = None) -> str:
    base = f"/v1/{namespace}/kv/{collection}"
    return base if key is None else f"{base}/{quote(key, safe='')}"


async def test_set_get_delete_round_trip(gw: GatewayClient) -> None:
    etag = await gw.kv.set("settings", "theme", "dark")
    assert etag.startswith('"') and etag.endswith('"')
    assert await gw.kv.get("settings", "theme") == "dark"
    entry = await gw.kv.get_entry("settings", "theme")
    assert entry == KvEntry(key="theme", value="dark", etag=etag)
    await gw.kv.delete("settings", "theme")
    assert await gw.kv.get("settings", "theme") is None
    assert await gw.kv.get_entry("settings", "theme") is None
    await gw.kv.delete("settings", "theme")  # deleting a missing key is fine


@pytest.mark.parametrize("value", VALUES, ids=[f"v{i}" for i in range(len(VALUES))])
async def test_values_come_back_exactly(gw: GatewayClient, http: httpx.AsyncClient, value: object) -> None:
    await gw.kv.set("values", "k", value)
    got = await gw.kv.get("values", "k")
    assert got == value and type(got) is type(value)
    if isinstance(value, float):
        assert repr(got) == repr(value)
    raw = await http.get(kv_url(gw.namespace, "values", "k"))
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("application/json")
    assert raw.text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def test_stored_null_is_200_null(gw: GatewayClient, http: httpx.AsyncClient) -> None:
    await gw.kv.set("c", "nothing", None)
    r = await http.get(kv_url(gw.namespace, "c", "nothing"))
    assert r.status_code == 200 and r.content == b"null" and r.headers["etag"]
    entry = await gw.kv.get_entry("c", "nothing")
    assert entry is not None and entry.value is None
    missing = await http.get(kv_url(gw.namespace, "c", "absent"))
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["code"] == "not_found"


async def test_raw_body_is_stored_compact_and_returned_verbatim(gw: GatewayClient, http: httpx.AsyncClient) -> None:
    body = b'{ "b" : [1, 2.50, 3e2],\n "a": "\\u00e9", "big": 123456789012345678901234567890 }'
    r = await http.put(kv_url(gw.namespace, "c", "k"), content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 204 and r.headers["etag"]
    got = await http.get(kv_url(gw.namespace, "c", "k"))
    # Compact, with every number as written (issue 19: 2.50 is not rewritten 2.5, nor 3e2 300.0).
    assert got.text == '{"b":[1,2.50,3e2],"a":"é","big":123456789012345678901234567890}'
    assert got.headers["etag"] == r.headers["etag"]


@pytest.mark.parametrize("key", ODD_KEYS)
async def test_keys_with_slashes_colons_spaces(gw: GatewayClient, key: str) -> None:
    await gw.kv.set("odd", key, {"key": key})
    assert await gw.kv.get("odd", key) == {"key": key}
    assert [e.key for e in (await gw.kv.list("odd"))[0]] == [key]
    await gw.kv.delete("odd", key)
    assert await gw.kv.get("odd", key) is None


async def test_longest_key_is_accepted(gw: GatewayClient) -> None:
    key = "é" * 512  # 1024 bytes
    await gw.kv.set("c", key, 1)
    assert await gw.kv.get("c", key) == 1


async def test_list_is_in_byte_order_with_prefix_and_cursor(gw: GatewayClient) -> None:
    for i, key in enumerate(reversed(ORDERED_KEYS)):
        await gw.kv.set("ordered", key, i)
    entries, cursor = await gw.kv.list("ordered")
    assert [e.key for e in entries] == ORDERED_KEYS and cursor is None
    assert await gw.kv.get_all("ordered") == [len(ORDERED_KEYS) - 1 - i for i in range(len(ORDERED_KEYS))]
    # pages of 3 through cursors
    seen, cursor = [], None
    while True:
        page, cursor = await gw.kv.list("ordered", limit=3, cursor=cursor)
        assert len(page) <= 3
        seen += [e.key for e in page]
        if cursor is None:
            break
    assert seen == ORDERED_KEYS
    assert [e.key async for e in gw.kv.iter_entries("ordered", page_size=2)] == ORDERED_KEYS
    # prefix: "a" matches "a", "a b", "a/b", "a:b" but not "B"
    assert [e.key for e in (await gw.kv.list("ordered", prefix="a"))[0]] == ["a", "a b", "a/b", "a:b"]
    assert [e.key for e in (await gw.kv.list("ordered", prefix="a/"))[0]] == ["a/b"]
    assert (await gw.kv.list("ordered", prefix="zz"))[0] == []
    page, cursor = await gw.kv.list("ordered", prefix="a", limit=2)
    assert [e.key for e in page] == ["a", "a b"]
    page, cursor = await gw.kv.list("ordered", prefix="a", limit=2, cursor=cursor)
    assert [e.key for e in page] == ["a/b", "a:b"]
    assert await gw.kv.keys("ordered", prefix="a") == ["a", "a b", "a/b", "a:b"]


async def test_the_next_cursor_of_the_longest_keys_is_accepted(gw: GatewayClient) -> None:
    """A cursor holds the last key and the prefix, JSON-escaped and base64'd: for keys of 1,024
    quotes under a prefix of 600 it is about 4,400 characters, more than the 4,096 the list
    took, and the second page was a 422."""
    first, second = '"' * 1024, '"' * 1023 + "~"
    await gw.kv.set("long", first, 1)
    await gw.kv.set("long", second, 2)
    page, cursor = await gw.kv.list("long", prefix='"' * 600, limit=1)
    assert [e.key for e in page] == [first] and cursor is not None and len(cursor) > 4096
    page, cursor = await gw.kv.list("long", prefix='"' * 600, limit=1, cursor=cursor)
    assert [e.key for e in page] == [second]


async def test_prefix_with_like_wildcards_is_literal(gw: GatewayClient) -> None:
    for key in ["a%b", "a_b", "axb", "A%b"]:
        await gw.kv.set("wild", key, key)
    assert await gw.kv.keys("wild", prefix="a%") == ["a%b"]
    assert await gw.kv.keys("wild", prefix="a_") == ["a_b"]


async def test_list_items_carry_value_and_etag(gw: GatewayClient, http: httpx.AsyncClient) -> None:
    etag = await gw.kv.set("c", "k", {"x": [1, None]})
    r = await http.get(kv_url(gw.namespace, "c"))
    assert r.json() == {"items": [{"key": "k", "value": {"x": [1, None]}, "etag": etag}], "next_cursor": None}


async def test_get_all_of_an_empty_collection(gw: GatewayClient) -> None:
    assert await gw.kv.get_all("never-written") == []


async def test_etag_changes_on_every_write(gw: GatewayClient, http: httpx.AsyncClient) -> None:
    e1 = await gw.kv.set("c", "k", 1)
    e2 = await gw.kv.set("c", "k", 1)
    assert e1 != e2
    r = await http.get(kv_url(gw.namespace, "c", "k"))
    assert r.headers["etag"] == e2


async def test_if_match_compare_and_swap(gw: GatewayClient) -> None:
    e1 = await gw.kv.set("c", "counter", 1)
    e2 = await gw.kv.set("c", "counter", 2, if_match=e1)
    with pytest.raises(PreconditionFailed) as info:
        await gw.kv.set("c", "counter", 3, if_match=e1)
    assert info.value.status_code == 412 and info.value.code == "precondition_failed"
    assert await gw.kv.get_entry("c", "counter") == KvEntry(key="counter", value=2, etag=e2)
    with pytest.raises(PreconditionFailed):
        await gw.kv.set("c", "missing", 1, if_match=e2)  # If-Match on a missing key
    assert await gw.kv.get("c", "missing") is None
    with pytest.raises(PreconditionFailed):
        await gw.kv.set("c", "counter", 9, if_match='"not-a-version"')
    e3 = await gw.kv.set("c", "counter", 4, if_match="*")
    with pytest.raises(PreconditionFailed):
        await gw.kv.set("c", "missing", 1, if_match="*")
    # a list of tags matches any of them
    await gw.kv.set("c", "counter", 5, if_match=f'"1", {e3}')
    assert await gw.kv.get("c", "counter") == 5


@pytest.mark.parametrize("tag", ['"9223372036854775808"', '"99999999999999999999999"', '"' + "1" * 5000 + '"'])
async def test_etags_beyond_any_version_match_nothing(gw: GatewayClient, tag: str) -> None:
    """Versions are BIGINT: a bigger number is never one of ours (412 for If-Match; If-None-Match writes)."""
    await gw.kv.set("c", "big", 1)
    with pytest.raises(PreconditionFailed):
        await gw.kv.set("c", "big", 2, if_match=tag)
    await gw.kv.set("c", "big", 3, if_none_match=tag)
    current = await gw.kv.set("c", "big", 4)
    await gw.kv.set("c", "big", 5, if_match=f"{tag}, {current}")
    assert await gw.kv.get("c", "big") == 5


async def test_a_condition_lists_at_most_64_entity_tags(gw: GatewayClient, http: httpx.AsyncClient) -> None:
    """Each listed tag is a bound value of the write's statement, and each count its own
    statement: 64 distinct tags at most (a tag listed twice counts once), more is a 422 naming
    the header, and nothing is written."""
    current = await gw.kv.set("c", "many", 1)
    url = kv_url(gw.namespace, "c", "many")
    tags = ", ".join(f'"{n}"' for n in range(1000, 1064))
    r = await http.put(url, json=2, headers={"If-Match": f"{tags}, {current}, {current}"})
    assert r.status_code == 422 and "If-Match" in r.json()["detail"], r.text
    r = await http.put(url, json=2, headers={"If-None-Match": f"{tags}, {current}"})
    assert r.status_code == 422 and "If-None-Match" in r.json()["detail"], r.text
    assert await gw.kv.get("c", "many") == 1
    r = await http.put(url, json=3, headers={"If-Match": ", ".join([*tags.split(", ")[:63], current, current])})
    assert r.status_code == 204, r.text
    assert await gw.kv.get("c", "many") == 3


@pytest.mark.postgres_only
async def test_an_entry_rewritten_while_the_sweep_deletes_it_stays(gw: GatewayClient, backend: Backend) -> None:
    """The sweep deletes what its subquery found expired; a write that rewrote one of those
    entries meanwhile (a new value, no TTL: its 204 said so) is not deleted, because the
    expiry is checked again on the row deleted. Made certain with a row lock: the sweep waits
    on the row while the rewrite commits. Before, the entry was gone (PostgreSQL only: SQLite's
    sweep holds the write lock)."""
    from app.core.fast.fixed_statements import fixed_statements
    from app.core.db.upsert import insert_builder
    from app.kv.repository import KvRepository

    engine = create_async_engine(backend.urls["metadata"])
    try:
        async with engine.connect() as writer, engine.connect() as sweeper:
            # Locked while it is still live, then left to expire: locked after it expired, the
            # gateway's own sweep could delete it first (seen once in CI: nothing was locked,
            # and the test's sweep found nothing to wait for).
            await gw.kv.set("ttl", "raced", "old", ttl_seconds=1.0)
            where = "namespace = :ns AND collection = 'ttl' AND key = 'raced'"
            locked = await writer.execute(text(f"SELECT 1 FROM kv_entries WHERE {where} FOR UPDATE"), {"ns": gw.namespace})
            assert locked.all() == [(1,)]
            await asyncio.sleep(1.2)
            repo = KvRepository(insert_builder("postgresql"), fixed_statements("postgresql"))

            async def sweep() -> int:
                async with sweeper.begin():
                    return await repo.sweep_expired(sweeper, datetime.now(timezone.utc), 100)
            swept = asyncio.ensure_future(sweep())
            await asyncio.sleep(0.5)
            assert not swept.done()  # waiting on the row
            await writer.execute(
                text(f"UPDATE kv_entries SET value = '\"new\"', expires_at = NULL, version = version + 1 WHERE {where}"),
                {"ns": gw.namespace},
            )
            await writer.commit()
            await swept
    finally:
        await engine.dispose()
    assert await gw.kv.get("ttl", "raced") == "new"


async def test_etags_of_non_ascii_digits_match_nothing(gw: GatewayClient, http: httpx.AsyncClient) -> None:
    """``"\xb2"`` (superscript two, as the latin-1 header decodes) is a digit to Python, not a version."""
    await gw.kv.set("c", "sup", 1)
    url = f"/v1/{gw.namespace}/kv/c/sup"
    r = await http.put(url, json=2, headers={"If-Match": b'"\xb2"'})
    assert r.status_code == 412 and r.headers["content-type"] == "application/problem+json", r.text
    r = await http.put(url, json=3, headers={"If-None-Match": b'"\xb2"'})
    assert r.status_code == 204, r.text
    assert await gw.kv.get("c", "sup") == 3


async def test_if_none_match_star_creates_only(gw: GatewayClient) -> None:
    etag = await gw.kv.set("c", "once", "first", if_none_match="*")
    with pytest.raises(PreconditionFailed):
        await gw.kv.set("c", "once", "second", if_none_match="*")
    assert await gw.kv.get_entry("c", "once") == KvEntry(key="once", value="first", etag=etag)
    # If-None-Match with a tag: write unless the current version is that one
    with pytest.raises(PreconditionFailed):
        await gw.kv.set("c", "once", "third", if_none_match=etag)
    await gw.kv.set("c", "once", "fourth", if_none_match='"12345"')
    assert await gw.kv.get("c", "once") == "fourth"


async def test_only_a_bare_star_is_any_and_if_match_compares_strongly(gw: GatewayClient, http: httpx.AsyncClient) -> None:
    """Found by attack: a quoted ``"*"`` was taken as the wildcard (an unconditional overwrite
    for ``If-Match``, create-only for ``If-None-Match``), and ``If-Match`` took weak tags. RFC
    9110: only a bare ``*`` is any, and ``If-Match`` compares strongly (a weak tag never matches)."""
    etag = await gw.kv.set("c", "star", 1)
    url = f"/v1/{gw.namespace}/kv/c/star"
    for header in ('"*"', f"W/{etag}", f'W/{etag}, "*"'):
        r = await http.put(url, json=2, headers={"If-Match": header})
        assert r.status_code == 412 and r.headers["content-type"] == "application/problem+json", (header, r.text)
    assert await gw.kv.get("c", "star") == 1
    r = await http.put(url, json=3, headers={"If-None-Match": '"*"'})  # a tag no version has: the write goes on
    assert r.status_code == 204, r.text
    etag = r.headers["etag"]
    r = await http.put(url, json=4, headers={"If-None-Match": f"W/{etag}"})  # If-None-Match compares weakly
    assert r.status_code == 412, r.text
    r = await http.put(url, json=5, headers={"If-Match": f'"0", {etag}'})
    assert r.status_code == 204, r.text


async def test_delete_then_recreate_gives_a_new_etag(gw: GatewayClient) -> None:
    old = await gw.kv.set("c", "k", 1)
    await gw.kv.delete("c", "k")
    new = await gw.kv.set("c", "k", 1, if_none_match="*")
    assert new != old
    with pytest.raises(PreconditionFailed):
        await gw.kv.set("c", "k", 2, if_match=old)


async def test_ttl_expiry_hides_the_entry(gw: GatewayClient, http: httpx.AsyncClient) -> None:
    await gw.kv.set("ttl", "short", "soon gone", ttl_seconds=1)
    await gw.kv.set("ttl", "long", "stays", ttl_seconds=3600)
    await gw.kv.set("ttl", "forever", "stays")
    assert await gw.kv.get("ttl", "short") == "soon gone"
    await asyncio.sleep(1.3)
    assert await gw.kv.get_entry("ttl", "short") is None
    assert (await http.get(kv_url(gw.namespace, "ttl", "short"))).status_code == 404
    assert await gw.kv.keys("ttl") == ["forever", "long"]
    assert await gw.kv.get_all("ttl") == ["stays", "stays"]
    with pytest.raises(PreconditionFailed):
        await gw.kv.set("ttl", "short", 1, if_match="*")  # expired = missing
    await gw.kv.set("ttl", "short", "again", if_none_match="*")  # create-only over an expired entry
    assert await gw.kv.get("ttl", "short") == "again"
    # a plain set without ttl_seconds clears the expiry
    await gw.kv.set("ttl", "long", "no expiry now")
    assert await gw.kv.get("ttl", "long") == "no expiry now"


async def _count_rows(backend: Backend, namespace: str) -> int:
    engine = create_async_engine(backend.urls["metadata"])
    try:
        async with engine.connect() as conn:
            result = await conn.execute(
                text("SELECT count(*) FROM kv_entries WHERE namespace = :ns"), {"ns": namespace}
            )
            return int(result.scalar_one())
    finally:
        await engine.dispose()


async def test_expired_entries_are_swept_in_the_background(
    server: Server, backend: Backend, namespace: str, api_key: str | None, tmp_path
) -> None:
    env = {"GATEWAY_AUTH__ADMIN_KEY": api_key} if api_key else {}
    fast = start_server(backend, tmp_path / "sweep.log", GATEWAY_KV__SWEEP_INTERVAL_SECONDS="0.2",
                        GATEWAY_KV__SWEEP_BATCH="2", **env)
    try:
        async with GatewayClient(fast.url, namespace=namespace, api_key=api_key) as client:
            for i in range(5):
                await client.kv.set("ttl", f"k{i}", i, ttl_seconds=1)
            await client.kv.set("ttl", "keep", "kept")
            assert await _count_rows(backend, namespace) == 6
            deadline = asyncio.get_running_loop().time() + 15
            while await _count_rows(backend, namespace) > 1:
                assert asyncio.get_running_loop().time() < deadline, "expired entries were not swept"
                await asyncio.sleep(0.2)
            assert await client.kv.get_all("ttl") == ["kept"]
    finally:
        stop_server(fast)


async def test_namespaces_are_isolated(
    gw: GatewayClient, server: Server, api_key: str | None, client_transport: str
) -> None:
    async with GatewayClient(server.url, gw.namespace + "-other", api_key, transport=client_transport) as other:
        await gw.kv.set("shared", "k", "mine")
        await other.kv.set("shared", "k", "theirs")
        assert await gw.kv.get("shared", "k") == "mine"
        assert await other.kv.get("shared", "k") == "theirs"
        assert await gw.kv.get_all("shared") == ["mine"]
        await other.kv.delete("shared", "k")
        assert await gw.kv.get("shared", "k") == "mine"
        assert await other.kv.get("shared", "k") is None
        etag = (await gw.kv.get_entry("shared", "k")).etag  # type: ignore[union-attr]
        with pytest.raises(PreconditionFailed):
            await other.kv.set("shared", "k", "stolen", if_match=etag)
        assert await gw.kv.get("shared", "k") == "mine"


# --- bad input: a 4xx problem naming the field, and nothing stored changes ---------------------


async def _assert_problem(r: httpx.Response, status: int, field: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert field in body["detail"], body
    if "errors" in body:
        assert any(field in [str(x) for x in e["loc"]] for e in body["errors"]), body


BAD_WRITES = [
    pytest.param("c", "k", b"not json", {}, 422, "value", id="not-json"),
    pytest.param("c", "k", b"", {}, 422, "value", id="empty-body"),
    pytest.param("c", "k", b"NaN", {}, 422, "value", id="nan"),
    pytest.param("c", "k", b'{"x": Infinity}', {}, 422, "value", id="infinity"),
    pytest.param("c", "k", b"[1, NaN]", {}, 422, "value", id="nan-in-array"),
    pytest.param("c", "k", b'{"a": -Infinity}', {}, 422, "value", id="minus-infinity"),
    pytest.param("c", "k", b'"\\udc00"', {}, 422, "value", id="lone-surrogate"),
    pytest.param("c", "k", b'{"a": 1} trailing', {}, 422, "value", id="trailing-data"),
    pytest.param("c", "k", b"\xff\xfe", {}, 422, "value", id="not-utf8"),
    pytest.param("c", "k", b'"' + b"x" * (1024 * 1024) + b'"', {}, 413, "value", id="too-large"),
    pytest.param("c", "k", b"1", {"ttl_seconds": "0"}, 422, "ttl_seconds", id="ttl-zero"),
    pytest.param("c", "k", b"1", {"ttl_seconds": "-5"}, 422, "ttl_seconds", id="ttl-negative"),
    pytest.param("c", "k", b"1", {"ttl_seconds": "soon"}, 422, "ttl_seconds", id="ttl-text"),
    pytest.param("c", "k", b"1", {"ttl_seconds": "1e12"}, 422, "ttl_seconds", id="ttl-huge"),
    pytest.param("c$", "k", b"1", {}, 422, "collection", id="bad-collection"),
    pytest.param("_c", "k", b"1", {}, 422, "collection", id="collection-leading-underscore"),
    pytest.param("c", "é" * 513, b"1", {}, 422, "key", id="key-over-1024-bytes"),
    pytest.param("c", "a\x01b", b"1", {}, 422, "key", id="key-control-char"),
    pytest.param("c", "a\x7fb", b"1", {}, 422, "key", id="key-del"),
]


@pytest.mark.parametrize(("collection", "key", "body", "params", "status", "field"), BAD_WRITES)
async def test_bad_writes_are_problems_and_change_nothing(
    gw: GatewayClient, http: httpx.AsyncClient,
    collection: str, key: str, body: bytes, params: dict, status: int, field: str,
) -> None:
    before = await gw.kv.set("c", "k", {"original": True})
    r = await http.put(kv_url(gw.namespace, collection, key), content=body, params=params,
                       headers={"Content-Type": "application/json"})
    await _assert_problem(r, status, field)
    assert await gw.kv.get_entry("c", "k") == KvEntry(key="k", value={"original": True}, etag=before)
    assert await gw.kv.keys("c") == ["k"]


async def test_bad_namespace_is_a_problem(http: httpx.AsyncClient) -> None:
    r = await http.put("/v1/bad%20ns/kv/c/k", content=b"1")
    await _assert_problem(r, 422, "namespace")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "10000000"}, "limit"),
        ({"limit": "lots"}, "limit"),
        ({"cursor": "garbage!"}, "cursor"),
        ({"cursor": "eyJ2IjoyfQ"}, "cursor"),  # valid base64 JSON, not our cursor
        ({"keys_only": "maybe"}, "keys_only"),
    ],
)
async def test_bad_list_parameters(gw: GatewayClient, http: httpx.AsyncClient, params: dict, field: str) -> None:
    await gw.kv.set("c", "k", 1)
    r = await http.get(kv_url(gw.namespace, "c"), params=params)
    await _assert_problem(r, 422, field)


async def test_cursor_of_another_prefix_is_refused(gw: GatewayClient) -> None:
    for key in ["a1", "a2", "b1"]:
        await gw.kv.set("c", key, 1)
    _, cursor = await gw.kv.list("c", prefix="a", limit=1)
    assert cursor is not None
    with pytest.raises(InvalidRequest) as info:
        await gw.kv.list("c", prefix="b", cursor=cursor)
    assert "cursor" in str(info.value)


async def test_client_refuses_nan_before_sending(gw: GatewayClient) -> None:
    with pytest.raises(ValueError):
        await gw.kv.set("c", "k", float("nan"))
    assert await gw.kv.get("c", "k") is None


async def test_openapi_documents_kv(http: httpx.AsyncClient) -> None:
    spec = (await http.get("/openapi.json")).json()
    paths = spec["paths"]
    item = paths["/v1/{namespace}/kv/{collection}/{key}"]
    assert {"get", "put", "delete"} <= set(item)
    assert any(p["name"] == "ttl_seconds" for p in item["put"]["parameters"])
    assert item["put"]["summary"] and item["put"]["description"]
    assert "/v1/{namespace}/kv/{collection}" in paths


def test_a_kv_write_has_committed_when_its_first_step_returns(tmp_path) -> None:  # noqa: ANN001
    """Every kv write is one SQLite step: the change and the commit. A ``RETURNING`` write (the
    version read back) kept its write transaction open after that step, until aiosqlite's thread
    took the GIL back from a busy event loop for the next one; meanwhile every other writer slept
    in SQLite's busy handler (16 concurrent kv sets: 1,440-1,460/s with it, 1,960 without:
    docs/benchmarks.md). Here the first step of each write statement runs on one connection and
    another connection, which waits for no lock, must be able to write straight after it."""
    import sqlean

    from app.core.fast.fixed_statements import fixed_statements
    from app.core.db.upsert import insert_builder
    from app.kv.repository import KvRepository

    urls = {db: f"sqlite+aiosqlite:///{tmp_path}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
    result = run_cli(Backend("sqlite", backend_env(urls, tmp_path), urls), "migrate")
    assert result.returncode == 0, result.stderr
    repo = KvRepository(insert_builder("sqlite"), fixed_statements("sqlite"))
    writes = {
        "upsert": repo._upsert, "create only": repo._create_only, "create unless": repo._create_unless(2),
        "replace if": repo._replace_if(2, 1),
    }
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    params = {"ns": "n", "c": "c", "k": "k", "v": "1", "nv": 7, "now": now, "exp": None,
              "iv0": 1, "iv1": 2, "mv0": 7, "mv1": 8, "xv0": 9}
    first, other = (sqlean.connect(f"{tmp_path}/metadata.db", isolation_level=None) for _ in range(2))
    other.execute("PRAGMA busy_timeout=0")
    for name, statement in writes.items():
        sql = statement.sql  # type: ignore[attr-defined]
        cursor = first.execute(sql, statement._args(params))  # type: ignore[attr-defined]
        other.execute("INSERT INTO kv_entries VALUES ('n', 'c', 'other', '1', 1, '2026-01-01', '2026-01-01', NULL) "
                      "ON CONFLICT DO UPDATE SET version = kv_entries.version + 1")  # "database is locked" if not
        cursor.close()
