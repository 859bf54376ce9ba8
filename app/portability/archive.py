"""The archive's tar framing, both ways, as plain async code over bytes.

Writing: each member is a PAX header (stdlib ``tarfile.TarInfo.tobuf``) carrying the member's
sha256 and line count (``SG.sha256``, ``SG.lines``), its bytes, and the padding to 512; the
archive ends with two zero blocks. Reading: ``ArchiveReader`` parses the same headers from an
async byte stream, one member at a time, never holding more than the member piece asked for.
Only regular files with safe relative names are accepted (no links, devices, ``..``, absolute
paths, backslashes or NUL); anything else, a bad header or a missing end is an ``ArchiveError``
naming the member.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

from app.core.errors import ProblemError

BLOCK = 512
SHA256_HEADER = "SG.sha256"
LINES_HEADER = "SG.lines"
MAX_PAX_BYTES = 64 * 1024  # a PAX extended header is a few named values, never large


class ArchiveError(ProblemError):
    """The archive is malformed or refused: ``code`` says how, ``member`` where (422)."""

    status, code, title = 422, "archive_invalid", "Unprocessable Content"

    def __init__(self, code: str, message: str, member: str | None = None) -> None:
        where = f"{member}: " if member else ""
        super().__init__(f"{where}{message}", code=code, errors=[{"loc": ["archive", member or ""], "msg": message}])
        self.member = member


class ArchiveTooLarge(ArchiveError):
    """A member over its bound (413)."""

    status, title = 413, "Content Too Large"


def member_header(name: str, size: int, sha256: str, lines: int | None = None) -> bytes:
    """The PAX header blocks of a regular member ``name`` of ``size`` bytes."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0  # members do not depend on when they were written: equal data, equal bytes
    pax = {SHA256_HEADER: sha256}
    if lines is not None:
        pax[LINES_HEADER] = str(lines)
    info.pax_headers = pax
    return info.tobuf(tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


END = b"\0" * (2 * BLOCK)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


def safe_name(name: str) -> bool:
    """A relative path of plain segments (no ``..``, no absolute path, backslash or NUL)."""
    return bool(_SAFE_NAME.fullmatch(name)) and ".." not in name.split("/") and len(name) <= 255


@dataclass
class Member:
    name: str
    size: int
    sha256: str | None
    lines: int | None


class ArchiveReader:
    """Members of a tar read from ``source`` (an async iterator of byte pieces), in order."""

    def __init__(self, source: AsyncIterator[bytes]) -> None:
        self._source = source
        self._buffer = bytearray()
        self._eof = False
        self.received = 0
        self.last: str | None = None  # the last member whose header was read

    async def _fill(self, n: int) -> bool:
        while len(self._buffer) < n and not self._eof:
            try:
                piece = await anext(self._source)
            except StopAsyncIteration:
                self._eof = True
                break
            self.received += len(piece)
            self._buffer += piece
        return len(self._buffer) >= n

    async def _take(self, n: int) -> bytes:
        if not await self._fill(n):
            raise ArchiveError("archive_truncated", f"the archive ends inside {self.last or 'its first header'}", self.last)
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    async def _block(self) -> bytes | None:
        """The next header block, or None at the end-of-archive marker."""
        if not await self._fill(BLOCK):
            raise ArchiveError(
                "archive_truncated", f"the archive ends after {self.last or 'nothing'} without its end marker", self.last
            )
        block = await self._take(BLOCK)
        if block == b"\0" * BLOCK:
            return None
        return block

    async def next(self) -> Member | None:
        """The next member's header (its data is then read with ``read``/``pieces``), or None
        at the end of the archive."""
        block = await self._block()
        if block is None:
            return None
        pax: dict[str, str] = {}
        info = self._parse(block)
        if info.type == tarfile.XHDTYPE:
            if info.size > MAX_PAX_BYTES:
                raise ArchiveTooLarge("archive_member_too_large", "a PAX header is too large", self.last)
            pax = self._pax(await self._take(info.size + len(padding(info.size))), info.size)
            block = await self._block()
            if block is None:
                raise ArchiveError("archive_corrupt", "a PAX header without its member", self.last)
            info = self._parse(block)
        name = pax.get("path", info.name)
        self.last = name
        if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            raise ArchiveError("archive_unsafe_member", f"member {name!r} is not a regular file", name)
        if not safe_name(name):
            raise ArchiveError("archive_unsafe_member", f"member name {name!r} is not a safe relative path", name)
        raw_size = pax.get("size", str(info.size))
        if not raw_size.isdigit() or len(raw_size) > 18:
            raise ArchiveError("archive_corrupt", f"member {name!r} has no valid size", name)
        size = int(raw_size)
        lines = pax.get(LINES_HEADER)
        return Member(name, size, pax.get(SHA256_HEADER), int(lines) if lines is not None and lines.isdigit() else None)

    def _parse(self, block: bytes) -> tarfile.TarInfo:
        try:
            return tarfile.TarInfo.frombuf(block, "utf-8", "strict")
        except (tarfile.HeaderError, UnicodeDecodeError) as exc:
            raise ArchiveError("archive_corrupt", f"a bad tar header after {self.last or 'the start'}: {exc}", self.last) from None

    def _pax(self, data: bytes, size: int) -> dict[str, str]:
        out: dict[str, str] = {}
        raw = data[:size]
        pos = 0
        try:
            while pos < len(raw):
                space = raw.index(b" ", pos)
                length = int(raw[pos:space])
                record = raw[space + 1:pos + length - 1].decode("utf-8")
                key, _, value = record.partition("=")
                out[key] = value
                pos += length
        except (ValueError, UnicodeDecodeError):
            raise ArchiveError("archive_corrupt", "a malformed PAX header", self.last) from None
        return out

    async def read(self, member: Member) -> bytes:
        """The whole data of ``member`` (the caller bounded its size first)."""
        data = await self._take(member.size)
        await self._take(len(padding(member.size)))
        return data

    async def pieces(self, member: Member, piece: int = 1 << 20) -> AsyncIterator[bytes]:
        """The data of ``member`` in pieces of at most ``piece`` bytes."""
        left = member.size
        while left:
            n = min(piece, left)
            yield await self._take(n)
            left -= n
        await self._take(len(padding(member.size)))
