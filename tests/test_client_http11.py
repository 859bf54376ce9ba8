"""The client's own HTTP/1.1 transport (``storage_gateway_client._http11``).

Protocol edge cases run against tiny raw asyncio servers written here (no mocks of the transport):
keep-alive reuse and its limits, servers that close idle connections, every body framing, the
timeouts and errors httpx defines, cancellation, malformed answers. The last tests run the real
gateway through ``GatewayClient``, which uses this transport by default for ``http://``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Self

import httpx
import pytest
from storage_gateway_client import GatewayClient
from storage_gateway_client._http11 import Http11Transport

from tests.conftest import Server, free_port

# --- a raw HTTP/1.1 server for the tests ---------------------------------------------------------


@dataclass
class Req:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    raw_body: bytes  # as it came over the wire (chunk framing included)


async def read_request(reader: asyncio.StreamReader) -> Req | None:
    """One request, or ``None`` when the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ")
    assert version == "HTTP/1.1"
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = raw = b""
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line[:-2], 16)
            data = await reader.readexactly(size + 2)
            raw += size_line + data
            assert data[-2:] == b"\r\n"
            body += data[:-2]
            if size == 0:
                break
    elif "content-length" in headers:
        body = raw = await reader.readexactly(int(headers["content-length"]))
    return Req(method, target, headers, body, raw)


def answer(status: int = 200, body: bytes = b"", headers: tuple[str, ...] = (), length: bool = True) -> bytes:
    """A response as bytes (with ``Content-Length`` unless ``length`` is false)."""
    lines = [f"HTTP/1.1 {status} Whatever", *headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


Handler = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class RawServer:
    """Serves each connection with ``handler(connection_number, reader, writer)``; counts
    connections, how many are open at once, and the requests the handlers note."""

    handler: Handler
    connections: int = 0
    open_now: int = 0
    max_open: int = 0
    requests: list[Req] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # a client closed a connection
    _tasks: set[asyncio.Task] = field(default_factory=set)

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        self.connections += 1
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        try:
            await self.handler(self.connections, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the test is over (cancelled by __aexit__)
        finally:
            self.open_now -= 1
            writer.transport.abort()
            self._tasks.discard(asyncio.current_task())  # type: ignore[arg-type]

    def serving(self, respond: Callable[[Req], bytes], delay: float = 0.0) -> Handler:
        """A handler answering every request on a connection with ``respond(request)``."""

        async def handler(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while (req := await read_request(reader)) is not None:
                self.requests.append(req)
                if delay:
                    await asyncio.sleep(delay)
                writer.write(respond(req))
                await writer.drain()
            self.closed.set()

        return handler


def raw_server(respond: Callable[[Req], bytes] | None = None, *, handler: Handler | None = None,
               delay: float = 0.0) -> RawServer:
    """A RawServer with a keep-alive handler answering ``respond(request)``, or a custom ``handler``."""
    server = RawServer(handler=None)  # type: ignore[arg-type]
    server.handler = handler or server.serving(respond or (lambda req: answer(200, b"ok")), delay)
    return server


def client(server: RawServer, transport: Http11Transport | None = None, **timeouts: float) -> httpx.AsyncClient:
    timeout = httpx.Timeout(timeouts.pop("default", 5.0), **timeouts)
    return httpx.AsyncClient(base_url=server.url, transport=transport or Http11Transport(), timeout=timeout)


def pool(c: httpx.AsyncClient) -> object:
    """The transport's pool (for checks that no slot or connection leaked)."""
    transport = c._transport
    assert isinstance(transport, Http11Transport)
    return transport._pool


# --- which transport GatewayClient uses ---------------------------------------------------------


def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


async def test_gateway_client_uses_http11_for_plain_http_only(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_proxy_env(monkeypatch)
    async with GatewayClient("http://127.0.0.1:1", namespace="ns") as gw:
        assert isinstance(gw._transport.client._transport, Http11Transport)
    async with GatewayClient("https://gateway.example", namespace="ns") as gw:
        assert type(gw._transport.client._transport) is httpx.AsyncHTTPTransport
    mine = httpx.MockTransport(lambda request: httpx.Response(200))
    async with GatewayClient("http://127.0.0.1:1", namespace="ns", transport=mine) as gw:
        assert gw._transport.client._transport is mine
    async with httpx.AsyncClient() as own, GatewayClient("http://127.0.0.1:1", namespace="ns", http_client=own) as gw:
        assert gw._transport.client is own


async def test_an_http_proxy_in_the_environment_is_still_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx mounts environment proxies only for its default transport, so with ``HTTP_PROXY`` set
    GatewayClient keeps that transport: the request goes to the proxy in absolute form."""
    _no_proxy_env(monkeypatch)
    async with raw_server(lambda req: answer(200, b'{"status": "ready"}', ("Content-Type: application/json",))) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        async with GatewayClient("http://gateway.invalid:8080", namespace="ns", retries=1) as gw:
            assert not isinstance(gw._transport.client._transport, Http11Transport)
            assert await gw.health() == {"status": "ready"}
        assert [r.target for r in proxy.requests] == ["http://gateway.invalid:8080/readyz"]
        monkeypatch.setenv("NO_PROXY", "*")
        async with GatewayClient("http://gateway.invalid:8080", namespace="ns") as gw:
            assert isinstance(gw._transport.client._transport, Http11Transport)


# --- keep-alive ---------------------------------------------------------------------------------


async def test_sequential_requests_share_one_connection_with_nodelay() -> None:
    async with raw_server(lambda req: answer(200, req.target.encode())) as server, client(server) as c:
        for i in range(50):
            r = await c.get(f"/n/{i}")
            assert r.status_code == 200 and r.content == f"/n/{i}".encode()
            assert r.reason_phrase == "Whatever" and r.http_version == "HTTP/1.1"
        assert server.connections == 1
        (conn,) = pool(c)._open  # type: ignore[attr-defined]
        sock = conn.writer.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


async def test_idle_connection_closed_by_the_server_is_not_reused() -> None:
    """The server answers one request per connection and closes it (saying nothing): the next
    request sees the close and opens a new connection, each request reaching the server once."""

    async def one_per_connection(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        req = await read_request(reader)
        assert req is not None
        server.requests.append(req)
        writer.write(answer(200, b"one"))
        await writer.drain()
        writer.close()

    async with raw_server(handler=one_per_connection) as server, client(server) as c:
        for _ in range(5):
            assert (await c.post("/p", content=b"x")).content == b"one"
            await asyncio.sleep(0.02)
        assert server.connections == 5 and len(server.requests) == 5


async def test_bytes_sent_on_an_idle_connection_retire_it() -> None:
    """Some servers send an unasked 408 on an idle connection before closing it (later): that
    connection must not be reused, nor the 408 taken as the next request's answer."""

    async def says_408_when_idle(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (req := await read_request(reader)) is not None:
            server.requests.append(req)
            writer.write(answer(200, f"c{n}".encode()))
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(answer(408, b"idle", ("Connection: close",)))

    async with raw_server(handler=says_408_when_idle) as server, client(server) as c:
        assert (await c.get("/")).content == b"c1"
        await asyncio.sleep(0.15)
        r = await c.get("/")
        assert r.status_code == 200 and r.content == b"c2"
        assert len(server.requests) == 2


async def test_request_on_a_connection_the_server_dropped_is_retried_once_when_safe() -> None:
    """The race a pool cannot see coming: the server takes the request on a kept-alive connection
    and closes it without an answer. A GET (idempotent) is sent again on a new connection; a POST
    whose request went out whole is not (the server may have acted on it)."""

    async def drops_second(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i in range(2):
            req = await read_request(reader)
            if req is None:
                return
            server.requests.append(req)
            if i == 1:
                return  # closes without answering
            writer.write(answer(200, f"c{n}".encode()))
            await writer.drain()

    async with raw_server(handler=drops_second) as server, client(server) as c:
        assert (await c.get("/a")).content == b"c1"
        assert (await c.get("/b")).content == b"c2"  # /b failed on c1, then went out on c2
        assert [r.target for r in server.requests] == ["/a", "/b", "/b"]
        assert (await c.put("/c", content=b"body")).content == b"c3"  # PUT is idempotent, c2 dropped it
        assert [r.body for r in server.requests[-2:]] == [b"body", b"body"]
        with pytest.raises(httpx.RemoteProtocolError, match="without answering"):
            await c.post("/d", content=b"once")  # c3 drops it: no second attempt
        assert [r.target for r in server.requests].count("/d") == 1
        assert (await c.post("/e", content=b"fresh")).content == b"c4"  # a fresh connection is fine
        assert pool(c)._slots == 1  # type: ignore[attr-defined]


async def test_a_fresh_connection_is_never_retried() -> None:
    async def drops(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.requests.append(await read_request(reader))  # type: ignore[arg-type]

    async with raw_server(handler=drops) as server, client(server) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            await c.get("/")
        assert server.connections == 1 and pool(c)._slots == 0  # type: ignore[attr-defined]


async def test_keepalive_limits_and_expiry() -> None:
    async with raw_server(lambda req: answer(200, b"ok"), delay=0.05) as server:
        limits = httpx.Limits(max_connections=10, max_keepalive_connections=2, keepalive_expiry=0.3)
        async with client(server, Http11Transport(limits)) as c:
            responses = await asyncio.gather(*(c.get("/") for _ in range(5)))
            assert all(r.status_code == 200 for r in responses) and server.connections == 5
            await asyncio.sleep(0.05)
            assert server.open_now == 2  # three closed, two kept idle
            await c.get("/")
            assert server.connections == 5  # reused
            await asyncio.sleep(0.4)  # past the expiry: not reused
            await c.get("/")
            assert server.connections == 6
            await asyncio.sleep(0.05)
            assert server.open_now == 1


async def test_max_connections_queue_and_pool_timeout() -> None:
    big = os.urandom(100_000)  # over 64 KiB: the body is not read with the head
    async with raw_server(lambda req: answer(200, big), delay=0.05) as server:
        async with client(server, Http11Transport(httpx.Limits(max_connections=2))) as c:
            responses = await asyncio.gather(*(c.get(f"/{i}") for i in range(12)))
            assert all(r.status_code == 200 for r in responses)
            assert server.max_open == 2 and server.connections == 2

        async with client(server, Http11Transport(httpx.Limits(max_connections=1)), pool=0.2) as c:
            async with c.stream("GET", "/held"):  # the only slot, its body not read yet
                with pytest.raises(httpx.PoolTimeout):
                    await c.get("/waits")
            assert (await c.get("/after")).status_code == 200
            assert pool(c)._slots == 1  # type: ignore[attr-defined]


async def test_pool_serves_other_hosts_by_closing_idle_connections() -> None:
    one_slot = Http11Transport(httpx.Limits(max_connections=1))
    async with raw_server() as a, raw_server() as b, httpx.AsyncClient(transport=one_slot, timeout=2) as c:
        assert (await c.get(f"{a.url}/")).status_code == 200
        assert (await c.get(f"{b.url}/")).status_code == 200  # a's idle connection made room
        await asyncio.wait_for(a.closed.wait(), 2)
        assert (await c.get(f"{a.url}/")).status_code == 200
        assert a.connections == 2 and b.connections == 1


# --- bodies -------------------------------------------------------------------------------------


async def test_response_framings() -> None:
    big = os.urandom(200_000)
    chunks = [b"hello ", b"chunked ", b"world"]

    async def handler(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (req := await read_request(reader)) is not None:
            server.requests.append(req)
            if req.target == "/chunked":
                writer.write(answer(200, headers=("Transfer-Encoding: chunked",), length=False))
                for i, piece in enumerate(chunks):
                    writer.write(b"%x;ext=%d\r\n%b\r\n" % (len(piece), i, piece))
                    await writer.drain()
                writer.write(b"0\r\nX-Trailer: yes\r\n\r\n")
            elif req.target == "/big-chunk":
                writer.write(answer(200, headers=("Transfer-Encoding: chunked",), length=False))
                writer.write(b"%X\r\n%b\r\n0\r\n\r\n" % (len(big), big))
            elif req.target == "/big":
                writer.write(answer(200, big))
            elif req.target == "/head":
                writer.write(answer(200, headers=("Content-Length: 1000",), length=False))
            elif req.target == "/204":
                writer.write(answer(204, length=False))
            elif req.target == "/304":
                writer.write(answer(304, headers=("Content-Length: 50",), length=False))
            elif req.target == "/interim":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
                writer.write(answer(200, b"final", ("X-Multi: a", "x-multi: b")))
            elif req.target == "/close":
                writer.write(answer(200, b"bye", ("Connection: close",)))
            elif req.target == "/http10":
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n10")
            elif req.target == "/eof":
                writer.write(answer(200, big, length=False))
                await writer.drain()
                return
            await writer.drain()

    async with raw_server(handler=handler) as server, client(server) as c:
        r = await c.get("/chunked")
        assert r.content == b"".join(chunks) and "x-trailer" not in r.headers
        async with c.stream("GET", "/big-chunk") as r:
            pieces = [p async for p in r.aiter_raw()]
        assert b"".join(pieces) == big and max(map(len, pieces)) <= 64 * 1024 and len(pieces) >= 4
        async with c.stream("GET", "/big") as r:
            pieces = [p async for p in r.aiter_raw()]
        assert b"".join(pieces) == big and max(map(len, pieces)) <= 64 * 1024
        r = await c.head("/head")
        assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "1000"
        r = await c.get("/204")
        assert r.status_code == 204 and r.content == b""
        r = await c.get("/304")
        assert r.status_code == 304 and r.content == b""
        r = await c.get("/interim")
        assert r.status_code == 200 and r.content == b"final"
        assert r.headers.get_list("x-multi") == ["a", "b"]
        assert [k for k, _ in r.headers.raw][:1] == [b"X-Multi"]  # raw names and order kept
        assert server.connections == 1  # all of the above on one connection
        assert (await c.get("/close")).content == b"bye"
        assert (await c.get("/http10")).content == b"10"  # on a new connection (previous closed)
        assert server.connections == 2
        assert (await c.get("/eof")).content == big  # HTTP/1.0 without keep-alive: new connection
        assert server.connections == 3
        assert (await c.get("/chunked")).content == b"".join(chunks)  # body read to EOF: not reused
        assert server.connections == 4


async def test_request_bodies_arrive_intact() -> None:
    async with raw_server(lambda req: answer(200, hashlib.sha256(req.body).hexdigest().encode())) as server, \
            client(server) as c:
        data = os.urandom(3 * 1024 * 1024 + 17)

        async def pieces() -> AsyncIterator[bytes]:
            for start in range(0, len(data), 100_000):
                yield data[start:start + 100_000]
            yield b""  # an empty piece must not end the chunked body early

        r = await c.put("/stream", content=pieces())
        assert r.text == hashlib.sha256(data).hexdigest()
        req = server.requests[-1]
        assert req.headers["transfer-encoding"] == "chunked" and req.raw_body.endswith(b"\r\n0\r\n\r\n")
        r = await c.post("/bytes", content=data)
        assert r.text == hashlib.sha256(data).hexdigest()
        assert server.requests[-1].headers["content-length"] == str(len(data))
        r = await c.post("/json", json={"a": [1, 2, 3]})
        assert server.requests[-1].body == b'{"a":[1,2,3]}'
        r = await c.get("/empty")
        assert server.requests[-1].body == b"" and "content-length" not in server.requests[-1].headers
        assert server.connections == 1


async def test_header_injection_is_refused_before_sending() -> None:
    async with raw_server() as server, client(server) as c:
        with pytest.raises(httpx.LocalProtocolError):
            await c.get("/", headers={"X-Evil": "a\r\nInjected: 1"})
        assert server.requests == [] and pool(c)._slots == 0  # type: ignore[attr-defined]


async def test_early_answer_while_uploading_is_returned() -> None:
    """Like httpcore: a server that answers (413) and closes before taking the whole body gives
    that answer, not a write error."""

    async def refuses(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer(413, b"too big", ("Connection: close",)))
        await writer.drain()
        await asyncio.sleep(0.1)  # the answer reaches the client before the reset

    async def endless() -> AsyncIterator[bytes]:
        block = os.urandom(1024 * 1024)
        for _ in range(64):
            yield block

    async with raw_server(handler=refuses) as server, client(server) as c:
        r = await c.put("/upload", content=endless())
        assert r.status_code == 413 and r.content == b"too big"
        assert pool(c)._slots == 0  # type: ignore[attr-defined]


# --- timeouts, errors, cancellation -------------------------------------------------------------


async def test_timeouts_and_connect_errors() -> None:
    async def silent(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        req = await read_request(reader)
        if req is not None and req.target == "/partial":
            writer.write(answer(200, headers=("Content-Length: 100000",), length=False) + b"x" * 1000)
        await asyncio.sleep(60)

    async def never_reads(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(60)

    async with raw_server(handler=silent) as server, client(server, read=0.2) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.get("/")
        async with c.stream("GET", "/partial") as r:
            with pytest.raises(httpx.ReadTimeout):
                await r.aread()
        assert pool(c)._slots == 0  # type: ignore[attr-defined]

    async with raw_server(handler=never_reads) as server, client(server, write=0.2) as c:
        with pytest.raises(httpx.WriteTimeout):
            await c.put("/", content=b"x" * (64 * 1024 * 1024))
        assert pool(c)._slots == 0  # type: ignore[attr-defined]

    async with httpx.AsyncClient(transport=Http11Transport(), timeout=2) as c:
        with pytest.raises(httpx.ConnectError) as err:
            await c.get(f"http://127.0.0.1:{free_port()}/")
        assert isinstance(err.value.__cause__, OSError)
        assert pool(c)._slots == 0  # type: ignore[attr-defined]
        with pytest.raises(httpx.UnsupportedProtocol):
            await c.get("https://127.0.0.1:1/")


async def test_cancellation_mid_response_closes_that_connection_only() -> None:
    big = os.urandom(1024 * 1024)

    async def handler(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (req := await read_request(reader)) is not None:
            if req.target == "/stall":
                writer.write(answer(200, headers=(f"Content-Length: {len(big)}",), length=False) + big[:200_000])
                await writer.drain()
                await reader.read()  # until the client closes
                server.closed.set()
                return
            if req.target == "/no-answer":
                await reader.read()
                server.closed.set()
                return
            writer.write(answer(200, b"ok"))
            await writer.drain()

    async with raw_server(handler=handler) as server, client(server) as c:
        assert (await c.get("/")).content == b"ok"
        started = asyncio.Event()

        async def consume() -> None:
            async with c.stream("GET", "/stall") as r:  # on the kept-alive connection
                async for _ in r.aiter_raw():
                    started.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(started.wait(), 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.closed.wait(), 2)  # that connection was closed...
        assert (await c.get("/")).content == b"ok"  # ...and the next request opened another
        assert server.connections == 2 and pool(c)._slots == 1  # type: ignore[attr-defined]

        server.closed.clear()
        task = asyncio.create_task(c.get("/no-answer"))  # cancelled while waiting for the head
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.closed.wait(), 2)
        assert (await c.get("/")).content == b"ok"
        assert server.connections == 3 and pool(c)._slots == 1  # type: ignore[attr-defined]


async def test_early_close_of_a_streamed_body_closes_the_connection() -> None:
    big = os.urandom(1024 * 1024)
    async with raw_server(lambda req: answer(200, big)) as server, client(server) as c:
        async with c.stream("GET", "/") as r:
            async for _ in r.aiter_raw():
                break
        assert (await c.get("/")).content == big
        assert server.connections == 2 and pool(c)._slots == 1  # type: ignore[attr-defined]


MALFORMED = {
    "status-line": b"HTTX/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    "status-code": b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
    "no-colon": b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    "folded": b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 0\r\n\r\n",
    "space-before-colon": b"HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n",
    "bad-length": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    "two-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
    "bare-lf": b"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n",
    "head-too-long": b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (300 * 1024) + b"\r\n\r\n",
    "no-answer": b"",
    "cut-head": b"HTTP/1.1 200 OK\r\nContent-Le",
    "cut-body": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
    "bad-chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
    "chunk-without-crlf": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n",
    "cut-chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_answers_are_remote_protocol_errors(case: str) -> None:
    async def handler(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(MALFORMED[case])
        await writer.drain()

    async with raw_server(handler=handler) as server, client(server) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            await c.get("/")
        assert pool(c)._slots == 0  # type: ignore[attr-defined]


async def test_a_reset_mid_response_is_a_read_error() -> None:
    async def resets(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(200, headers=("Content-Length: 100000",), length=False) + b"x" * 1000)
        await writer.drain()
        await asyncio.sleep(0.05)
        linger = struct.pack("ii", 1, 0)  # close with a reset, not a FIN
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        writer.transport.abort()

    async with raw_server(handler=resets) as server, client(server) as c:
        async with c.stream("GET", "/") as r:
            with pytest.raises(httpx.ReadError) as err:
                await r.aread()
        assert isinstance(err.value.__cause__, ConnectionResetError)
        assert pool(c)._slots == 0  # type: ignore[attr-defined]


async def test_close_closes_every_connection_and_refuses_new_requests() -> None:
    async with raw_server() as server:
        transport = Http11Transport()
        c = client(server, transport)
        await asyncio.gather(c.get("/"), c.get("/"))
        assert server.open_now == 2
        await c.aclose()
        await asyncio.sleep(0.05)
        assert server.open_now == 0
        with pytest.raises(RuntimeError, match="closed"):
            await transport.handle_async_request(httpx.Request("GET", f"{server.url}/"))


# --- the real gateway ---------------------------------------------------------------------------


@pytest.fixture
def client_transport() -> str:
    """These are tests of ``Http11Transport`` itself: ``gw`` uses it, never httpx's transport."""
    return "http11"


async def test_gateway_calls_share_one_connection(gw: GatewayClient) -> None:
    for i in range(30):
        await gw.kv.set("c", "k", i)
        assert await gw.kv.get("c", "k") == i
    transport = gw._transport.client._transport
    assert isinstance(transport, Http11Transport)
    assert len(transport._pool._open) == 1


async def test_20_mib_chunked_upload_and_streamed_download(gw: GatewayClient, server: Server) -> None:
    block = os.urandom(1024 * 1024)
    digest = hashlib.sha256()

    async def source() -> AsyncIterator[bytes]:
        for i in range(20):
            piece = block[i:] + block[:i]
            digest.update(piece)
            yield piece

    info = await gw.files.upload("h11", "20.bin", source())  # chunked: no length given
    assert info.size == 20 * 1024 * 1024 and info.sha256 == digest.hexdigest()

    got = hashlib.sha256()
    sizes = []
    async with gw._transport.stream("GET", f"/v1/{gw.namespace}/files/h11/20.bin") as r:
        assert r.status_code == 200
        async for piece in r.aiter_raw():
            sizes.append(len(piece))
            got.update(piece)
    assert got.hexdigest() == info.sha256 and sum(sizes) == info.size and max(sizes) <= 64 * 1024

    got = hashlib.sha256()
    async for piece in gw.files.download("h11", "20.bin"):
        got.update(piece)
    assert got.hexdigest() == info.sha256
    assert len(gw._transport.client._transport._pool._open) == 1  # type: ignore[attr-defined]
