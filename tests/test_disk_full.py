"""A full disk (issue 19): writes are 507 ``insufficient_storage``, deletes free space, /readyz says so.

The SQLite gateway runs on a real small filesystem: a tmpfs mounted in a private mount namespace
(``unshare --mount``, with ``--map-root-user`` when not root), so nothing outside sees it. It is
filled through the API until a write is refused; then acknowledged data must be intact, reads
served, writes refused up front, deletes and trims must work and give the space back, and the
gateway must accept writes again (and survive a second fill the same way, its reserve restored).

PostgreSQL's disk-full SQLSTATE (53100) is mapped the same way: checked through the real app and
the real asyncpg error class (a PostgreSQL server cannot be given a small disk without root).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_KEY, Backend, Server, start_server, stop_server

SIZE_MB = 64
PIECE = 1024 * 1024


def _wrapper(mount_point: Path) -> tuple[str, ...]:
    unshare = shutil.which("unshare")
    assert unshare, "util-linux unshare is needed to mount a small tmpfs"
    user = () if os.geteuid() == 0 else ("--map-root-user",)
    script = f'mount -t tmpfs -o size={SIZE_MB}m tmpfs "$0" && exec "$@"'
    return (unshare, "--mount", *user, "--", "sh", "-c", script, str(mount_point))


@pytest.fixture
def small_disk_server(tmp_path: Path) -> Iterator[Server]:
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    backend = Backend("sqlite", {"GATEWAY_DATA_DIR": str(mount_point)})
    server = start_server(backend, tmp_path / "gateway.log", wrapper=_wrapper(mount_point))
    yield server
    stop_server(server)


def _problem(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text)
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == code, r.text


def _fill(client: httpx.Client, ns: str, start: int) -> tuple[int, dict[str, str]]:
    """Upload 1 MiB files until one is refused; (index of the refused one, sha256 by stored id)."""
    stored: dict[str, str] = {}
    for i in range(start, start + 4 * SIZE_MB):
        data = os.urandom(PIECE)
        r = client.put(f"/v1/{ns}/files/c/f{i}", content=data)
        if r.status_code == 507:
            _problem(r, 507, "insufficient_storage")
            return i, stored
        assert r.status_code in (200, 201), r.text
        stored[f"f{i}"] = hashlib.sha256(data).hexdigest()
    raise AssertionError(f"{4 * SIZE_MB} MiB fit on a {SIZE_MB} MiB disk")


def _wait_ready(client: httpx.Client, within: float) -> httpx.Response:
    deadline = time.monotonic() + within
    while True:
        r = client.get("/readyz")
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def test_a_full_disk_is_507_deletes_free_space_and_readyz_says_so(small_disk_server: Server) -> None:
    ns = "full"
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=small_disk_server.url, timeout=60, headers=auth) as client:
        r = client.post(f"/v1/{ns}/records/log", json={"records": [{"key": f"{i:04}", "value": i} for i in range(50)]})
        assert r.status_code == 200, r.text
        assert client.put(f"/v1/{ns}/vectors/v", json={"vector_size": 2}).is_success
        assert client.post(f"/v1/{ns}/vectors/v/points", json={"points": [{"id": "p", "vector": [1, 0]}]}).is_success
        checkpoint = {"thread_id": "t", "checkpoint_id": "c1", "checkpoint": {"type": "bytes", "data": "AA=="}}
        assert client.post(f"/v1/{ns}/checkpoints/put", json=checkpoint).is_success
        refused, stored = _fill(client, ns, 0)
        assert len(stored) >= 10, f"only {len(stored)} MiB stored before the disk was full"

        # Not ready, with the reason; writes refused up front, reads served, nothing lost.
        r = client.get("/readyz")
        assert r.status_code == 503 and r.json()["ready"] is False
        assert "full" in r.json()["reason"], r.text
        _problem(client.put(f"/v1/{ns}/kv/c/k", json="x" * 1000), 507, "insufficient_storage")
        _problem(client.post(f"/v1/{ns}/records/log", json={"records": [{"key": "z", "value": 1}]}),
                 507, "insufficient_storage")
        _problem(client.put(f"/v1/{ns}/files/c/f{refused}", content=b"small"), 507, "insufficient_storage")
        for file_id, digest in stored.items():
            r = client.get(f"/v1/{ns}/files/c/{file_id}")
            assert r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == digest, file_id
        assert client.get(f"/v1/{ns}/files/c/f{refused}").status_code == 404  # the refused one left nothing
        # Reads sent as POST are served too (issue 44: they were 507 "writes are refused").
        r = client.post(f"/v1/{ns}/vectors/v/search", json={"vector": [1, 0], "limit": 1})
        assert r.status_code == 200 and [h["id"] for h in r.json()["results"]] == ["p"], r.text
        r = client.post(f"/v1/{ns}/vectors/v/points/list", json={})
        assert r.status_code == 200 and [p["id"] for p in r.json()["items"]] == ["p"], r.text
        r = client.post(f"/v1/{ns}/checkpoints/search", json={"thread_id": "t"})
        assert r.status_code == 200 and [c["checkpoint_id"] for c in r.json()["items"]] == ["c1"], r.text

        # Deletes and trims work and give the space back.
        r = client.post(f"/v1/{ns}/records/log/trim", json={"before": "0040"})
        assert r.status_code == 200 and r.json() == {"deleted": 40}, r.text
        keep = sorted(stored)[:2]
        for file_id in sorted(stored)[2:]:
            r = client.delete(f"/v1/{ns}/files/c/{file_id}")
            assert r.status_code == 204, (file_id, r.status_code, r.text)
        assert client.delete(f"/v1/{ns}/kv/c/never-written").status_code == 204

        # Ready again within a few seconds, and writes accepted.
        r = _wait_ready(client, within=15)
        assert r.status_code == 200 and r.json()["reason"] is None, r.text
        assert client.put(f"/v1/{ns}/kv/c/k", json="back").is_success
        for file_id in keep:
            r = client.get(f"/v1/{ns}/files/c/{file_id}")
            assert hashlib.sha256(r.content).hexdigest() == stored[file_id]

        # A second fill behaves the same (the reserve was written again): 507, then deletes work.
        _, stored_again = _fill(client, ns, 1000)
        assert len(stored_again) >= 10, f"only {len(stored_again)} MiB fit after the space came back"
        assert client.get("/readyz").status_code == 503
        for file_id in stored_again:
            assert client.delete(f"/v1/{ns}/files/c/{file_id}").status_code == 204, file_id
        r = _wait_ready(client, within=15)
        assert r.status_code == 200, r.text
        assert client.get(f"/v1/{ns}/records/log").json()["items"][0]["key"] == "0040"
    log = small_disk_server.log()
    assert "Traceback" not in log, log[-3000:]


def test_postgres_disk_full_sqlstate_is_507() -> None:
    """53100 from asyncpg, as SQLAlchemy's asyncpg dialect raises it, answers 507 (not 503)."""
    import asyncio

    import asyncpg
    from fastapi import FastAPI
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_dbapi

    from app.core.errors import disk_full_kind, install_error_handlers

    orig = asyncpg.exceptions.DiskFullError("could not extend file: No space left on device")
    assert orig.sqlstate == "53100"
    dbapi = AsyncAdapt_asyncpg_dbapi(asyncpg)
    adapted = dbapi.OperationalError(f"<class 'asyncpg.exceptions.DiskFullError'>: {orig}")
    adapted.sqlstate = orig.sqlstate
    error = sa_exc.OperationalError("INSERT ...", {}, adapted)
    assert disk_full_kind(error) == "postgresql"

    app = FastAPI()
    install_error_handlers(app)

    @app.put("/boom")
    async def boom() -> None:
        raise error

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.put("/boom")

    r = asyncio.run(call())
    _problem(r, 507, "insufficient_storage")
    assert "retry-after" not in r.headers


def test_the_reserve_goes_only_beside_sqlite_files(tmp_path: Path) -> None:
    """PostgreSQL databases get no reserve file (their URL's database name is not a path)."""
    from app.core.config import Database, Settings
    from app.core.db.databases import Databases
    from app.core.db.diskspace import DiskSpace

    pg = "postgresql+asyncpg://gw@127.0.0.1/gw_metadata"
    settings = Settings.model_validate({"data_dir": tmp_path, "databases": {"metadata": {"url": pg}}})
    space = DiskSpace(Databases(settings))
    assert space.directories == {tmp_path.resolve(): [Database.vectors, Database.checkpoints]}
