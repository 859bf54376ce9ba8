"""Request body limits enforced before a handler reads anything.

JSON routes are bounded by ``limits.max_body_bytes``: a declared ``Content-Length`` over it is
refused before the handler runs, and a chunked body is counted as it arrives. File uploads
stream and count their own bytes against ``limits.max_file_bytes`` instead, so they are passed
through.

Before answering 413 the rest of the body is read and dropped (up to ``DRAIN_MAX_BYTES``): an
HTTP/1.1 client that is still sending would otherwise see a reset connection instead of the
answer. Past that bound the connection is closed.

A body that stops arriving (a slow or stalled client) is cut off after
``limits.body_idle_timeout_seconds`` without a byte, with 408, on every route.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DRAIN_MAX_BYTES = 64 * 1024 * 1024


async def drain(receive: Receive, max_bytes: int = DRAIN_MAX_BYTES) -> bool:
    """Read and drop the rest of a request body; False when it was longer than ``max_bytes``."""
    drained = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        drained += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
        if drained > max_bytes:
            return False

from app.core.errors import PayloadTooLarge, RequestTimeout, render


def idle_timeout(receive: Receive, seconds: float) -> Receive:
    """``receive`` that raises ``RequestTimeout`` when the body stalls for ``seconds``.

    Only while the body is still arriving: afterwards ``receive`` waits for the disconnect,
    which may rightly take as long as the response does.
    """
    body_done = False

    async def timed() -> Message:
        nonlocal body_done
        if body_done:
            return await receive()
        try:
            async with asyncio.timeout(seconds):  # no task per read, unlike asyncio.wait_for
                message = await receive()
        except TimeoutError:
            raise RequestTimeout(f"the request body sent nothing for {seconds:g} seconds") from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            body_done = True
        return message

    return timed


def _has_body(scope: Scope) -> bool:
    """Whether the request announces a body (HTTP/1.1 needs Content-Length or chunking for one)."""
    for name, value in scope.get("headers", ()):
        if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return True
    return False


class BodyLimitMiddleware:
    def __init__(
        self, app: ASGIApp, max_body_bytes: int, idle_timeout_seconds: float = 30.0,
        streamed_marker: str = "/files/",
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.idle_timeout_seconds = idle_timeout_seconds
        self.streamed_marker = streamed_marker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        receive = idle_timeout(receive, self.idle_timeout_seconds)
        if self.streamed_marker in scope.get("path", ""):
            await self.app(scope, receive, send)
            return
        try:
            await self._buffered(scope, receive, send)
        except RequestTimeout as exc:
            response = render(exc)
            response.headers["Connection"] = "close"
            await response(scope, receive, send)

    async def _buffered(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.max_body_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await self._refuse(scope, receive, send, limit, drain_first=declared <= DRAIN_MAX_BYTES)
                    return
        # Read the whole (bounded) body now; JSON handlers would hold it in memory anyway.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(body)
            if size > limit:
                await self._refuse(scope, receive, send, limit, drain_first=more)
                return
            chunks.append(body)
        payload = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": payload, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, limit: int, drain_first: bool) -> None:
        if drain_first and not await drain(receive):
            drain_first = False
        response = render(PayloadTooLarge(f"request body exceeds the limit of {limit} bytes"))
        if not drain_first:
            response.headers["Connection"] = "close"
        await response(scope, receive, send)
