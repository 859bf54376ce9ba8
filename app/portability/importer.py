"""Import an archive (docs/archive-format.md) into an empty namespace, streamed.

Rules: the namespace must hold nothing (409 ``namespace_not_empty``). The archive loads into a
hidden staging namespace and is published only once all of it is checked (``staging``): until
then readers of the namespace see nothing of it, and a killed import, sent again, starts over
from a clean staging (or, killed while publishing, finishes the publish). Each member is bounded
before it is read and checked before anything of it is written: a part's sha256 and line count
against its PAX header, each line by the capability's loader (as the API checks a write), a
blob's bytes against its name. A part commits in write transactions of ``LOAD_ROWS`` lines, so
no other writer of the database waits for a whole part. Whatever goes wrong (a
corrupt, truncated or lying archive, a refused line, the client gone), the staging namespace is
deleted again (``delete_namespace``) before the error is answered; the namespace was never touched. The manifest's counts, and ``checksums.json``'s list, are checked
at the end.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import IO, Any, TypeVar

import anyio
import orjson
from sqlalchemy import exists, select
from sqlalchemy.exc import IntegrityError

from app.core.errors import Conflict, ProblemError
from app.core.jsonvalue import find_invalid
from app.core.namespace_data import RefusedLine, Rows, writer
from app.core.state import GatewayState
from app.portability.archive import SHA256_HEADER, ArchiveError, ArchiveReader, ArchiveTooLarge, Member
from app.portability import staging
from app.portability.exporter import FORMAT, VERSION

MAX_MANIFEST_BYTES = 1024 * 1024
MAX_PART_BYTES = 16 * 1024 * 1024
MAX_CHECKSUMS_BYTES = 64 * 1024 * 1024
SPOOL_BYTES = 1024 * 1024  # a blob up to this stays in memory while it is checked; larger ones go to a temporary file
PIECE = 1024 * 1024
LOAD_ROWS = 500  # lines a write transaction loads: SQLite's write lock is not held for a whole part

_PART = re.compile(r"^([a-z][a-z0-9_]*)/([a-z][a-z0-9_]*)/(\d{6})\.jsonl$")
_BLOB = re.compile(r"^([a-z][a-z0-9_]*)/blobs/([0-9a-f]{64})$")

_T = TypeVar("_T")
importing: set[str] = set()  # namespaces this process is importing into


class NamespaceNotEmpty(Conflict):
    code = "namespace_not_empty"


async def holds_data(state: GatewayState, namespace: str) -> bool:
    """Whether any capability has a row of ``namespace`` (its namespaced tables)."""
    for capability in state.capabilities:
        async with state.databases.engine(capability.database).connect() as conn:
            for table in capability.tables:
                if await conn.scalar(select(exists().where(table.c.namespace == namespace))):
                    return True
    return False


Progress = Callable[[str, int, int], None]


async def import_archive(
    state: GatewayState, namespace: str, source: AsyncIterator[bytes], *, progress: Progress | None = None,
) -> dict[str, Any]:
    """Load the archive read from ``source`` into ``namespace`` (empty); what was loaded. If an
    import of ``namespace`` was killed while it was published, that publish is finished instead
    and ``source`` is not read (``"resumed": "publish"``)."""
    if namespace in importing:
        raise Conflict(f"an import into {namespace!r} is already running", code="import_in_progress")
    importing.add(namespace)  # before the first await: two requests at once cannot both pass
    started = time.monotonic()
    try:
        previous = await staging.pending(state, namespace)
        if previous is not None and previous.state == "publishing":
            published = await staging.publish(state, previous)
            return {"namespace": namespace, "resumed": "publish", "published": published,
                    "seconds": round(time.monotonic() - started, 3)}
        await _refuse_data(state, namespace)
        job = await staging.begin(state, namespace, previous)
        try:
            loaded = await _Import(state, job.staging, source, progress, staging.Heartbeat(state, job)).run()
            await _refuse_data(state, namespace)  # written to while the archive loaded
            await staging.claim(state, job)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await staging.abandon(state, job)
            raise
        loaded["namespace"] = namespace
        loaded["published"] = await staging.publish(state, job)
    finally:
        importing.discard(namespace)
    loaded["seconds"] = round(time.monotonic() - started, 3)
    return loaded


async def _refuse_data(state: GatewayState, namespace: str) -> None:
    if await holds_data(state, namespace):
        raise NamespaceNotEmpty(
            f"namespace {namespace!r} holds data; an archive is imported into an empty namespace only (mode=fail)"
        )


class _Import:
    def __init__(
        self, state: GatewayState, namespace: str, source: AsyncIterator[bytes], progress: Progress | None,
        heartbeat: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.state = state
        self.heartbeat = heartbeat
        self.namespace = namespace
        self.reader = ArchiveReader(source)
        self.progress = progress
        self.by_name = {c.name: c for c in state.capabilities}
        self.seen: list[dict[str, Any]] = []
        self.loaded: dict[str, dict[str, list[Any]]] = {}  # cap -> part -> [count, {collection: count}]
        self.contexts: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.done: set[str] = set()
        self.manifest_parts: dict[str, dict[str, Any]] = {}
        self.names: set[str] = set()  # the parts read (blobs may come again, after a later batch of rows)

    async def _bounded(self, member: Member, limit: int) -> bytes:
        if member.size > limit:
            raise ArchiveTooLarge("archive_member_too_large", f"{member.size} bytes; at most {limit} are accepted", member.name)
        if member.sha256 is None and member.name != "checksums.json":
            raise ArchiveError("archive_corrupt", f"its header carries no {SHA256_HEADER}", member.name)
        data = await self.reader.read(member)
        digest = await _off_loop(lambda: hashlib.sha256(data).hexdigest(), len(data))
        if member.sha256 is not None and digest != member.sha256:
            raise ArchiveError("archive_corrupt", f"its sha256 is {digest}, its header says {member.sha256}", member.name)
        self.seen.append({"name": member.name, "sha256": digest, "bytes": len(data)})
        return data

    async def run(self) -> dict[str, Any]:
        first = await self.reader.next()
        if first is None or first.name != "manifest.json":
            raise ArchiveError("archive_member_missing", "the archive must begin with manifest.json",
                               first.name if first else "manifest.json")
        raw = await self._bounded(first, MAX_MANIFEST_BYTES)
        try:
            manifest = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ArchiveError("archive_corrupt", "manifest.json is not JSON", "manifest.json") from None
        self._check_manifest(manifest)
        capabilities: dict[str, Any] = manifest["capabilities"]
        self.manifest_parts = {cap: entry["parts"] for cap, entry in capabilities.items()}
        self.order = [name for name in self.by_name if name in capabilities]
        for name in self.order:  # what the loaders may need to know about where the archive came from
            self.contexts[name] = {"source": manifest.get("source") or {}}
        while True:
            member = await self.reader.next()
            if member is None:
                raise ArchiveError("archive_member_missing", "the archive ends without checksums.json", "checksums.json")
            if member.name == "checksums.json":
                await self._checksums(member, raw)
                break
            if (part := _PART.fullmatch(member.name)) is not None:
                await self._part(member, part.group(1), part.group(2))
            elif (blob := _BLOB.fullmatch(member.name)) is not None:
                await self._blob(member, blob.group(1), blob.group(2))
            else:
                raise ArchiveError("archive_unknown_member", "not a member of this format", member.name)
        if await self.reader.next() is not None:
            raise ArchiveError("archive_corrupt", "members after checksums.json", self.reader.last)
        for name in self.order:
            await self._finish(name)
        self._check_counts(capabilities)
        return {
            "namespace": self.namespace,
            "loaded": {cap: {part: v[0] for part, v in parts.items()} for cap, parts in self.loaded.items()},
            "members": len(self.seen),
            "bytes": self.reader.received,
            "source": manifest.get("source"),
        }

    def _check_manifest(self, manifest: Any) -> None:
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ArchiveError("archive_invalid", f"manifest.json is not a {FORMAT} manifest", "manifest.json")
        version = manifest.get("version")
        if not isinstance(version, int) or version > VERSION or version < 1:
            raise ArchiveError("archive_version_unsupported", f"format version {version!r}; this gateway reads {VERSION}", "manifest.json")
        caps = manifest.get("capabilities")
        if not isinstance(caps, dict) or not all(isinstance(v, dict) and isinstance(v.get("parts"), dict) for v in caps.values()):
            raise ArchiveError("archive_invalid", "manifest.json has no capabilities with their parts", "manifest.json")
        unknown = sorted(set(caps) - set(self.by_name))
        if unknown:
            raise ArchiveError("archive_unknown_capability", f"this gateway does not serve {', '.join(unknown)}", "manifest.json")
        for cap, entry in caps.items():
            if entry.get("version", 1) != 1:
                raise ArchiveError("archive_version_unsupported", f"{cap} version {entry.get('version')!r}", "manifest.json")
            for part, counted in entry["parts"].items():
                if not isinstance(counted, dict) or not isinstance(counted.get("count"), int):
                    raise ArchiveError("archive_invalid", f"{cap}/{part} has no count", "manifest.json")
                collections = counted.get("collections", {})
                if not isinstance(collections, dict) or not all(
                    isinstance(c, dict) and isinstance(c.get("count"), int) for c in collections.values()
                ):
                    raise ArchiveError("archive_invalid", f"{cap}/{part} has collections without counts", "manifest.json")
        source = manifest.get("source")
        if source is not None and (not isinstance(source, dict) or not isinstance(source.get("backends", {}), dict)):
            raise ArchiveError("archive_invalid", "manifest.json's source is not an object with backends", "manifest.json")

    def _enter(self, cap: str, member: str) -> None:
        """Capabilities come in the gateway's order, each once."""
        if cap not in self.order:
            raise ArchiveError("archive_manifest_mismatch", f"capability {cap!r} is not in the manifest", member)
        if cap in self.done:
            raise ArchiveError("archive_corrupt", f"{cap} again after a later capability", member)
        for earlier in self.order[: self.order.index(cap)]:
            self.done.add(earlier)

    async def _finish(self, cap: str) -> None:
        capability = self.by_name[cap]
        ctx = self.contexts.setdefault(cap, {})
        if ctx.get("finished"):
            return
        ctx["finished"] = True
        try:
            await capability.namespace_data.finish(
                self.state.services[cap], self.state.databases.engine(capability.database), self.namespace, ctx
            )
        except RefusedLine as exc:
            raise ArchiveError("archive_member_missing", str(exc), cap) from None

    async def _part(self, member: Member, cap: str, part: str) -> None:
        self._enter(cap, member.name)
        if member.name in self.names:
            raise ArchiveError("archive_corrupt", "the member appears twice", member.name)
        self.names.add(member.name)
        for earlier in list(self.done):
            await self._finish(earlier)
        data = await self._bounded(member, MAX_PART_BYTES)
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        if member.lines is None or member.lines != len(lines):
            raise ArchiveError("archive_corrupt", f"{len(lines)} lines, its header says {member.lines}", member.name)

        def parse() -> list[dict[str, Any]]:
            rows = []
            for n, line in enumerate(lines, 1):
                try:
                    row = _loads(line)
                except (ValueError, RecursionError):
                    raise ArchiveError("archive_invalid_line", f"line {n} is not JSON", member.name) from None
                if not isinstance(row, dict):
                    raise ArchiveError("archive_invalid_line", f"line {n} is not a JSON object", member.name)
                invalid = find_invalid(row, f"line {n}")  # a lone surrogate cannot be stored (nor 1e999)
                if invalid is not None:
                    raise ArchiveError("archive_invalid_line", f"{invalid[0]}: {invalid[1]}", member.name)
                rows.append(row)
            return rows

        rows = await _off_loop(parse, len(data))
        self.seen[-1]["lines"] = len(rows)
        capability = self.by_name[cap]
        if part not in capability.namespace_data.parts:
            raise ArchiveError("archive_unknown_member", f"{cap} has no part {part!r}", member.name)
        counted = self.loaded.setdefault(cap, {}).setdefault(part, [0, {}])
        for row in rows:
            collection = row.get("collection")
            if isinstance(collection, str):
                counted[1][collection] = counted[1].get(collection, 0) + 1
        counted[0] += len(rows)
        declared = self.manifest_parts.get(cap, {}).get(part)
        if declared is None or counted[0] > declared.get("count", 0):  # fail as soon as a count passes the manifest's
            raise ArchiveError(
                "archive_manifest_mismatch", f"{cap}/{part}: more lines than the manifest counts "
                f"({declared.get('count') if declared else 'none'})", member.name,
            )
        ctx = self.contexts.setdefault(cap, {})
        try:
            engine = writer(self.state.databases.engine(capability.database))
            for start in range(0, len(rows), LOAD_ROWS):  # a write lock is held for a slice at a time
                async with engine.begin() as conn:
                    await capability.namespace_data.load(
                        self.state.services[cap], conn, self.namespace, Rows(part, tuple(rows[start:start + LOAD_ROWS])), ctx
                    )
        except RefusedLine as exc:
            raise ArchiveError("archive_invalid_line", str(exc), member.name) from None
        except ProblemError as exc:
            if isinstance(exc, ArchiveError):
                raise
            raise ArchiveError("archive_invalid_line", str(exc), member.name) from None
        except IntegrityError:  # two lines of one item (a key twice), or a reference to nothing
            raise ArchiveError("archive_invalid_line", "the database refused its lines: an item twice?", member.name) from None
        if self.heartbeat is not None:
            await self.heartbeat()
        staging.crash_point(f"load:{member.name}")
        if self.progress is not None:
            self.progress(cap, len(rows), len(data))

    async def _blob(self, member: Member, cap: str, sha256: str) -> None:
        self._enter(cap, member.name)
        if member.sha256 != sha256:
            raise ArchiveError("archive_corrupt", f"its header's {SHA256_HEADER} is not its name", member.name)
        limit = self.state.settings.limits.max_file_bytes
        if member.size > limit:  # refused from its header, before a byte of it is read
            raise ArchiveTooLarge("archive_member_too_large", f"{member.size} bytes; files are at most {limit}", member.name)
        capability = self.by_name[cap]
        spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
        try:
            digest = hashlib.sha256()
            async for piece in self.reader.pieces(member, PIECE):
                digest.update(piece)
                await _run(spool.write, piece)
            if digest.hexdigest() != sha256:
                raise ArchiveError("archive_corrupt", f"its bytes' sha256 is {digest.hexdigest()}", member.name)
            self.seen.append({"name": member.name, "sha256": sha256, "bytes": member.size})
            counted = self.loaded.setdefault(cap, {}).setdefault("blobs", [0, {}])
            counted[0] += 1

            async def data() -> AsyncIterator[bytes]:
                await _run(spool.seek, 0)
                while piece := await _run(spool.read, PIECE):
                    yield piece

            try:
                await capability.namespace_data.load_blob(
                    self.state.services[cap], self.namespace, sha256, data, self.contexts.setdefault(cap, {})
                )
            except RefusedLine as exc:
                raise ArchiveError("archive_invalid_line", str(exc), member.name) from None
            except ProblemError as exc:
                if isinstance(exc, ArchiveError):
                    raise
                raise ArchiveError("archive_invalid_line", str(exc), member.name) from None
        finally:
            spool.close()
        if self.progress is not None:
            self.progress(cap, 0, member.size)

    async def _checksums(self, member: Member, manifest_raw: bytes) -> None:
        seen = list(self.seen)
        raw = await self._bounded(member, MAX_CHECKSUMS_BYTES)
        try:
            listed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ArchiveError("archive_corrupt", "checksums.json is not JSON", member.name) from None
        if not isinstance(listed, dict) or listed.get("manifest_sha256") != hashlib.sha256(manifest_raw).hexdigest():
            raise ArchiveError("archive_corrupt", "checksums.json does not name this manifest", member.name)
        members = listed.get("members") or []
        expected = [(m["name"], m["sha256"]) for m in seen]
        try:
            got = [(m["name"], m["sha256"]) for m in members]
        except (TypeError, KeyError):
            raise ArchiveError("archive_corrupt", "checksums.json lists no members", member.name) from None
        if got != expected:
            missing = next((name for (name, _), (n2, _) in zip(got, expected, strict=False) if name != n2), None)
            if missing is None:
                missing = got[len(expected)][0] if len(got) > len(expected) else expected[len(got)][0]
            raise ArchiveError("archive_member_missing", "checksums.json lists other members than the archive holds", missing)

    def _check_counts(self, capabilities: dict[str, Any]) -> None:
        for cap, entry in capabilities.items():
            for part, counted in entry["parts"].items():
                got = self.loaded.get(cap, {}).get(part, [0, {}])
                if got[0] != counted["count"]:
                    raise ArchiveError(
                        "archive_manifest_mismatch", f"{cap}/{part}: the manifest counts {counted['count']}, "
                        f"the archive holds {got[0]}", "manifest.json",
                    )
                for collection, c in (counted.get("collections") or {}).items():
                    if got[1].get(collection, 0) != c.get("count"):
                        raise ArchiveError(
                            "archive_manifest_mismatch", f"{cap}/{part} collection {collection!r}: the manifest counts "
                            f"{c.get('count')}, the archive holds {got[1].get(collection, 0)}", "manifest.json",
                        )
        for cap, parts in self.loaded.items():
            for part in parts:
                if part not in capabilities.get(cap, {}).get("parts", {}):
                    raise ArchiveError("archive_manifest_mismatch", f"{cap}/{part} is not in the manifest", "manifest.json")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(line: bytes) -> Any:
    """A line as JSON, numbers as written: the stdlib's parser (orjson reads an integer past 64
    bits as a float), without NaN and Infinity."""
    return json.loads(line, parse_constant=_no_constant)


OFF_LOOP_BYTES = 256 * 1024  # hashing or parsing more than this runs in a thread: the loop serves other requests


async def _off_loop(fn: Callable[[], _T], size: int) -> _T:
    return await asyncio.to_thread(fn) if size > OFF_LOOP_BYTES else fn()


async def _run(fn: Callable[..., Any], *args: Any) -> Any:
    """A file call off the event loop."""
    return await asyncio.to_thread(fn, *args)
