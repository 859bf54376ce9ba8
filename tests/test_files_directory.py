"""Files in a local directory (``files.backend: directory``), the embedded default on SQLite.

The whole files suite also runs on ``sqlite_directory`` / ``postgres_directory``
(``FILE_BACKENDS``); these tests cover what is particular to it: that it is the default on SQLite
and not on PostgreSQL, where the bytes are, that old versions' files go, and that a missing
file is never answered with other bytes.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from app.core.config import Settings
from app.files.local import LocalFiles, is_local_key
from tests.conftest import ADMIN_KEY, Backend, backend_env, run_cli, start_server, stop_server
from tests.files_storage import metadata, storage_state

HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


def test_the_default_is_a_directory_on_sqlite_and_the_database_on_postgres(tmp_path: Path) -> None:
    on_sqlite = Settings(data_dir=tmp_path)
    assert on_sqlite.files_backend() == "directory"
    assert on_sqlite.files_directory() == tmp_path / "files"
    on_postgres = Settings(persistence={"postgres_base_dsn": "postgresql://u@db:5432"})  # type: ignore[arg-type]
    assert on_postgres.files_backend() == "database"
    chosen = Settings(data_dir=tmp_path, files={"backend": "database", "directory": {"path": str(tmp_path / "x")}})  # type: ignore[arg-type]
    assert chosen.files_backend() == "database" and chosen.files_directory() == tmp_path / "x"


def test_keys_never_become_paths_outside_the_directory(tmp_path: Path) -> None:
    local = LocalFiles(tmp_path, fsync=False)
    key = local.key_for("ns", "0" * 32)
    assert is_local_key(key) and local.path(key).parent.parent == tmp_path
    for bad in ("/../../etc/passwd", "/" + "0" * 16 + "/../x", "files/" + "0" * 32, "/" + "0" * 16 + "/" + "A" * 32):
        with pytest.raises(ValueError):
            local.path(bad)
    assert not is_local_key("files/abc") and not is_local_key(None)


async def test_the_embedded_default_writes_files_to_the_data_dir(tmp_path: Path) -> None:
    urls = {db: f"sqlite+aiosqlite:///{tmp_path}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
    default = Backend("sqlite", backend_env(urls, tmp_path), urls, files="directory")  # no files.backend set
    assert run_cli(default, "migrate").returncode == 0
    server = start_server(default, tmp_path / "gw.log")
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=HEADERS, timeout=30) as http:
            ready = (await http.get("/readyz")).json()["storage"]["files"]
            assert ready == {"backend": "directory", "reachable": True, "location": str(tmp_path / "files"),
                             "error": None}
            first, second = os.urandom(3 * 1024 * 1024 + 5), os.urandom(1000)
            assert (await http.put("/v1/ns/files/c/f", content=first)).status_code == 201
            async with metadata(default) as conn:
                key = (await conn.execute(text("SELECT object_key FROM files"))).scalar_one()
                assert (await conn.execute(text("SELECT count(*) FROM file_chunks"))).scalar_one() == 0
            path = LocalFiles(tmp_path / "files", fsync=False).path(key)
            assert path.read_bytes() == first
            assert (tmp_path / "metadata.db-writelock").exists()  # the swap took its turn (app.fairness.writequeue)
            assert (await http.get("/v1/ns/files/c/f")).content == first
            r = await http.get("/v1/ns/files/c/f", headers={"Range": "bytes=1048570-2097160"})
            assert r.status_code == 206 and r.content == first[1048570:2097161]

            # A new version is a new file; the old one is gone once the swap committed.
            assert (await http.put("/v1/ns/files/c/f", content=second)).status_code == 200
            assert not path.exists()
            assert (await http.get("/v1/ns/files/c/f")).content == second
            assert (await http.delete("/v1/ns/files/c/f")).status_code == 204
            assert await storage_state(default) == {"orphans": 0, "uploads": 0, "unreferenced": 0}
            assert [p for p in (tmp_path / "files").rglob("*") if p.is_file()] == []
    finally:
        stop_server(server)


@pytest.mark.parametrize("backend", ["sqlite_directory", "postgres_directory"], indirect=True)
async def test_a_missing_file_is_a_503_never_other_bytes(server: object, backend: Backend, namespace: str) -> None:
    url = getattr(server, "url")
    data = os.urandom(2000)
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=30) as http:
        assert (await http.put(f"/v1/{namespace}/files/c/gone", content=data)).status_code == 201
        async with metadata(backend) as conn:
            key = (await conn.execute(text(
                "SELECT object_key FROM files WHERE namespace = :ns"), {"ns": namespace})).scalar_one()
        LocalFiles(Path(backend.env["GATEWAY_DATA_DIR"]) / "files", fsync=False).path(key).unlink()
        r = await http.get(f"/v1/{namespace}/files/c/gone")
        assert r.status_code == 503 and r.headers["content-type"] == "application/problem+json"
        head = await http.head(f"/v1/{namespace}/files/c/gone")  # metadata alone still answers
        assert head.status_code == 200 and head.headers["etag"] == f'"{hashlib.sha256(data).hexdigest()}"'


@pytest.mark.parametrize("backend", ["sqlite_directory", "sqlite"], indirect=True)
def test_a_download_reads_its_row_on_the_loops_thread_when_bytes_are_in_files(
    server: object, backend: Backend, namespace: str
) -> None:
    """Files outside the database: the row alone is read inline (``app.core.fast.inline_sqlite``, no
    hand-off to aiosqlite's thread); chunks in the database are never read inline."""
    from tests.test_inline_reads import moved, outcomes

    data = os.urandom(5000)
    with httpx.Client(base_url=getattr(server, "url"), headers=HEADERS, timeout=30) as client:
        assert client.put(f"/v1/{namespace}/files/c/f", content=data).status_code == 201
        before = outcomes(client)
        for _ in range(5):
            assert client.get(f"/v1/{namespace}/files/c/f").content == data
        expected = {"inline": 5} if backend.files == "directory" else {}
        assert moved(before, outcomes(client)) == expected


@pytest.mark.parametrize("backend", ["sqlite_directory", "sqlite_s3", "sqlite", "postgres_directory"], indirect=True)
def test_an_uploads_version_swap_commits_on_the_loops_thread_when_bytes_are_outside_the_database(
    server: object, backend: Backend, namespace: str
) -> None:
    """On SQLite with file bytes outside the database, the swap of a new version (read the row,
    check the conditions, write the row) is one inline transaction (``app.core.fast.inline_sqlite``):
    SQLite's write lock is never held across an ``await``. A refused condition changes nothing;
    a lock held elsewhere sends the swap through the pool, which waits for it."""
    from app.core.fast.inline_sqlite import LOCK_TRIES
    from app.core.db.sqlite import SQLITE
    from tests.test_inline_reads import write_outcomes

    inline = not backend.is_postgres and backend.files != "database"
    url = f"/v1/{namespace}/files/c/f"
    with httpx.Client(base_url=getattr(server, "url"), headers=HEADERS, timeout=30) as client:
        before = write_outcomes(client)
        assert client.put(url, content=b"one").status_code == 201
        assert client.put(url, content=b"two").status_code == 200
        assert client.put(url, content=b"three", headers={"If-Match": '"not-the-etag"'}).status_code == 412
        assert client.get(url).content == b"two"
        after = write_outcomes(client)
        assert after["inline"] - before["inline"] == (2 if inline else 0)
        if backend.is_postgres:
            return
        holder = SQLITE.connect(backend.urls["metadata"].split(":///", 1)[1], isolation_level=None,
                                check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.5, holder.execute, ("COMMIT",))
        release.start()
        try:
            started = time.monotonic()
            assert client.put(url, content=b"four").status_code == 200
            assert time.monotonic() - started >= 0.4
        finally:
            release.join()
            holder.close()
        assert client.get(url).content == b"four"
        # Tried inline LOCK_TRIES times over a few milliseconds, then through the pool.
        assert write_outcomes(client)["busy"] - after["busy"] == (LOCK_TRIES if inline else 0)
