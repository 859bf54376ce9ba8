"""Worker processes that each accept from a listening socket of their own (``SO_REUSEPORT``).

uvicorn's supervisor hands every worker the same listening socket. Whichever worker's event loop
wakes first accepts every connection then waiting, so a burst of keep-alive connections (a load
generator, a plugin's connection pool) lands on one worker while the others idle: in
``bench_peers.py`` with two workers at concurrency 16, one worker spent 5.35 and 5.81 s of CPU
while the other spent 1.41 and 0.04 s (``docs/benchmarks.md``), so one core did the work of two.

Here the parent binds one socket per worker, every one with ``SO_REUSEPORT`` on the same address,
and each worker serves only its own: the kernel spreads new connections over the sockets by a
hash of their addresses. The parent keeps every socket open and never accepts on one, so the
connections that arrive while a worker is being replaced wait in its socket's queue for the
replacement instead of being refused.

- Before binding, the address is bound once without ``SO_REUSEPORT``: if anything listens there
  already (another gateway started with the same port would otherwise join the group and take a
  share of the connections), start-up fails as uvicorn's does.
- A worker that dies is started again on its socket (logged with its exit code); a worker that
  fails its start-up (uvicorn's exit code 3) stops them all, as uvicorn's supervisor does, since
  every restart would fail the same way.
- SIGTERM or SIGINT: the parent closes its copies of the sockets (once the workers close theirs,
  new connections are refused), passes SIGTERM on, and waits for each worker's graceful shutdown
  (``timeout_graceful_shutdown`` and a margin, then SIGKILL). Exit 0 after a stop asked for.

Only public uvicorn API: ``Config`` (pickled to each worker, as uvicorn does), ``Config.configure_logging``
and ``Server.run(sockets=...)``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from multiprocessing.connection import wait
from multiprocessing.context import SpawnProcess
from types import FrameType

import uvicorn
from uvicorn.config import STARTUP_FAILURE as STARTUP_FAILURE  # its exit code: failed before serving

log = logging.getLogger("app")


STOP_MARGIN_SECONDS = 5.0
"""How much longer than the graceful timeout a worker gets before it is killed."""

RESTART_PAUSE_SECONDS = 1.0
"""The pause before starting again a worker that died within ``QUICK_DEATH_SECONDS`` of its start
(a worker that cannot stay up is not restarted in a tight loop)."""

QUICK_DEATH_SECONDS = 10.0

_spawn = multiprocessing.get_context("spawn")


def bind_sockets(host: str, port: int, count: int, backlog: int) -> list[socket.socket]:
    """``count`` listening sockets on ``host:port`` sharing it with ``SO_REUSEPORT`` (port 0: a
    free one, the same for all). ``OSError`` when something listens there already."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:  # fails if the address is taken
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        port = probe.getsockname()[1]
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sock.listen(backlog)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def exit_cleanly(signum: int, frame: FrameType | None) -> None:
    """A signal handler: exit 0 (a stop that was asked for is a success)."""
    raise SystemExit(0)


def _worker(config: uvicorn.Config, sock: socket.socket) -> None:
    """A worker process: uvicorn's server on its own socket. SIGTERM or SIGINT: its graceful
    shutdown, after which uvicorn raises the signal again, here an exit 0."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, exit_cleanly)
    config.configure_logging()
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)


class Workers:
    """``config.workers`` uvicorn servers, each on its own socket of ``sockets`` (see the module)."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket]) -> None:
        self.config = config
        self.sockets = sockets
        self.processes: list[SpawnProcess] = []  # one per socket, once ``run`` starts them
        self.started: list[float] = []  # when each was started (monotonic)
        self.stopping = threading.Event()
        self.failed = False

    def _start(self, index: int) -> SpawnProcess:
        """A new worker on socket ``index``, started."""
        process = _spawn.Process(target=_worker, args=(self.config, self.sockets[index]), name=f"worker-{index}")
        process.start()
        return process

    def _stop_asked(self, signum: int, frame: FrameType | None) -> None:
        log.info("received %s: stopping the workers", signal.Signals(signum).name)
        self.stopping.set()

    def run(self) -> int:
        """Serve until stopped; the exit code (0, or ``STARTUP_FAILURE`` if a worker could not start)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop_asked)
        self.processes = [self._start(index) for index in range(len(self.sockets))]
        self.started = [time.monotonic()] * len(self.sockets)
        log.info("started %d workers, one listening socket each", len(self.sockets), extra={"pid": os.getpid()})
        while not self.stopping.is_set():
            wait([p.sentinel for p in self.processes], timeout=0.5)
            for index, process in enumerate(self.processes):
                if process.is_alive() or self.stopping.is_set():
                    continue
                process.join()
                if process.exitcode == STARTUP_FAILURE:
                    log.error("worker %d (pid %s) failed to start: stopping", index, process.pid)
                    self.failed = True
                    self.stopping.set()
                    break
                log.error("worker %d (pid %s) exited with code %s: starting it again", index, process.pid, process.exitcode)
                if time.monotonic() - self.started[index] < QUICK_DEATH_SECONDS and self.stopping.wait(RESTART_PAUSE_SECONDS):
                    break
                self.processes[index] = self._start(index)
                self.started[index] = time.monotonic()
        self._stop_all()
        return STARTUP_FAILURE if self.failed else 0

    def _stop_all(self) -> None:
        for sock in self.sockets:  # the workers' copies close as they shut down
            sock.close()
        running = [p for p in self.processes if p.is_alive()]
        for process in running:
            process.terminate()  # SIGTERM: its graceful shutdown
        grace = float(self.config.timeout_graceful_shutdown or 0) + STOP_MARGIN_SECONDS
        deadline = time.monotonic() + grace
        for process in running:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.error("worker (pid %s) still running %.0f s after SIGTERM: killed", process.pid, grace)
                process.kill()
                process.join()
