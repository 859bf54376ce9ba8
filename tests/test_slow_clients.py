"""Slow or stalled clients cannot hold a request open: a body that stops arriving is a 408."""

from __future__ import annotations

import socket
import time
import httpx
import pytest

from tests.conftest import ADMIN_KEY, Backend, Server, start_server, stop_server


@pytest.fixture(scope="module")
def impatient_server(backend: Backend, server: Server, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A second gateway on the same (already migrated) databases with a 1 s body idle timeout."""
    log = tmp_path_factory.mktemp("impatient") / "log"
    srv = start_server(backend, log, GATEWAY_LIMITS__BODY_IDLE_TIMEOUT_SECONDS="1")
    yield srv
    stop_server(srv)


def stalled_request(url: str, method: str, path: str, headers: dict[str, str], first_bytes: bytes) -> tuple[float, bytes]:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        started = time.monotonic()
        sock.sendall(head.encode() + first_bytes)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
        return time.monotonic() - started, answer


@pytest.mark.parametrize(
    ("method", "path", "headers", "first_bytes"),
    [
        ("PUT", "/v1/{ns}/kv/c/k", {"Content-Type": "application/json", "Content-Length": "100"}, b'{"a": '),
        ("POST", "/v1/{ns}/records/c", {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}, b"5\r\n{\"rec"),
        ("PUT", "/v1/{ns}/files/c/f", {"Content-Type": "text/plain", "Content-Length": "1000000"}, b"x" * 1000),
    ],
)
def test_stalled_body_is_answered_408(impatient_server: Server, namespace: str, method: str, path: str,
                                      headers: dict[str, str], first_bytes: bytes) -> None:
    elapsed, answer = stalled_request(impatient_server.url, method, path.format(ns=namespace), headers, first_bytes)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert elapsed < 10
    with httpx.Client(base_url=impatient_server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        assert client.get(f"/v1/{namespace}/kv/c/k").status_code == 404
        assert client.get(f"/v1/{namespace}/records/c").json()["items"] == []
        assert client.get(f"/v1/{namespace}/files/c/f").status_code == 404


def test_connections_beyond_the_limit_are_refused_not_queued(backend: Backend, server: Server,
                                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    """Clients holding connections open cannot starve the process: past the limit, 503."""
    log = tmp_path_factory.mktemp("limited") / "log"
    srv = start_server(backend, log, GATEWAY_LIMITS__MAX_CONNECTIONS="3")
    host, port = srv.url.removeprefix("http://").split(":")
    held = []
    try:
        for _ in range(3):  # requests in progress that never finish their body
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(b"PUT /v1/x/kv/c/k HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
                         b"Authorization: Bearer " + ADMIN_KEY.encode() + b"\r\n\r\n{")
            held.append(sock)
        time.sleep(0.5)
        r = httpx.get(f"{srv.url}/healthz", timeout=10)
        assert r.status_code == 503
        assert r.headers["content-type"] == "application/problem+json" and r.headers["retry-after"] == "1"
        assert r.json()["code"] == "too_many_connections"
    finally:
        for sock in held:
            sock.close()
        stop_server(srv)
