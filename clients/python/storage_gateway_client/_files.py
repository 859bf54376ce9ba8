"""The files capability over HTTP: the seed's FileStore plus streamed uploads and downloads.

``save_file`` / ``get_file`` / ``delete_file`` move whole ``bytes`` (the seed's FileStore).
``upload`` streams bytes, an async iterator or a file path; ``download`` streams chunks and
``download_to`` writes a path (atomically, checking the sha256). None of the streaming calls
holds a whole file in memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Union

import httpx
from pydantic import BaseModel, Field

from ._exceptions import GatewayError, TransportError, error_from_response
from ._resource import Resource

READ_CHUNK_BYTES = 1024 * 1024
PAGE_SIZE = 1000

UploadSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", AsyncIterable[bytes]]


class FileInfo(BaseModel):
    """A stored file's metadata."""

    id: str
    size: int = Field(ge=0)
    content_type: str
    sha256: str
    created_at: datetime
    updated_at: datetime

    @property
    def etag(self) -> str:
        return f'"{self.sha256}"'


class FileHead(BaseModel):
    """What a file's response headers say (``HEAD``, or a download's first answer)."""

    size: int = Field(ge=0, description="Size of the whole file.")
    content_type: str
    sha256: str
    last_modified: datetime | None = None
    content_length: int = Field(ge=0, description="Bytes in this response (less than size for a range).")

    @property
    def etag(self) -> str:
        return f'"{self.sha256}"'

    @classmethod
    def of(cls, response: httpx.Response) -> FileHead:
        h = response.headers
        length = int(h.get("content-length", "0"))
        size = length
        content_range = h.get("content-range")
        if content_range and "/" in content_range:
            size = int(content_range.rsplit("/", 1)[1])
        modified = h.get("last-modified")
        return cls(
            size=size,
            content_type=h.get("content-type", "application/octet-stream"),
            sha256=h.get("etag", "").strip('"'),
            last_modified=parsedate_to_datetime(modified) if modified else None,
            content_length=length,
        )


class FileList(BaseModel):
    """A page of file metadata in id order."""

    items: list[FileInfo]
    next_cursor: str | None = None


class FilesUsage(BaseModel):
    """How much a namespace stores in files."""

    namespace: str
    total_bytes: int
    file_count: int


class IntegrityError(GatewayError):
    """A downloaded file's sha256 differs from its ETag (the transfer was corrupted)."""


def _etag(value: str | None) -> str | None:
    if value is None or value == "*" or value.startswith(('"', "W/")):
        return value
    return f'"{value}"'


class _PathSource:
    """A file read in chunks in a worker thread; iterable again, so a retried upload resends it."""

    def __init__(self, path: Path, chunk_bytes: int) -> None:
        self.path = path
        self.chunk_bytes = chunk_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        f = await asyncio.to_thread(open, self.path, "rb")
        try:
            while chunk := await asyncio.to_thread(f.read, self.chunk_bytes):
                yield chunk
        finally:
            await asyncio.to_thread(f.close)


class FileDownload:
    """A streamed download: ``async with`` it (``.head``, ``aiter_bytes()``), or ``async for`` it.

    Either way the response is closed when done, on error, or when iteration stops early.
    """

    def __init__(self, api: FilesAPI, url: str, headers: dict[str, str], chunk_bytes: int) -> None:
        self._api = api
        self._url = url
        self._headers = headers
        self._chunk_bytes = chunk_bytes
        self._cm: Any = None
        self.response: httpx.Response | None = None
        self.head: FileHead | None = None

    async def __aenter__(self) -> FileDownload:
        self._cm = self._api._stream("GET", self._url, headers=self._headers)
        try:
            response = await self._cm.__aenter__()
        except httpx.TransportError as exc:
            raise TransportError(f"GET {self._url}: {exc.__class__.__name__}: {exc}", cause=exc) from exc
        if response.status_code >= 400:
            try:
                await response.aread()
            finally:
                await self._cm.__aexit__(None, None, None)
            raise error_from_response(response)
        self.response = response
        self.head = FileHead.of(response)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._cm is not None:
            cm, self._cm = self._cm, None
            await cm.__aexit__(exc_type, exc, tb)

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body in pieces of at most the chunk size."""
        if self.response is None:
            raise RuntimeError("enter the download with `async with` first")
        try:
            async for piece in self.response.aiter_raw(self._chunk_bytes):
                yield piece
        except httpx.TransportError as exc:
            raise TransportError(f"GET {self._url}: {exc.__class__.__name__}: {exc}", cause=exc) from exc

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async with self:
            async for piece in self.aiter_bytes():
                yield piece


class FilesAPI(Resource):
    """``save_file``, ``get_file``, ``delete_file`` as in the seed's FileStore, and streaming."""

    capability = "files"

    # --- the seed's FileStore ------------------------------------------------------------

    async def save_file(
        self, collection: str, file_id: str, data: bytes, content_type: str | None = None
    ) -> FileInfo:
        """Store ``data`` as ``file_id`` (replacing any previous version)."""
        return await self.upload(collection, file_id, data, content_type=content_type)

    async def get_file(self, collection: str, file_id: str) -> bytes | None:
        """The whole file, or ``None`` when it does not exist (use ``download`` for large files)."""
        response = await self._transport.request("GET", self._path(collection, file_id), ok=(404,))
        if response.status_code == 404:
            return None
        return response.content

    async def delete_file(self, collection: str, file_id: str, *, if_match: str | None = None) -> None:
        """Delete the file; deleting a missing file is not an error."""
        headers = {"If-Match": _etag(if_match)} if if_match is not None else {}
        await self._transport.request(
            "DELETE", self._path(collection, file_id), headers=headers, idempotent=if_match is None
        )

    # --- streaming -----------------------------------------------------------------------

    async def upload(
        self,
        collection: str,
        file_id: str,
        source: UploadSource,
        *,
        content_type: str | None = None,
        if_match: str | None = None,
        if_none_match: str | None = None,
        chunk_bytes: int = READ_CHUNK_BYTES,
    ) -> FileInfo:
        """Stream ``source`` (bytes, a path, or an async iterator of bytes) as the new version.

        ``if_match=etag`` replaces only that version; ``if_none_match="*"`` only creates.
        Bytes and paths are retried on connection errors; async iterators (one-shot) and
        conditional uploads are not.
        """
        headers = {"Content-Type": content_type or "application/octet-stream"}
        if if_match is not None:
            headers["If-Match"] = _etag(if_match)  # type: ignore[assignment]
        if if_none_match is not None:
            headers["If-None-Match"] = _etag(if_none_match)  # type: ignore[assignment]
        retryable = if_match is None and if_none_match is None
        content: Any
        if isinstance(source, (bytes, bytearray, memoryview)):
            content = bytes(source)
        elif isinstance(source, (str, os.PathLike)):
            path = Path(source)
            headers["Content-Length"] = str((await asyncio.to_thread(path.stat)).st_size)
            content = _PathSource(path, chunk_bytes)
        elif isinstance(source, AsyncIterable):
            content = source
            retryable = False
        else:
            raise TypeError("source must be bytes, a path, or an async iterable of bytes")
        response = await self._transport.request(
            "PUT", self._path(collection, file_id), content=content, headers=headers, idempotent=retryable
        )
        return FileInfo.model_validate_json(response.content)

    def download(
        self,
        collection: str,
        file_id: str,
        *,
        start: int | None = None,
        end: int | None = None,
        chunk_bytes: int = READ_CHUNK_BYTES,
    ) -> FileDownload:
        """Stream the file (or bytes ``start``..``end`` inclusive): ``async for chunk in ...``,
        or ``async with ... as d`` for ``d.head`` and ``d.aiter_bytes()``. Missing: ``NotFound``."""
        headers: dict[str, str] = {}
        if start is not None or end is not None:
            headers["Range"] = f"bytes={start or 0}-{'' if end is None else end}"
        return FileDownload(self, self._path(collection, file_id), headers, chunk_bytes)

    async def download_to(self, collection: str, file_id: str, path: str | os.PathLike[str]) -> FileHead:
        """Write the file to ``path`` (through a temporary file, renamed when the sha256 matches)."""
        target = Path(path)
        partial = target.with_name(f".{target.name}.part")
        digest = hashlib.sha256()
        f = await asyncio.to_thread(open, partial, "wb")
        try:
            async with self.download(collection, file_id) as d:
                async for piece in d.aiter_bytes():
                    digest.update(piece)
                    await asyncio.to_thread(f.write, piece)
                head = d.head
            await asyncio.to_thread(f.close)
            assert head is not None
            if digest.hexdigest() != head.sha256:
                raise IntegrityError(f"{file_id}: sha256 {digest.hexdigest()} differs from ETag {head.sha256}")
            await asyncio.to_thread(os.replace, partial, target)
        except BaseException:
            f.close()
            partial.unlink(missing_ok=True)
            raise
        return head

    async def head(self, collection: str, file_id: str) -> FileHead | None:
        """Size, content type, sha256 and last modification, or ``None`` when missing."""
        response = await self._transport.request("HEAD", self._path(collection, file_id), ok=(404,))
        if response.status_code == 404:
            return None
        return FileHead.of(response)

    async def stat(self, collection: str, file_id: str) -> FileInfo | None:
        """Full metadata of one file, or ``None`` (the first listed id with ``file_id`` as prefix)."""
        page = await self.list_files(collection, prefix=file_id, limit=1)
        if page.items and page.items[0].id == file_id:
            return page.items[0]
        return None

    async def list_files(
        self, collection: str, *, prefix: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> FileList:
        """One page of metadata in id order; pass ``next_cursor`` back as ``cursor``."""
        params: dict[str, Any] = {}
        if prefix:
            params["prefix"] = prefix
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        response = await self._transport.request("GET", self._path(collection), params=params)
        return FileList.model_validate_json(response.content)

    async def iter_files(
        self, collection: str, *, prefix: str | None = None, page_size: int = PAGE_SIZE
    ) -> AsyncIterator[FileInfo]:
        """Every file's metadata, page after page."""
        cursor = None
        while True:
            page = await self.list_files(collection, prefix=prefix, limit=page_size, cursor=cursor)
            for item in page.items:
                yield item
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def usage(self) -> FilesUsage:
        """Total bytes and number of files of this namespace."""
        response = await self._transport.request("GET", self._path())
        return FilesUsage.model_validate_json(response.content)

    def _stream(
        self, method: str, url: str, headers: dict[str, str]
    ) -> AbstractAsyncContextManager[httpx.Response]:
        return self._transport.stream(method, url, headers={**self._transport._headers, **headers})
