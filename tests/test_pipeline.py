"""The request pipeline under attack, on both backends, against real gateway processes.

Nothing is read before the caller is known and the matched route's limit applies; cut-off bodies
are freed; idle sockets neither count against the connection limit nor stay open; slow bodies are
cut off; one namespace's slow writers hold no connection or lock that another namespace needs;
header floods and malformed requests are refused in problem+json by the connection layer.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_KEY, Backend, Server, start_server, stop_server

MiB = 1024 * 1024
PROBLEM = "application/problem+json"


def rss_bytes(server: Server) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def address(server: Server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def exchange(server: Server, head: bytes, body: Iterator[bytes] = iter(()), timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` and then ``body`` (from a thread, so an early answer is read while sending);
    return the answer's status, headers and body."""
    sock = socket.create_connection(address(server), timeout=timeout)

    def send() -> None:
        try:
            sock.sendall(head)
            for piece in body:
                sock.sendall(piece)
        except OSError:
            pass  # the server answered and closed: the answer is what counts

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
        head_part, _, rest = data.partition(b"\r\n\r\n")
        lines = head_part.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            piece = sock.recv(65536)
            if not piece:
                break
            rest += piece
        return status, headers, rest[:length]
    finally:
        sock.close()
        sender.join(timeout=timeout)


def chunked(total: int, piece: int = MiB) -> Iterator[bytes]:
    sent = 0
    block = b" " * piece
    while sent < total:
        size = min(piece, total - sent)
        yield f"{size:x}\r\n".encode() + block[:size] + b"\r\n"
        sent += size
    yield b"0\r\n\r\n"


def request_head(method: str, path: str, key: str | None, extra: str = "Transfer-Encoding: chunked\r\n") -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return f"{method} {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n{auth}{extra}\r\n".encode()


# Routes whose namespace, collection, key or id spell another route's word, plain and percent-encoded.
CONFUSING = [
    ("PUT", "/v1/files/kv/c/k"),
    ("PUT", "/v1/{ns}/kv/files/x"),
    ("PUT", "/v1/{ns}/kv/c/files/x"),
    ("PUT", "/v1/{ns}/kv/c/%2Ffiles%2Fx"),
    ("PUT", "/v1/{ns}/kv/points/search"),
    ("PUT", "/v1/{ns}/records/files/trim"),
    ("PUT", "/v1/{ns}/records/c/%2Ffiles%2F"),
    ("POST", "/v1/{ns}/records/files/trim"),
    ("POST", "/v1/{ns}/records/search"),
    ("POST", "/v1/{ns}/vectors/files/points"),
    ("POST", "/v1/{ns}/vectors/points/search"),
    ("POST", "/v1/{ns}/vectors/list/points/list"),
    ("POST", "/v1/{ns}/vectors/reset/points/delete"),
    ("PATCH", "/v1/{ns}/vectors/files/points/files/y"),
    ("PATCH", "/v1/{ns}/vectors/v/points/%2Ffiles%2F"),
    ("PUT", "/v1/{ns}/vectors/%66iles"),
    ("POST", "/v1/{ns}/vectors/delete/reset"),
]


@pytest.fixture(scope="module")
def fresh_server(backend: Backend, server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway of its own for memory measurements (no other test's allocations in its RSS)."""
    srv = start_server(backend, tmp_path_factory.mktemp("fresh") / "log")
    yield srv
    stop_server(srv)


def test_over_limit_bodies_are_refused_before_they_are_buffered(fresh_server: Server, namespace: str) -> None:
    """Without a key: 401 before a byte of the body is read. With one: 413 at the route's limit
    (16 MiB of JSON, one value for kv and record PUTs). The gateway's memory barely moves."""
    server = fresh_server
    before = rss_bytes(server)
    for method, template in CONFUSING:
        path = template.format(ns=namespace)
        status, headers, body = exchange(server, request_head(method, path, None), chunked(48 * MiB))
        assert status == 401 and headers["content-type"] == PROBLEM, (path, status, body[:200])
        status, headers, body = exchange(server, request_head(method, path, ADMIN_KEY), chunked(24 * MiB))
        assert status == 413 and headers["content-type"] == PROBLEM, (path, status, body[:200])
        assert json.loads(body)["code"] == "payload_too_large"
    grown = rss_bytes(server) - before
    assert grown < 32 * MiB, f"RSS grew {grown / MiB:.1f} MiB"
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        assert client.get(f"/v1/{namespace}/kv/files").json()["items"] == []
        assert client.get(f"/v1/{namespace}/records/files").json()["items"] == []


def test_cut_off_bodies_are_freed(fresh_server: Server, namespace: str) -> None:
    """20 bodies that stop halfway (JSON under its limit, and 100 MB file uploads) leave the
    gateway's memory where it was after the first of each (which warms the database's caches)."""
    server = fresh_server

    def cut_off(head: bytes, pieces: Iterator[bytes]) -> None:
        with socket.create_connection(address(server), timeout=30) as sock:
            sock.sendall(head)
            for piece in pieces:
                sock.sendall(piece)
            time.sleep(0.2)  # the server has it all; now the client goes away

    def first(n: int, pieces: Iterator[bytes]) -> Iterator[bytes]:
        for _, piece in zip(range(n), pieces, strict=False):
            yield piece

    before = 0
    for i in range(11):
        if i == 1:
            time.sleep(0.5)
            before = rss_bytes(server)
        json_route = f"/v1/{namespace}/records/c{i}" if i % 2 else f"/v1/{namespace}/vectors/files/points"
        cut_off(request_head("POST", json_route, ADMIN_KEY), first(12, chunked(100 * MiB)))
        cut_off(
            request_head("PUT", f"/v1/{namespace}/files/c/f{i}", ADMIN_KEY, f"Content-Length: {100 * MiB}\r\n"),
            iter([b"x" * MiB] * 12),
        )
    time.sleep(1)
    grown = rss_bytes(server) - before
    assert grown < 32 * MiB, f"RSS grew {grown / MiB:.1f} MiB"
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        assert client.get(f"/v1/{namespace}/files/c").json()["items"] == []


def test_idle_sockets_do_not_stop_real_requests(server: Server, namespace: str) -> None:
    """1,000 connections that never send a byte: a real request still gets its answer at once."""
    idle = [socket.create_connection(address(server), timeout=10) for _ in range(1000)]
    try:
        time.sleep(0.5)
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
            started = time.monotonic()
            assert client.get("/healthz").status_code == 200
            assert client.put(f"/v1/{namespace}/kv/c/k", json=1).status_code == 204
            assert time.monotonic() - started < 1.0
    finally:
        for sock in idle:
            sock.close()


@pytest.fixture(scope="module")
def strict_server(backend: Backend, server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway on the same databases with short deadlines for heads and bodies."""
    log = tmp_path_factory.mktemp("strict") / "log"
    srv = start_server(
        backend, log,
        GATEWAY_LIMITS__BODY_TIMEOUT_SECONDS="2", GATEWAY_LIMITS__HEADER_TIMEOUT_SECONDS="2",
        GATEWAY_LIMITS__MIN_BODY_RATE_BYTES="500", GATEWAY_LIMITS__SEND_IDLE_TIMEOUT_SECONDS="2",
        GATEWAY_FILES__MAX_DOWNLOADS="4", GATEWAY_FILES__MAX_DOWNLOADS_PER_NAMESPACE="2",
        # Chunks larger than the sockets' buffers, so a one-chunk download can be stuck too.
        GATEWAY_LIMITS__FILE_CHUNK_BYTES=str(16 * MiB),
    )
    yield srv
    stop_server(srv)


def trickle(server: Server, head: bytes, body: bool) -> tuple[float, bytes]:
    """Send ``head`` (and then a body) one byte a second; return when the server answers or closes."""
    sock = socket.create_connection(address(server), timeout=30)
    started = time.monotonic()
    answer = b""
    try:
        if body:
            sock.sendall(head)
            data = b"x" * 10_000
        else:
            data = head
        sock.settimeout(1.0)
        for byte in data:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            try:
                piece = sock.recv(65536)
                if not piece:
                    break
                answer += piece
                if b"\r\n\r\n" in answer:
                    break
            except TimeoutError:
                pass
            if time.monotonic() - started > 20:
                break
    finally:
        sock.close()
    return time.monotonic() - started, answer


def test_a_body_sent_a_byte_a_second_is_cut_off(strict_server: Server, namespace: str) -> None:
    elapsed, answer = trickle(
        strict_server, request_head("PUT", f"/v1/{namespace}/files/c/slow", ADMIN_KEY, "Content-Length: 10000\r\n"),
        body=True,
    )
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert PROBLEM.encode() in answer
    assert 1.5 < elapsed < 5, elapsed  # body_timeout_seconds=2, plus 1 s per 500 bytes received
    with httpx.Client(base_url=strict_server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        assert client.get(f"/v1/{namespace}/files/c/slow").status_code == 404


def test_a_head_sent_a_byte_a_second_is_cut_off(strict_server: Server, namespace: str) -> None:
    head = request_head("GET", f"/v1/{namespace}/kv/c/k", ADMIN_KEY, "X-Padding: " + "p" * 100 + "\r\n")
    elapsed, answer = trickle(strict_server, head, body=False)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert PROBLEM.encode() in answer
    assert elapsed < 5, elapsed  # header_timeout_seconds=2


def test_one_namespaces_slow_writers_do_not_fail_another_namespace(server: Server, namespace: str) -> None:
    """64 writers of one namespace sending their bodies a byte a second hold no connection and no
    lock: another namespace's reads and writes go on, for longer than the pool timeout."""
    slow_ns = f"{namespace}slow"
    slow = []
    # (collections named like another route: such paths once escaped the body limits)
    paths = [("PUT", f"/v1/{slow_ns}/kv/files/k{i}") for i in range(32)]
    paths += [("PUT", f"/v1/{slow_ns}/records/files/k{i}") for i in range(16)]
    paths += [("POST", f"/v1/{slow_ns}/vectors/files{i}/points") for i in range(16)]
    for method, path in paths:
        sock = socket.create_connection(address(server), timeout=10)
        sock.sendall(request_head(method, path, ADMIN_KEY, "Content-Length: 1000\r\n") + b"[")
        slow.append(sock)
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(1.0):
            for sock in slow:
                try:
                    sock.sendall(b" ")
                except OSError:
                    pass

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    worst = 0.0
    try:
        with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
            deadline = time.monotonic() + 7  # past the 5 s pool and lock timeouts
            i = 0
            while time.monotonic() < deadline:
                started = time.monotonic()
                assert client.put(f"/v1/{namespace}/kv/c/k{i}", json=i).status_code == 204
                assert client.get(f"/v1/{namespace}/kv/c/k{i}").json() == i
                assert client.put(f"/v1/{namespace}/records/c/{i:08d}", json={"i": i}).status_code == 204
                assert client.get(f"/v1/{namespace}/records/c").status_code == 200
                worst = max(worst, time.monotonic() - started)
                i += 1
        assert worst < 2.0, worst
    finally:
        stop.set()
        dripper.join()
        for sock in slow:
            sock.close()


HEADS = [
    pytest.param("".join(f"X-H{i}: v\r\n" for i in range(10_000)), 431, id="10000-headers"),
    pytest.param("".join(f"X-H{i}: v\r\n" for i in range(101)), 431, id="101-headers"),
    pytest.param("X-Big: " + "b" * (8 * MiB) + "\r\n", 431, id="8MB-header"),
    pytest.param("".join(f"X-H{i}: {'v' * 1000}\r\n" for i in range(40)), 431, id="40KB-of-headers"),
    pytest.param("".join(f"X-H{i}: {'v' * 200}\r\n" for i in range(90)), 200, id="90-headers-18KB-fine"),
    pytest.param("X-Nul: a\x00b\r\n", 400, id="nul-in-header"),
    pytest.param("X-Cr: a\rb\r\n", 400, id="cr-in-header"),
    pytest.param("Content-Length: 1\r\nContent-Length: 2\r\n", 400, id="duplicate-content-length"),
    pytest.param("Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", 400, id="length-and-chunked"),
    # found by attack: httptools decodes chunked alone, so a gzip-coded upload was stored still gzipped
    pytest.param("Transfer-Encoding: gzip, chunked\r\n", 501, id="gzip-chunked"),
    pytest.param("Transfer-Encoding: identity\r\n", 501, id="identity"),
]


@pytest.mark.parametrize(("headers", "status"), HEADS)
def test_header_floods_and_malformed_heads_are_refused_in_problem_json(server: Server, headers: str, status: int) -> None:
    head = f"GET /healthz HTTP/1.1\r\nHost: gw\r\n{headers}\r\n".encode("latin-1")
    got, answer_headers, body = exchange(server, b"", iter([head[i:i + 65536] for i in range(0, len(head), 65536)]))
    assert got == status, body[:200]
    if status >= 400:
        assert answer_headers["content-type"] == PROBLEM
        assert json.loads(body)["status"] == status


@pytest.mark.parametrize(("line", "status"), [
    ("GET /healthz", 400), ("GET /healthz HTTP/0.9", 400), ("GET /healthz HTTP/2.0", 505), ("GET /healthz HTTP/1.0", 200),
])
def test_a_request_line_of_another_http_version_is_refused(server: Server, line: str, status: int) -> None:
    """Found by attack (issue 44): a request line without a version (HTTP/0.9) was answered as HTTP/1.1."""
    got, headers, body = exchange(server, f"{line}\r\nHost: gw\r\n\r\n".encode())
    assert got == status, body[:200]
    if status >= 400:
        assert headers["content-type"] == PROBLEM and json.loads(body)["status"] == status


def test_a_request_then_a_half_close_is_answered(server: Server, namespace: str) -> None:
    """Found by attack (issue 44): a complete request followed by the client shutting its sending
    side (``shutdown(SHUT_WR)``, as some clients and proxies do) was stored and never answered
    (asyncio closed the connection at the end of the input). Now the answer comes, then the close."""
    records = json.dumps({"records": [{"key": "a", "value": 1}]}).encode()
    sent = [
        ("PUT", f"/v1/{namespace}/kv/c/k", b'"v"', 204),
        ("POST", f"/v1/{namespace}/records/c", records, 200),
        ("POST", f"/v1/{namespace}/checkpoints/put",
         b'{"thread_id":"t","checkpoint_id":"c1","checkpoint":{"type":"bytes","data":"AA=="}}', 200),
    ]
    for method, path, body, status in sent * 3:
        head = request_head(method, path, ADMIN_KEY, f"Content-Length: {len(body)}\r\n")
        with socket.create_connection(address(server), timeout=10) as sock:
            sock.sendall(head + body + head + body)  # two, pipelined: both answered
            sock.shutdown(socket.SHUT_WR)
            answer = read_to_end(sock)  # the server closes once both are out
        assert answer.count(f"HTTP/1.1 {status} ".encode()) == 2, (method, path, answer[:300])


def stuck_download(server: Server, path: str) -> socket.socket:
    """A download whose client reads its head and then stops reading."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address(server))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {ADMIN_KEY}\r\n\r\n".encode())
    assert sock.recv(12).startswith(b"HTTP/1.1 200")
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    """Everything ``sock`` receives until the server closes (or resets) the connection."""
    sock.settimeout(10)
    got = bytearray()
    try:
        while piece := sock.recv(1 << 20):
            got += piece
    except ConnectionResetError:
        pass
    return bytes(got)


def test_stuck_downloads_are_capped_and_cut_off(strict_server: Server, namespace: str) -> None:
    """Downloads hold a connection while their client reads: per namespace and per process only a
    share of the pool may do so (503 + Retry-After past it, before a connection is taken), and a
    client that stops reading is cut off after limits.send_idle_timeout_seconds."""
    other = f"{namespace}b"
    blob = b"z" * (32 * MiB)
    with httpx.Client(base_url=strict_server.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        for ns in (namespace, other):
            assert client.put(f"/v1/{ns}/files/c/big", content=blob).status_code in (200, 201)
        stuck = [stuck_download(strict_server, f"/v1/{namespace}/files/c/big") for _ in range(2)]
        try:
            r = client.get(f"/v1/{namespace}/files/c/big")
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.headers["content-type"] == PROBLEM
            assert client.get(f"/v1/{other}/files/c/big").content == blob  # another namespace still downloads
            assert client.put(f"/v1/{namespace}/kv/c/k", json=1).status_code == 204  # and other routes run
            time.sleep(4)  # past send_idle_timeout_seconds=2: the stuck readers were cut off
            assert client.get(f"/v1/{namespace}/files/c/big").content == blob
        finally:
            for sock in stuck:
                sock.close()


def test_stuck_downloads_of_one_chunk_files_hold_no_slot(strict_server: Server, namespace: str) -> None:
    """A file of one chunk (1 MiB by default) is read whole with its row, so its download holds
    neither a connection nor a download slot while the client reads: more stuck readers than
    the namespace's slots do not turn the next download into a 503."""
    blob = bytes(range(256)) * 4096 * 16  # exactly one chunk of the strict server's 16 MiB
    with httpx.Client(base_url=strict_server.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        assert client.put(f"/v1/{namespace}/files/c/one", content=blob).status_code in (200, 201)
        stuck = [stuck_download(strict_server, f"/v1/{namespace}/files/c/one") for _ in range(5)]
        try:
            r = client.get(f"/v1/{namespace}/files/c/one")
            assert r.status_code == 200 and r.content == blob
            time.sleep(4)  # past send_idle_timeout_seconds=2: each stuck answer was cut off
            for sock in stuck:
                assert len(read_to_end(sock)) < len(blob)  # what was sent before the cut, not all
        finally:
            for sock in stuck:
                sock.close()


AMPLIFIERS = [
    pytest.param(b'{"points": [' + b"{}," * (5 * MiB) + b"{}]}", 413, id="5M-empty-objects"),
    pytest.param(b'{"points": [{"vector": [' + b'"a",' * (3 * MiB) + b"1]}]}", 413, id="3M-values"),
    pytest.param(b'{"points": [{"vector": [' + b'"a",' * 1_900_000 + b"1]}]}", 422, id="1.9M-bad-numbers"),
    pytest.param(b'{"points": [' + b"[" * 90_000 + b"]" * 90_000 + b"]}", 422, id="90k-deep"),  # past the parser's 200 levels
]


@pytest.mark.parametrize(("body", "status"), AMPLIFIERS)
def test_json_bodies_that_would_cost_far_more_than_their_size_are_refused_quickly(
    fresh_server: Server, namespace: str, body: bytes, status: int
) -> None:
    """Under 16 MiB, but millions of objects or values: refused before parsing (413), or stopped
    at the first element past a hard ceiling (422), in well under a second and a few MiB."""
    with httpx.Client(base_url=fresh_server.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        assert client.put(f"/v1/{namespace}/vectors/v", json={"vector_size": 3, "distance": "cosine"}).is_success
        before = rss_bytes(fresh_server)
        started = time.monotonic()
        r = client.post(f"/v1/{namespace}/vectors/v/points", content=body, headers={"Content-Type": "application/json"})
        elapsed = time.monotonic() - started
    assert r.status_code == status and r.headers["content-type"] == PROBLEM, r.text[:300]
    assert elapsed < 2.0, elapsed
    assert rss_bytes(fresh_server) - before < 64 * MiB
