"""How a download reads an S3 object: a plain GET of a presigned URL kept per key, falling back
to ``get_object``; and its row read in one statement outside a transaction (docs/benchmarks.md,
"files on S3": both were most of a 1 MiB download's cost in the gateway)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import create_async_engine

from app.core.config import Settings
from app.core.fast import fixed_statements as statements
from app.files.backend import backend_for
from app.files.s3 import ObjectMissing, S3Objects
from app.files.service import FilesService
from app.files.storage import ObjectReader
from tests.conftest import Backend
from tests.files_storage import bucket
from tests.test_files import url

on_s3 = pytest.mark.parametrize("backend", ["sqlite_s3", "postgres_s3"], indirect=True)


class Calls:
    """Counts the calls of one of the S3 client's methods (and still makes them)."""

    def __init__(self, objects: S3Objects, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
        client = objects._client
        real = getattr(client, name)
        self.count = 0

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(client, name, counted)


async def read(objects: S3Objects, key: str, start: int, end: int) -> bytes:
    body = await objects.get(key, start, end)
    try:
        return b"".join([piece async for piece in body.chunks()])
    finally:
        body.close()


@pytest.fixture
def key() -> Iterator[str]:
    yield f"get-tests/{uuid.uuid4().hex}"


@on_s3
async def test_downloads_of_one_object_share_one_presigned_url(
    backend: Backend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(300_000)
    async with bucket(backend) as objects:
        await objects.put(key, data)
        presigned = Calls(objects, "generate_presigned_url", monkeypatch)
        through_client = Calls(objects, "get_object", monkeypatch)
        assert await read(objects, key, 0, len(data) - 1) == data
        assert await read(objects, key, 10, 20) == data[10:21]
        assert await read(objects, key, len(data) - 5, len(data) - 1) == data[-5:]
        assert (presigned.count, through_client.count) == (1, 0)


@on_s3
async def test_a_url_that_stops_working_is_dropped_and_get_object_answers(
    backend: Backend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(70_000)
    async with bucket(backend) as objects:
        await objects.put(key, data)
        assert await read(objects, key, 0, 9) == data[:10]
        until, kept = objects._get_urls[key]
        # As an expired URL or rotated credentials would answer: 403.
        broken = kept.replace("X-Amz-Signature=", "X-Amz-Signature=0")
        objects._get_urls[key] = (until, broken)
        through_client = Calls(objects, "get_object", monkeypatch)
        assert await read(objects, key, 5, 69_999) == data[5:]
        assert through_client.count == 1
        assert objects._get_urls.get(key) is None  # forgotten: the next GET signs anew
        assert await read(objects, key, 0, 69_999) == data
        # (compared whole: a fresh signature may itself begin with "0", one time in 16)
        assert through_client.count == 1 and objects._get_urls[key][1] != broken


@on_s3
async def test_a_missing_object_is_object_missing(backend: Backend, key: str) -> None:
    async with bucket(backend) as objects:
        with pytest.raises(ObjectMissing):
            await objects.get(key, 0, 9)
        assert key not in objects._get_urls


@pytest.mark.parametrize("backend", ["postgres_s3"], indirect=True)
async def test_the_download_row_is_read_outside_a_transaction(
    backend: Backend, http: httpx.AsyncClient, namespace: str
) -> None:
    """One SELECT sent with asyncpg in autocommit (the driver path), nothing through SQLAlchemy:
    no BEGIN/ROLLBACK around it."""
    data = os.urandom(1000)
    assert (await http.put(url(namespace, "f", "row"), content=data)).status_code == 201
    engine = create_async_engine(backend.urls["metadata"])
    through_sqlalchemy: list[str] = []
    on_driver: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        through_sqlalchemy.append(statement)

    def observe(sql: str, arguments: Any) -> None:
        on_driver.append(sql)

    statements.observers.append(observe)
    try:
        async with bucket(backend) as objects:
            service = FilesService(engine, backend_for("postgresql"), Settings(), objects)
            reader = await service.open(namespace, "f", "row")
            await reader.close()
    finally:
        statements.observers.remove(observe)
        await engine.dispose()
    assert isinstance(reader, ObjectReader) and reader.row.size == len(data)
    assert through_sqlalchemy == [] and len(on_driver) == 1 and "FROM files" in on_driver[0]


@on_s3
async def test_downloads_from_the_bucket_take_a_bounded_share_of_its_connections(
    backend: Backend, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by attack: a GET from the bucket holds one of the download pool's connections while
    its client reads, and only downloads of database chunks were capped. About 100 slow readers
    of one namespace filled the pool (``files.s3.max_connections``), and every other namespace's
    download waited for a connection with no deadline. Now each takes a slot, 503 past the
    namespace's share or the pool's size, and gives it back when closed."""
    from app.core.errors import ServiceUnavailable
    from app.core.http.conditions import WriteConditions
    from app.files.ranges import whole
    from tests.test_files_limits import in_process_app

    app = in_process_app(backend, monkeypatch, GATEWAY_FILES__S3__MAX_CONNECTIONS="4",
                         GATEWAY_LIMITS__FILE_CHUNK_BYTES=str(64 * 1024))
    a, b, c = (f"slots{uuid.uuid4().hex[:8]}" for _ in range(3))
    data = os.urandom(256 * 1024)
    async with app.router.lifespan_context(app):
        service = app.state.gateway.services["files"]
        for ns in (a, b, c):
            async with service.new_blob(ns) as writer:
                await writer.write(data)
                await writer.commit(ns, "c", "f", "application/octet-stream", WriteConditions())
        held = []
        try:
            for _ in range(2):  # half of the 4 connections: namespace a's share
                reader = await service.open(a, "c", "f")
                assert isinstance(reader, ObjectReader)
                held.append(reader)
                await reader.start(whole(reader.row.size))
            with pytest.raises(ServiceUnavailable, match="this namespace"):
                await service.open(a, "c", "f")
            for _ in range(2):  # b takes the other two
                held.append(await service.open(b, "c", "f"))
            with pytest.raises(ServiceUnavailable, match="the server"):
                await service.open(c, "c", "f")  # within its share, but the pool is taken
            await held.pop(0).close()  # one of a's given back: a downloads again, whole
            reader = await service.open(a, "c", "f")
            try:
                await reader.start(whole(reader.row.size))
                assert b"".join([p async for p in reader.iter_bytes(whole(reader.row.size))]) == data
            finally:
                await reader.close()
        finally:
            for reader in held:
                await reader.close()
        assert service.blobs.bucket_downloads.held == 0
        # Every answer a download can end in gives its slot back.
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            path = f"/v1/{a}/files/c/f"
            etag = (await http.get(path)).headers["etag"]
            answers = [
                await http.head(path),
                await http.get(path, headers={"If-None-Match": etag}),
                await http.get(path, headers={"Range": "bytes=0-9"}),
                await http.get(path, headers={"Range": f"bytes={len(data)}-"}),
            ]
            assert [r.status_code for r in answers] == [200, 304, 206, 416]
            assert service.blobs.bucket_downloads.held == 0
