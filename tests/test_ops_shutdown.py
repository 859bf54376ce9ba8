"""Graceful shutdown: on SIGTERM the gateway stops accepting, finishes what is in flight, exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_KEY, Backend, Server, start_server


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


async def slow_put(port: int, path: str, body: bytes, pieces: int, started: asyncio.Event,
                   release: asyncio.Event) -> tuple[int, dict[str, str]]:
    """A kv PUT whose body arrives slowly: one piece, then the rest only after ``release``.

    ``started`` is set only once the gateway has answered ``100 Continue``: a worker has accepted
    the connection and the app is reading the body. (Set when the client had merely written, the
    connection could still wait in the listening socket's backlog on a loaded machine, and
    closing that socket on SIGTERM resets it: a request no server had taken, not one in flight.)
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"PUT {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nX-Request-ID: slow-put\r\n"
        "Expect: 100-continue\r\n\r\n"
    )
    writer.write(head.encode())
    await writer.drain()
    assert await asyncio.wait_for(reader.readline(), 10) == b"HTTP/1.1 100 Continue\r\n"
    assert await asyncio.wait_for(reader.readline(), 10) == b"\r\n"
    step = len(body) // pieces
    writer.write(body[:step])
    await writer.drain()
    started.set()
    await release.wait()
    for i in range(step, len(body), step):
        writer.write(body[i:i + step])
        await writer.drain()
        await asyncio.sleep(0.05)
    status_line = await reader.readline()
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    writer.close()
    return int(status_line.split()[1]), headers


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_finishes_in_flight_requests_refuses_new_ones_and_exits_0(
    backend: Backend, server: Server, auth_headers: dict[str, str], tmp_path: Path, workers: int
) -> None:
    # `server` makes sure the backend's databases are migrated; this test runs its own gateway.
    port_server = await asyncio.to_thread(
        start_server, backend, tmp_path / "gateway.log", "--workers", str(workers),
        GATEWAY_SHUTDOWN_GRACE_SECONDS="20",
    )
    port = httpx.URL(port_server.url).port
    ns = f"sigterm{uuid.uuid4().hex[:8]}"
    value = {"payload": "x" * 200_000}
    body = json.dumps(value).encode()
    started, release = asyncio.Event(), asyncio.Event()
    put = asyncio.create_task(slow_put(port, f"/v1/{ns}/kv/c/slow", body, 20, started, release))
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.sleep(0.3)  # the app is reading the body: the request is in flight
    port_server.process.send_signal(signal.SIGTERM)
    # The listening sockets close at once (with several workers, the parent's copies and each
    # worker's): new connections are refused while the old one finishes.
    deadline = time.monotonic() + 5
    while not await asyncio.to_thread(refuses_connections, port):
        assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
        await asyncio.sleep(0.1)
    assert port_server.process.poll() is None, "exited before the in-flight request finished"
    release.set()
    status, headers = await asyncio.wait_for(put, 30)
    assert status in (200, 201, 204)
    assert headers["x-request-id"] == "slow-put"
    code = await asyncio.to_thread(port_server.process.wait, 30)
    log = port_server.log()
    assert code == 0, log[-3000:]
    assert "Application shutdown complete" in log  # the lifespan ran to its end: engines disposed
    # What the slow request wrote is there for the next process.
    async with httpx.AsyncClient(base_url=server.url, headers=auth_headers) as c:
        r = await c.get(f"/v1/{ns}/kv/c/slow")
        assert r.status_code == 200 and r.json() == value
