"""Files served safely, and Range parsed in linear time (issue 19), on both backends.

- ``Range`` is parsed without backtracking: a 1 MB header in-process in under 10 ms, a header at
  the server's limit over HTTP answered at once while ``/healthz`` is answered meanwhile, and
  numbers of thousands of digits answered as any position past the file (never a 500).
- Every answer carries ``X-Content-Type-Options: nosniff`` (errors, health, metrics, the server's
  own 431 too); downloads carry ``Content-Security-Policy: default-src 'none'; sandbox``; types a
  browser would run (HTML, SVG, XHTML, XML, JavaScript, unknown) are attachments unless
  ``files.inline_types`` names them.
- Keyless mode refuses writes from a web page of another origin (403), unless
  ``auth.allowed_origins`` names it; clients sending no ``Origin`` and the gateway's own pages pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from app.core.errors import RangeNotSatisfiable
from app.files.ranges import ByteRange, parse_range
from tests.conftest import Server, start_server, stop_server

MB = 1_000_000
HUGE = "9" * 5000


def url(namespace: str, collection: str, file_id: str) -> str:
    return f"/v1/{namespace}/files/{collection}/{quote(file_id, safe='')}"


# --- the parser, in-process -----------------------------------------------------------------


_TIMING = """
import json, sys, time
from app.core.errors import RangeNotSatisfiable
from app.files.ranges import parse_range
MB = 1_000_000
cases = {
    "spaces-x": "bytes=0-" + " " * MB + "x",  # the issue's probe: quadratic with the old pattern
    "leading-spaces": "bytes=" + " " * MB + "0-1",
    "long-end": "bytes=0-" + "1" * MB,
    "zeros": "bytes=" + "0" * MB + "-",
    "dashes": "bytes=" + "-" * MB,
    "many-ranges": "bytes=" + "0-1," * (MB // 4),
    "padded": " " * MB + "bytes=0-1" + " " * MB,
    "unicode-digits": "bytes=0-" + "\u0663" * MB,
}
best = {}
for name, header in cases.items():
    times = []
    for _ in range(7):
        start = time.perf_counter()
        try:
            parse_range(header, 1000)
        except RangeNotSatisfiable:
            pass
        times.append(time.perf_counter() - start)
    best[name] = min(times)
print(json.dumps(best))
"""


def test_a_1mb_range_header_parses_in_under_10ms() -> None:
    """Timed in a child process, so that a backtracking parser fails the test instead of hanging it."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        done = subprocess.run([sys.executable, "-c", _TIMING], capture_output=True, text=True, timeout=60,
                              env=env, cwd=root, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("parsing 1 MB Range headers took more than 60 s")
    assert done.returncode == 0, done.stderr
    best = json.loads(done.stdout)
    slow = {name: f"{t * 1000:.1f} ms" for name, t in best.items() if t >= 0.010}
    assert not slow, slow


def test_range_numbers_are_bounded() -> None:
    size = 1000
    assert parse_range(f"bytes=0-{HUGE}", size) == ByteRange(0, size - 1)  # end past the file: clamped
    assert parse_range(f"bytes=-{HUGE}", size) == ByteRange(0, size - 1)  # suffix longer than the file
    assert parse_range(f"bytes={'0' * 5000}5-9", size) == ByteRange(5, 9)  # leading zeros are not size
    assert parse_range("bytes=0-9223372036854775807", size) == ByteRange(0, size - 1)
    assert parse_range("bytes=0-99999999999999999999", size) == ByteRange(0, size - 1)  # 20 digits
    for header in (f"bytes={HUGE}-", f"bytes={HUGE}-{HUGE}", "bytes=99999999999999999999-"):
        with pytest.raises(RangeNotSatisfiable) as caught:
            parse_range(header, size)
        assert caught.value.headers == {"Content-Range": f"bytes */{size}"}
    # Not digits (Unicode digits included), several ranges, other units: ignored (200).
    for header in ("bytes=²-3", "bytes=0-٣", "bytes=0-1,2-3", "bytes=0-" + " " * 100 + "x",
                   f"bytes={HUGE}-5", "bytes=--1", "bytes=1-2-3", "items=0-1", "bytes", "bytes=-"):
        assert parse_range(header, size) is None, header[:40]
    # What the old parser accepted still means the same.
    assert parse_range(" bytes = 10 - 20 ", size) == ByteRange(10, 20)
    assert parse_range("BYTES=10-", size) == ByteRange(10, size - 1)
    assert parse_range("bytes=\t-5", size) == ByteRange(size - 5, size - 1)


# --- over HTTP ------------------------------------------------------------------------------


async def _range_while_healthz(server: Server, path: str, header: str, auth: dict[str, str]) -> None:
    """GET ``path`` with ``header`` as Range while /healthz is asked every 10 ms: both prompt."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=auth) as client:
        await client.get("/healthz")  # warm connections
        done = asyncio.Event()
        health_waits: list[float] = []

        async def ask_healthz() -> None:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as other:
                while not done.is_set():
                    start = time.perf_counter()
                    assert (await other.get("/healthz")).status_code == 200
                    health_waits.append(time.perf_counter() - start)
                    await asyncio.sleep(0.01)

        task = asyncio.create_task(ask_healthz())
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        r = await client.get(path, headers={"Range": header})
        elapsed = time.perf_counter() - start
        await asyncio.sleep(0.05)
        done.set()
        await task
    assert r.status_code == 200 and r.content == b"0123456789", r.text[:300]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert elapsed < 1.0, f"the ranged GET took {elapsed:.2f} s"
    assert health_waits and max(health_waits) < 0.5, f"/healthz waited {max(health_waits):.2f} s"


async def test_a_range_header_at_the_limit_is_answered_at_once(
    server: Server, http: httpx.AsyncClient, namespace: str, auth_headers: dict[str, str]
) -> None:
    r = await http.put(url(namespace, "r", "f"), content=b"0123456789")
    assert r.status_code in (200, 201), r.text
    # 32 KiB head (the default limits.max_header_bytes): the rest of the head is ~300 bytes.
    header = "bytes=0-" + " " * (32 * 1024 - 1024) + "x"
    await _range_while_healthz(server, url(namespace, "r", "f"), header, auth_headers)


async def test_range_numbers_of_5000_digits_are_not_a_500(http: httpx.AsyncClient, namespace: str) -> None:
    u = url(namespace, "r", "f")
    assert (await http.put(u, content=b"0123456789")).status_code in (200, 201)
    r = await http.get(u, headers={"Range": f"bytes={HUGE}-"})
    assert r.status_code == 416 and r.headers["content-range"] == "bytes */10", r.text
    assert r.headers["content-type"] == "application/problem+json"
    for header in (f"bytes=0-{HUGE}", f"bytes=-{HUGE}"):
        r = await http.get(u, headers={"Range": header})
        assert r.status_code == 206 and r.content == b"0123456789", r.text
        assert r.headers["content-range"] == "bytes 0-9/10"
    r = await http.get(u, headers={"Range": f"bytes={HUGE}-5"})
    assert r.status_code == 200 and r.content == b"0123456789"


# --- headers of every answer and of downloads -------------------------------------------------

ATTACHMENT_TYPES = [
    "text/html", "text/html; charset=utf-8", "image/svg+xml", "application/xhtml+xml",
    "application/javascript", "text/javascript", "text/xml", "application/xml", "application/pdf",
    "application/x-unknown-thing", "TEXT/HTML",
]
INLINE_TYPES = [
    "text/plain", "text/plain; charset=utf-8", "application/json", "application/octet-stream",
    "image/png", "image/jpeg", "audio/ogg", "video/mp4",
]


async def test_types_a_browser_would_run_are_attachments(http: httpx.AsyncClient, namespace: str) -> None:
    body = b"<html><script>alert(document.domain)</script></html>"
    for i, content_type in enumerate(ATTACHMENT_TYPES + INLINE_TYPES):
        u = url(namespace, "t", f"f{i}")
        r = await http.put(u, content=body, headers={"Content-Type": content_type})
        assert r.status_code in (200, 201), r.text
        for method in ("GET", "HEAD"):
            r = await http.request(method, u)
            assert r.status_code == 200, (method, content_type)
            assert r.headers["content-type"] == content_type
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["content-security-policy"] == "default-src 'none'; sandbox"
            disposition = r.headers.get("content-disposition")
            expected = "attachment" if content_type in ATTACHMENT_TYPES else None
            assert disposition == expected, (method, content_type, disposition)
        r = await http.get(u, headers={"Range": "bytes=0-5"})
        assert r.status_code == 206 and r.headers["content-security-policy"] == "default-src 'none'; sandbox"
        assert r.headers.get("content-disposition") == ("attachment" if content_type in ATTACHMENT_TYPES else None)
    # A multipart upload declares its type too: the same rule.
    r = await http.post(f"/v1/{namespace}/files/t", files={"file": ("x.svg", b"<svg/>", "image/svg+xml")},
                        data={"file_id": "m.svg"})
    assert r.status_code in (200, 201), r.text
    r = await http.get(url(namespace, "t", "m.svg"))
    assert r.headers["content-disposition"] == "attachment" and r.headers["x-content-type-options"] == "nosniff"


async def test_every_answer_says_nosniff(server: Server, http: httpx.AsyncClient, namespace: str) -> None:
    answers = [
        await http.get("/healthz"),
        await http.get("/readyz"),
        await http.get("/metrics"),
        await http.get("/openapi.json"),
        await http.get("/docs"),
        await http.get("/nowhere"),  # 404 outside /v1
        await http.get(f"/v1/{namespace}/kv/c/missing"),  # 404 problem
        await http.put(f"/v1/{namespace}/kv/c/k", content=b"{not json"),  # 422
        await http.request("PATCH", f"/v1/{namespace}/kv/c/k"),  # 405
        await http.put(f"/v1/{namespace}/kv/c/k", json={"a": 1}),  # 200
        await http.delete(f"/v1/{namespace}/kv/c/k"),  # 204
        await http.get(f"/v1/{namespace}/files/c/missing"),
    ]
    async with httpx.AsyncClient(base_url=server.url) as anon:
        answers.append(await anon.get(f"/v1/{namespace}/kv/c/k"))  # 401
    for r in answers:
        assert r.headers.get("x-content-type-options") == "nosniff", (r.request.method, r.request.url, r.status_code)
        assert r.headers.get_list("x-content-type-options") == ["nosniff"]
    statuses = {r.status_code for r in answers}
    assert {200, 204, 401, 404, 405, 422} <= statuses
    # The server's own answers, before the app (a head too large: 431).
    r = await http.get("/healthz", headers={"X-Big": "x" * (64 * 1024)})
    assert r.status_code == 431 and r.headers["x-content-type-options"] == "nosniff"


# --- keyless mode: no writes from other origins ------------------------------------------------

ALLOWED = "https://app.example"


@pytest.fixture
def keyless(server: Server, tmp_path: Path, namespace: str) -> Iterator[Server]:
    """A keyless gateway on the test server's (migrated) databases, with an allowed origin,
    text/html served inline (and SVG too in one namespace), and room for a 1 MB Range header."""
    srv = start_server(
        server.backend, tmp_path / "keyless.log",
        GATEWAY_AUTH__MODE="disabled",
        GATEWAY_AUTH__ALLOWED_ORIGINS=json.dumps([ALLOWED.upper() + "/"]),
        GATEWAY_FILES__INLINE_TYPES=json.dumps(["text/html"]),
        GATEWAY_FILES__INLINE_TYPES_BY_NAMESPACE=json.dumps({namespace + "site": ["image/svg+xml"]}),
        GATEWAY_LIMITS__MAX_HEADER_BYTES=str(1024 * 1024),
    )
    yield srv
    stop_server(srv)


async def test_keyless_mode_refuses_writes_from_other_origins(keyless: Server, namespace: str) -> None:
    host = keyless.url.removeprefix("http://")
    port = host.rpartition(":")[2]
    kv = f"/v1/{namespace}/kv/c/k"
    async with httpx.AsyncClient(base_url=keyless.url, timeout=30) as client:
        assert (await client.put(kv, json="before")).is_success  # no Origin: not a browser
        refused = ["https://evil.example", "null", f"http://localhost:{port}", f"https://{host}",
                   f"http://{host}.evil.example", "http://127.0.0.1", f"http://127.0.0.1:{int(port) + 1}",
                   "garbage", ""]
        for origin in refused:
            for method, path, kwargs in [
                ("PUT", kv, {"json": "planted"}),
                ("DELETE", kv, {}),
                ("POST", f"/v1/{namespace}/files/c", {"files": {"file": ("p.html", b"<script>", "text/html")}}),
                ("POST", f"/v1/{namespace}/records/c/trim", {"json": {"before": "z"}}),
            ]:
                r = await client.request(method, path, headers={"Origin": origin}, **kwargs)
                assert r.status_code == 403, (origin, method, path, r.status_code, r.text)
                assert r.headers["content-type"] == "application/problem+json"
                assert r.json()["code"] == "forbidden"
        # Nothing changed; reads from anywhere still work (the browser keeps them from the page).
        r = await client.get(kv, headers={"Origin": "https://evil.example"})
        assert r.status_code == 200 and r.json() == "before"
        assert (await client.get(f"/v1/{namespace}/files/c")).json()["items"] == []
        # The gateway's own pages (/docs), with or without the default port, and the allowed origin.
        for i, origin in enumerate([keyless.url, keyless.url.upper(), ALLOWED, ALLOWED.upper()]):
            r = await client.put(kv, json=i, headers={"Origin": origin})
            assert r.is_success, (origin, r.text)
        r = await client.put(kv, json="x", headers={"Origin": "http://example.org", "Host": "example.org"})
        assert r.is_success
        r = await client.put(kv, json="x", headers={"Origin": "http://example.org", "Host": "example.org:80"})
        assert r.is_success
        r = await client.put(kv, json="x", headers={"Origin": "http://example.org:8080", "Host": "example.org:80"})
        assert r.status_code == 403


async def test_inline_types_setting_and_a_1mb_range_over_http(keyless: Server, namespace: str) -> None:
    async with httpx.AsyncClient(base_url=keyless.url, timeout=30) as client:
        for file_id, content_type in [("page", "text/html; charset=utf-8"), ("pic", "image/svg+xml")]:
            r = await client.put(url(namespace, "c", file_id), content=b"0123456789",
                                 headers={"Content-Type": content_type})
            assert r.status_code in (200, 201), r.text
        r = await client.get(url(namespace, "c", "page"))
        assert "content-disposition" not in r.headers  # files.inline_types names text/html
        assert r.headers["content-security-policy"] == "default-src 'none'; sandbox"
        r = await client.get(url(namespace, "c", "pic"))
        assert r.headers["content-disposition"] == "attachment"
        # files.inline_types_by_namespace: SVG inline in that one namespace, still sandboxed
        site = namespace + "site"
        r = await client.put(url(site, "c", "pic"), content=b"<svg/>", headers={"Content-Type": "image/svg+xml"})
        assert r.status_code in (200, 201), r.text
        for method in ("GET", "HEAD"):
            r = await client.request(method, url(site, "c", "pic"))
            assert "content-disposition" not in r.headers, method
            assert r.headers["content-security-policy"] == "default-src 'none'; sandbox"
    # limits.max_header_bytes is 1 MiB on this server: a 1 MB Range header goes through whole.
    await _range_while_healthz(keyless, url(namespace, "c", "page"), "bytes=0-" + " " * MB + "x", {})
