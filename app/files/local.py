"""The local directory of ``files.backend: directory``: every call the gateway makes to it.

A version's bytes are one file, ``{root}/{sha256(namespace)[:16]}/{blob_id}``. It is written as
``{blob_id}.part`` and renamed once whole (flushed to disk first, unless
``files.directory.fsync`` is off), so a name without ``.part`` always holds a complete version;
the rename happens before the row that points at it commits. A row points at it with the key
``/{segment}/{blob_id}``: the leading ``/`` tells it from an S3 key (``files.s3.prefix`` cannot
start with one) and from chunks in the database (no key). Keys are derived only from values the
gateway controls, and checked against their pattern before they become paths.

Every function here blocks: the sink and the reader (``app.files.storage``) call them in worker
threads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from app.files.s3 import ObjectMissing, namespace_segment

LOCAL_KEY_PREFIX = "/"
_KEY = re.compile(r"^/([0-9a-f]{16})/([0-9a-f]{32})$")
_NAME = re.compile(r"^([0-9a-f]{32})(\.part)?$")
_PART = ".part"


def is_local_key(key: str | None) -> bool:
    """Whether a row's ``object_key`` names a file of the local directory."""
    return key is not None and key.startswith(LOCAL_KEY_PREFIX)


@dataclass(frozen=True)
class ListedFile:
    path: Path
    blob_id: str
    modified: datetime


class LocalFiles:
    """The directory (created with the first file written to it) and how files are named in it."""

    def __init__(self, root: Path, *, fsync: bool) -> None:
        self.root = root
        self.fsync = fsync

    def key_for(self, namespace: str, blob_id: str) -> str:
        return f"{LOCAL_KEY_PREFIX}{namespace_segment(namespace)}/{blob_id}"

    def path(self, key: str) -> Path:
        match = _KEY.match(key)
        if match is None:
            raise ValueError(f"not a key of the local files directory: {key!r}")
        return self.root / match.group(1) / match.group(2)

    # --- writing ---------------------------------------------------------------------------

    def open_part(self, key: str) -> int:
        """A new, empty ``.part`` file for ``key``: its descriptor."""
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(f"{path}{_PART}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)

    @staticmethod
    def append(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def complete(self, fd: int, key: str) -> None:
        """Flush and close ``fd`` (the ``.part`` of ``key``), then give it its final name."""
        path = self.path(key)
        try:
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(f"{path}{_PART}", path)
        if self.fsync:  # the rename itself survives a power cut only once its directory is flushed
            directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    def finish(self, key: str, tail: bytes, fd: int | None = None) -> None:
        """The last piece appended to ``fd`` (``key``'s ``.part`` from ``open_part``; a new one
        when None: a version of one piece), then flushed and named, in one call (one thread hop)."""
        if fd is None:
            fd = self.open_part(key)
        try:
            self.append(fd, tail)
        except BaseException:
            os.close(fd)
            raise
        self.complete(fd, key)

    def discard(self, key: str) -> None:
        """Remove ``key``'s file and its ``.part``, whichever exist."""
        path = self.path(key)
        for name in (f"{path}{_PART}", str(path)):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass

    # --- reading ---------------------------------------------------------------------------

    def open_read(self, key: str) -> int:
        """A descriptor of ``key``'s file (it stays readable if the file is removed meanwhile);
        ``ObjectMissing`` when it is gone (its version was replaced since its row was read)."""
        try:
            return os.open(self.path(key), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ObjectMissing(key) from None

    @staticmethod
    def read(fd: int, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (a file that ends sooner is an error, never sent)."""
        data = os.pread(fd, length, offset)
        while len(data) < length:
            more = os.pread(fd, length - len(data), offset + len(data))
            if not more:
                raise RuntimeError(f"a stored file ended after {offset + len(data)} bytes")
            data += more
        return data

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """``read`` of a file opened and closed in the same call."""
        fd = self.open_read(key)
        try:
            return self.read(fd, offset, length)
        finally:
            os.close(fd)

    # --- sweeping --------------------------------------------------------------------------

    def listed(self, batch: int = 1000) -> Iterator[list[ListedFile]]:
        """Every file the gateway wrote (whole or ``.part``), ``batch`` at a time."""
        page: list[ListedFile] = []
        try:
            segments = list(os.scandir(self.root))
        except FileNotFoundError:
            return
        for segment in segments:
            if not segment.is_dir(follow_symlinks=False) or not re.fullmatch(r"[0-9a-f]{16}", segment.name):
                continue
            with os.scandir(segment.path) as entries:
                for entry in entries:
                    match = _NAME.match(entry.name)
                    if match is None or not entry.is_file(follow_symlinks=False):
                        continue
                    try:
                        modified = datetime.fromtimestamp(entry.stat(follow_symlinks=False).st_mtime, UTC)
                    except FileNotFoundError:
                        continue
                    page.append(ListedFile(Path(entry.path), match.group(1), modified))
                    if len(page) >= batch:
                        yield page
                        page = []
        if page:
            yield page

    @staticmethod
    def remove(path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def writable(self) -> str | None:
        """None when files can be written here, else why not."""
        probe = self.root if self.root.exists() else self.root.parent
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not os.access(probe, os.W_OK | os.X_OK):
            return f"{probe} is not writable"
        return None
