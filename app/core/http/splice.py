"""Moving a response body from one socket to another inside the kernel (Linux ``splice(2)``).

A download from S3 is a relay: every byte comes in on the S3 connection and goes out on the
client's. Through Python each byte is copied out of the kernel into a buffer and back in, and on
two cores that relay was the ceiling of S3 downloads (docs/benchmarks.md, "The relay ceiling":
0.55-0.72 of a direct download for a bare aiohttp relay under uvicorn). ``splice`` moves the
pages through a pipe without copying them to user space, as HAProxy's ``option splice-response``
does: a bare splice relay measured 0.77-0.84 of direct on the same machine and run.

``relay`` is the loop, on non-blocking sockets, waiting on the event loop for whichever side can
move. It owns neither socket: it waits on duplicates of their descriptors, because a transport
(uvicorn's, aiohttp's) is registered with the loop for the originals.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sys
import time
from collections.abc import Callable

EXTENSION = "storage_gateway.splice"  # scope["extensions"] key of a connection that can splice (app.core.http.server)
PIPE_BYTES = 1024 * 1024  # the pipe between the sockets (the unprivileged maximum by default)
_F_SETPIPE_SZ, _F_GETPIPE_SZ = 1031, 1032  # fcntl.F_SETPIPE_SZ / F_GETPIPE_SZ (Linux)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)

AVAILABLE = sys.platform == "linux" and hasattr(os, "splice")


class SourceEnded(Exception):
    """The source closed before ``count`` bytes came through."""


class SourceTimeout(Exception):
    """The source sent nothing for ``read_timeout`` seconds."""


class SinkStalled(Exception):
    """The sink took nothing for ``write_timeout`` seconds."""


class SinkClosed(ConnectionError):
    """The sink's connection is closing (the client left)."""


async def relay(
    source: int, sink: int, count: int, *, read_timeout: float, write_timeout: float,
    closing: Callable[[], bool] = lambda: False,
) -> None:
    """Move exactly ``count`` bytes from socket ``source`` to socket ``sink`` (both non-blocking).

    Raises ``SourceEnded`` (after passing on what came), ``SourceTimeout``, ``SinkStalled``,
    ``SinkClosed`` (``closing()`` said so) or the ``OSError`` of a failed socket (a reset client:
    ``BrokenPipeError`` and the like). The pipe is closed on return and on error.
    """
    loop = asyncio.get_running_loop()
    fds: list[int] = []
    try:
        out, into = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        fds += (out, into)
        try:
            fcntl.fcntl(into, _F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:  # a lowered /proc/sys/fs/pipe-max-size, or this user's pipes over their quota
            pass
        room = fcntl.fcntl(into, _F_GETPIPE_SZ)
        fds.append(watch_in := os.dup(source))
        fds.append(watch_out := os.dup(sink))
        await _move(loop, source, sink, out, into, watch_in, watch_out, count, room, read_timeout, write_timeout, closing)
    finally:
        for fd in fds:
            os.close(fd)


async def _move(
    loop: asyncio.AbstractEventLoop, source: int, sink: int, out: int, into: int, watch_in: int, watch_out: int,
    count: int, room: int, read_timeout: float, write_timeout: float, closing: Callable[[], bool],
) -> None:
    """``relay``'s loop. A pipe holds ``room`` bytes at most, and fewer when the data came in small
    packets (one page slot per packet): a read into it can stop short of ``room``. So the source
    is read until it has nothing or the pipe takes nothing more, and while the pipe holds bytes
    only the sink is waited for (waiting on a source that has data would wake at once: a spin)."""
    left, held, ended = count, 0, False
    read_at = wrote_at = time.monotonic()
    while (left and not ended) or held:
        if closing():
            raise SinkClosed("the client connection is closing")
        if left and held < room and not ended:
            try:
                moved = os.splice(source, into, min(left, room - held), flags=_FLAGS)
            except BlockingIOError:  # nothing to read, or the pipe is full
                moved = -1
            except OSError as exc:  # a reset source: the client's side is not at fault
                raise SourceEnded(f"the source failed ({exc.__class__.__name__}) {left} bytes short") from None
            if moved == 0:  # what came still goes out, then SourceEnded
                ended = True
                continue
            if moved > 0:
                read_at = time.monotonic()
                if not held:  # the sink's clock starts when it has something to take
                    wrote_at = read_at
                left, held = left - moved, held + moved
                continue  # fill the pipe first: fewer, larger writes
        if held:
            try:
                moved = os.splice(out, sink, held, flags=_FLAGS)
            except BlockingIOError:
                moved = 0
            if moved > 0:
                wrote_at = time.monotonic()
                held -= moved
                continue
            # The sink is full: wait for it alone (the source waits in its socket buffer).
            if not await _ready(loop, None, watch_out, wrote_at + write_timeout - time.monotonic()):
                raise SinkStalled(f"the sink took nothing for {write_timeout:g} s")
            continue
        # The pipe is empty and the source has nothing: wait for it, from the last progress.
        if not await _ready(loop, watch_in, None, max(read_at, wrote_at) + read_timeout - time.monotonic()):
            raise SourceTimeout(f"the source sent nothing for {read_timeout:g} s")
    if left:
        raise SourceEnded(f"the source ended {left} bytes short")


async def _ready(loop: asyncio.AbstractEventLoop, readable: int | None, writable: int | None, timeout: float) -> bool:
    """Whether ``readable`` can be read or ``writable`` written within ``timeout`` seconds."""
    if timeout <= 0:
        return False
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if readable is not None:
        loop.add_reader(readable, wake)
    if writable is not None:
        loop.add_writer(writable, wake)
    try:
        async with asyncio.timeout(timeout):
            await ready
        return True
    except TimeoutError:
        return False
    finally:
        if readable is not None:
            loop.remove_reader(readable)
        if writable is not None:
            loop.remove_writer(writable)
