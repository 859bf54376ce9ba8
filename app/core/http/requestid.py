"""Request ids: taken from ``X-Request-ID`` when it is sane, generated otherwise, echoed on every answer
(with ``X-Content-Type-Options: nosniff``, which every answer carries too).

A pure ASGI middleware (no ``BaseHTTPMiddleware``: that buffers streams and costs a task per
request). The id is kept in ``scope["state"]`` (so ``request.state.request_id`` works, which the
problem renderer reads) and in a context variable (so every log line of the request carries it).
"""

from __future__ import annotations

import itertools
import os
import re
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
# Sent on every answer with the id: no browser may guess a type other than the one declared
# (a stored file or an error must never be sniffed into HTML or script).
NOSNIFF = (b"x-content-type-options", b"nosniff")
MAX_LENGTH = 128
# Printable ASCII without spaces: safe to echo in a header and to write in a log line.
_ACCEPTABLE = re.compile(rb"[\x21-\x7e]{1,%d}" % MAX_LENGTH)

_OURS = (HEADER, NOSNIFF[0])

_current: ContextVar[str | None] = ContextVar("request_id", default=None)

# Generated ids: 64 random bits per process, then a counter (32 hex characters in all, like a
# uuid4's hex). Unique across processes and restarts without a system call per request.
_PROCESS_PREFIX = os.urandom(8).hex()
_sequence = itertools.count(1)


def _new_process_prefix() -> None:
    global _PROCESS_PREFIX, _sequence
    _PROCESS_PREFIX, _sequence = os.urandom(8).hex(), itertools.count(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_process_prefix)  # a forked worker must not repeat ids


def current_request_id() -> str | None:
    """The id of the request being served by this task, if any."""
    return _current.get()


def accept_or_generate(value: bytes | None) -> str:
    """The caller's id when it is 1..128 printable ASCII characters, else a new one."""
    if value is not None and _ACCEPTABLE.fullmatch(value):
        return value.decode("ascii")
    return f"{_PROCESS_PREFIX}{next(_sequence):016x}"


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
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in _OURS]
                headers += ((HEADER, raw), NOSNIFF)
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _current.reset(token)
