"""Several workers (``storage-gateway serve --workers N``): each accepts from a socket of its own.

Under uvicorn's supervisor every worker accepted from one shared socket, and a burst of
keep-alive connections landed on whichever woke first (32 of 32, 30 of 32, 32 of 32 in three
tries). Here: a burst is spread over both workers, a worker that dies is replaced on its socket
while the connections meant for it wait, and a second gateway cannot join the port.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import BIN, Backend, Server, gateway_env, start_server, stop_server

pytestmark = pytest.mark.sqlite_only  # the process model is the same on both backends

CONNECTIONS = 32


def workers_of(server: Server) -> list[psutil.Process]:
    """The gateway's live worker processes (not multiprocessing's resource tracker)."""
    workers = []
    for child in psutil.Process(server.process.pid).children():
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                workers.append(child)
        except psutil.NoSuchProcess:  # (a worker just killed: a zombie until it is reaped)
            pass
    return workers


def connections_per_worker(server: Server) -> dict[int, int]:
    port = httpx.URL(server.url).port
    return {
        worker.pid: sum(1 for c in worker.net_connections("tcp") if c.status == "ESTABLISHED" and c.laddr.port == port)
        for worker in workers_of(server)
    }


def listening_sockets(worker: psutil.Process, port: int) -> set[str]:
    """The listening sockets on ``port`` that ``worker`` holds, by kernel identity (inode)."""
    return {
        os.readlink(f"/proc/{worker.pid}/fd/{c.fd}")
        for c in worker.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port
    }


async def burst(url: str, count: int) -> list[int]:
    """``count`` keep-alive connections opened at once, one request each; their statuses."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(limits=limits, timeout=30) as http:
        answers = await asyncio.gather(*(http.get(f"{url}/healthz") for _ in range(count)))
        return [a.status_code for a in answers]


@pytest.fixture
def two_workers(server: Server, backend: Backend, tmp_path: Path) -> Iterator[Server]:
    # `server` has migrated the backend's databases; this gateway has two workers of its own.
    gateway = start_server(backend, tmp_path / "gateway.log", "--workers", "2")
    yield gateway
    stop_server(gateway)


async def test_a_burst_of_connections_is_spread_over_the_workers(two_workers: Server) -> None:
    port = httpx.URL(two_workers.url).port
    first, second = (listening_sockets(w, port) for w in workers_of(two_workers))
    assert len(first) == len(second) == 1 and first != second  # a socket each, not one shared
    counts: dict[int, int] = {}

    async def opened_and_counted() -> None:
        limits = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
        async with httpx.AsyncClient(limits=limits, timeout=30) as http:
            answers = await asyncio.gather(*(http.get(f"{two_workers.url}/healthz") for _ in range(CONNECTIONS)))
            assert [a.status_code for a in answers] == [200] * CONNECTIONS
            counts.update(await asyncio.to_thread(connections_per_worker, two_workers))

    await opened_and_counted()
    assert len(counts) == 2 and sum(counts.values()) == CONNECTIONS, counts
    # The kernel hashes each connection's addresses to a socket: an even split is not promised,
    # but one worker holding (almost) all of them is what a shared socket did.
    assert min(counts.values()) >= 4, counts


async def test_a_worker_that_dies_is_replaced_and_connections_meant_for_it_wait(two_workers: Server) -> None:
    victim, survivor = workers_of(two_workers)
    victim.kill()  # SIGKILL: no shutdown of its own
    # New connections start at once: those the kernel gives the dead worker's socket wait in its
    # queue (the parent keeps it open) until the replacement accepts them.
    started = time.monotonic()
    statuses = await asyncio.gather(*(burst(two_workers.url, 1) for _ in range(CONNECTIONS)))
    assert [s for (s,) in statuses] == [200] * CONNECTIONS
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 30  # (if no connection went to its socket, the replacement may still be starting)
    while True:
        pids = {w.pid for w in workers_of(two_workers)}
        if len(pids) == 2 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert survivor.pid in pids and victim.pid not in pids and len(pids) == 2
    assert f"(pid {victim.pid}) exited with code -9: starting it again" in two_workers.log()
    assert await burst(two_workers.url, CONNECTIONS) == [200] * CONNECTIONS  # both serve again


def test_a_second_gateway_cannot_join_the_port(two_workers: Server, backend: Backend) -> None:
    port = str(httpx.URL(two_workers.url).port)
    second = subprocess.run(
        [str(BIN / "storage-gateway"), "serve", "--workers", "2", "--port", port],
        env=gateway_env(backend), capture_output=True, text=True, timeout=60,
    )
    assert second.returncode == 2, second.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in second.stderr
    assert httpx.get(f"{two_workers.url}/healthz").status_code == 200  # the first one is untouched


def test_sigterm_stops_every_worker_and_exits_0(server: Server, backend: Backend, tmp_path: Path) -> None:
    gateway = start_server(backend, tmp_path / "gateway.log", "--workers", "2")
    workers = workers_of(gateway)
    gateway.process.send_signal(signal.SIGTERM)
    assert gateway.process.wait(timeout=60) == 0, gateway.log()[-3000:]
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    assert gateway.log().count("Application shutdown complete") == 2  # each worker's lifespan ended
    port = httpx.URL(gateway.url).port
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
