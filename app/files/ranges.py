"""``Range: bytes=...`` (RFC 9110 section 14): one range is served as 206, anything else as 200.

Only a single byte range is honoured; a header with several ranges, another unit or bad syntax
is ignored (the whole file is sent with 200), as RFC 9110 allows. A well-formed range that lies
wholly outside the file is ``RangeNotSatisfiable`` (416 with ``Content-Range: bytes */size``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.core.errors import RangeNotSatisfiable

_RANGE_RE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class ByteRange:
    """Inclusive ``start``..``end``; ``end < start`` only for the empty whole of an empty file."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start + 1


def whole(size: int) -> ByteRange:
    return ByteRange(0, size - 1)


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The single range ``header`` asks for, ``None`` to send everything, or 416."""
    if header is None:
        return None
    match = _RANGE_RE.match(header)
    if not match:
        return None  # several ranges, another unit, or bad syntax: ignored
    first, last = match.groups()
    if first == "" and last == "":
        return None
    if first == "":
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise _unsatisfiable(size)
        return ByteRange(max(0, size - suffix), size - 1)
    start = int(first)
    end = int(last) if last != "" else size - 1
    if last != "" and end < start:
        return None  # invalid range: ignored
    if start >= size:
        raise _unsatisfiable(size)
    return ByteRange(start, min(end, size - 1))


def _unsatisfiable(size: int) -> RangeNotSatisfiable:
    return RangeNotSatisfiable(
        f"the requested range is outside the file's {size} bytes",
        headers={"Content-Range": f"bytes */{size}"},
    )
