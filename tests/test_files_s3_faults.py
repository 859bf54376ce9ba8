"""Files on S3 when the S3 server fails: stopped mid-upload, stopped mid-download, restarted.

A SeaweedFS of its own (the session's one keeps serving the other tests) and a gateway on it,
on both metadata databases. The gateway is never restarted: it must recover by itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from tests.conftest import Backend, Server, s3_env, start_server, stop_server
from tests.files_storage import wait_clean
from tests.s3server import SeaweedS3
from tests.test_files import sha, url

pytestmark = pytest.mark.parametrize("backend", ["sqlite_s3", "postgres_s3"], indirect=True)

MiB = 1024 * 1024
BUCKET = "gateway-faults"


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed-faults"))
    server.start()
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def fault_backend(backend: Backend, server: Server, faulty: SeaweedS3) -> Backend:
    """The test backend's (migrated) databases, with file bytes in the faulty bucket."""
    env = {**backend.env, **s3_env(faulty, BUCKET, f"faults-{uuid.uuid4().hex[:8]}/")}
    return replace(backend, env=env)


@pytest.fixture
def gateway(fault_backend: Backend, faulty: SeaweedS3, tmp_path: Path) -> Iterator[Server]:
    srv = start_server(
        fault_backend, tmp_path / "gateway.log",
        GATEWAY_FILES__S3__PART_BYTES=str(5 * MiB), GATEWAY_FILES__S3__CONNECT_TIMEOUT="1",
        GATEWAY_FILES__S3__READ_TIMEOUT="5", GATEWAY_FILES__UPLOAD_STALE_SECONDS="3",
        GATEWAY_FILES__SWEEP_INTERVAL_SECONDS="0.5",
    )
    try:
        yield srv
    finally:
        stop_server(srv)
        if faulty.process is None:  # leave it running for the next test
            faulty.start()


async def until_ok(http: httpx.AsyncClient, path: str, timeout: float = 30) -> httpx.Response:
    """GET ``path`` until it answers 200 (the gateway reconnecting to a restarted bucket)."""
    deadline = time.monotonic() + timeout
    while True:
        r = await http.get(path)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        assert r.status_code == 503, r.text
        await asyncio.sleep(0.2)


def assert_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "object_store_unavailable"
    assert int(r.headers["retry-after"]) > 0


async def test_stopped_mid_upload_then_restarted(
    gateway: Server, faulty: SeaweedS3, fault_backend: Backend, namespace: str, auth_headers: dict[str, str]
) -> None:
    old = os.urandom(MiB + 5)
    path = url(namespace, "f", "doc")
    async with httpx.AsyncClient(base_url=gateway.url, headers=auth_headers, timeout=60) as http:
        assert (await http.put(path, content=old)).status_code == 201

        async def body() -> AsyncIterator[bytes]:
            for i in range(15):  # 15 MiB in 5 MiB parts; the server dies after 12 MiB
                if i == 12:
                    await asyncio.to_thread(faulty.stop)
                yield os.urandom(MiB)
                await asyncio.sleep(0.02)

        assert_unavailable(await http.put(path, content=body()))
        # While the bucket is down: metadata answers, bytes are a 503, other capabilities serve.
        head = await http.head(path)
        assert head.status_code == 200 and head.headers["etag"] == f'"{sha(old)}"'
        assert_unavailable(await http.get(path))
        assert (await http.put(f"/v1/{namespace}/kv/c/k", json={"still": "here"})).status_code < 300
        ready = await http.get("/readyz")
        assert ready.status_code == 200
        files = ready.json()["storage"]["files"]
        assert files["backend"] == "s3" and files["reachable"] is False and files["location"] == BUCKET
        # Restarted: the same gateway process reads the old version, whole, and writes again.
        await asyncio.to_thread(faulty.start)
        r = await until_ok(http, path)
        assert r.status_code == 200 and r.content == old
        assert (await http.get("/readyz")).json()["storage"]["files"]["reachable"] is True
        new = os.urandom(6 * MiB)
        assert (await http.put(path, content=new)).status_code == 200
        assert (await http.get(path)).content == new
    # The aborted multipart upload and the replaced object are gone once the sweep has run.
    state = await wait_clean(fault_backend, timeout=30)
    assert state == {"orphans": 0, "uploads": 0, "unreferenced": 0}


async def test_stopped_mid_download_is_a_cut_off_never_corrupt(
    gateway: Server, faulty: SeaweedS3, namespace: str, auth_headers: dict[str, str]
) -> None:
    data = os.urandom(64 * MiB)
    path = url(namespace, "f", "big")
    async with httpx.AsyncClient(base_url=gateway.url, headers=auth_headers, timeout=60) as http:
        assert (await http.put(path, content=data)).status_code == 201
        got = bytearray()
        with pytest.raises(httpx.TransportError):
            async with http.stream("GET", path) as r:
                assert r.status_code == 200 and r.headers["content-length"] == str(len(data))
                async for piece in r.aiter_raw():
                    got += piece
                    if len(got) >= MiB and faulty.process is not None:
                        await asyncio.to_thread(faulty.stop)
        assert MiB <= len(got) < len(data)
        assert bytes(got) == data[: len(got)]  # a prefix of the file: cut off, never a mix
        await asyncio.to_thread(faulty.start)
        r = await until_ok(http, path)
        assert hashlib.sha256(r.content).hexdigest() == sha(data)
        ranged = await http.get(path, headers={"Range": "bytes=10-20"})
        assert ranged.status_code == 206 and ranged.content == data[10:21]


async def test_presigned_redirect(
    fault_backend: Backend, faulty: SeaweedS3, tmp_path: Path, namespace: str, auth_headers: dict[str, str]
) -> None:
    srv = start_server(fault_backend, tmp_path / "presign.log", GATEWAY_FILES__S3__PRESIGN_DOWNLOADS="true",
                       GATEWAY_FILES__S3__PRESIGN_SECONDS="60")
    try:
        data = os.urandom(3 * MiB + 7)
        path = url(namespace, "f", "p.bin")
        async with httpx.AsyncClient(base_url=srv.url, headers=auth_headers, timeout=60) as http:
            r = await http.put(path, content=data, headers={"Content-Type": "image/png"})
            assert r.status_code == 201
            etag = r.headers["etag"]
            r = await http.get(path)
            assert r.status_code == 307 and r.headers["etag"] == etag
            location = r.headers["location"]
            assert location.startswith(faulty.endpoint) and "X-Amz-Signature" in location
            # 304 and 404 stay with the gateway; the bucket serves the bytes (and Range) itself.
            assert (await http.get(path, headers={"If-None-Match": etag})).status_code == 304
            assert (await http.get(url(namespace, "f", "missing"))).status_code == 404
        async with httpx.AsyncClient(timeout=60) as bare:
            whole = await bare.get(location)
            assert whole.status_code == 200 and whole.content == data
            assert whole.headers["content-type"] == "image/png"
            part = await bare.get(location, headers={"Range": "bytes=5-9"})
            assert part.status_code == 206 and part.content == data[5:10]
    finally:
        stop_server(srv)
