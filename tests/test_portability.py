"""Namespace export and import (issue #47, phase 1): ``GET /v1/{ns}/export``, ``POST /v1/{ns}/import``,
the client's ``export_namespace`` / ``import_namespace`` and the CLI's ``export`` / ``import``.

A namespace holding every capability (the samples' seed and workload, plus a kv TTL, two files with
one content, a collection with a payload index and a text field, checkpoint retention) goes from
this backend's gateway to a gateway on the other backend and back, under other names; every
sample snapshot, the search results and the manifest's counts agree. Corrupt, truncated, lying
and oversized archives are refused with a 4xx naming the member, and nothing stays stored; the
scope is enforced before any byte of the body is read.
"""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from storage_gateway_client import GatewayClient
from storage_gateway_client._exceptions import Conflict, GatewayError
from tests.conftest import (
    ADMIN_KEY,
    TEST_BUCKET,
    Backend,
    Server,
    backend_env,
    create_postgres_databases,
    run_cli,
    s3_env,
    start_server,
    stop_server,
)


@pytest.fixture(scope="module")
def other(backend: Backend, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Server]:
    """A gateway on the other backend: SQLite with files in a directory for PostgreSQL, PostgreSQL
    with files on S3 (SeaweedFS) for SQLite (whose own files are chunks in the database)."""
    data_dir = tmp_path_factory.mktemp("other")
    if backend.is_postgres:
        urls = {db: f"sqlite+aiosqlite:///{data_dir}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
        name, files = "sqlite", "directory"
        env = {**backend_env(urls, data_dir), "GATEWAY_FILES__BACKEND": files}
    else:
        base = request.getfixturevalue("postgres_base_url")
        urls = create_postgres_databases(base, f"gwp_{uuid.uuid4().hex[:8]}")
        name, files = "postgres", "s3"
        seaweed = request.getfixturevalue("seaweed")
        env = {**backend_env(urls, data_dir), **s3_env(seaweed, TEST_BUCKET, f"port-{uuid.uuid4().hex[:6]}/")}
    other_backend = Backend(name, env, urls, files=files)
    assert run_cli(other_backend, "migrate").returncode == 0
    srv = start_server(other_backend, data_dir / "gateway.log")
    yield srv
    stop_server(srv)


async def _seed(server: Server, http: httpx.AsyncClient, ns: str) -> None:
    for capability in server.capabilities:
        samples = capability.samples_for("seed", "workload")
        await samples.workload(http, ns)
        await samples.seed(http, ns)

    def ok(r: httpx.Response) -> httpx.Response:
        assert r.status_code < 300, r.text
        return r

    ok(await http.put(f"/v1/{ns}/kv/ttl/k", json={"n": 1.5, "big": 12345678901234567890}, params={"ttl": 3600}))
    ok(await http.put(f"/v1/{ns}/files/dup/a", content=b"same bytes", headers={"Content-Type": "text/plain"}))
    ok(await http.put(f"/v1/{ns}/files/dup/b", content=b"same bytes", headers={"Content-Type": "text/plain"}))
    ok(await http.put(f"/v1/{ns}/files/dup/empty", content=b""))
    ok(await http.put(f"/v1/{ns}/vectors/docs", json={
        "vector_size": 3, "distance": "cosine", "text_field": "text",
        "payload_indexes": [{"field": "user", "kind": "keyword"}],
    }))
    ok(await http.post(f"/v1/{ns}/vectors/docs/points", json={"points": [
        {"id": f"p{i}", "vector": [1.0, i / 10, 0.5 - i / 40], "payload": {"user": f"u{i % 3}", "text": f"note {i} apples", "x": 0.1 * i}}
        for i in range(20)
    ]}))
    ok(await http.put(f"/v1/{ns}/checkpoints/retention", json={"keep_latest": 5, "idle_ttl_seconds": 86400}))
    ok(await http.post(f"/v1/{ns}/checkpoints/put", content=(  # an integer past 64 bits, a float, a filter term
        '{"thread_id": "big", "checkpoint_id": "c1", "checkpoint": {"type": "bytes", "data": "AA=="}, '
        '"channel_versions": {}, "metadata": {"n": 123456789012345678901234567890, "x": 0.1, "run_id": "r9"}}'
    ), headers={"Content-Type": "application/json"}))


async def _answers(server: Server, http: httpx.AsyncClient, ns: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for capability in server.capabilities:
        out[capability.name] = await capability.samples_for("snapshot").snapshot(http, ns)
    kv = await http.get(f"/v1/{ns}/kv/ttl/k")
    out["kv_ttl"] = (kv.text, kv.headers.get("etag"), kv.headers.get("expires") or kv.headers.get("x-expires-at"))
    out["files_dup"] = [
        (r.content, r.headers.get("etag"), r.headers.get("last-modified"), r.headers.get("content-type"))
        for r in [await http.get(f"/v1/{ns}/files/dup/{f}") for f in ("a", "b", "empty")]
    ]
    out["files_list"] = (await http.get(f"/v1/{ns}/files/dup")).json()
    collection = (await http.get(f"/v1/{ns}/vectors/docs")).json()
    out["index"] = {k: collection["index"][k] for k in ("kind", "m", "ef_construction")}  # SQLite: always exact
    out["collection"] = {k: collection[k] for k in ("vector_size", "distance", "text_field", "text_language", "count", "created_at")}
    out["payload_indexes"] = [(p["field"], p["kind"]) for p in collection["payload_indexes"]]
    search = await http.post(f"/v1/{ns}/vectors/docs/search", json={
        "vector": [1.0, 0.3, 0.2], "limit": 5, "filters": {"user": "u1"},
    })
    out["search"] = [(h["id"], round(h["score"], 5), h.get("payload")) for h in search.json()["results"]]
    hybrid = await http.post(f"/v1/{ns}/vectors/docs/search", json={"vector": [1.0, 0.3, 0.2], "query": "apples", "limit": 3})
    out["hybrid"] = [h["id"] for h in hybrid.json()["results"]]
    out["retention"] = (await http.get(f"/v1/{ns}/checkpoints/retention")).json()
    out["big"] = json.loads((await http.get(f"/v1/{ns}/checkpoints/tuple", params={"thread_id": "big"})).text)
    assert out["big"]["metadata"]["n"] == 123456789012345678901234567890, out["big"]
    found = (await http.post(f"/v1/{ns}/checkpoints/search", json={"filter": {"run_id": "r9"}})).json()
    out["filtered"] = [(i["thread_id"], i["checkpoint_id"]) for i in found["items"]]
    assert out["filtered"] == [("big", "c1")]
    return _portable(out, ns)


# What differs by backend, not by data: the vector index's backend, build state and plans.
_BACKEND_KEYS = frozenset({"backend", "state", "plans", "progress", "ef_search", "calibration", "subgraphs", "error"})


def _portable(value: Any, ns: str) -> Any:
    """``value`` with the namespace's name as ``NS`` and the backend's own facts left out."""
    if isinstance(value, dict):
        index_options = ("kind", "m", "ef_construction") if "backend" in value else ()  # a vector index: SQLite's is exact
        return {k: _portable(v, ns) for k, v in value.items() if k not in _BACKEND_KEYS and k not in index_options}
    if isinstance(value, list | tuple):
        return [_portable(v, ns) for v in value]
    if isinstance(value, str) and value == ns:
        return "NS"
    return value


def _same(after: dict[str, Any], before: dict[str, Any], *, same_backend: bool = True) -> None:
    """Equal answers, each difference named (across backends, but for the vector index's kind)."""
    differing = {
        k: (after.get(k), before[k]) for k in before if after.get(k) != before[k] and (same_backend or k != "index")
    }
    assert not differing, json.dumps(differing, default=repr, indent=1)


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


async def test_round_trip_across_backends(
    server: Server, other: Server, http: httpx.AsyncClient, namespace: str, tmp_path: Path
) -> None:
    await _seed(server, http, namespace)
    before = await _answers(server, http, namespace)
    archive_path = tmp_path / "a.tar"
    async with GatewayClient(server.url, namespace, ADMIN_KEY) as gw:
        written = await gw.export_namespace(archive_path)
    archive = archive_path.read_bytes()
    assert written == len(archive)
    members = _members(archive)
    names = list(members)
    assert names[0] == "manifest.json" and names[-1] == "checksums.json"
    manifest = json.loads(members["manifest.json"])
    assert set(manifest["capabilities"]) == {c.name for c in server.capabilities}
    checksums = json.loads(members["checksums.json"])
    assert [m["name"] for m in checksums["members"]] == names[:-1]
    # the manifest's counts are the lines of the parts
    for cap, entry in manifest["capabilities"].items():
        for part, counted in entry["parts"].items():
            if part == "blobs":
                assert counted["count"] == sum(1 for n in names if n.startswith(f"{cap}/blobs/"))
            else:
                lines = sum(members[n].count(b"\n") for n in names if n.startswith(f"{cap}/{part}/"))
                assert lines == counted["count"], (cap, part)
    assert manifest["capabilities"]["files"]["parts"]["blobs"]["count"] < manifest["capabilities"]["files"]["parts"]["files"]["count"]

    there = f"{namespace}x"
    async with httpx.AsyncClient(base_url=other.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http2:
        async with GatewayClient(other.url, there, ADMIN_KEY) as gw2:
            report = await gw2.import_namespace(archive_path)
            assert report["loaded"]["kv"]["kv_entries"] == manifest["capabilities"]["kv"]["parts"]["kv_entries"]["count"]
            _same(await _answers(other, http2, there), before, same_backend=False)
            back = b"".join([piece async for piece in gw2.iter_export()])
        # again into this backend, under a third name, from the other backend's export
        home = f"{namespace}y"
        async with GatewayClient(server.url, home, ADMIN_KEY) as gw, GatewayClient(other.url, there, ADMIN_KEY) as gw2:
            await gw.import_namespace(gw2.iter_export())  # streamed from one gateway into the other, no file
        _same(await _answers(server, http, home), before)
        # an export of unchanged data has the same parts (the same backend: PostgreSQL writes jsonb its own way)
        async with GatewayClient(server.url, namespace, ADMIN_KEY) as gw:
            again = _members(b"".join([piece async for piece in gw.iter_export()]))
        assert list(again) == names
        for name, data in members.items():
            if name not in ("manifest.json", "checksums.json"):
                assert again[name] == data, name
        # a namespace that holds data is refused
        async with GatewayClient(server.url, home, ADMIN_KEY) as gw:
            with pytest.raises(GatewayError) as refused:
                await gw.import_namespace(back)
        assert isinstance(refused.value, Conflict) and refused.value.code == "namespace_not_empty"


def _rebuild(members: list[tuple[str, bytes]], pax: dict[str, dict[str, str]] | None = None) -> bytes:
    """A tar of ``members`` with the exporter's PAX headers (sha256 and lines), ``pax`` overriding."""
    from app.portability.archive import END, member_header, padding
    import hashlib

    out = []
    for name, data in members:
        headers = {"sha256": hashlib.sha256(data).hexdigest(), "lines": str(data.count(b"\n")) if name.endswith(".jsonl") else None}
        headers.update((pax or {}).get(name, {}))
        lines = headers.get("lines")
        out.append(member_header(name, len(data), headers["sha256"] or "", int(lines) if lines else None) + data + padding(len(data)))
    return b"".join(out) + END


async def _empty(http: httpx.AsyncClient, ns: str) -> None:
    assert (await http.get(f"/v1/{ns}/kv/settings")).json()["items"] == []
    assert (await http.get(f"/v1/{ns}/files/dup")).json()["items"] == []
    assert (await http.get(f"/v1/{ns}/vectors/docs")).status_code == 404
    assert (await http.get(f"/v1/{ns}/records/history")).json()["items"] == []


async def test_bad_archives_are_refused_and_nothing_stays(
    server: Server, http: httpx.AsyncClient, namespace: str
) -> None:
    await _seed(server, http, namespace)
    archive = b"".join([piece async for piece in (await _export_stream(server, namespace))])
    members = list(_members(archive).items())
    names = [n for n, _ in members]
    first_part = next(i for i, n in enumerate(names) if n.endswith(".jsonl"))
    blob = next(i for i, n in enumerate(names) if "/blobs/" in n)

    def flipped(i: int) -> bytes:
        data = bytearray(members[i][1])
        data[len(data) // 2] ^= 0x01
        return _rebuild([*members[:i], (members[i][0], bytes(data)), *members[i + 1:]], {members[i][0]: {"sha256": __import__("hashlib").sha256(members[i][1]).hexdigest()}})

    lying = json.loads(members[0][1])
    lying["capabilities"]["kv"]["parts"]["kv_entries"]["count"] += 1
    lying_bytes = json.dumps(lying).encode()
    lying["capabilities"]["kv"]["parts"]["kv_entries"]["count"] -= 2
    under_bytes = json.dumps(lying).encode()
    kv_part = names.index(next(n for n in names if n.startswith("kv/kv_entries/")))
    bad_lines = members[kv_part][1].replace(b'"value":"', b'"value":"not json', 1)
    refused_line = [*members[1:kv_part], (members[kv_part][0], bad_lines), *members[kv_part + 1:-1]]
    surrogate_lines = members[kv_part][1].replace(b'{"collection":"', b'{"collection":"\\ud800', 1)
    surrogate = [*members[1:kv_part], (members[kv_part][0], surrogate_lines), *members[kv_part + 1:-1]]
    kv_lines = members[kv_part][1].splitlines(keepends=True)
    doubled = [*members[1:kv_part], (members[kv_part][0], kv_lines[0] + members[kv_part][1]), *members[kv_part + 1:-1]]
    # (lying_bytes counts one kv entry more: the doubled line is the one)
    checks = {
        "a key twice": (
            _rebuild([("manifest.json", lying_bytes), *doubled, ("checksums.json", _checksums(lying_bytes, doubled))]),
            422, "archive_invalid_line", names[kv_part],
        ),
        "a part twice": (
            _rebuild([*members[:kv_part + 1], members[kv_part], *members[kv_part + 1:]]), 422, "archive_corrupt", names[kv_part],
        ),
        "a lone surrogate": (
            _rebuild([members[0], *surrogate, ("checksums.json", _checksums(members[0][1], surrogate))]),
            422, "archive_invalid_line", names[kv_part],
        ),
        "a line the API would refuse": (
            _rebuild([members[0], *refused_line, ("checksums.json", _checksums(members[0][1], refused_line))]),
            422, "archive_invalid_line", names[kv_part],
        ),
        "flipped byte in a part": (flipped(first_part), 422, "archive_corrupt", names[first_part]),
        "flipped byte in a blob": (flipped(blob), 422, "archive_corrupt", names[blob]),
        "truncated": (archive[: len(archive) * 2 // 3], 422, "archive_truncated", None),
        "member missing": (_rebuild(members[:first_part] + members[first_part + 1:]), 422, "archive_member_missing", None),
        "manifest lies": (_rebuild([("manifest.json", lying_bytes), *members[1:-1], ("checksums.json", _checksums(lying_bytes, members[1:-1]))]),
                          422, "archive_manifest_mismatch", "manifest.json"),
        "manifest undercounts": (
            _rebuild([("manifest.json", under_bytes), *members[1:-1], ("checksums.json", _checksums(under_bytes, members[1:-1]))]),
            422, "archive_manifest_mismatch", names[kv_part],  # refused at that part, before it is stored
        ),
        "no sha256 in a header": (_rebuild(members[:-1], {names[first_part]: {"sha256": ""}}), 422, "archive_corrupt", names[first_part]),
        "path with ..": (_rebuild([*members[:2], ("kv/../../etc/passwd", b"x\n"), *members[2:]]), 422, "archive_unsafe_member", None),
        "not a tar": (b"hello" * 300, 422, None, None),
    }
    target = f"{namespace}bad"
    for what, (body, status, code, member) in checks.items():
        r = await http.post(f"/v1/{target}/import", content=body, headers={"Content-Type": "application/x-tar"})
        assert r.status_code == status, (what, r.text)
        assert r.headers["content-type"].startswith("application/problem+json"), what
        problem = r.json()
        if code is not None:
            assert problem["code"] == code, (what, problem)
        if member is not None:
            assert member in problem["detail"], (what, problem)
        await _empty(http, target)
    # a member over its bound: 413, refused from its header alone
    from app.portability import importer

    huge = _rebuild([members[0]])[:-1024]
    big_header = __import__("app.portability.archive", fromlist=["member_header"]).member_header(
        "kv/kv_entries/000001.jsonl", importer.MAX_PART_BYTES + 1, "0" * 64, 1
    )
    r = await http.post(f"/v1/{target}/import", content=huge + big_header + b"\0" * 4096)
    assert r.status_code == 413 and r.json()["code"] == "archive_member_too_large", r.text
    await _empty(http, target)
    # after all of that, the namespace takes the good archive
    r = await http.post(f"/v1/{target}/import", content=archive)
    assert r.status_code == 200, r.text


def _checksums(manifest: bytes, members: list[tuple[str, bytes]]) -> bytes:
    import hashlib

    listed = [{"name": "manifest.json", "sha256": hashlib.sha256(manifest).hexdigest()}]
    listed += [{"name": n, "sha256": hashlib.sha256(d).hexdigest()} for n, d in members]
    return json.dumps({"manifest_sha256": listed[0]["sha256"], "members": listed}).encode()


async def _export_stream(server: Server, namespace: str) -> Any:
    gw = GatewayClient(server.url, namespace, ADMIN_KEY)

    async def pieces() -> Any:
        try:
            async for piece in gw.iter_export():
                yield piece
        finally:
            await gw.close()

    return pieces()


async def test_namespace_admin_scope(server: Server, http: httpx.AsyncClient, namespace: str) -> None:
    async def key(ns_pattern: str, scopes: list[str]) -> str:
        r = await http.post("/v1/admin/keys", json={"namespace": ns_pattern, "scopes": scopes})
        assert r.status_code == 201, r.text
        return str(r.json()["key"])

    everything = await key("*", ["*:*"])
    admin_elsewhere = await key("other-*", ["namespace:admin"])
    admin_here = await key(f"{namespace}*", ["namespace:admin"])
    await http.put(f"/v1/{namespace}/kv/c/k", json=1)
    for refused in (everything, admin_elsewhere):
        headers = {"Authorization": f"Bearer {refused}"}
        assert (await http.get(f"/v1/{namespace}/export", headers=headers)).status_code == 403
        r = await http.post(f"/v1/{namespace}z/import", headers=headers, content=b"x" * 10_000)
        assert r.status_code == 403 and r.headers["content-type"].startswith("application/problem+json")
    headers = {"Authorization": f"Bearer {admin_here}"}
    exported = await http.get(f"/v1/{namespace}/export", headers=headers)
    assert exported.status_code == 200 and exported.headers["content-type"] == "application/x-tar"
    r = await http.post(f"/v1/{namespace}z/import", headers=headers, content=exported.content)
    assert r.status_code == 200, r.text
    assert (await http.get(f"/v1/{namespace}z/kv/c/k")).json() == 1
    bad = await http.post("/v1/admin/keys", json={"namespace": "*", "scopes": ["namespace:write"]})
    assert bad.status_code == 422


def test_cli_export_and_import(server: Server, backend: Backend, namespace: str, tmp_path: Path) -> None:
    async def seed() -> None:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
            await http.put(f"/v1/{namespace}/kv/c/k", json={"v": 1})
            await http.put(f"/v1/{namespace}/records/r/0001", json={"v": 2})

    asyncio.run(seed())
    out = tmp_path / "ns.tar"
    exported = run_cli(backend, "export", namespace, "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    assert out.stat().st_size > 0 and tarfile.is_tarfile(out)
    imported = run_cli(backend, "import", f"{namespace}c", str(out))
    assert imported.returncode == 0, imported.stderr
    report = json.loads(imported.stdout)
    assert report["loaded"]["kv"] == {"kv_entries": 1} and report["loaded"]["records"] == {"records": 1}
    again = run_cli(backend, "import", f"{namespace}c", str(out))
    assert again.returncode == 1 and "holds data" in again.stderr


async def test_the_export_reads_one_snapshot(server: Server, backend: Backend, http: httpx.AsyncClient, namespace: str, tmp_path: Path) -> None:
    """What commits after the export's snapshots opened is not in it (SQLite: one read transaction
    per file; PostgreSQL: repeatable read, read only, refusing writes)."""
    from contextlib import AsyncExitStack

    from sqlalchemy import text

    from app.core.config import Database
    from app.main import services
    from app.portability.exporter import build_manifest, inventory, open_snapshots
    from tests.conftest import in_process_settings

    await http.put(f"/v1/{namespace}/kv/c/before", json=1)
    async with services(in_process_settings(backend, tmp_path)) as state, AsyncExitStack() as stack:
        conns = await open_snapshots(state, stack)
        assert (await http.put(f"/v1/{namespace}/kv/c/after", json=2)).status_code < 300
        assert (await http.put(f"/v1/{namespace}/records/r/0001", json=3)).status_code < 300
        manifest = build_manifest(state, namespace, await inventory(state, conns, namespace))
        if backend.is_postgres:
            conn = conns[Database.metadata]
            assert await conn.scalar(text("SHOW transaction_isolation")) == "repeatable read"
            assert await conn.scalar(text("SHOW transaction_read_only")) == "on"
    assert manifest["capabilities"]["kv"]["parts"]["kv_entries"]["count"] == 1
    assert "records" not in manifest["capabilities"]["records"]["parts"]


async def test_pages_are_bounded_by_bytes(
    server: Server, backend: Backend, http: httpx.AsyncClient, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of an export holds at most ``batch`` rows and about ``PAGE_BYTES`` of large values:
    with a bound smaller than one value, every page is one row (and none is lost)."""
    from contextlib import AsyncExitStack

    from app.core import namespace_data
    from app.main import services
    from app.portability.exporter import open_snapshots
    from tests.conftest import in_process_settings

    for key in ("a", "b", "c"):
        assert (await http.put(f"/v1/{namespace}/kv/c/{key}", json={"v": key * 100})).status_code < 300
    async with services(in_process_settings(backend, tmp_path)) as state, AsyncExitStack() as stack:
        conns = await open_snapshots(state, stack)
        kv = next(c for c in state.capabilities if c.name == "kv")
        conn = conns[kv.database]
        whole = [p async for p in kv.namespace_data.export(None, conn, namespace, 500)]
        monkeypatch.setattr(namespace_data, "PAGE_BYTES", 50)
        paged = [p async for p in kv.namespace_data.export(None, conn, namespace, 500)]
    assert [len(p.rows) for p in whole] == [3] and [len(p.rows) for p in paged] == [1, 1, 1]
    assert [r for p in paged for r in p.rows] == list(whole[0].rows)


async def test_an_export_taken_while_writers_run_imports_whole(
    server: Server, http: httpx.AsyncClient, namespace: str
) -> None:
    """8 writers replace files, kv values and points while the namespace is exported: the archive
    is whole (every file's bytes match its sha256, every count its manifest: the import checks
    both) and every imported value is one a writer wrote."""
    import os

    assert (await http.put(f"/v1/{namespace}/vectors/w", json={"vector_size": 2})).status_code < 300
    stop = asyncio.Event()
    written: dict[str, set[int]] = {}

    async def writer(w: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            body = os.urandom(1000 + 97 * n)
            assert (await http.put(f"/v1/{namespace}/files/w/f{w}", content=body)).status_code < 300
            assert (await http.put(f"/v1/{namespace}/kv/w/k{w}", json={"n": n, "w": w})).status_code < 300
            r = await http.post(f"/v1/{namespace}/vectors/w/points", json={"points": [
                {"id": f"p{w}", "vector": [float(n), 1.0], "payload": {"n": n}}
            ]})
            assert r.status_code < 300
            written.setdefault(f"k{w}", set()).add(n)

    writers = [asyncio.create_task(writer(w)) for w in range(8)]
    while len(written) < 8:  # every writer has written once (a loaded machine took more than a fixed 0.3 s)
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)
    async with GatewayClient(server.url, namespace, ADMIN_KEY) as gw:
        archive = b"".join([piece async for piece in gw.iter_export()])
    stop.set()
    await asyncio.gather(*writers)
    target = f"{namespace}w"
    r = await http.post(f"/v1/{target}/import", content=archive)
    assert r.status_code == 200, r.text
    manifest = json.loads(_members(archive)["manifest.json"])
    assert r.json()["loaded"]["files"]["files"] == manifest["capabilities"]["files"]["parts"]["files"]["count"] == 8
    for w in range(8):
        value = (await http.get(f"/v1/{target}/kv/w/k{w}")).json()
        assert value["n"] in written[f"k{w}"] and value["w"] == w
        point = (await http.get(f"/v1/{target}/vectors/w/points/p{w}", params={"with_vector": "true"})).json()
        assert point["vector"][0] == point["payload"]["n"]  # a point is whole: its vector and payload of one write


async def test_the_reader_refuses_any_mangled_header_as_an_archive_error() -> None:
    """Every byte of a small archive's headers changed, one at a time: the reader answers members
    or an ``ArchiveError`` (a 4xx), never another exception (a 500)."""
    import random

    from app.portability.archive import ArchiveError, ArchiveReader

    archive = _rebuild([("manifest.json", b"{}\n"), ("kv/kv_entries/000001.jsonl", b'{"a":1}\n')])
    rng = random.Random(47)
    positions = [i for i in range(len(archive)) if (i // 512) in (0, 1, 2, 4, 5, 6)]  # PAX headers, their records, tar headers
    for i in positions:
        mangled = bytearray(archive)
        mangled[i] = rng.choice([0, 0x2F, 0x2E, 0x37, 0x78, 0xFF, mangled[i] ^ 1])

        async def source(data: bytes = bytes(mangled)) -> Any:
            yield data

        reader = ArchiveReader(source())
        try:
            while (member := await reader.next()) is not None:
                if member.size <= 1 << 20:
                    await reader.read(member)
                else:
                    break
        except ArchiveError:
            pass


async def test_delete_namespace_over_http(server: Server, http: httpx.AsyncClient, namespace: str) -> None:
    """``DELETE /v1/{ns}``: the admin key or ``namespace:admin`` on that namespace (not on another,
    not ``*:*``); every capability's data goes, what went is reported; other namespaces keep theirs."""
    async def key(ns_pattern: str, scopes: list[str]) -> str:
        r = await http.post("/v1/admin/keys", json={"namespace": ns_pattern, "scopes": scopes})
        assert r.status_code == 201, r.text
        return str(r.json()["key"])

    await _seed(server, http, namespace)
    await _seed(server, http, f"{namespace}k")  # a neighbour whose name starts the same
    before = await _answers(server, http, f"{namespace}k")
    for refused in (await key("*", ["*:*"]), await key(f"{namespace}k", ["namespace:admin"])):
        r = await http.delete(f"/v1/{namespace}", headers={"Authorization": f"Bearer {refused}"})
        assert r.status_code == 403 and r.headers["content-type"].startswith("application/problem+json"), r.text
    assert (await http.get(f"/v1/{namespace}/kv/ttl/k")).status_code == 200
    async with GatewayClient(server.url, namespace, await key(namespace, ["namespace:admin"])) as gw:
        report = await gw.delete_namespace()
        assert report["done"] is True
        deleted = report["deleted"]
        assert deleted["kv"]["kv_entries"] >= 2 and deleted["vectors"]["points"] >= 20, deleted
        assert deleted["files"] and deleted["records"] and deleted["checkpoints"], deleted
        again = await gw.delete_namespace()
        assert all(not counts for counts in again["deleted"].values()), again
    await _empty(http, namespace)
    assert (await http.get(f"/v1/{namespace}/kv/ttl/k")).status_code == 404
    _same(await _answers(server, http, f"{namespace}k"), before)
    r = await http.delete(f"/v1/{namespace}", params={"wait": 31})
    assert r.status_code == 422, r.text


async def _leftovers(backend: Backend, target: str) -> list[str]:
    """Rows of staging namespaces (``~imp.…``) in any namespaced table, and the target's import row."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    from app.core.db.tables import METADATA

    found = []
    for db, md in METADATA.items():
        engine = create_async_engine(backend.urls[db.value])
        try:
            async with engine.connect() as conn:
                for table in md.tables.values():
                    if "namespace" in table.c:
                        n = await conn.scalar(text(f"SELECT count(*) FROM {table.name} WHERE namespace LIKE '~imp.%'"))
                        found += [f"{table.name}: {n}"] if n else []
                if "namespace_imports" in md.tables:
                    rows = (await conn.execute(text("SELECT state FROM namespace_imports WHERE target = :t"), {"t": target})).all()
                    found += [f"namespace_imports: {r.state}" for r in rows]
        finally:
            await engine.dispose()
    return found


async def _age(backend: Backend, target: str) -> None:
    """The target's import row as if untouched for two hours."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update
    from sqlalchemy.ext.asyncio import create_async_engine

    from app.portability.staging import namespace_imports

    engine = create_async_engine(backend.urls["metadata"])
    try:
        async with engine.begin() as conn:
            await conn.execute(update(namespace_imports).where(namespace_imports.c.target == target)
                               .values(updated_at=datetime.now(UTC) - timedelta(hours=2)))
    finally:
        await engine.dispose()


async def test_a_killed_import_sent_again_ends_as_one_never_interrupted(
    server: Server, other: Server, http: httpx.AsyncClient, namespace: str, tmp_path: Path
) -> None:
    """Into the other backend's gateway (PostgreSQL with files on S3, or SQLite with files in a
    directory): readers of the target see nothing while an import is stalled half-way; a gateway
    SIGKILLed early, in the vector points and half-way through the publish leaves nothing visible
    (but what it had published); the early one's staging, left for an hour, is swept at the next
    start-up; the others' when the same archive is sent again, and each namespace then answers as
    an import that was never interrupted does, usage included."""
    import signal

    import app.models  # noqa: F401  (every table, for _leftovers)

    await _seed(server, http, namespace)
    archive = b"".join([piece async for piece in (await _export_stream(server, namespace))])
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        members = tar.getmembers()
    points = next(m for m in members if m.name.startswith("vectors/points/"))
    kills = {"early": f"load:{members[1].name}", "points": f"load:{points.name}", "publish": "publish:files"}
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    targets = {what: f"{namespace}k{n}" for n, what in enumerate(kills)}
    servers: dict[str, Server] = {}

    def crashing(what: str) -> Server:
        servers[what] = start_server(other.backend, tmp_path / f"{what}.log", SG_TEST_CRASH_AT=kills[what])
        return servers[what]

    # two of the gateways to kill start while the stalled import runs (a start takes seconds here)
    starting = asyncio.gather(*(asyncio.to_thread(crashing, what) for what in ("early", "publish")))
    try:
        async with httpx.AsyncClient(base_url=other.url, timeout=60, headers=headers) as there:
            async def answers(ns: str) -> dict[str, Any]:
                return {**await _answers(other, there, ns), "usage": _portable((await there.get(f"/v1/{ns}/usage")).json(), ns)}

            # stalled after the vector points: the target shows nothing of it, then all of it
            stalled, go = f"{namespace}s", asyncio.Event()

            async def body() -> Any:
                yield archive[: points.offset_data + points.size]
                await go.wait()
                yield archive[points.offset_data + points.size:]

            task = asyncio.create_task(there.post(f"/v1/{stalled}/import", content=body()))
            for _ in range(200):  # until the collections are loaded (hidden)
                if any(f.startswith("vector_collections") for f in await _leftovers(other.backend, stalled)):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the import did not load the vector collections")
            assert not task.done()
            await _empty(there, stalled)
            assert (await there.post(f"/v1/{stalled}/checkpoints/search", json={})).json()["items"] == []
            go.set()
            assert (await task).status_code == 200, (await task).text
            expected = await answers(stalled)
            await starting

            for what in kills:
                if what == "points":  # started after the early one was left for an hour: its start-up sweeps it
                    await asyncio.to_thread(crashing, what)
                    for _ in range(100):
                        if not await _leftovers(other.backend, targets["early"]):
                            break
                        await asyncio.sleep(0.1)
                    else:
                        raise AssertionError(f"not swept: {await _leftovers(other.backend, targets['early'])}")
                async with httpx.AsyncClient(base_url=servers[what].url, timeout=60, headers=headers) as doomed:
                    with pytest.raises(httpx.TransportError):
                        await doomed.post(f"/v1/{targets[what]}/import", content=archive)
                assert servers[what].process.wait(timeout=30) == -signal.SIGKILL, servers[what].log()
                if what != "publish":  # killed while loading: nothing of it is visible, its staging is left
                    await _empty(there, targets[what])
                    assert await _leftovers(other.backend, targets[what])
                if what == "early":
                    await _age(other.backend, targets[what])
            for what, target in targets.items():
                again = await there.post(f"/v1/{target}/import", content=archive)
                assert again.status_code == 200, (what, again.text)
                assert again.json().get("resumed") == ("publish" if what == "publish" else None), again.json()
                assert not [f for f in await _leftovers(other.backend, target) if f.startswith("namespace_imports")], what
                _same(await answers(target), expected)
            assert await _leftovers(other.backend, "") == []  # every staging swept or published
    finally:
        await asyncio.gather(starting, return_exceptions=True)
        for server_ in servers.values():
            if server_.process.poll() is None:
                stop_server(server_)
