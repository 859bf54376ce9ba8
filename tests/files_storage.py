"""Where the files tests look behind the API: the metadata database, the bucket on S3, the
local directory on ``directory``.

The same three numbers on every files backend, so one assertion covers them all:
- ``orphans``: stored bytes that neither a file row nor an upload in progress holds (a leak);
- ``uploads``: uploads in progress (``file_uploads`` rows);
- ``unreferenced``: stored bytes no file row points at (chunks; on S3 objects and multipart
  uploads in progress; in a directory files and ``.part`` files), which must drop to 0 once
  cleanup after a failure has run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from app.files.settings import S3Settings
from app.files.local import LocalFiles
from app.files.s3 import S3Objects
from tests.conftest import Backend

CHUNK = 1024 * 1024  # the server's default limits.file_chunk_bytes


def local_files(backend: Backend) -> LocalFiles:
    """The directory of a ``directory`` backend (``files`` in its data dir, the default)."""
    return LocalFiles(Path(backend.env["GATEWAY_DATA_DIR"]) / "files", fsync=False)


def s3_settings(backend: Backend) -> S3Settings:
    env = backend.env
    return S3Settings(
        endpoint_url=env["GATEWAY_FILES__S3__ENDPOINT_URL"], bucket=env["GATEWAY_FILES__S3__BUCKET"],
        prefix=env["GATEWAY_FILES__S3__PREFIX"],
    )


@asynccontextmanager
async def bucket(backend: Backend) -> AsyncIterator[S3Objects]:
    """The backend's bucket, seen through the gateway's own S3 client (credentials from env)."""
    import os

    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ["AWS_ACCESS_KEY_ID"] = backend.env["AWS_ACCESS_KEY_ID"]
    os.environ["AWS_SECRET_ACCESS_KEY"] = backend.env["AWS_SECRET_ACCESS_KEY"]
    try:
        objects = await S3Objects.open(s3_settings(backend))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield objects
    finally:
        await objects.close()


@asynccontextmanager
async def metadata(backend: Backend) -> AsyncIterator[AsyncConnection]:
    engine = create_async_engine(backend.urls["metadata"])
    try:
        async with engine.connect() as conn:
            yield conn
    finally:
        await engine.dispose()


async def _ids(conn: AsyncConnection, table: str) -> set[str]:
    return set((await conn.execute(text(f"SELECT blob_id FROM {table}"))).scalars())


async def storage_state(backend: Backend) -> dict[str, int]:
    async with metadata(backend) as conn:
        uploads = (await conn.execute(text("SELECT count(*) FROM file_uploads"))).scalar_one()
        if backend.chunks_in_database:
            orphans = (await conn.execute(text(
                "SELECT count(*) FROM file_chunks c WHERE NOT EXISTS "
                "(SELECT 1 FROM files f WHERE f.blob_id = c.blob_id) AND NOT EXISTS "
                "(SELECT 1 FROM file_uploads u WHERE u.blob_id = c.blob_id)"
            ))).scalar_one()
            unreferenced = (await conn.execute(text(
                "SELECT count(*) FROM file_chunks c WHERE NOT EXISTS "
                "(SELECT 1 FROM files f WHERE f.blob_id = c.blob_id)"
            ))).scalar_one()
            return {"orphans": orphans, "uploads": uploads, "unreferenced": unreferenced}
        in_files, in_uploads = await _ids(conn, "files"), await _ids(conn, "file_uploads")
    orphans = unreferenced = 0
    if backend.files == "directory":
        for listed in local_files(backend).listed():
            for file in listed:
                unreferenced += file.blob_id not in in_files
                orphans += file.blob_id not in in_files and file.blob_id not in in_uploads
        return {"orphans": orphans, "uploads": uploads, "unreferenced": unreferenced}
    async with bucket(backend) as objects:
        async for page in objects.objects():
            for obj in page:
                unreferenced += obj.blob_id not in in_files
                orphans += obj.blob_id not in in_files and obj.blob_id not in in_uploads
        async for page in objects.uploads():
            for upload in page:
                unreferenced += 1
                orphans += upload.blob_id not in in_uploads
    return {"orphans": orphans, "uploads": uploads, "unreferenced": unreferenced}


async def pieces_of(backend: Backend, namespace: str, collection: str, file_id: str) -> int:
    """How many pieces hold the file's bytes: chunks in the database, or 1 object (0 if none)."""
    async with metadata(backend) as conn:
        if backend.chunks_in_database:
            return (await conn.execute(text(
                "SELECT count(*) FROM file_chunks c JOIN files f ON f.blob_id = c.blob_id "
                "WHERE f.namespace = :ns AND f.collection = :c AND f.file_id = :id"
            ), {"ns": namespace, "c": collection, "id": file_id})).scalar_one()
        key = (await conn.execute(text(
            "SELECT object_key FROM files WHERE namespace = :ns AND collection = :c AND file_id = :id"
        ), {"ns": namespace, "c": collection, "id": file_id})).scalar()
    if key is None:
        return 0
    if backend.files == "directory":
        return int(local_files(backend).path(key).is_file())
    async with bucket(backend) as objects:
        async for page in objects.objects():
            if any(obj.key == key for obj in page):
                return 1
    return 0


def expected_pieces(backend: Backend, size: int, chunk: int = CHUNK) -> int:
    return -(-size // chunk) if backend.chunks_in_database else 1


async def wait_clean(backend: Backend, timeout: float = 15.0) -> dict[str, int]:
    """Wait until no upload is in progress and nothing stored lacks a file (cleanup runs after a cut)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        state = await storage_state(backend)
        if state["unreferenced"] == 0 and state["uploads"] == 0:
            return state
        if asyncio.get_running_loop().time() > deadline:
            return state
        await asyncio.sleep(0.1)
