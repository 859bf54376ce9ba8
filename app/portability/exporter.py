"""Export one namespace as an archive (docs/archive-format.md), streamed.

One snapshot per database (SQLite: one read transaction; PostgreSQL: repeatable read, read
only), shared by the capabilities of that database and kept for the whole export: the manifest's
counts are taken by a first pass over the same snapshot, so they are exactly what follows. Memory
is bounded by one part (``part_bytes``) and one piece of a file, never by the namespace.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app import __version__
from app.core.config import Database
from app.core.namespace_data import Blob, Rows
from app.core.state import GatewayState
from app.portability.archive import END, member_header, padding

FORMAT = "storage-gateway-archive"
VERSION = 1  # the major: an importer refuses a higher one
MINOR = 0  # new optional parts, fields or capabilities: readers of the same major skip nothing they need

PART_BYTES = 4 * 1024 * 1024
PART_LINES = 10_000
BATCH = 500  # rows a capability reads at a time


@dataclass
class Counted:
    count: int = 0
    bytes: int = 0
    collections: dict[str, list[int]] = field(default_factory=dict)

    def add(self, n_bytes: int, collection: str | None) -> None:
        self.count += 1
        self.bytes += n_bytes
        if collection is not None:
            c = self.collections.setdefault(collection, [0, 0])
            c[0] += 1
            c[1] += n_bytes

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": self.count, "bytes": self.bytes}
        if self.collections:
            out["collections"] = {k: {"count": v[0], "bytes": v[1]} for k, v in sorted(self.collections.items())}
        return out


def line_of(row: dict[str, Any]) -> bytes:
    """A JSON line; integers past 64 bits (checkpoint metadata may hold them) through the stdlib."""
    try:
        return orjson.dumps(row) + b"\n"
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise
        return json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode() + b"\n"


async def open_snapshots(state: GatewayState, stack: AsyncExitStack) -> dict[Database, AsyncConnection]:
    """One read-only snapshot connection per database the capabilities use."""
    out: dict[Database, AsyncConnection] = {}
    for capability in state.capabilities:
        db = capability.database
        if db in out:
            continue
        engine = state.databases.engine(db)
        if state.databases.dialect(db) == "postgresql":
            engine = engine.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        conn = await stack.enter_async_context(engine.connect())
        await conn.begin()
        if state.databases.dialect(db) == "postgresql":
            await conn.execute(text("SELECT 1"))
        else:  # the snapshot of a WAL read transaction starts at its first read
            await conn.execute(text("SELECT count(*) FROM sqlite_schema"))
        out[db] = conn
    return out


async def _items(state: GatewayState, conns: dict[Database, AsyncConnection], namespace: str) -> AsyncIterator[tuple[str, Rows | Blob]]:
    for capability in state.capabilities:
        data = capability.namespace_data
        service = state.services[capability.name]
        async for item in data.export(service, conns[capability.database], namespace, BATCH):
            yield capability.name, item


async def inventory(state: GatewayState, conns: dict[Database, AsyncConnection], namespace: str) -> dict[str, dict[str, Counted]]:
    """Per capability and part, the lines (and per collection) and their bytes; ``blobs`` for bytes."""
    out: dict[str, dict[str, Counted]] = {c.name: {} for c in state.capabilities}
    async for name, item in _items(state, conns, namespace):
        parts = out[name]
        if isinstance(item, Blob):
            parts.setdefault("blobs", Counted()).add(item.size, None)
            continue
        counted = parts.setdefault(item.table, Counted())
        for row in item.rows:
            collection = row.get("collection")
            counted.add(len(line_of(row)), collection if isinstance(collection, str) else None)
    return out


def build_manifest(state: GatewayState, namespace: str, counts: dict[str, dict[str, Counted]]) -> dict[str, Any]:
    databases = state.databases
    capabilities = {}
    for capability in state.capabilities:
        parts = counts[capability.name]
        capabilities[capability.name] = {
            "version": 1,
            "database": capability.database.value,
            "parts": {name: parts[name].as_json() for name in (*capability.namespace_data.parts, "blobs") if name in parts},
        }
    return {
        "format": FORMAT,
        "version": VERSION,
        "minor": MINOR,
        "namespace": namespace,
        "created_at": datetime.now(UTC).isoformat(),
        "source": {
            "gateway": __version__,
            "backends": {db.value: databases.dialect(db) for db in Database},
            "files_backend": getattr(getattr(state.services.get("files"), "blobs", None), "backend", None),
        },
        "snapshot": {"cut": "per_database"},
        "bounds": {"part_bytes": PART_BYTES, "part_lines": PART_LINES},
        "capabilities": capabilities,
        "totals": {
            "items": sum(c.count for parts in counts.values() for n, c in parts.items() if n != "blobs"),
            "bytes": sum(c.bytes for parts in counts.values() for c in parts.values()),
        },
    }


Progress = Callable[[str, int, int], None]
"""Told (capability, lines, bytes) as each member is written."""


async def export_archive(
    state: GatewayState, namespace: str, *, on_manifest: Callable[[dict[str, Any]], None] | None = None,
    progress: Progress | None = None, part_bytes: int = PART_BYTES, part_lines: int = PART_LINES,
) -> AsyncGenerator[bytes, None]:
    """The archive of ``namespace``, piece by piece (each at most a part or a piece of a file)."""
    async with AsyncExitStack() as stack:
        conns = await open_snapshots(state, stack)
        started = time.monotonic()
        manifest = build_manifest(state, namespace, await inventory(state, conns, namespace))
        manifest["snapshot"]["inventory_seconds"] = round(time.monotonic() - started, 3)
        if on_manifest is not None:
            on_manifest(manifest)
        members: list[dict[str, Any]] = []

        def header(name: str, data: bytes, lines: int | None) -> bytes:
            digest = hashlib.sha256(data).hexdigest()
            members.append({"name": name, "sha256": digest, "bytes": len(data), **({"lines": lines} if lines is not None else {})})
            return member_header(name, len(data), digest, lines)

        manifest_bytes = orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n"
        yield header("manifest.json", manifest_bytes, None) + manifest_bytes + padding(len(manifest_bytes))

        numbers: dict[tuple[str, str], int] = {}
        buffer: list[bytes] = []
        size = 0
        current: tuple[str, str] | None = None

        def flush() -> bytes:
            nonlocal buffer, size
            assert current is not None
            number = numbers.get(current, 0) + 1
            numbers[current] = number
            data = b"".join(buffer)
            lines = len(buffer)
            buffer, size = [], 0
            name = f"{current[0]}/{current[1]}/{number:06d}.jsonl"
            if progress is not None:
                progress(current[0], lines, len(data))
            return header(name, data, lines) + data + padding(len(data))

        async for cap, item in _items(state, conns, namespace):
            if isinstance(item, Blob):
                if buffer:
                    yield flush()
                yield await _blob_header(cap, item, members)
                written = 0
                digest = hashlib.sha256()
                async for piece in item.open():
                    written += len(piece)
                    if written > item.size:
                        raise RuntimeError(f"{cap}: blob {item.sha256} holds more than its {item.size} bytes")
                    digest.update(piece)
                    yield piece
                if written != item.size or digest.hexdigest() != item.sha256:
                    # the archive is cut here: an importer refuses it as truncated or corrupt
                    raise RuntimeError(f"{cap}: blob {item.sha256} does not match its stored size and sha256")
                if progress is not None:
                    progress(cap, 0, item.size)
                yield padding(item.size)
                continue
            key = (cap, item.table)
            if key != current and buffer:
                yield flush()
            current = key
            for row in item.rows:
                line = line_of(row)
                if buffer and (size + len(line) > part_bytes or len(buffer) >= part_lines):
                    yield flush()
                buffer.append(line)
                size += len(line)
        if buffer:
            yield flush()
        checksums = orjson.dumps(
            {"manifest_sha256": members[0]["sha256"], "members": members}, option=orjson.OPT_INDENT_2
        ) + b"\n"
        digest = hashlib.sha256(checksums).hexdigest()
        yield member_header("checksums.json", len(checksums), digest) + checksums + padding(len(checksums)) + END


async def _blob_header(cap: str, blob: Blob, members: list[dict[str, Any]]) -> bytes:
    name = f"{cap}/blobs/{blob.sha256}"
    members.append({"name": name, "sha256": blob.sha256, "bytes": blob.size})
    return member_header(name, blob.size, blob.sha256)
