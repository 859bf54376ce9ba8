"""``storage-gateway files migrate --to s3`` and back, on both metadata databases.

Files written on the database backend move to the bucket in batches (``--limit``: an interrupted
run is resumed by running it again) while a gateway keeps reading them, then move back; and
through a local directory (``--to directory``) the same way.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from tests.conftest import BIN, Backend, gateway_env, run_cli, s3_env, start_server, stop_server
from tests.files_storage import CHUNK, metadata, storage_state
from tests.s3server import SeaweedS3
from tests.test_files import sha, url

pytestmark = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)

SIZES = [0, 1, CHUNK - 1, CHUNK + 1, 3 * CHUNK + 17, 200, 5000]
CHUNKS = sum(-(-size // CHUNK) for size in SIZES)


async def locations(backend: Backend) -> dict[str, int]:
    async with metadata(backend) as conn:
        rows = (await conn.execute(text(
            "SELECT count(*) FILTER (WHERE object_key IS NULL), "
            "count(*) FILTER (WHERE object_key IS NOT NULL AND object_key NOT LIKE '/%'), "
            "count(*) FILTER (WHERE object_key LIKE '/%'), "
            "(SELECT count(*) FROM file_chunks) FROM files"
        ))).one()
    return {"database": rows[0], "s3": rows[1], "directory": rows[2], "chunks": rows[3]}


async def written_on_the_database(
    backend: Backend, tmp_path: Path, auth_headers: dict[str, str], namespace: str, files: dict[str, bytes]
) -> list[dict[str, object]]:
    """``files`` uploaded through a gateway on the database backend; its listing of them."""
    db_gateway = start_server(backend, tmp_path / "db.log")
    try:
        async with httpx.AsyncClient(base_url=db_gateway.url, headers=auth_headers, timeout=60) as http:
            for file_id, data in files.items():
                assert (await http.put(url(namespace, "c", file_id), content=data)).status_code == 201
            listed: list[dict[str, object]] = (await http.get(url(namespace, "c"))).json()["items"]
            return listed
    finally:
        stop_server(db_gateway)


async def keep_reading(http: httpx.AsyncClient, namespace: str, files: dict[str, bytes], stop: asyncio.Event) -> int:
    """Read every file again and again, checking its bytes, until ``stop``; how many reads."""
    reads = 0
    while not stop.is_set():
        for file_id, data in files.items():
            r = await http.get(url(namespace, "c", file_id))
            assert r.status_code == 200 and r.content == data, file_id
            reads += 1
        await asyncio.sleep(0.1)  # reads go on throughout, without hogging the CPU
    return reads


async def test_migrate_to_s3_and_back(
    fresh_backend: Backend, seaweed: SeaweedS3, tmp_path: Path, auth_headers: dict[str, str],
) -> None:
    assert run_cli(fresh_backend, "migrate").returncode == 0
    s3 = s3_env(seaweed, "gateway-tests", f"migrate-{uuid.uuid4().hex[:8]}/")
    on_s3 = Backend(fresh_backend.name, {**fresh_backend.env, **s3}, fresh_backend.urls, files="s3")
    namespace = f"m{uuid.uuid4().hex[:8]}"
    files = {f"f{i}": os.urandom(size) for i, size in enumerate(SIZES)}

    listed = await written_on_the_database(fresh_backend, tmp_path, auth_headers, namespace, files)
    assert await locations(fresh_backend) == {"database": len(files), "s3": 0, "directory": 0, "chunks": CHUNKS}

    # A gateway already on s3 (new uploads go there) keeps serving every file while they move.
    gateway = start_server(on_s3, tmp_path / "s3.log")
    try:
        async with httpx.AsyncClient(base_url=gateway.url, headers=auth_headers, timeout=60) as http:
            stop_reading = asyncio.Event()
            reader = asyncio.create_task(keep_reading(http, namespace, files, stop_reading))
            # Interrupted after 3 files, then resumed: nothing moves twice, nothing is lost.
            first = await asyncio.to_thread(run_cli, on_s3, "files", "migrate", "--to", "s3", "--limit", "3")
            assert first.returncode == 0, first.stderr
            assert "moved 3 files" in first.stdout and f"{len(files) - 3} not yet on s3" in first.stdout
            assert "files," in first.stderr  # the progress bar
            assert (await locations(fresh_backend))["s3"] == 3
            rest = await asyncio.to_thread(run_cli, on_s3, "files", "migrate", "--to", "s3")
            assert rest.returncode == 0, rest.stderr
            assert f"moved {len(files) - 3} files" in rest.stdout and "0 not yet on s3" in rest.stdout
            stop_reading.set()
            assert await reader > 0
            assert await locations(fresh_backend) == {"database": 0, "s3": len(files), "directory": 0, "chunks": 0}
            for file_id, data in files.items():
                r = await http.get(url(namespace, "c", file_id))
                assert r.content == data and r.headers["etag"] == f'"{sha(data)}"'
            # The same versions: sha256, sizes, types and timestamps as written.
            assert (await http.get(url(namespace, "c"))).json()["items"] == listed
            assert await storage_state(on_s3) == {"orphans": 0, "uploads": 0, "unreferenced": 0}

            # And back: the bucket keeps nothing of them.
            back = await asyncio.to_thread(run_cli, on_s3, "files", "migrate", "--to", "database")
            assert back.returncode == 0, back.stderr
            assert f"moved {len(files)} files" in back.stdout
            assert await locations(fresh_backend) == {"database": len(files), "s3": 0, "directory": 0, "chunks": CHUNKS}
            for file_id, data in files.items():
                assert (await http.get(url(namespace, "c", file_id))).content == data
            assert (await http.get(url(namespace, "c"))).json()["items"] == listed
            assert await storage_state(on_s3) == {"orphans": 0, "uploads": 0, "unreferenced": 0}
    finally:
        stop_server(gateway)


async def test_migrate_to_a_directory_then_s3_and_back(
    fresh_backend: Backend, seaweed: SeaweedS3, tmp_path: Path, auth_headers: dict[str, str],
) -> None:
    """Database -> directory -> s3 -> database, with a gateway on the directory backend (and the
    bucket configured, so it reads what is there) serving every file throughout."""
    assert run_cli(fresh_backend, "migrate").returncode == 0
    s3 = s3_env(seaweed, "gateway-tests", f"migrate-{uuid.uuid4().hex[:8]}/")
    on_dir = Backend(fresh_backend.name, {**fresh_backend.env, **s3, "GATEWAY_FILES__BACKEND": "directory"},
                     fresh_backend.urls, files="directory")
    on_s3 = Backend(fresh_backend.name, {**fresh_backend.env, **s3}, fresh_backend.urls, files="s3")
    namespace = f"m{uuid.uuid4().hex[:8]}"
    files = {f"f{i}": os.urandom(size) for i, size in enumerate(SIZES)}
    listed = await written_on_the_database(fresh_backend, tmp_path, auth_headers, namespace, files)

    gateway = start_server(on_dir, tmp_path / "dir.log")
    try:
        async with httpx.AsyncClient(base_url=gateway.url, headers=auth_headers, timeout=60) as http:
            stop_reading = asyncio.Event()

            async def same_files() -> None:
                for file_id, data in files.items():
                    r = await http.get(url(namespace, "c", file_id))
                    assert r.content == data and r.headers["etag"] == f'"{sha(data)}"'
                assert (await http.get(url(namespace, "c"))).json()["items"] == listed

            reader = asyncio.create_task(keep_reading(http, namespace, files, stop_reading))
            moved = await asyncio.to_thread(run_cli, on_dir, "files", "migrate", "--to", "directory")
            assert moved.returncode == 0, moved.stderr
            assert f"moved {len(files)} files" in moved.stdout and "0 not yet on directory" in moved.stdout
            stop_reading.set()
            assert await reader > 0
            assert await locations(fresh_backend) == {"database": 0, "s3": 0, "directory": len(files), "chunks": 0}
            await same_files()
            assert await storage_state(on_dir) == {"orphans": 0, "uploads": 0, "unreferenced": 0}

            to_s3 = await asyncio.to_thread(run_cli, on_dir, "files", "migrate", "--to", "s3")
            assert to_s3.returncode == 0, to_s3.stderr
            assert await locations(fresh_backend) == {"database": 0, "s3": len(files), "directory": 0, "chunks": 0}
            await same_files()  # a directory gateway reads from the bucket too
            assert await storage_state(on_dir) == {"orphans": 0, "uploads": 0, "unreferenced": 0}
            assert await storage_state(on_s3) == {"orphans": 0, "uploads": 0, "unreferenced": 0}

            back = await asyncio.to_thread(run_cli, on_dir, "files", "migrate", "--to", "database")
            assert back.returncode == 0, back.stderr
            assert await locations(fresh_backend) == {"database": len(files), "s3": 0, "directory": 0, "chunks": CHUNKS}
            await same_files()
            assert await storage_state(on_s3) == {"orphans": 0, "uploads": 0, "unreferenced": 0}
    finally:
        stop_server(gateway)


def test_migrate_needs_a_bucket(backend: Backend) -> None:
    result = subprocess.run(
        [str(BIN / "storage-gateway"), "files", "migrate", "--to", "s3"],
        env=gateway_env(backend), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "files.s3.bucket" in result.stderr
