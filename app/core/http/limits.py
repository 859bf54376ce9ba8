"""Request bodies: what each route takes, read only after the caller is known, within limits.

Every route declares its body with ``@accepts(...)`` on its endpoint (``Body.JSON``, ``Body.VALUE``,
``Body.STREAM``); a route that declares nothing takes no body, and a route with a body model or a
writing method that declares nothing fails at start-up (``body_spec``). ``app.core.http.routing``
reads the declaration of the *matched* route, after authentication, and only then:

- ``NONE``: any body byte is a 413 (nothing is buffered).
- ``JSON`` / ``VALUE``: the whole body is read, at most ``limits.max_body_bytes`` (JSON) or
  ``limits.max_value_bytes`` plus ``VALUE_SLACK_BYTES`` (one stored value; the service checks the
  exact limit), and handed to the route complete: the route's database connection and locks are
  taken only after the last byte has arrived. A JSON body must also not hold more than
  ``limits.max_json_containers`` objects and arrays or ``limits.max_json_values`` values
  (``check_json_shape``), which bounds what parsing it costs.
- ``STREAM``: the route reads the body itself as it arrives (file uploads), counted against
  ``limits.max_file_bytes`` plus the declared overhead.
- ``ARCHIVE``: the same for a namespace archive (``POST /v1/{namespace}/import``), counted
  against ``MAX_ARCHIVE_BYTES`` (1 TiB); each of its members is bounded by the importer.

A declared ``Content-Length`` over the limit is refused before a byte is read. Every body is read
against two clocks (``BodyClock``): ``limits.body_idle_timeout_seconds`` without a byte, and a
deadline that starts at ``limits.body_timeout_seconds`` and grows by one second per
``limits.min_body_rate_bytes`` received (Apache's ``mod_reqtimeout`` rule), so a client sending a
byte a second is cut off however long it keeps trickling. Either is a 408 that closes the
connection. A body that is cut off mid-send frees what was read at once (nothing of it outlives
the read, and no exception is left holding it).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.types import Message, Receive, Scope

from app.core.config import LimitsSettings
from app.core.errors import PayloadTooLarge, RequestTimeout

VALUE_SLACK_BYTES = 64 * 1024  # whitespace around a value, which the exact check in the service allows
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH"})
_ATTRIBUTE = "__gateway_body__"

F = TypeVar("F", bound=Callable[..., Any])


class Body(enum.Enum):
    NONE = "none"
    JSON = "json"
    VALUE = "value"
    STREAM = "stream"
    ARCHIVE = "archive"  # a namespace archive (app.portability), streamed like STREAM, to MAX_ARCHIVE_BYTES


MAX_ARCHIVE_BYTES = 1 << 40


@dataclass(frozen=True)
class BodySpec:
    """What a route takes as its request body, and whether a POST only reads."""

    kind: Body = Body.NONE
    read_only: bool = False
    overhead: int = 0  # bytes allowed above a STREAM's file limit (multipart framing)

    def limit(self, limits: LimitsSettings) -> int:
        if self.kind is Body.JSON:
            return limits.max_body_bytes
        if self.kind is Body.VALUE:
            return limits.max_value_bytes + VALUE_SLACK_BYTES
        if self.kind is Body.STREAM:
            return limits.max_file_bytes + self.overhead
        if self.kind is Body.ARCHIVE:
            return MAX_ARCHIVE_BYTES
        return 0

    @property
    def buffered(self) -> bool:
        return self.kind in (Body.JSON, Body.VALUE)


NO_BODY = BodySpec()


def accepts(kind: Body, *, read_only: bool = False, overhead: int = 0) -> Callable[[F], F]:
    """Declare the request body of the route whose endpoint this decorates."""
    spec = BodySpec(kind, read_only, overhead)

    def mark(endpoint: F) -> F:
        setattr(endpoint, _ATTRIBUTE, spec)
        return endpoint

    return mark


def body_spec(endpoint: Callable[..., Any], methods: set[str], has_body_model: bool, path: str) -> BodySpec:
    """The endpoint's declared body; a route that obviously takes one but says nothing fails here."""
    spec: BodySpec | None = getattr(endpoint, _ATTRIBUTE, None)
    if spec is not None:
        return spec
    if has_body_model or methods & WRITE_METHODS:
        raise RuntimeError(
            f"{sorted(methods)} {path}: declare the request body with @accepts(Body.…) on {endpoint.__qualname__}"
        )
    return NO_BODY


def declared_length(scope: Scope) -> int | None:
    """``Content-Length`` (the server layer refused malformed or conflicting ones), or None."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value)
    return None


def has_body(scope: Scope) -> bool:
    """Whether the request announces a body (HTTP/1.1 needs Content-Length or chunking for one)."""
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return True
    return False


def too_large(spec: BodySpec, limit: int) -> PayloadTooLarge:
    if spec.kind is Body.NONE:
        return PayloadTooLarge("this route takes no request body")
    what = "value" if spec.kind is Body.VALUE else "request body"
    message = f"{what} exceeds the limit of {limit} bytes"
    errors = [{"loc": ["value"], "msg": message}] if spec.kind is Body.VALUE else None
    return PayloadTooLarge(message, errors=errors)


class BodyClock:
    """Times one request body: an idle timeout and a deadline that a minimum rate extends."""

    __slots__ = ("_idle", "_initial", "_rate", "_start", "done", "received")

    def __init__(self, limits: LimitsSettings) -> None:
        self._idle = limits.body_idle_timeout_seconds
        self._initial = limits.body_timeout_seconds
        self._rate = float(limits.min_body_rate_bytes)
        self._start: float | None = None
        self.received = 0
        self.done = False

    async def receive(self, receive: Receive) -> Message:
        if self.done:  # afterwards ``receive`` waits for the disconnect, as long as the answer takes
            return await receive()
        now = asyncio.get_running_loop().time()
        if self._start is None:
            self._start = now
        deadline = min(now + self._idle, self._start + self._initial + self.received / self._rate)
        try:
            async with asyncio.timeout_at(deadline):  # no task per read, unlike asyncio.wait_for
                message = await receive()
        except TimeoutError:
            raise RequestTimeout(
                "the request body arrived too slowly (a stall of "
                f"{self._idle:g} s, or under {self._rate:g} bytes a second after {self._initial:g} s)",
                headers={"Connection": "close"},
            ) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.done = True
        self.received += len(message.get("body", b""))
        return message


async def read_body(scope: Scope, receive: Receive, spec: BodySpec, limit: int, clock: BodyClock) -> bytes | None:
    """The whole body, at most ``limit`` bytes; None when the client went away before its end."""
    declared = declared_length(scope)
    if declared is not None and declared > limit:
        raise too_large(spec, limit)
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            message = await clock.receive(receive)
            if message["type"] != "http.request":
                return None
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                raise too_large(spec, limit)
            if body:
                chunks.append(body)
            if not message.get("more_body", False):
                return b"".join(chunks)
    finally:
        chunks.clear()  # a cut-off or refused body is freed now, whoever keeps this frame


def check_json_shape(body: bytes, limits: LimitsSettings) -> None:
    """413 before parsing when a JSON body would cost far more memory and CPU than its size.

    16 MiB of ``{},{},...`` is 5.6 million dicts (3 GB and 20 s of validation measured before this
    check). Objects and arrays are counted by their opening brackets and values by the commas
    between them; both are upper bounds (brackets and commas inside strings count too), taken
    with two ``bytes.count`` scans (a few ms for 16 MiB).
    """
    containers = body.count(b"{") + body.count(b"[")
    if containers > limits.max_json_containers:
        raise PayloadTooLarge(
            f"the JSON body has more than {limits.max_json_containers} objects and arrays "
            "(`limits.max_json_containers`)"
        )
    if body.count(b",") >= limits.max_json_values:
        raise PayloadTooLarge(
            f"the JSON body has more than {limits.max_json_values} values (`limits.max_json_values`)"
        )


def replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` that hands over ``body`` as one message, then waits as ``receive`` does."""
    pending: list[bytes] = [body]

    async def replayed() -> Message:
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        return await receive()

    return replayed


def streamed(receive: Receive, spec: BodySpec, limit: int, clock: BodyClock) -> Receive:
    """``receive`` for a route that reads its body as it arrives: timed, and counted to ``limit``."""

    async def counted() -> Message:
        message = await clock.receive(receive)
        if clock.received > limit:
            raise too_large(spec, limit)
        return message

    return counted
