"""Files on both backends, through the client and raw HTTP against a real server.

Round trips at the chunk edges and 64 MiB, every Range form, conditional requests, cut-off and
concurrent uploads (checked in the database or the bucket: nothing orphaned, never a mix), odd
file ids, namespace isolation, multipart uploads, listing and usage; with file bytes in the
database and in a real S3 server.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest

from storage_gateway_client import GatewayClient, NotFound, PreconditionFailed
from tests.conftest import FILE_BACKENDS, Backend, Server
from tests.files_storage import CHUNK, expected_pieces, pieces_of, storage_state, wait_clean

__all__ = ["CHUNK", "sha", "storage_state", "url", "wait_clean"]

# Every test here runs on both metadata databases, with file bytes in the database or in S3.
pytestmark = pytest.mark.parametrize("backend", FILE_BACKENDS, indirect=True)


def url(namespace: str, collection: str, file_id: str | None = None) -> str:
    base = f"/v1/{namespace}/files/{collection}"
    return f"{base}/{quote(file_id, safe='')}" if file_id is not None else base


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def pieces(data: bytes, size: int = 256 * 1024, delay: float = 0.0) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        if delay:
            await asyncio.sleep(delay)
        yield data[i : i + size]


async def raw_cut_off_put(
    server: Server, path: str, declared: int, payload: bytes, auth: dict[str, str], linger: float = 0.5
) -> None:
    """PUT that announces ``declared`` bytes, sends ``payload`` (fewer) and drops the connection."""
    parts = urlsplit(server.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    head = [f"PUT {path} HTTP/1.1", f"Host: {parts.hostname}", f"Content-Length: {declared}",
            "Content-Type: application/octet-stream"]
    head += [f"{k}: {v}" for k, v in auth.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    for i in range(0, len(payload), 64 * 1024):
        writer.write(payload[i : i + 64 * 1024])
        await writer.drain()
    await asyncio.sleep(linger)  # the server stores what it got so far
    writer.transport.abort()


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 17])
async def test_round_trip_at_chunk_edges(gw: GatewayClient, http: httpx.AsyncClient, backend: Backend,
                                          namespace: str, size: int) -> None:
    data = os.urandom(size)
    info = await gw.files.save_file("blobs", "f.bin", data, content_type="image/png")
    assert (info.id, info.size, info.sha256, info.content_type) == ("f.bin", size, sha(data), "image/png")
    assert await gw.files.get_file("blobs", "f.bin") == data
    streamed = b"".join([c async for c in gw.files.download("blobs", "f.bin")])
    assert sha(streamed) == sha(data)
    r = await http.get(url(namespace, "blobs", "f.bin"))
    assert r.status_code == 200
    assert r.headers["content-length"] == str(size)
    assert r.headers["content-type"] == "image/png"
    assert r.headers["etag"] == f'"{sha(data)}"'
    assert r.headers["accept-ranges"] == "bytes"
    assert "last-modified" in r.headers
    assert await pieces_of(backend, namespace, "blobs", "f.bin") == expected_pieces(backend, size)


async def test_64_mib_streamed_both_ways(gw: GatewayClient, backend: Backend, namespace: str) -> None:
    block = os.urandom(CHUNK)
    digest = hashlib.sha256()
    total = 64 * CHUNK

    async def source() -> AsyncIterator[bytes]:
        for i in range(64):
            piece = block[i:] + block[:i]  # 64 distinct 1 MiB blocks, never the whole file at once
            digest.update(piece)
            yield piece

    info = await gw.files.upload("big", "64.bin", source())
    assert info.size == total and info.sha256 == digest.hexdigest()
    got = hashlib.sha256()
    n = 0
    async with gw.files.download("big", "64.bin") as d:
        assert d.head is not None and d.head.size == total and d.head.sha256 == info.sha256
        async for piece in d.aiter_bytes():
            got.update(piece)
            n += len(piece)
    assert n == total and got.hexdigest() == info.sha256
    assert await pieces_of(backend, namespace, "big", "64.bin") == expected_pieces(backend, total)


async def test_upload_from_path_and_download_to_path(gw: GatewayClient, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    data = os.urandom(3 * CHUNK + 5)
    src.write_bytes(data)
    info = await gw.files.upload("docs", "a/b.bin", src, content_type="application/pdf")
    assert info.sha256 == sha(data)
    head = await gw.files.download_to("docs", "a/b.bin", tmp_path / "out.bin")
    assert (tmp_path / "out.bin").read_bytes() == data
    assert head.content_type == "application/pdf" and head.size == len(data)
    assert not list(tmp_path.glob(".*part"))
    h = await gw.files.head("docs", "a/b.bin")
    assert h is not None and h.sha256 == sha(data) and h.size == len(data)
    st = await gw.files.stat("docs", "a/b.bin")
    assert st is not None and st.id == "a/b.bin" and st.size == len(data)
    assert await gw.files.stat("docs", "a/b") is None
    assert await gw.files.head("docs", "nope") is None


async def test_missing_file_and_delete(gw: GatewayClient, http: httpx.AsyncClient, namespace: str,
                                       backend: Backend) -> None:
    assert await gw.files.get_file("c", "missing") is None
    with pytest.raises(NotFound):
        async with gw.files.download("c", "missing"):
            pass
    r = await http.get(url(namespace, "c", "missing"))
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    await gw.files.delete_file("c", "missing")
    await gw.files.save_file("c", "x", os.urandom(CHUNK + 10))
    r = await http.delete(url(namespace, "c", "x"))
    assert r.status_code == 204
    assert await gw.files.get_file("c", "x") is None
    assert (await http.delete(url(namespace, "c", "x"))).status_code == 204
    assert (await wait_clean(backend))["unreferenced"] == 0


async def test_early_break_closes_the_download(gw: GatewayClient) -> None:
    data = os.urandom(5 * CHUNK)
    await gw.files.save_file("c", "big", data)
    for _ in range(30):  # more than the server's pool: a leaked snapshot connection would hang
        async with gw.files.download("c", "big", chunk_bytes=64 * 1024) as d:
            async for _piece in d.aiter_bytes():
                break
    assert await gw.files.get_file("c", "big") == data


# --- ranges --------------------------------------------------------------------------------


async def test_every_range_form(gw: GatewayClient, http: httpx.AsyncClient, namespace: str) -> None:
    size = 2 * CHUNK + CHUNK // 2
    data = os.urandom(size)
    await gw.files.save_file("r", "f", data)
    u = url(namespace, "r", "f")

    async def rng(header: str) -> httpx.Response:
        return await http.get(u, headers={"Range": header})

    cases = {
        "bytes=0-0": (0, 0),
        "bytes=10-99": (10, 99),
        f"bytes={CHUNK - 5}-{CHUNK + 5}": (CHUNK - 5, CHUNK + 5),  # spans a chunk boundary
        f"bytes={CHUNK - 1}-{2 * CHUNK}": (CHUNK - 1, 2 * CHUNK),  # spans three chunks
        f"bytes={CHUNK}-": (CHUNK, size - 1),  # open-ended
        "bytes=-100": (size - 100, size - 1),  # suffix
        f"bytes=-{size * 3}": (0, size - 1),  # suffix longer than the file
        f"bytes=5-{size * 10}": (5, size - 1),  # end past the file: clamped
        f"bytes={size - 1}-": (size - 1, size - 1),
    }
    for header, (start, end) in cases.items():
        r = await rng(header)
        assert r.status_code == 206, header
        assert r.content == data[start : end + 1], header
        assert r.headers["content-range"] == f"bytes {start}-{end}/{size}", header
        assert r.headers["content-length"] == str(end - start + 1), header
    for header in (f"bytes={size}-", f"bytes={size + 5}-{size + 10}", "bytes=-0"):
        r = await rng(header)
        assert r.status_code == 416, header
        assert r.headers["content-range"] == f"bytes */{size}"
        assert r.headers["content-type"] == "application/problem+json"
    # Several ranges, other units and bad syntax are ignored: the whole file with 200.
    for header in ("bytes=0-1,5-6", "items=0-1", "bytes=abc", "bytes=9-3"):
        r = await rng(header)
        assert r.status_code == 200 and r.content == data, header
    # The client's ranged download.
    part = b"".join([c async for c in gw.files.download("r", "f", start=CHUNK - 3, end=CHUNK + 3)])
    assert part == data[CHUNK - 3 : CHUNK + 4]
    # If-Range: honoured only while the validator still matches.
    etag = f'"{sha(data)}"'
    assert (await http.get(u, headers={"Range": "bytes=0-9", "If-Range": etag})).status_code == 206
    r = await http.get(u, headers={"Range": "bytes=0-9", "If-Range": '"other"'})
    assert r.status_code == 200 and len(r.content) == size
    # A date is not enough (two versions written in one second share Last-Modified): the whole file.
    r = await http.get(u, headers={"Range": "bytes=0-9", "If-Range": r.headers["last-modified"]})
    assert r.status_code == 200 and len(r.content) == size


async def test_ranges_of_an_empty_file(gw: GatewayClient, http: httpx.AsyncClient, namespace: str) -> None:
    await gw.files.save_file("r", "empty", b"")
    u = url(namespace, "r", "empty")
    for header in ("bytes=0-", "bytes=-1", "bytes=0-0"):
        r = await http.get(u, headers={"Range": header})
        assert r.status_code == 416 and r.headers["content-range"] == "bytes */0", header
    r = await http.get(u)
    assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "0"


# --- conditional requests ------------------------------------------------------------------


async def test_conditional_requests(gw: GatewayClient, http: httpx.AsyncClient, namespace: str) -> None:
    u = url(namespace, "cond", "f")
    v1, v2 = os.urandom(1000), os.urandom(CHUNK + 1000)
    r = await http.put(u, content=v1, headers={"If-None-Match": "*"})
    assert r.status_code == 201 and r.headers["etag"] == f'"{sha(v1)}"'
    assert r.json()["sha256"] == sha(v1)
    etag1 = r.headers["etag"]
    # Create-only over an existing file, and If-Match with a stale tag: 412, nothing changes.
    r = await http.put(u, content=v2, headers={"If-None-Match": "*"})
    assert r.status_code == 412 and r.json()["code"] == "precondition_failed"
    r = await http.put(u, content=v2, headers={"If-Match": '"0000"'})
    assert r.status_code == 412
    for header in ('"*"', f"W/{etag1}"):  # only a bare * is any; If-Match compares strongly
        assert (await http.put(u, content=v2, headers={"If-Match": header})).status_code == 412
    with pytest.raises(PreconditionFailed):
        await gw.files.upload("cond", "f", pieces(v2), if_none_match="*")
    assert await gw.files.get_file("cond", "f") == v1
    # GET / HEAD with If-None-Match: 304 with the ETag, no body.
    for method in ("GET", "HEAD"):
        r = await http.request(method, u, headers={"If-None-Match": etag1})
        assert r.status_code == 304 and r.headers["etag"] == etag1 and r.content == b""
        r = await http.request(method, u, headers={"If-None-Match": '"other", "x"'})
        assert r.status_code == 200
    # If-Match with the current tag replaces; 200 (not 201) and the new tag.
    r = await http.put(u, content=v2, headers={"If-Match": etag1, "Content-Type": "text/plain"})
    assert r.status_code == 200 and r.headers["etag"] == f'"{sha(v2)}"'
    info = await gw.files.upload("cond", "f", v1, if_match=sha(v2))  # bare sha256 accepted by the client
    assert info.sha256 == sha(v1)
    # If-Match on a missing file, DELETE with a stale tag: 412.
    assert (await http.put(url(namespace, "cond", "nope"), content=b"x", headers={"If-Match": "*"})).status_code == 412
    assert (await http.delete(u, headers={"If-Match": '"stale"'})).status_code == 412
    assert await gw.files.get_file("cond", "f") == v1
    assert (await http.delete(u, headers={"If-Match": f'"{sha(v1)}"'})).status_code == 204
    assert await gw.files.get_file("cond", "f") is None


async def test_created_at_kept_and_content_type_default(gw: GatewayClient, http: httpx.AsyncClient,
                                                         namespace: str) -> None:
    first = await gw.files.save_file("m", "f", b"one")
    await asyncio.sleep(0.01)
    second = await gw.files.save_file("m", "f", b"two", content_type="text/plain")
    assert second.created_at == first.created_at and second.updated_at > first.updated_at
    r = await http.get(url(namespace, "m", "f"))
    assert r.headers["content-type"] == "text/plain"  # exactly as stored: no charset added
    r = await http.put(url(namespace, "m", "g"), content=b"raw", headers={"Content-Type": ""})
    assert r.json()["content_type"] == "application/octet-stream"


# --- failures ------------------------------------------------------------------------------


async def test_cut_off_upload_keeps_old_version_and_leaves_no_chunks(
    gw: GatewayClient, server: Server, backend: Backend, namespace: str, auth_headers: dict[str, str]
) -> None:
    old = os.urandom(2 * CHUNK + 3)
    await gw.files.save_file("cut", "f", old)
    # A raw client announces 8 MiB, sends 3.5 MiB (three chunks get stored) and vanishes.
    await raw_cut_off_put(server, url(namespace, "cut", "f"), 8 * CHUNK, os.urandom(3 * CHUNK + CHUNK // 2),
                          auth_headers)
    state = await wait_clean(backend)
    assert state == {"orphans": 0, "uploads": 0, "unreferenced": 0}
    assert await gw.files.get_file("cut", "f") == old
    # A first upload that is cut off leaves nothing at all.
    await raw_cut_off_put(server, url(namespace, "cut", "new"), 4 * CHUNK, os.urandom(2 * CHUNK + 1), auth_headers)
    assert (await wait_clean(backend))["unreferenced"] == 0
    assert await gw.files.get_file("cut", "new") is None
    assert [f.id async for f in gw.files.iter_files("cut")] == ["f"]


async def test_client_generator_failing_midway(
    gw: GatewayClient, backend: Backend, server: Server, auth_headers: dict[str, str], namespace: str
) -> None:
    old = os.urandom(CHUNK // 2)
    await gw.files.save_file("cut", "g", old)

    async def failing() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield os.urandom(CHUNK)
        await asyncio.sleep(0.3)
        raise RuntimeError("the source broke")

    async with httpx.AsyncClient(base_url=server.url, headers=auth_headers, timeout=30) as client:
        with pytest.raises(RuntimeError, match="source broke"):
            await client.put(url(namespace, "cut", "g"), content=failing())
    assert (await wait_clean(backend))["unreferenced"] == 0
    assert await gw.files.get_file("cut", "g") == old


async def test_concurrent_uploads_to_one_id_never_mix(
    gw: GatewayClient, backend: Backend, namespace: str
) -> None:
    a, b = os.urandom(3 * CHUNK + 11), os.urandom(3 * CHUNK + 7)
    for _ in range(2):
        results = await asyncio.gather(
            gw.files.upload("race", "f", pieces(a, 128 * 1024, 0.005)),
            gw.files.upload("race", "f", pieces(b, 128 * 1024, 0.005)),
        )
        assert {r.sha256 for r in results} == {sha(a), sha(b)}
        final = await gw.files.get_file("race", "f")
        assert final in (a, b)
        info = await gw.files.stat("race", "f")
        assert info is not None and info.sha256 == sha(final)
        assert await pieces_of(backend, namespace, "race", "f") == expected_pieces(backend, len(final))
        assert (await wait_clean(backend))["unreferenced"] == 0


async def test_download_during_replace_sends_one_version(gw: GatewayClient, backend: Backend) -> None:
    old, new = os.urandom(6 * CHUNK), os.urandom(6 * CHUNK)
    await gw.files.save_file("snap", "f", old)
    got = bytearray()
    async with gw.files.download("snap", "f", chunk_bytes=256 * 1024) as d:
        pieces_iter = d.aiter_bytes()
        got += await pieces_iter.__anext__()
        # Replace (and so drop the old chunks) while the download is under way, then delete.
        await gw.files.save_file("snap", "f", new)
        async for piece in pieces_iter:
            got += piece
    assert bytes(got) == old
    assert await gw.files.get_file("snap", "f") == new
    async with gw.files.download("snap", "f", chunk_bytes=256 * 1024) as d:
        pieces_iter = d.aiter_bytes()
        got = bytearray(await pieces_iter.__anext__())
        await gw.files.delete_file("snap", "f")
        async for piece in pieces_iter:
            got += piece
    assert bytes(got) == new
    assert (await wait_clean(backend))["unreferenced"] == 0


# --- names, isolation, listing -------------------------------------------------------------


async def test_odd_file_ids(gw: GatewayClient, http: httpx.AsyncClient, namespace: str) -> None:
    ids = ["a/b/c.txt", "with space.png", "ünïcødé/ファイル.bin", "x:y", "trailing/", "%2F literally", "..", "a" * 1024]
    for i, file_id in enumerate(ids):
        await gw.files.save_file("odd", file_id, f"content {i}".encode())
    for i, file_id in enumerate(ids):
        assert await gw.files.get_file("odd", file_id) == f"content {i}".encode()
    listed = [f.id async for f in gw.files.iter_files("odd", page_size=3)]
    assert listed == sorted(ids, key=lambda s: s.encode("utf-8"))
    r = await http.put(url(namespace, "odd", "a" * 1025), content=b"x")
    assert r.status_code == 422 and "file_id" in r.text
    r = await http.put(url(namespace, "odd", "bad\x01id"), content=b"x")
    assert r.status_code == 422 and "file_id" in r.text
    r = await http.put(f"/v1/{namespace}/files/bad name/f", content=b"x")
    assert r.status_code == 422
    r = await http.put(url(namespace, "odd", "f"), content=b"x", headers={"Content-Type": "no-slash"})
    assert r.status_code == 422 and "Content-Type" in r.text
    assert await gw.files.get_file("odd", "f") is None
    # The Location of a new file named "." or "..": its dots encoded, or it names the collection
    for dots in (".", ".."):
        r = await http.put(f"/v1/{namespace}/files/loc/{dots.replace('.', '%2E')}", content=b"x")
        assert r.status_code == 201, r.text
        assert r.headers["location"].endswith(f"/files/loc/{dots.replace('.', '%2E')}"), r.headers["location"]
        assert (await http.get(r.headers["location"])).content == b"x"


async def test_namespaces_are_isolated(server: Server, gw: GatewayClient, api_key: str | None,
                                       namespace: str, client_transport: str) -> None:
    data = os.urandom(CHUNK + 1)
    await gw.files.save_file("shared", "f", data)
    async with GatewayClient(server.url, namespace + "_other", api_key, transport=client_transport) as other:
        assert await other.files.get_file("shared", "f") is None
        assert await other.files.head("shared", "f") is None
        assert (await other.files.list_files("shared")).items == []
        assert (await other.files.usage()).file_count == 0
        await other.files.delete_file("shared", "f")
        await other.files.save_file("shared", "f", b"theirs")
        assert await other.files.get_file("shared", "f") == b"theirs"
    assert await gw.files.get_file("shared", "f") == data
    assert (await gw.files.usage()).total_bytes == len(data)


async def test_list_prefix_cursor_and_usage(gw: GatewayClient, http: httpx.AsyncClient, namespace: str) -> None:
    sizes = {"img/a.png": 10, "img/b.png": 20, "img/c.png": 30, "imgx": 40, "doc/readme": 50}
    for file_id, size in sizes.items():
        await gw.files.save_file("l", file_id, os.urandom(size), content_type="application/x-test")
    await gw.files.save_file("other", "z", os.urandom(7))
    page = await gw.files.list_files("l", prefix="img/", limit=2)
    assert [f.id for f in page.items] == ["img/a.png", "img/b.png"] and page.next_cursor
    page2 = await gw.files.list_files("l", prefix="img/", limit=2, cursor=page.next_cursor)
    assert [f.id for f in page2.items] == ["img/c.png"] and page2.next_cursor is None
    item = page.items[0]
    assert item.size == 10 and item.content_type == "application/x-test" and len(item.sha256) == 64
    assert [f.id async for f in gw.files.iter_files("l")] == sorted(sizes)
    usage = await gw.files.usage()
    assert (usage.total_bytes, usage.file_count, usage.namespace) == (sum(sizes.values()) + 7, 6, namespace)
    r = await http.get(url(namespace, "l"), params={"cursor": "garbage"})
    assert r.status_code == 422 and "cursor" in r.text
    r = await http.get(url(namespace, "l"), params={"limit": 0})
    assert r.status_code == 422


# --- multipart -----------------------------------------------------------------------------


async def test_multipart_upload(gw: GatewayClient, http: httpx.AsyncClient, namespace: str) -> None:
    data = os.urandom(2 * CHUNK + 99)
    r = await http.post(url(namespace, "mp"), files={"file": ("pic.png", data, "image/png")},
                        data={"file_id": "u1/pic.png"})
    assert r.status_code == 201, r.text
    assert r.json()["id"] == "u1/pic.png" and r.json()["sha256"] == sha(data)
    assert r.headers["location"].endswith(url(namespace, "mp", "u1/pic.png"))
    assert await gw.files.get_file("mp", "u1/pic.png") == data
    assert (await gw.files.head("mp", "u1/pic.png")).content_type == "image/png"
    # Replacing through the form: 200; no file_id: one is generated and returned.
    r = await http.post(url(namespace, "mp"), files={"file": ("x", b"small", "text/plain")}, data={"file_id": "u1/pic.png"})
    assert r.status_code == 200
    r = await http.post(url(namespace, "mp"), files={"file": ("x", b"gen")})
    assert r.status_code == 201
    generated = r.json()["id"]
    assert await gw.files.get_file("mp", generated) == b"gen"
    # Bad forms: no file part, unknown field, not multipart, bad file_id.
    r = await http.post(url(namespace, "mp"), files={"other": ("x", b"1")})
    assert r.status_code == 422 and "other" in r.text
    r = await http.post(url(namespace, "mp"), data={"file_id": "only-id"}, files={"file_": ("x", b"")})
    assert r.status_code == 422
    r = await http.post(url(namespace, "mp"), content=b"raw", headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 415
    r = await http.post(url(namespace, "mp"), files={"file": ("x", b"1")}, data={"file_id": "bad\x01"})
    assert r.status_code == 422 and "file_id" in r.text
    r = await http.post(url(namespace, "mp"), content=b"--xyz\r\ngarbage", headers={"Content-Type": "multipart/form-data; boundary=xyz"})
    assert r.status_code == 422
    assert (await gw.files.usage()).file_count == 2
