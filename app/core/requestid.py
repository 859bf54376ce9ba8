"""Request ids: taken from ``X-Request-ID`` when it is sane, generated otherwise, echoed on every answer.

A pure ASGI middleware (no ``BaseHTTPMiddleware``: that buffers streams and costs a task per
request). The id is kept in ``scope["state"]`` (so ``request.state.request_id`` works, which the
problem renderer reads) and in a context variable (so every log line of the request carries it).
"""

from __future__ import annotations

import re
import uuid
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
MAX_LENGTH = 128
# Printable ASCII without spaces: safe to echo in a header and to write in a log line.
_ACCEPTABLE = re.compile(rb"[\x21-\x7e]{1,%d}" % MAX_LENGTH)

_current: ContextVar[str | None] = ContextVar("request_id", default=None)


def current_request_id() -> str | None:
    """The id of the request being served by this task, if any."""
    return _current.get()


def accept_or_generate(value: bytes | None) -> str:
    """The caller's id when it is 1..128 printable ASCII characters, else a new one."""
    if value is not None and _ACCEPTABLE.fullmatch(value):
        return value.decode("ascii")
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Outermost middleware: fix the request id before anything else runs and echo it back."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = None
        for name, value in scope.get("headers", ()):
            if name == HEADER:
                sent = value
                break
        request_id = accept_or_generate(sent)
        scope.setdefault("state", {})["request_id"] = request_id
        token = _current.set(request_id)
        raw = request_id.encode("ascii")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != HEADER]
                headers.append((HEADER, raw))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _current.reset(token)
