"""Files with non-default settings, each on its own gateway process: the size limit (413), a
chunk size other than the default, and chunks of an upload cut off by a crash being swept."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from storage_gateway_client import GatewayClient, InvalidRequest
from tests.conftest import FILE_BACKENDS, Backend, Server, start_server, stop_server
from tests.files_storage import storage_state, wait_clean
from tests.test_files import sha, url

pytestmark = pytest.mark.parametrize("backend", FILE_BACKENDS, indirect=True)

LIMIT = 300_000
SMALL_CHUNK = 65_536


def keyed(api_key: str | None) -> dict[str, str]:
    """The fixtures' key for a gateway started here (``tests.conftest`` imported again has its own)."""
    return {"GATEWAY_AUTH__ADMIN_KEY": api_key} if api_key else {}


@pytest.fixture
def small_server(server: Server, backend: Backend, tmp_path: Path, api_key: str | None) -> Iterator[Server]:
    """A second gateway on the same (migrated) databases with a small file limit and chunks."""
    srv = start_server(
        backend, tmp_path / "small.log", **keyed(api_key),
        GATEWAY_LIMITS__MAX_FILE_BYTES=str(LIMIT), GATEWAY_LIMITS__FILE_CHUNK_BYTES=str(SMALL_CHUNK),
    )
    yield srv
    stop_server(srv)


async def test_size_limit_is_413_and_changes_nothing(
    small_server: Server, backend: Backend, namespace: str, api_key: str | None,
    auth_headers: dict[str, str], client_transport: str,
) -> None:
    old = os.urandom(LIMIT)  # exactly the limit is allowed
    async with GatewayClient(small_server.url, namespace, api_key, transport=client_transport) as gw, \
            httpx.AsyncClient(base_url=small_server.url, headers=auth_headers, timeout=30) as http:
        assert (await gw.files.save_file("lim", "f", old)).size == LIMIT
        # Declared too large: refused before the body is read.
        r = await http.put(url(namespace, "lim", "f"), content=os.urandom(LIMIT + 1))
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large"

        # Streamed (chunked, no length) past the limit: 413 as soon as it passes.
        async def endless() -> AsyncIterator[bytes]:
            for _ in range(8):
                yield os.urandom(50_000)

        r = await http.put(url(namespace, "lim", "f"), content=endless())
        assert r.status_code == 413
        with pytest.raises(InvalidRequest) as err:
            await gw.files.upload("lim", "f", endless())
        assert err.value.status_code == 413
        # A multipart form whose file is too large.
        r = await http.post(url(namespace, "lim"), files={"file": ("x", os.urandom(LIMIT + 10))},
                            data={"file_id": "f"})
        assert r.status_code == 413
        assert await gw.files.get_file("lim", "f") == old
        assert (await gw.files.usage()).total_bytes == LIMIT
    assert (await wait_clean(backend))["unreferenced"] == 0


async def test_other_chunk_size_round_trip_and_ranges(
    small_server: Server, server: Server, namespace: str, api_key: str | None,
    auth_headers: dict[str, str], client_transport: str,
) -> None:
    data = os.urandom(4 * SMALL_CHUNK + 123)
    async with GatewayClient(small_server.url, namespace, api_key, transport=client_transport) as gw:
        await gw.files.save_file("c", "f", data)
        part = b"".join([p async for p in gw.files.download("c", "f", start=SMALL_CHUNK - 1, end=3 * SMALL_CHUNK)])
        assert part == data[SMALL_CHUNK - 1 : 3 * SMALL_CHUNK + 1]
    # The main server (1 MiB chunks) reads it with the chunk size it was written with.
    async with GatewayClient(server.url, namespace=namespace, api_key=api_key, transport=client_transport) as gw:
        assert sha(await gw.files.get_file("c", "f") or b"") == sha(data)


async def test_chunks_of_a_crashed_upload_are_swept(
    server: Server, backend: Backend, namespace: str, tmp_path: Path, auth_headers: dict[str, str],
    api_key: str | None,
) -> None:
    assert (await wait_clean(backend))["unreferenced"] == 0
    # Database: 64 KiB chunks; S3: 5 MiB parts (the smallest S3 allows): a multipart upload in
    # progress; directory: 64 KiB pieces appended to one .part file.
    piece = 5 * 1024 * 1024 if backend.is_s3 else SMALL_CHUNK
    stored = 5  # chunks (database)
    doomed = start_server(
        backend, tmp_path / "doomed.log", GATEWAY_LIMITS__FILE_CHUNK_BYTES=str(SMALL_CHUNK),
        GATEWAY_FILES__S3__PART_BYTES=str(5 * 1024 * 1024), **keyed(api_key),
    )
    parts = urlsplit(doomed.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        head = [f"PUT {url(namespace, 'crash', 'f')} HTTP/1.1", f"Host: {parts.hostname}",
                f"Content-Length: {20 * piece}"] + [f"{k}: {v}" for k, v in auth_headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + os.urandom(8 * piece))
        await writer.drain()
        for _ in range(100):  # until the gateway has stored some pieces
            state = await storage_state(backend)
            if state["uploads"] == 1 and state["unreferenced"] >= (stored if backend.chunks_in_database else 1):
                break
            await asyncio.sleep(0.1)
        doomed.process.kill()  # no cleanup can run: what was stored stays behind
        doomed.process.wait()
    finally:
        writer.transport.abort()
    state = await storage_state(backend)
    assert state["uploads"] == 1 and state["orphans"] == 0
    assert state["unreferenced"] >= (stored if backend.chunks_in_database else 1)
    sweeper = start_server(
        backend, tmp_path / "sweeper.log", **keyed(api_key),
        GATEWAY_FILES__UPLOAD_STALE_SECONDS="0.5", GATEWAY_FILES__SWEEP_INTERVAL_SECONDS="0.2",
    )
    try:
        assert await wait_clean(backend) == {"orphans": 0, "uploads": 0, "unreferenced": 0}
    finally:
        stop_server(sweeper)


def in_process_app(backend: Backend, monkeypatch: pytest.MonkeyPatch, **settings: str):  # noqa: ANN201
    """The app in this process on the backend's databases and file storage, auth off."""
    from app.core.config import Settings
    from app.main import create_app

    for name, value in {**backend.env, "GATEWAY_AUTH__MODE": "disabled", "GATEWAY_AUTO_MIGRATE": "false",
                        **settings}.items():
        monkeypatch.setenv(name, value)
    return create_app(Settings())


async def test_a_slow_upload_keeps_its_heartbeat_between_pieces(
    backend: Backend, server: Server, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body may arrive at ``limits.min_body_rate_bytes`` (500 B/s), slower than one piece per
    ``files.upload_stale_seconds``: the upload's heartbeat is touched between pieces, and the
    sweep leaves it alone. Before, only a stored piece touched it: with 1 MiB pieces and the
    default 600 s, an upload slower than 1.75 KB/s was swept and answered 409 at its end."""
    from app.core.http.conditions import WriteConditions

    app = in_process_app(backend, monkeypatch, GATEWAY_FILES__UPLOAD_STALE_SECONDS="1",
                         GATEWAY_LIMITS__FILE_CHUNK_BYTES="4096")
    async with app.router.lifespan_context(app):
        service = app.state.gateway.services["files"]
        async with service.new_blob(namespace) as writer:
            body = os.urandom(writer.piece_bytes + 1000)  # one piece stored: the heartbeat started
            await writer.write(body)
            for _ in range(8):  # 2.4 s without another piece, a trickle of bytes
                await asyncio.sleep(0.3)
                await writer.write(b"x")
                body += b"x"
            assert await service.sweep() == 0
            await writer.commit(namespace, "slow", "f", "application/octet-stream", WriteConditions())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            r = await http.get(url(namespace, "slow", "f"))
            assert r.status_code == 200 and r.content == body


async def test_a_body_in_tiny_pieces_is_gathered_before_it_is_queued(
    backend: Backend, server: Server, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sends its body in tiny TCP segments gets tiny pieces from the server: they
    are gathered into pieces of up to ``SMALL_PIECE`` bytes before they are queued, and the
    bytes come back exact. Before, 300,000 bytes in 4-byte pieces were up to 75,000 entries, taken
    one by one from a list's front: quadratic in the pieces, on the event loop's thread."""
    from app.core.http.conditions import WriteConditions
    from app.files.service import SMALL_PIECE

    app = in_process_app(backend, monkeypatch, GATEWAY_LIMITS__FILE_CHUNK_BYTES=str(SMALL_CHUNK))
    body = os.urandom(300_000)
    most = 0
    async with app.router.lifespan_context(app):
        service = app.state.gateway.services["files"]
        async with service.new_blob(namespace) as writer:
            for i in range(0, len(body), 4):
                await writer.write(body[i : i + 4])
                most = max(most, len(writer._pending_pieces))
            await writer.commit(namespace, "tiny", "f", "application/octet-stream", WriteConditions())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            r = await http.get(url(namespace, "tiny", "f"))
            assert r.status_code == 200 and r.content == body
    assert most <= len(body) // SMALL_PIECE + 2, most


async def snapshots_held(backend: Backend) -> int:
    """Read snapshots the gateway holds in the metadata database: PostgreSQL, its connections idle
    in a transaction with an xmin (what holds back VACUUM); SQLite, 1 when a WAL
    checkpoint of a write made now cannot finish (a reader's snapshot predates it), else 0."""
    from sqlalchemy import text

    from tests.files_storage import metadata

    if backend.name.startswith("postgres"):
        async with metadata(backend) as conn:
            return int((await conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'storage-gateway' AND state = 'idle in transaction' "
                "AND backend_xmin IS NOT NULL"
            ))).scalar_one())
    import sqlite3

    path = backend.urls["metadata"].split("///", 1)[1]

    def checkpoint() -> int:
        db = sqlite3.connect(path, timeout=0.5, isolation_level=None)
        try:
            db.execute("CREATE TABLE IF NOT EXISTS probe_writes (x)")
            db.execute("INSERT INTO probe_writes VALUES (1)")
            db.execute("PRAGMA busy_timeout = 0")  # not waiting for the reader: it may let go meanwhile
            busy, _log, _done = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return int(busy)
        finally:
            db.close()

    return await asyncio.to_thread(checkpoint)


async def test_a_slow_download_lets_its_snapshot_go(
    backend: Backend, server: Server, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A download of database chunks reads them in one snapshot for at most
    ``files.download_snapshot_seconds``; one still running then reads each further chunk on its
    own, and holds no snapshot between them. Its file replaced after that: it is cut off
    (``VersionGone``), never finished with the new version's bytes. Before, the snapshot (and a
    pooled connection) lasted as long as the client took to read: a reader at 9 KB/s held back
    PostgreSQL's VACUUM, or every WAL checkpoint of SQLite, for hours. Bytes in S3 or a local file
    never change once written: such a download sends the old version whole."""
    from app.core.http.conditions import WriteConditions
    from app.files.ranges import whole
    from app.files.storage import ChunkReader, VersionGone

    app = in_process_app(backend, monkeypatch, GATEWAY_FILES__DOWNLOAD_SNAPSHOT_SECONDS="0.5",
                         GATEWAY_LIMITS__FILE_CHUNK_BYTES=str(SMALL_CHUNK))
    old, new = os.urandom(8 * SMALL_CHUNK), os.urandom(3 * SMALL_CHUNK)
    async with app.router.lifespan_context(app):
        service = app.state.gateway.services["files"]
        for data in (old, old):  # a slow download with no replace, then one with
            async with service.new_blob(namespace) as writer:
                await writer.write(data)
                await writer.commit(namespace, "slow", "f", "application/octet-stream", WriteConditions())
        for replaced in (False, True):
            reader = await service.open(namespace, "slow", "f")
            got = bytearray()
            try:
                await reader.start(whole(reader.row.size))
                pieces = reader.iter_bytes(whole(reader.row.size))
                got += await anext(pieces)
                if backend.chunks_in_database:
                    assert isinstance(reader, ChunkReader)
                    assert await snapshots_held(backend) == 1  # the check sees a snapshot
                await asyncio.sleep(0.7)  # the client slow to take the chunk read: the snapshot goes on time
                assert await snapshots_held(backend) == 0
                got += await anext(pieces, b"")  # past the limit: read on its own (S3, a local file: done)
                assert await snapshots_held(backend) == 0
                if replaced:
                    async with service.new_blob(namespace) as writer:
                        await writer.write(new)
                        await writer.commit(namespace, "slow", "f", "application/octet-stream", WriteConditions())
                if replaced and backend.chunks_in_database:
                    with pytest.raises(VersionGone):
                        async for piece in pieces:
                            got += piece
                    assert len(got) < len(old) and bytes(got) == old[: len(got)]
                else:
                    async for piece in pieces:
                        got += piece
                    assert bytes(got) == old
            finally:
                await reader.close()
    assert (await wait_clean(backend))["unreferenced"] == 0


async def test_a_slow_downloader_is_cut_off_when_its_file_changes_after_the_snapshot(
    server: Server, backend: Backend, namespace: str, tmp_path: Path, api_key: str | None,
    client_transport: str,
) -> None:
    """Through a gateway process and the client: a download still running after
    ``files.download_snapshot_seconds`` whose file is replaced meanwhile ends short (the client
    raises ``TransportError``) with a prefix of the old bytes, never the new ones; the gateway logs
    why. Bytes in S3 or a local file never change once written: the old version comes whole."""
    from storage_gateway_client import TransportError

    srv = start_server(backend, tmp_path / "snapshot.log", **keyed(api_key),
                       GATEWAY_FILES__DOWNLOAD_SNAPSHOT_SECONDS="0.5")
    old = os.urandom(32 * 1024 * 1024)  # more than the sockets' buffers hold: the gateway waits on the client
    try:
        async with GatewayClient(srv.url, namespace, api_key, transport=client_transport) as gw:
            await gw.files.save_file("cut", "f", old)
            got = bytearray()
            async with gw.files.download("cut", "f") as d:
                pieces = d.aiter_bytes()
                got += await anext(pieces)
                await asyncio.sleep(1.0)
                await gw.files.save_file("cut", "f", b"new")
                if backend.chunks_in_database:
                    with pytest.raises(TransportError):
                        async for piece in pieces:
                            got += piece
                else:
                    async for piece in pieces:
                        got += piece
            if backend.chunks_in_database:
                assert len(got) < len(old) and bytes(got) == old[: len(got)]
                assert "outlasted its snapshot" in srv.log()
            else:
                assert bytes(got) == old
            assert await gw.files.get_file("cut", "f") == b"new"
    finally:
        stop_server(srv)


async def test_a_move_that_outlasts_its_snapshot_skips_a_file_deleted_meanwhile(
    backend: Backend, server: Server, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``files migrate`` copies through the same reader as a download: one that outlasts
    ``files.download_snapshot_seconds`` and finds the file deleted meanwhile skips it (False, as
    for a file that changed), its copy dropped. Found in review: ``VersionGone`` escaped and
    stopped the whole migration with a traceback."""
    import app.files.service as files_service
    from app.core.http.conditions import WriteConditions

    app = in_process_app(backend, monkeypatch, GATEWAY_FILES__DOWNLOAD_SNAPSHOT_SECONDS="0.2",
                         GATEWAY_LIMITS__FILE_CHUNK_BYTES="4096")
    async with app.router.lifespan_context(app):
        service = app.state.gateway.services["files"]
        async with service.new_blob(namespace) as writer:
            await writer.write(os.urandom(10 * 4096))
            await writer.commit(namespace, "mv", "f", "application/octet-stream", WriteConditions())
        row = await service.get(namespace, "mv", "f")
        original, pieces = files_service.BlobWriter.write, 0

        async def slow_write(self: files_service.BlobWriter, data: bytes) -> None:
            nonlocal pieces
            pieces += 1
            if pieces == 2:  # a slow target; a gateway deletes the file meanwhile
                await asyncio.sleep(0.4)
                await service.delete(namespace, "mv", "f", WriteConditions())
            await original(self, data)

        monkeypatch.setattr(files_service.BlobWriter, "write", slow_write)
        moved = await service.move(namespace, "mv", row)
        if backend.chunks_in_database:
            assert pieces >= 2 and moved is False
        else:  # the reader may hand over the file in one piece: deleted meanwhile only if not
            assert moved is (pieces < 2)
    assert (await wait_clean(backend))["unreferenced"] == 0
