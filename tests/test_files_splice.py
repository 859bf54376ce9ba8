"""S3 downloads spliced from the S3 connection to the client's in the kernel (``app.core.http.splice``).

The loop itself on socket pairs (every way it can end), then the gateway on SeaweedFS, both
metadata databases: spliced bytes are the file's (whole, ranged, through the client), the
connection carries the next answer, a small file or ``files.s3.splice_downloads: false`` is not
spliced, and a client that stops reading is cut off after ``limits.send_idle_timeout_seconds``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.core.http import splice
from storage_gateway_client import GatewayClient
from tests.conftest import ADMIN_KEY, Backend, Server, start_server, stop_server
from tests.test_files import url
from tests.test_ops_telemetry import parse_metrics, value
from tests.test_pipeline import read_to_end, stuck_download

MiB = 1024 * 1024
SPLICED = "gateway_file_bytes_spliced_total"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def tcp_pair(segment: int) -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection whose packets carry ``segment`` bytes at most (on a
    real network ~1448: each fills a page slot of a pipe it is spliced into)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.socket()
        a.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, segment)
        a.connect(listener.getsockname())
        b, _ = listener.accept()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


async def feed(sock: socket.socket, data: bytes, close: bool = True) -> None:
    await asyncio.get_running_loop().sock_sendall(sock, data)
    if close:
        sock.close()


async def drain(sock: socket.socket, limit: int) -> bytes:
    got = bytearray()
    loop = asyncio.get_running_loop()
    while len(got) < limit:
        piece = await loop.sock_recv(sock, 1 << 20)
        if not piece:
            break
        got += piece
    return bytes(got)


# --- the loop ---------------------------------------------------------------------------------


async def test_relay_moves_exactly_count_bytes_and_leaves_no_descriptor() -> None:
    data = os.urandom(5 * MiB + 123)
    (src_in, src_out), (dst_in, dst_out) = pair(), pair()
    before = open_fds()
    writer = asyncio.create_task(feed(src_in, data + b"not this"))  # bytes past count stay on the socket
    reader = asyncio.create_task(drain(dst_out, len(data)))
    await splice.relay(src_out.fileno(), dst_in.fileno(), len(data), read_timeout=5, write_timeout=5)
    assert await reader == data
    await writer
    assert open_fds() == before - 1  # the pipe and the duplicates are closed (and feed closed src_in)
    assert src_out.recv(100) == b"not this"
    for s in (src_out, dst_in, dst_out):
        s.close()


async def test_relay_raises_when_the_source_ends_short() -> None:
    (src_in, src_out), (dst_in, dst_out) = pair(), pair()
    before = open_fds()
    writer = asyncio.create_task(feed(src_in, b"x" * 1000))
    reader = asyncio.create_task(drain(dst_out, 2000))
    with pytest.raises(splice.SourceEnded):
        await splice.relay(src_out.fileno(), dst_in.fileno(), 2000, read_timeout=5, write_timeout=5)
    await writer
    dst_in.close()
    assert await reader == b"x" * 1000  # what came, then nothing: never other bytes
    assert open_fds() == before - 2  # (src_in and dst_in closed)
    src_out.close()
    dst_out.close()


async def test_relay_times_out_on_a_silent_source() -> None:
    (src_in, src_out), (dst_in, dst_out) = pair(), pair()
    await feed(src_in, b"y" * 10, close=False)
    started = time.monotonic()
    with pytest.raises(splice.SourceTimeout):
        await splice.relay(src_out.fileno(), dst_in.fileno(), 100, read_timeout=0.5, write_timeout=5)
    assert 0.4 < time.monotonic() - started < 3
    for s in (src_in, src_out, dst_in, dst_out):
        s.close()


async def test_relay_gives_up_on_a_sink_that_takes_nothing() -> None:
    (src_in, src_out), (dst_in, dst_out) = pair(), pair()
    data = os.urandom(16 * MiB)  # far more than the socket buffers and the pipe hold
    writer = asyncio.create_task(feed(src_in, data, close=False))
    started = time.monotonic()
    with pytest.raises(splice.SinkStalled):
        await splice.relay(src_out.fileno(), dst_in.fileno(), len(data), read_timeout=5, write_timeout=0.5)
    assert 0.4 < time.monotonic() - started < 3
    writer.cancel()
    for s in (src_in, src_out, dst_in, dst_out):
        s.close()


async def test_relay_stops_when_the_sink_is_closing_or_reset() -> None:
    (src_in, src_out), (dst_in, dst_out) = pair(), pair()
    with pytest.raises(splice.SinkClosed):
        await splice.relay(src_out.fileno(), dst_in.fileno(), 10, read_timeout=5, write_timeout=5, closing=lambda: True)
    dst_out.close()  # the client is gone: the next write fails
    writer = asyncio.create_task(feed(src_in, b"z" * MiB, close=False))
    with pytest.raises(OSError):
        await splice.relay(src_out.fileno(), dst_in.fileno(), MiB, read_timeout=5, write_timeout=5)
    writer.cancel()
    for s in (src_in, src_out, dst_in):
        s.close()


async def test_relay_waits_for_a_slow_sink_without_spinning_or_timing_out_the_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sink slower than the source, and a pipe that fills before the bytes it was asked for (a
    pipe holds a number of page slots, one per packet spliced in; here: a resize that did not
    happen, the quota case): while the pipe holds bytes only the sink is waited for (the source,
    always readable, would wake the loop at once), and the source's silence is not counted while
    it could not be read."""
    import fcntl as real

    class Unresizable:
        @staticmethod
        def fcntl(fd: int, cmd: int, arg: int = 0) -> int:
            return 0 if cmd == 1031 else real.fcntl(fd, cmd, arg)  # F_SETPIPE_SZ: "done", but not

    monkeypatch.setattr(splice, "fcntl", Unresizable)
    (src_in, src_out), (dst_in, dst_out) = tcp_pair(1400), pair()
    data = os.urandom(6 * MiB)
    writer = asyncio.create_task(feed(src_in, data, close=False))
    loop = asyncio.get_running_loop()

    async def slow_reader() -> bytes:
        got = bytearray()
        while len(got) < len(data):
            await asyncio.sleep(0.02)
            got += await loop.sock_recv(dst_out, 256 * 1024)
        return bytes(got)

    reader = asyncio.create_task(slow_reader())
    cpu, wall = time.process_time(), time.monotonic()
    await splice.relay(src_out.fileno(), dst_in.fileno(), len(data), read_timeout=0.3, write_timeout=2)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    assert await reader == data
    assert wall > 0.3  # longer than read_timeout: the source's clock did not run while it waited
    assert cpu < wall / 2, (cpu, wall)  # waiting, not spinning
    await writer
    for s in (src_in, src_out, dst_in, dst_out):
        s.close()


def test_the_raw_get_sends_the_host_botocore_signed() -> None:
    from urllib.parse import urlsplit

    from app.files.s3 import _signed_host

    assert _signed_host(urlsplit("http://127.0.0.1:8333/b/k?X-Amz-Signature=s")) == "127.0.0.1:8333"
    assert _signed_host(urlsplit("http://MinIO.local:80/b/k")) == "minio.local"  # default port left out
    assert _signed_host(urlsplit("http://[::1]:9000/b/k")) == "[::1]:9000"


# --- the gateway on S3 ---------------------------------------------------------------------------

pytestmark_s3 = pytest.mark.parametrize("backend", ["sqlite_s3", "postgres_s3"], indirect=True)


async def spliced(http: httpx.AsyncClient) -> float:
    return value(parse_metrics((await http.get("/metrics")).text), SPLICED)


@pytestmark_s3
async def test_large_downloads_are_spliced_and_exact(server: Server, http: httpx.AsyncClient, namespace: str) -> None:
    data = os.urandom(9 * MiB + 7)
    path = url(namespace, "c", "big")
    assert (await http.put(path, content=data)).status_code == 201
    before = await spliced(http)
    r = await http.get(path)
    assert r.status_code == 200 and r.content == data
    after = await spliced(http)
    assert len(data) - MiB <= after - before <= len(data)  # all but what came with S3's answer head
    ranged = await http.get(path, headers={"Range": f"bytes={MiB + 3}-{6 * MiB + 2}"})
    assert ranged.status_code == 206 and ranged.content == data[MiB + 3:6 * MiB + 3]
    assert ranged.headers["content-range"] == f"bytes {MiB + 3}-{6 * MiB + 2}/{len(data)}"
    assert await spliced(http) - after >= 4 * MiB
    # The same connection carries the next answers (the Content-Length counted the spliced bytes).
    assert (await http.put(f"/v1/{namespace}/kv/c/k", json=1)).status_code == 204
    assert (await http.get(path, headers={"Range": "bytes=0-9"})).content == data[:10]


@pytestmark_s3
async def test_small_ranges_are_copied_not_spliced(server: Server, http: httpx.AsyncClient, namespace: str) -> None:
    data = os.urandom(9 * MiB)
    path = url(namespace, "c", "big")
    assert (await http.put(path, content=data)).status_code == 201
    before = await spliced(http)
    r = await http.get(path, headers={"Range": f"bytes=100-{3 * MiB}"})  # under SPLICE_MIN_BYTES
    assert r.status_code == 206 and r.content == data[100:3 * MiB + 1]
    assert await spliced(http) == before


@pytestmark_s3
async def test_the_client_downloads_spliced_files(
    server: Server, http: httpx.AsyncClient, namespace: str, client_transport: str, tmp_path: Path
) -> None:
    data = os.urandom(12 * MiB + 1)
    before = await spliced(http)
    async with GatewayClient(server.url, namespace, ADMIN_KEY, transport=client_transport) as gw:
        await gw.files.save_file("c", "doc.bin", data)
        assert await gw.files.get_file("c", "doc.bin") == data
        target = tmp_path / "copy.bin"
        await gw.files.download_to("c", "doc.bin", target)
        assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert await spliced(http) - before >= 2 * (len(data) - MiB)


@pytestmark_s3
def test_pipelined_downloads_are_each_spliced_whole(server: Server, namespace: str) -> None:
    """Two GETs sent at once on one connection: uvicorn makes the second request's cycle while the
    first answer is still being spliced; each answer keeps its own."""
    first, second = os.urandom(6 * MiB + 1), os.urandom(5 * MiB + 2)
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        for name, data in (("one", first), ("two", second)):
            assert client.put(url(namespace, "c", name), content=data).status_code == 201
    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30)
    try:
        sock.sendall(b"".join(
            f"GET {url(namespace, 'c', name)} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {ADMIN_KEY}\r\n\r\n".encode()
            for name in ("one", "two")
        ))
        stream = sock.makefile("rb")
        for data in (first, second):
            assert stream.readline().startswith(b"HTTP/1.1 200")
            length = None
            while (line := stream.readline()) != b"\r\n":
                name, _, value_ = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value_)
            assert length == len(data)
            assert stream.read(length) == data
    finally:
        sock.close()


@pytest.fixture
def strict(backend: Backend, server: Server, tmp_path: Path) -> Iterator[Server]:
    srv = start_server(backend, tmp_path / "strict.log", GATEWAY_LIMITS__SEND_IDLE_TIMEOUT_SECONDS="2")
    try:
        yield srv
    finally:
        stop_server(srv)


@pytestmark_s3
def test_a_client_that_stops_reading_a_spliced_download_is_cut_off(strict: Server, namespace: str) -> None:
    blob = os.urandom(48 * MiB)
    path = url(namespace, "c", "big")
    with httpx.Client(base_url=strict.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        assert client.put(path, content=blob).status_code == 201
        before = value(parse_metrics(client.get("/metrics").text), SPLICED)
        sock = stuck_download(strict, path)
        try:
            time.sleep(4)  # past send_idle_timeout_seconds=2
            assert len(read_to_end(sock)) < len(blob)  # cut off, not sent whole
        finally:
            sock.close()
        assert client.get(path).content == blob  # the next download is whole, and spliced
        assert value(parse_metrics(client.get("/metrics").text), SPLICED) - before >= len(blob) - MiB
    assert "took nothing for 2 s: cut off" in strict.log_path.read_text()


@pytestmark_s3
async def test_splicing_can_be_turned_off(backend: Backend, server: Server, namespace: str, tmp_path: Path) -> None:
    srv = start_server(backend, tmp_path / "off.log", GATEWAY_FILES__S3__SPLICE_DOWNLOADS="false")
    try:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
            data = os.urandom(9 * MiB)
            path = url(namespace, "c", "big")
            assert (await http.put(path, content=data)).status_code == 201
            assert (await http.get(path)).content == data
            assert await spliced(http) == 0
    finally:
        stop_server(srv)
