"""A whole namespace: ``export_namespace`` and ``import_namespace`` (streamed), ``delete_namespace``.

Both need the admin key or a key with the ``namespace:admin`` scope. The export is written to a
path (atomically: a temporary file renamed at the end, so a cut-off export leaves no archive) or
iterated; the import sends bytes, a path or an async iterator of bytes, never the whole archive
in memory, into an empty namespace. Neither has a read timeout: a large namespace takes time.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from ._exceptions import TransportError, error_from_response
from ._files import READ_CHUNK_BYTES, UploadSource, _PathSource
from ._paths import segment
from ._transport import Transport

LONG = httpx.Timeout(30.0, connect=5.0, read=None, write=None)


def _path(namespace: str, what: str) -> str:
    return f"/v1/{segment(namespace)}/{what}"


async def iter_export(transport: Transport, namespace: str, chunk_bytes: int = READ_CHUNK_BYTES) -> AsyncIterator[bytes]:
    url = _path(namespace, "export")
    try:
        async with transport.stream("GET", url, timeout=LONG) as response:
            if response.status_code >= 400:
                await response.aread()
                raise error_from_response(response)
            async for piece in response.aiter_raw(chunk_bytes):
                yield piece
    except httpx.TransportError as exc:
        raise TransportError(f"GET {url}: {exc.__class__.__name__}: {exc}", cause=exc) from exc


async def export_to(transport: Transport, namespace: str, destination: str | os.PathLike[str]) -> int:
    path = Path(destination)
    partial = path.with_name(path.name + ".partial")
    f = await asyncio.to_thread(open, partial, "wb")
    written = 0
    try:
        async for piece in iter_export(transport, namespace):
            await asyncio.to_thread(f.write, piece)
            written += len(piece)
        await asyncio.to_thread(f.close)
        await asyncio.to_thread(os.replace, partial, path)
    except BaseException:
        await asyncio.to_thread(f.close)
        await asyncio.to_thread(partial.unlink, True)
        raise
    return written


async def import_from(transport: Transport, namespace: str, source: UploadSource) -> dict[str, Any]:
    headers = {"Content-Type": "application/x-tar"}
    content: Any
    if isinstance(source, bytes | bytearray | memoryview):
        content = bytes(source)
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        headers["Content-Length"] = str((await asyncio.to_thread(path.stat)).st_size)
        content = _PathSource(path, READ_CHUNK_BYTES)
    elif isinstance(source, AsyncIterable):
        content = source
    else:
        raise TypeError("source must be bytes, a path, or an async iterable of bytes")
    response = await transport.request(
        "POST", _path(namespace, "import"), content=content, headers=headers, idempotent=False, timeout=LONG
    )
    result: dict[str, Any] = response.json()
    return result


async def delete(transport: Transport, namespace: str, wait: float) -> dict[str, Any]:
    """``DELETE /v1/{namespace}`` until it answers ``done`` (a 202 is a part; the next goes on)."""
    deleted: dict[str, dict[str, int]] = {}
    while True:
        response = await transport.request(
            "DELETE", f"/v1/{segment(namespace)}", params={"wait": wait}, idempotent=True, timeout=LONG
        )
        report: dict[str, Any] = response.json()
        for cap, counts in report["deleted"].items():
            mine = deleted.setdefault(cap, {})
            for what, n in counts.items():
                mine[what] = mine.get(what, 0) + n
        if report["done"]:
            return {"namespace": namespace, "deleted": deleted, "done": True}
