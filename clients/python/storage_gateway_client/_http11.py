"""A lean HTTP/1.1 transport for httpx on asyncio streams, for plain ``http://`` only.

Why: httpx's default transport (httpcore + h11 + anyio) spends about 500 µs of CPU per request;
for small JSON calls such as vector searches that is most of the client's cost. This transport
speaks just the HTTP/1.1 a client needs, straight on ``asyncio`` streams.

What it does:

- one pool of connections for all hosts, keyed by (host, port): at most ``max_connections``
  open (a caller waits up to the ``pool`` timeout for a slot, then ``httpx.PoolTimeout``; an idle
  connection to another host is closed to make room), at most ``max_keepalive_connections``
  idle; an idle connection is closed after ``keepalive_expiry`` seconds (4 s by default, under
  uvicorn's 5 s), and is never reused once its peer has closed it or sent anything while idle;
- request bodies as httpx frames them (``Content-Length``, or chunked when httpx set
  ``Transfer-Encoding: chunked``); a small request goes out in one write;
- responses framed by ``Content-Length``, chunked encoding (trailers ignored) or the end of the
  connection (then not reused); none for HEAD, 1xx, 204 and 304; interim 1xx answers other than
  101 skipped. A response of at most 64 KiB is read at once and its connection returned to the
  pool before the response is handed over; a larger one streams in pieces of at most 64 KiB and
  its connection goes back to the pool once the body was read to its end;
- httpx's errors: ``ConnectError``/``ConnectTimeout``, ``WriteError``/``WriteTimeout``,
  ``ReadError``/``ReadTimeout``, ``PoolTimeout``, ``RemoteProtocolError`` for a malformed or cut
  off response, each chained to the original exception. Any error or cancellation in the middle
  of a request closes that connection (a half-used connection never goes back to the pool).

The retry rule. When a connection that has served a request before fails before any byte of the
answer arrived (typically: the server closed it while it was idle), the request is sent once more
on a new connection, provided its body can be sent again (none, bytes, or a stream of which no
piece was taken yet), the failure is not a timeout, and either the method is idempotent (GET,
HEAD, PUT, DELETE, OPTIONS) or the failure came while writing the request (then the server
cannot have received all of it, so cannot have acted on it). A POST that went out completely is
not sent again: the server may have acted on it; the client's own retry layer decides.

As httpcore does, when writing the request fails the response is still read: a server may answer
(413, say) and close before taking the whole body.
"""

from __future__ import annotations

import asyncio
import select
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import Any, SupportsIndex, TypeVar

import httpx

HEAD_LIMIT = 256 * 1024  # the longest response head (or chunk-size line) accepted
CHUNK_BYTES = 64 * 1024  # the most bytes a response stream yields at once
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
HEX_DIGITS = b"0123456789abcdefABCDEF"
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=4.0)

Key = tuple[str, int]
T = TypeVar("T")


class _Reader(asyncio.StreamReader):
    """A StreamReader that records whether bytes arrived (during a request, or while idle), and
    that keeps what arrived readable when the connection is lost (a server may answer, say 413,
    then reset the connection): the loss is kept in ``lost`` and the reader sees an EOF."""

    idle = False  # the connection sits in the pool
    stale = False  # something arrived while idle: the connection must not be reused
    received = False  # some byte of the current answer arrived
    lost: BaseException | None = None

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:  # bytes, as asyncio feeds it
        if self.idle:
            self.stale = True
        self.received = True
        super().feed_data(data)

    def set_exception(self, exc: BaseException) -> None:
        self.lost = exc
        self.feed_eof()


class _Connection:
    """One TCP connection: its streams, and what the pool and the retry rule need to know."""

    __slots__ = ("body_taken", "fd", "idle_since", "key", "reader", "reused", "write_failed", "writer")

    def __init__(self, key: Key, reader: _Reader, writer: asyncio.StreamWriter) -> None:
        self.key = key
        self.reader = reader
        self.writer = writer
        self.fd: int = writer.get_extra_info("socket").fileno()
        self.reused = False  # it served a request before the current one
        self.idle_since = 0.0
        self.write_failed = False  # the current request could not be written whole
        self.body_taken = False  # a piece of the current request's body stream was taken

    def reusable_at(self, now: float, expiry: float) -> bool:
        """Whether this idle connection may take a request: fresh, open, and silent."""
        reader = self.reader
        if reader.stale or reader.at_eof() or reader.lost is not None:
            return False
        if self.writer.transport.is_closing() or now - self.idle_since > expiry:
            return False
        # Bytes or EOF the event loop has not picked up yet: the peer closed or misbehaved.
        return not _readable(self.fd)

    def close(self, abort: bool) -> None:
        """Close: after a complete exchange politely, a half-used connection at once (reset)."""
        if abort:
            self.writer.transport.abort()
        else:
            self.writer.transport.close()


def _readable(fd: int) -> bool:
    """Whether ``fd`` has bytes or EOF waiting (``poll``: ``select`` fails for fds over 1023)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])


class _Pool:
    """Connection slots and idle connections, shared by every host of one transport."""

    def __init__(self, limits: httpx.Limits) -> None:
        self.max_connections = limits.max_connections or sys.maxsize
        self.max_idle = sys.maxsize if limits.max_keepalive_connections is None else limits.max_keepalive_connections
        self.expiry = float("inf") if limits.keepalive_expiry is None else limits.keepalive_expiry
        self.closed = False
        self._slots = 0  # connections open or being opened
        self._open: set[_Connection] = set()
        self._idle: dict[Key, list[_Connection]] = {}  # per host, oldest first
        self._idle_count = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_idle(self, key: Key) -> _Connection | None:
        """The most recently used healthy idle connection to ``key``; unhealthy ones are closed."""
        if self.closed:
            raise RuntimeError("the HTTP transport is closed")
        conns = self._idle.get(key)
        if not conns:
            return None
        now = time.monotonic()
        while conns:
            conn = conns.pop()
            self._idle_count -= 1
            conn.reader.idle = False
            if conn.reusable_at(now, self.expiry):
                return conn
            self.discard(conn, abort=False)
        return None

    async def reserve(self, key: Key, timeout: float | None, reuse: bool) -> _Connection | None:
        """An idle connection to ``key`` (if ``reuse``), or ``None`` with a slot reserved to open one."""
        while True:
            conn = self.take_idle(key) if reuse else None
            if conn is not None:
                return conn
            if self.closed:
                raise RuntimeError("the HTTP transport is closed")
            if self._slots < self.max_connections:
                self._slots += 1
                return None
            if not self._evict_oldest_idle():
                await self._wait(timeout)

    def opened(self, conn: _Connection) -> None:
        """A connection was opened in a slot ``reserve`` gave."""
        self._open.add(conn)

    def free_slot(self) -> None:
        """Give back a slot (its connection could not be opened, or was closed)."""
        self._slots -= 1
        self._wake()

    def release(self, conn: _Connection, reusable: bool) -> None:
        """After a complete exchange: keep the connection for reuse, or close it."""
        if not reusable or self.closed or conn not in self._open:
            self.discard(conn, abort=False)
            return
        now = time.monotonic()
        conn.reused = True
        conn.idle_since = now
        conn.reader.idle = True
        self._idle.setdefault(conn.key, []).append(conn)
        self._idle_count += 1
        self._expire_idle(now)
        while self._idle_count > self.max_idle:
            self._evict_oldest_idle()
        self._wake()

    def discard(self, conn: _Connection, abort: bool = True) -> None:
        """Close a connection and free its slot (the second time it only closes it again)."""
        conn.close(abort)
        if conn in self._open:
            self._open.remove(conn)
            self.free_slot()

    def close(self) -> None:
        """Close every connection, idle or in use; waiters and later requests get an error."""
        self.closed = True
        self._idle.clear()
        self._idle_count = 0
        for conn in list(self._open):
            self.discard(conn, abort=not conn.reader.idle)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _expire_idle(self, now: float) -> None:
        """Close idle connections older than the keep-alive expiry."""
        for conns in self._idle.values():
            while conns and now - conns[0].idle_since > self.expiry:
                self._idle_count -= 1
                self.discard(conns.pop(0), abort=False)

    def _evict_oldest_idle(self) -> bool:
        """Close the longest idle connection of any host; ``False`` when none is idle."""
        oldest: list[_Connection] | None = None
        for conns in self._idle.values():
            if conns and (oldest is None or conns[0].idle_since < oldest[0].idle_since):
                oldest = conns
        if oldest is None:
            return False
        self._idle_count -= 1
        self.discard(oldest.pop(0), abort=False)
        return True

    async def _wait(self, timeout: float | None) -> None:
        """Wait until a slot may have freed or a connection gone idle (``PoolTimeout`` after ``timeout``)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._wake()  # woken and stopped at once: pass the turn on
            if isinstance(exc, TimeoutError):
                raise httpx.PoolTimeout(f"no connection free within {timeout} s") from exc
            raise

    def _wake(self) -> None:
        """Let the longest waiting caller look again."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class _Head:
    """A parsed response head, and how its body is framed: ``length`` bytes, ``chunked``, or
    (``length`` None and not chunked) until the connection ends."""

    __slots__ = ("chunked", "headers", "keep_alive", "length", "reason", "status", "version")

    def __init__(self, data: bytes, method: str) -> None:
        if data.count(b"\n") != data.count(b"\r\n"):
            raise httpx.RemoteProtocolError("malformed response head: a bare LF")
        lines = data[:-4].split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
            raise httpx.RemoteProtocolError(f"malformed status line: {lines[0][:100]!r}")
        self.version = parts[0]
        self.status = status = int(parts[1])
        self.reason = parts[2] if len(parts) == 3 else b""
        self.headers: list[tuple[bytes, bytes]] = []
        headers = self.headers
        length: int | None = None
        encoding: bytes | None = None
        connection = b""
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name[-1] in b" \t" or line[0] in b" \t":
                raise httpx.RemoteProtocolError(f"malformed header line: {line[:100]!r}")
            value = value.strip(b" \t")
            headers.append((name, value))
            lower = name.lower()
            if lower == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise httpx.RemoteProtocolError(f"bad Content-Length: {value[:40]!r}")
                length = int(value)
            elif lower == b"transfer-encoding":
                encoding = value.lower()
            elif lower == b"connection":
                connection += b"," + value.lower()
        tokens = {t.strip() for t in connection.split(b",")}
        self.keep_alive = b"close" not in tokens and (self.version != b"HTTP/1.0" or b"keep-alive" in tokens)
        self.chunked = False
        self.length: int | None = length
        if method == "HEAD" or status < 200 or status == 204 or status == 304:
            self.length = 0
            if status == 101:
                self.keep_alive = False  # the connection now speaks something else
        elif encoding is not None:
            self.chunked = encoding.rsplit(b",", 1)[-1].strip() == b"chunked"
            self.length = None
            if length is not None or not self.chunked:
                self.keep_alive = False  # ambiguous framing, or a body ended by closing
        elif length is None:
            self.keep_alive = False  # the body ends when the server closes


def _request_head(request: httpx.Request) -> tuple[bytes, bool, bool]:
    """The request line and headers as bytes, whether the body is chunked, whether to close after."""
    raw = request.headers.raw
    parts = [request.method.encode("ascii"), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
    chunked = close = False
    for name, value in raw:
        parts += (name, b": ", value, b"\r\n")
        lower = name.lower()
        if lower == b"transfer-encoding":
            chunked = value.lower().rsplit(b",", 1)[-1].strip() == b"chunked"
        elif lower == b"connection":
            close = b"close" in value.lower()
    parts.append(b"\r\n")
    head = b"".join(parts)
    lines = len(raw) + 2
    if head.count(b"\r\n") != lines or head.count(b"\r") != lines or head.count(b"\n") != lines:
        raise httpx.LocalProtocolError("CR or LF inside the request line or a header")
    return head, chunked, close


def _frame(chunk: bytes) -> bytes:
    """One piece of a chunked request body."""
    return b"%x\r\n%b\r\n" % (len(chunk), chunk)


class Http11Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over asyncio streams with a keep-alive pool; plain ``http://`` only."""

    def __init__(self, limits: httpx.Limits = DEFAULT_LIMITS) -> None:
        self._pool = _Pool(limits)

    async def aclose(self) -> None:
        """Close every connection; the transport cannot be used afterwards."""
        self._pool.close()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` on a pooled (or new) connection and return its response."""
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"Http11Transport speaks plain http only, not {url.scheme!r}")
        timeouts: dict[str, Any] = request.extensions.get("timeout") or {}
        key = (url.host, url.port or 80)
        head, chunked, close = _request_head(request)
        stream = request.stream
        body = b"".join(stream) if isinstance(stream, httpx.ByteStream) else None  # None: streamed
        for attempt in (0, 1):
            conn = self._pool.take_idle(key) if attempt == 0 else None
            if conn is None:
                conn = await self._checkout(key, timeouts, reuse=attempt == 0)
            try:
                return await self._exchange(conn, request, head, body, chunked, close, timeouts)
            except httpx.TransportError as exc:
                self._pool.discard(conn)
                if attempt == 0 and _may_retry(conn, request.method, body, exc):
                    continue
                raise
            except BaseException:
                self._pool.discard(conn)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _checkout(self, key: Key, timeouts: dict[str, Any], reuse: bool) -> _Connection:
        """A connection to ``key``: an idle one (if ``reuse``), or a new one in a free slot."""
        conn = await self._pool.reserve(key, timeouts.get("pool"), reuse)
        if conn is not None:
            return conn
        try:
            conn = await _connect(key, timeouts.get("connect"))
        except BaseException:
            self._pool.free_slot()
            raise
        self._pool.opened(conn)
        return conn

    async def _exchange(
        self, conn: _Connection, request: httpx.Request, head: bytes, body: bytes | None,
        chunked: bool, close: bool, timeouts: dict[str, Any],
    ) -> httpx.Response:
        """Write the request and read the response head (and a small body)."""
        conn.reader.received = conn.write_failed = conn.body_taken = False
        try:
            await _write_request(conn, request, head, body, chunked, timeouts.get("write"))
        except httpx.WriteError as exc:
            write_error: httpx.WriteError | None = exc
        else:
            write_error = None
        read_timeout = timeouts.get("read")
        try:
            response_head, content = await _read_response(conn.reader, request.method, read_timeout)
        except httpx.TransportError:
            if write_error is not None:
                raise write_error from write_error.__cause__
            raise
        keep_alive = response_head.keep_alive and not close and write_error is None
        stream = (
            httpx.ByteStream(content) if content is not None
            else _ResponseStream(self._pool, conn, response_head, keep_alive, read_timeout)
        )
        response = httpx.Response(
            response_head.status, headers=response_head.headers, stream=stream,
            extensions={"http_version": response_head.version, "reason_phrase": response_head.reason},
        )
        if content is not None:
            self._pool.release(conn, keep_alive)  # the exchange is complete
        return response


def _may_retry(conn: _Connection, method: str, body: bytes | None, exc: httpx.TransportError) -> bool:
    """The retry rule of the module docstring."""
    if not conn.reused or conn.reader.received or isinstance(exc, httpx.TimeoutException):
        return False
    if body is None and conn.body_taken:
        return False  # a streamed body cannot be produced again
    return method in IDEMPOTENT_METHODS or conn.write_failed


async def _connect(key: Key, timeout: float | None) -> _Connection:
    """Open a TCP connection (asyncio sets TCP_NODELAY on it)."""
    loop = asyncio.get_running_loop()
    reader = _Reader(limit=HEAD_LIMIT, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    try:
        async with asyncio.timeout(timeout):
            transport, _ = await loop.create_connection(lambda: protocol, key[0], key[1])
    except TimeoutError as exc:
        raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} took over {timeout} s") from exc
    except OSError as exc:
        raise httpx.ConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from exc
    return _Connection(key, reader, asyncio.StreamWriter(transport, protocol, reader, loop))


async def _write_request(
    conn: _Connection, request: httpx.Request, head: bytes, body: bytes | None, chunked: bool,
    timeout: float | None,
) -> None:
    """Head and body; a small request in one write."""
    if body is not None:
        if chunked:
            body = (_frame(body) if body else b"") + b"0\r\n\r\n"
        if len(body) <= CHUNK_BYTES:
            await _send(conn, head + body, timeout)
        else:
            await _send(conn, head, timeout)
            await _send(conn, body, timeout)
        return
    await _send(conn, head, timeout)
    conn.body_taken = True
    stream = request.stream
    if not isinstance(stream, httpx.AsyncByteStream):  # an AsyncClient builds only these
        raise TypeError("an async transport needs an async request body")
    async for chunk in stream:
        if chunk:
            await _send(conn, _frame(chunk) if chunked else chunk, timeout)
    if chunked:
        await _send(conn, b"0\r\n\r\n", timeout)


async def _send(conn: _Connection, data: bytes, timeout: float | None) -> None:
    """Write ``data``, waiting (up to ``timeout``) only while the socket's buffer is full."""
    writer = conn.writer
    try:
        writer.write(data)
        if writer.transport.get_write_buffer_size():
            async with asyncio.timeout(timeout):
                await writer.drain()
        else:
            await writer.drain()  # raises at once if the connection is gone
    except TimeoutError as exc:
        raise httpx.WriteTimeout(f"writing the request took over {timeout} s") from exc
    except OSError as exc:
        conn.write_failed = True
        raise httpx.WriteError(f"connection lost while writing the request: {exc!r}") from exc


async def _read_response(reader: _Reader, method: str, timeout: float | None) -> tuple[_Head, bytes | None]:
    """The final response head (interim 1xx other than 101 skipped) and, if it is at most 64 KiB,
    the whole body; ``None`` for a body to stream."""
    try:
        async with asyncio.timeout(timeout) as deadline:
            while True:
                head = _Head(await reader.readuntil(b"\r\n\r\n"), method)
                if not 100 <= head.status < 200 or head.status == 101:
                    break
            length = head.length
            if length is None or length > CHUNK_BYTES:
                return head, None
            if not length:
                return head, b""
            if timeout is not None:
                deadline.reschedule(asyncio.get_running_loop().time() + timeout)  # a new read
            return head, await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        if reader.lost is None and not reader.received:
            raise httpx.RemoteProtocolError("server closed the connection without answering") from exc
        raise _ended(reader, exc) from (reader.lost or exc)
    except (TimeoutError, asyncio.LimitOverrunError) as exc:
        raise _read_error(exc, timeout) from exc


async def _read(reader: _Reader, awaitable: Awaitable[T], timeout: float | None) -> T:
    """Await one read of a response body, with httpx's errors."""
    try:
        async with asyncio.timeout(timeout):
            return await awaitable
    except asyncio.IncompleteReadError as exc:
        raise _ended(reader, exc) from (reader.lost or exc)
    except (TimeoutError, asyncio.LimitOverrunError) as exc:
        raise _read_error(exc, timeout) from exc


def _ended(reader: _Reader, exc: Exception) -> httpx.TransportError:
    """The error for a response cut off: by a lost connection, or by the server closing it."""
    if reader.lost is not None:
        return httpx.ReadError(f"connection lost while reading the response: {reader.lost!r}")
    return httpx.RemoteProtocolError("server closed the connection mid-response")


def _read_error(exc: Exception, timeout: float | None) -> httpx.TransportError:
    """httpx's error for a read that timed out or overran the line limit."""
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(f"no data from the server within {timeout} s")
    return httpx.RemoteProtocolError(f"response head or chunk line longer than {HEAD_LIMIT} bytes")


class _ResponseStream(httpx.AsyncByteStream):
    """A body read from its connection as it is consumed, in pieces of at most 64 KiB.

    Read to its end, the connection goes back to the pool (when reusable); closed early, failed
    or cancelled, the connection is closed.
    """

    def __init__(self, pool: _Pool, conn: _Connection, head: _Head, keep_alive: bool, timeout: float | None) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._head = head
        self._keep_alive = keep_alive
        self._timeout = timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            raise httpx.StreamConsumed()
        reader = conn.reader
        try:
            if self._head.chunked:
                pieces = self._chunked(reader)
            elif self._head.length is not None:
                pieces = self._sized(reader, self._head.length)
            else:
                pieces = self._until_eof(reader)
            async for piece in pieces:
                yield piece
        except BaseException:
            self._finish(complete=False)
            raise
        self._finish(complete=True)

    async def aclose(self) -> None:
        self._finish(complete=False)

    def _finish(self, complete: bool) -> None:
        """Hand the connection back after a complete body, else close it; only the first call counts."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if complete:
            self._pool.release(conn, self._keep_alive)
        else:
            self._pool.discard(conn)

    async def _sized(self, reader: _Reader, length: int) -> AsyncIterator[bytes]:
        while length:
            piece = await _read(reader, reader.readexactly(min(length, CHUNK_BYTES)), self._timeout)
            length -= len(piece)
            yield piece

    async def _chunked(self, reader: _Reader) -> AsyncIterator[bytes]:
        while True:
            line = await _read(reader, reader.readuntil(b"\r\n"), self._timeout)
            size_field = line[:-2].split(b";", 1)[0].strip(b" \t")
            if not size_field or size_field.strip(HEX_DIGITS) or len(size_field) > 16:
                raise httpx.RemoteProtocolError(f"bad chunk size line: {line[:40]!r}")
            size = int(size_field, 16)
            if size == 0:
                while await _read(reader, reader.readuntil(b"\r\n"), self._timeout) != b"\r\n":
                    pass  # trailers are ignored
                return
            async for piece in self._sized(reader, size):
                yield piece
            if await _read(reader, reader.readexactly(2), self._timeout) != b"\r\n":
                raise httpx.RemoteProtocolError("a chunk not followed by CRLF")

    async def _until_eof(self, reader: _Reader) -> AsyncIterator[bytes]:
        while piece := await _read(reader, reader.read(CHUNK_BYTES), self._timeout):
            yield piece
        if reader.lost is not None:  # a reset, not the server's end of the body
            raise httpx.ReadError(f"connection lost while reading the response: {reader.lost!r}") from reader.lost
