"""The connection layer: what uvicorn's HTTP/1.1 protocol is told to refuse, and how.

uvicorn (httptools) has no limit on the size or number of request headers, no deadline for a
request head, counts idle keep-alive connections against ``limit_concurrency``, and answers a
malformed request or a full server in plain text. ``GatewayHttpProtocol`` is uvicorn's own
protocol with these added, per connection, from ``limits.*``:

- a request head (request line and headers) over ``max_header_bytes``, or with more than
  ``max_headers`` header lines, is answered 431; a ``Transfer-Encoding`` other than ``chunked``
  alone, 501;
- a head must arrive within ``header_timeout_seconds`` of the connection opening, or of the last
  answer on it (plus ``keep_alive_seconds``): otherwise 408 if it had begun, else a quiet close.
  This also bounds how long the rest of a refused body is read and dropped;
- past ``max_connections`` open connections, the longest idle one (no request in progress) is
  closed to make room; only when none is idle is the new connection answered 503;
- a request line without an HTTP version (HTTP/0.9) is answered 400, one of ``HTTP/2.0`` 505;
- a client that shuts its sending side after a complete request (``shutdown(SHUT_WR)``) gets its
  answer, then the connection closes (asyncio closed it at once, and the answer was dropped);
- every refusal is ``application/problem+json`` with a stable ``code``, then the connection closes
  (lingering: what the client still sends is read and dropped for a moment, so it reads the answer);
- an answer's head and body go out in one socket write (``CoalescingTransport``): uvicorn writes
  the head as soon as the app starts the answer, so every small answer cost two ``send`` calls and
  two TCP segments, and the client two wake-ups;
- on a plain TCP connection (Linux, no TLS), a started answer's body can be moved to the socket
  straight from another one, in the kernel: ``scope["extensions"][splice.EXTENSION]`` is a
  ``BodySplicer`` (``app.core.http.splice``; S3 downloads use it).

This subclasses uvicorn internals (the parser callbacks and ``send_400_response``): the one place
that does, pinned by ``tests/test_server_protocol.py``. Served as ``http=PROTOCOL`` by ``app.cli``.
"""

from __future__ import annotations

import asyncio
import http
import json
import time
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from app.core.config import LimitsSettings, get_settings
from app.core.errors import PROBLEM_JSON
from app.core.http import splice
from app.core.ops.metrics import count_problem

PROTOCOL = "app.core.http.server:GatewayHttpProtocol"
LINGER_SECONDS = 2.0
# A write at least this large goes out at once (with whatever small writes wait before it):
# joining it would only delay it, and it needs a socket write of its own anyway.
COALESCE_BYTES = 64 * 1024


@lru_cache(maxsize=1)
def _limits() -> LimitsSettings:
    return get_settings().limits


class HeadRefused(Exception):
    """Raised from a parser callback: httptools turns it into a parse error, answered with the
    refusal the callback set (431 for a head too large, 501 for a transfer coding)."""


def problem_bytes(
    status: int, code: str, detail: str, default_headers: list[tuple[bytes, bytes]], extra: dict[str, str] | None = None
) -> bytes:
    """A complete HTTP/1.1 problem+json answer that closes the connection."""
    phrase = http.HTTPStatus(status).phrase
    body = json.dumps(
        {"type": "about:blank", "title": phrase, "status": status, "code": code, "detail": detail}
    ).encode()
    head = [f"HTTP/1.1 {status} {phrase}\r\n".encode()]
    for name, value in default_headers:
        head.append(name + b": " + value + b"\r\n")
    for name, text in (extra or {}).items():
        head.append(f"{name}: {text}\r\n".encode())
    head.append(
        f"x-content-type-options: nosniff\r\ncontent-type: {PROBLEM_JSON}\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
    )
    count_problem(code, status)
    return b"".join(head) + body


class CoalescingTransport(asyncio.Transport):
    """A connection's transport whose small writes in one event-loop step leave in one socket write.

    uvicorn writes an answer's head when the app sends ``http.response.start`` and its body on the
    next message, in the same step for any answer that is not streamed. Written through, that was two
    ``send`` system calls and two TCP segments per answer: on a kv get, ~24% of a worker's CPU was in
    those two calls (py-spy, PostgreSQL, concurrency 16). Here a small write waits, and the writes
    waiting leave together (``writelines``: one ``writev`` on uvloop) when the answer is complete
    (``GatewayHttpProtocol.on_response_complete`` flushes, before the request's clean-up runs), when
    a write of ``COALESCE_BYTES`` or more comes (it takes them with it), or at the end of the
    event-loop step (``call_soon``: a streamed head does not wait for its first piece). Closing and
    half-closing never leave a write behind, and writes are never reordered.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._waiting: list[bytes | bytearray | memoryview] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._waiting:
            if len(data) >= COALESCE_BYTES:
                self._transport.write(data)
                return
            self._loop.call_soon(self.flush)
        self._waiting.append(data)
        if len(data) >= COALESCE_BYTES:
            self.flush()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Write what waits now (a no-op when nothing does, or when the connection is closing)."""
        waiting, self._waiting = self._waiting, []
        if waiting and not self._transport.is_closing():
            self._transport.writelines(waiting)

    def flushed(self) -> asyncio.Transport:
        """The transport underneath, with every write that waited handed to it."""
        self.flush()
        return self._transport

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._waiting = []
        self._transport.abort()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(d) for d in self._waiting)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()


class BodySplicer:
    """``scope["extensions"][splice.EXTENSION]``: the rest of a started answer's body, moved
    from a socket to the client's in the kernel. One per request (a pipelined request's cycle
    replaces ``protocol.cycle`` before this one's answer is done)."""

    def __init__(self, protocol: GatewayHttpProtocol, cycle: RequestResponseCycle) -> None:
        self._protocol = protocol
        self._cycle = cycle

    async def splice(self, source: int, count: int, *, read_timeout: float, write_timeout: float) -> None:
        """Send ``count`` bytes read from socket ``source`` as the next bytes of the body.

        Raises what ``splice.relay`` raises; the connection is then closed (a body cut short
        cannot carry another answer). The answer is completed as usual afterwards (an empty last
        ``http.response.body``), and its ``Content-Length`` counts the spliced bytes.
        """
        await self._protocol.splice_body(
            self._cycle, source, count, read_timeout=read_timeout, write_timeout=write_timeout
        )


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head limits, a head deadline and idle-first eviction."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = _limits()
        self._max_head = limits.max_header_bytes
        self._max_headers = limits.max_headers
        self._head_timeout = limits.header_timeout_seconds
        self._keep_alive = limits.keep_alive_seconds
        self._max_connections = limits.max_connections
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_pending = True  # the bytes arriving now belong to a request head
        self._head_bytes = 0
        self._header_lines = 0
        self._parsed_bytes = 0  # request line and headers of the current head, as parsed
        self._refusal: tuple[int, str, str] | None = None
        self._lingering = False
        self._half_closed = False  # the client shut its side after a complete request
        self.idle_since: float | None = None  # when the last answer ended (None: a request is on)
        self._can_splice = False

    # --- connections --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._out = CoalescingTransport(transport, self.loop)
        super().connection_made(self._out)
        self._can_splice = bool(
            splice.AVAILABLE and transport.get_extra_info("sslcontext") is None and transport.get_extra_info("socket")
        )
        self.idle_since = time.monotonic()
        if len(self.connections) > self._max_connections and not self._close_an_idle_connection():
            self.connections.discard(self)
            self._refuse(503, "too_many_connections", "the server has too many open connections; retry shortly",
                         {"Retry-After": "1"})
            return
        self._arm_head_timer(self._head_timeout)

    def _close_an_idle_connection(self) -> bool:
        """Close the connection idle the longest (never one with a request in progress)."""
        idle = [
            (since, c) for c in self.connections
            if c is not self and (since := getattr(c, "idle_since", None)) is not None
        ]
        if not idle:
            return False
        _, oldest = min(idle, key=lambda pair: pair[0])
        self.connections.discard(oldest)
        oldest.transport.close()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The client shut its sending side: after a complete request not answered yet, True keeps
        the transport open for the answer (closed once it is out); else None closes it, as uvicorn
        did always, and an answer in progress was dropped (the request ran, never answered)."""
        cycle = self.cycle  # the newest request (a pipelined one waits behind the others)
        # uvicorn annotates cycle as always set; it is None until the first request starts
        if self._lingering or cycle is None or cycle.response_complete or cycle.more_body:  # type: ignore[redundant-expr]
            return None
        self._half_closed = True
        return True

    # --- the request head ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # refused: dropped until the client closes or the linger ends
        if self._head_pending:  # raw bytes: a head still incomplete (one huge header) is bounded too
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_pending and self._head_bytes > self._max_head and not self.transport.is_closing():
            self._refuse(431, "request_header_fields_too_large",
                         f"the request head exceeds {self._max_head} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.idle_since = None
        self._header_lines = 0
        self._parsed_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._parsed_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_lines += 1
        self._parsed_bytes += len(name) + len(value) + 4
        if self._header_lines > self._max_headers:
            self._refusal = (431, "request_header_fields_too_large",
                             f"the request has more than {self._max_headers} header lines")
            raise HeadRefused
        if self._parsed_bytes > self._max_head:
            self._refusal = (431, "request_header_fields_too_large", f"the request head exceeds {self._max_head} bytes")
            raise HeadRefused
        if name.lower() == b"transfer-encoding" and value.strip().lower() != b"chunked":
            # httptools only requires chunked last and hands the body on decoded of it alone: a
            # gzip-coded upload was stored still gzipped. RFC 9112 6.1: a coding not understood is 501.
            coding = value.decode("latin-1")[:100]
            self._refusal = (501, "transfer_coding_not_implemented",
                             f"Transfer-Encoding {coding!r}: only chunked is implemented")
            raise HeadRefused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_pending = False
        self._cancel_head_timer()
        version = self.parser.get_http_version()
        if version not in ("1.1", "1.0"):
            # httptools reads a request line without a version as HTTP/0.9 (and one of "HTTP/2.0"
            # as that), and uvicorn answered either as HTTP/1.1 (RFC 9112 2.3: 0.9 is not served).
            self._refusal = (
                (400, "malformed_request", "the request line has no HTTP version (HTTP/0.9 is not served)")
                if version == "0.9" else
                (505, "http_version_not_supported", f"HTTP/{version} is not served here: only HTTP/1.1 and 1.0")
            )
            raise HeadRefused
        super().on_headers_complete()
        # The request's cycle exists now and its task has not run yet: the scope it got still
        # takes the extension (not when uvicorn answered by itself, e.g. an upgrade).
        cycle = self.cycle
        if self._can_splice and cycle is not None and cycle.scope is self.scope:  # type: ignore[redundant-expr]
            self.scope["extensions"] = {splice.EXTENSION: BodySplicer(self, cycle)}  # type: ignore[dict-item]  # (ASGI types extensions as plain dicts)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_pending = True  # what follows is the next request's head
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        self._out.flush()  # the whole answer leaves now, not after the request's clean-up
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self._half_closed and self.cycle.response_complete:
            self.transport.close()  # the client sends nothing more: its last answer is out
            return
        self.idle_since = time.monotonic()
        # The next head (and the rest of a body the answer did not wait for) must come in time.
        self._arm_head_timer(self._keep_alive + self._head_timeout)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request httptools could not parse, as problem+json."""
        status, code, detail = self._refusal or (400, "malformed_request", "the request is not valid HTTP/1.1")
        self._refuse(status, code, detail)

    # --- a body spliced from another socket -----------------------------------------------------

    async def splice_body(
        self, cycle: RequestResponseCycle, source: int, count: int, *, read_timeout: float, write_timeout: float
    ) -> None:
        raw = self._out.flushed()
        if cycle.disconnected or raw.is_closing():
            raise splice.SinkClosed("the client connection is closing")
        if (not cycle.response_started or cycle.response_complete or cycle.chunked_encoding is not False
                or not 0 < count <= cycle.expected_content_length):
            raise RuntimeError("a spliced body needs a started answer whose Content-Length covers it")
        try:
            deadline = time.monotonic() + write_timeout
            while raw.get_write_buffer_size():  # the head (and anything before) leaves first
                if raw.is_closing():
                    raise splice.SinkClosed("the client connection is closing")
                if time.monotonic() >= deadline:
                    raise splice.SinkStalled(f"the client took nothing for {write_timeout:g} s")
                await asyncio.sleep(0.001)
            await splice.relay(
                source, raw.get_extra_info("socket").fileno(), count,
                read_timeout=read_timeout, write_timeout=write_timeout, closing=raw.is_closing,
            )
        except BaseException:
            raw.close()  # part of the body may be out: this connection can carry nothing more
            raise
        cycle.expected_content_length -= count

    # --- helpers ------------------------------------------------------------------------------

    def _refuse(self, status: int, code: str, detail: str, extra: dict[str, str] | None = None) -> None:
        """Answer and close, lingering: a client still sending would otherwise get a reset that
        can destroy the answer before it reads it, so what it sends next is read and dropped for
        up to ``LINGER_SECONDS`` after our side of the connection is shut (nginx's lingering close)."""
        self._cancel_head_timer()
        if self.transport.is_closing() or self._lingering:
            return
        self.transport.write(problem_bytes(status, code, detail, self.server_state.default_headers, extra))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self._lingering = True
        self.transport.write_eof()
        self.transport.resume_reading()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def _arm_head_timer(self, seconds: float) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(seconds, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        # uvicorn annotates cycle as always set; it is None until the first request starts
        if self._head_pending and self._head_bytes > 0 and (self.cycle is None or self.cycle.response_complete):  # type: ignore[redundant-expr]
            self._refuse(408, "request_timeout", f"the request head did not arrive within {self._head_timeout:g} s")
        else:
            self.transport.close()
