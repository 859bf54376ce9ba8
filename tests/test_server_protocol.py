"""Pins what ``app.core.http.server`` relies on in uvicorn's httptools protocol (its one fence).

``GatewayHttpProtocol`` overrides parser callbacks and ``send_400_response`` and reads a few
attributes; if an uvicorn upgrade renames or re-signs any of them, this fails before the server
quietly stops enforcing its limits. The behaviour itself is tested on real processes in
``tests/test_pipeline.py``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from app.core.http.server import CoalescingTransport, GatewayHttpProtocol

OVERRIDDEN = {
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "eof_received": ["self"],
    "data_received": ["self", "data"],
    "on_message_begin": ["self"],
    "on_url": ["self", "url"],
    "on_header": ["self", "name", "value"],
    "on_headers_complete": ["self"],
    "on_message_complete": ["self"],
    "on_response_complete": ["self"],
    "send_400_response": ["self", "msg"],
}


def test_the_overridden_hooks_keep_their_signatures() -> None:
    for name, parameters in OVERRIDDEN.items():
        assert list(inspect.signature(getattr(HttpToolsProtocol, name)).parameters) == parameters, name
        assert getattr(GatewayHttpProtocol, name) is not getattr(HttpToolsProtocol, name), name


def test_parse_errors_are_still_answered_through_send_400_response() -> None:
    source = inspect.getsource(HttpToolsProtocol.data_received)
    assert "except httptools.HttpParserError" in source and "self.send_400_response(" in source


def test_the_attributes_read_are_still_set() -> None:
    init = inspect.getsource(HttpToolsProtocol.__init__)
    for attribute in ("self.connections =", "self.loop =", "self.server_state =", "self.cycle", "self.transport"):
        assert attribute in init, attribute
    assert "default_headers" in inspect.getsource(HttpToolsProtocol.send_400_response)
    cycle = inspect.getsource(RequestResponseCycle.__init__)  # read by eof_received
    for attribute in ("self.more_body =", "self.response_complete ="):
        assert attribute in cycle, attribute
    # uvicorn's own limit_concurrency is off (app.cli); the check that honours it is where we expect
    assert "limit_concurrency" in inspect.getsource(HttpToolsProtocol.on_headers_complete)


def test_a_spliced_body_is_counted_where_uvicorn_counts_a_body() -> None:
    """``splice_body`` reads the cycle's answer state and takes the spliced bytes off
    ``expected_content_length``, which ``send`` checks on every body message and at the end."""
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    init = inspect.getsource(RequestResponseCycle.__init__)
    for attribute in ("self.response_started", "self.response_complete", "self.chunked_encoding",
                      "self.expected_content_length", "self.disconnected", "self.scope = scope"):
        assert attribute in init, attribute
    send = inspect.getsource(RequestResponseCycle.send)
    assert "self.expected_content_length -= num_bytes" in send
    assert "if self.expected_content_length != 0:" in send
    # The splicer is bound to the cycle made for the request's scope, before its task runs.
    headers_complete = inspect.getsource(HttpToolsProtocol.on_headers_complete)
    assert "self.cycle = RequestResponseCycle(" in headers_complete and "scope=self.scope," in headers_complete
    assert "self.loop.create_task(" in inspect.getsource(HttpToolsProtocol._start_asgi_task)


# --- one socket write per answer (CoalescingTransport) -----------------------------------------


class RecordingTransport(asyncio.Transport):
    """What the protocol hands to the socket, call by call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False
        self.written_when_complete: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.calls.append(("writelines", b"".join(bytes(d) for d in list_of_data)))

    def close(self) -> None:
        self.calls.append(("close", b""))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.calls.append(("eof", b""))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    @property
    def sent(self) -> bytes:
        return b"".join(data for _, data in self.calls)

    @property
    def writes(self) -> list[str]:
        """The socket writes and the half-close, in order (the close at the end is the test's)."""
        return [kind for kind, _ in self.calls if kind != "close"]


def answer_with(body: bytes, pieces: int = 1) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body) * pieces).encode())]})
        for i in range(pieces):
            await send({"type": "http.response.body", "body": body, "more_body": i < pieces - 1})
        # What had reached the socket when the answer was complete, before any clean-up ran.
        transport = scope["state"]["transport"]
        transport.written_when_complete = transport.sent
    return app


async def serve_one(app: Any, request: bytes) -> RecordingTransport:
    config = Config(app=app, lifespan="off", log_level="warning")
    transport = RecordingTransport()
    protocol = GatewayHttpProtocol(config, ServerState(), {"transport": transport}, _loop=asyncio.get_running_loop())
    protocol.connection_made(transport)
    protocol.data_received(request)
    for _ in range(100):  # the app's task, then the flush it scheduled
        await asyncio.sleep(0)
        if protocol.cycle is not None and protocol.cycle.response_complete and transport.calls:
            await asyncio.sleep(0)
            break
    protocol.connection_lost(None)
    return transport


GET = b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n"


async def test_a_small_answer_leaves_in_one_socket_write_as_soon_as_it_is_complete() -> None:
    transport = await serve_one(answer_with(b'{"value": 1}'), GET)
    assert transport.writes == ["writelines"]
    head, _, body = transport.sent.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and body == b'{"value": 1}'
    # not at the end of the event-loop step, after the request's clean-up (returning its database
    # connection, metrics, the access log): that only delays the answer
    assert transport.written_when_complete == transport.sent


async def test_a_large_body_goes_out_at_once_with_the_head_before_it() -> None:
    piece = bytes(range(256)) * 1024  # 256 KiB
    transport = await serve_one(answer_with(piece, pieces=3), GET)
    assert transport.writes == ["writelines", "write", "write"]  # head + first piece together, then each piece
    assert transport.calls[0][1].startswith(b"HTTP/1.1 200 OK")
    assert transport.sent.partition(b"\r\n\r\n")[2] == piece * 3


async def test_a_refusal_is_written_before_the_half_close() -> None:
    transport = await serve_one(answer_with(b"never"), b"GET /x HTTP/1.1\r\nhost: t\r\n" + b"x-pad: y\r\n" * 10_000 + b"\r\n")
    assert transport.writes == ["writelines", "eof"]
    assert transport.sent.startswith(b"HTTP/1.1 431 ")


def test_the_coalescing_transport_is_a_complete_transport() -> None:
    """Every public method of ``asyncio.Transport`` is its own (a missing one would raise
    NotImplementedError deep in uvicorn or asyncio instead of reaching the socket)."""
    public = {name for name in dir(asyncio.Transport) if not name.startswith("_")}
    missing = {name for name in public if getattr(CoalescingTransport, name) is getattr(asyncio.Transport, name)}
    assert missing == set()
