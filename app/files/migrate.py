"""``storage-gateway files migrate --to s3|database|directory``: move stored files between backends.

One file at a time: its bytes are copied to the target backend under a new blob id, then one
transaction points the row at the copy (only if the file did not change meanwhile), then the
source bytes are dropped. Readers see the old bytes or the new ones, never neither, so gateways
keep serving throughout. An interrupted run leaves every file either moved or untouched; running
the command again moves what is left (it selects the rows not yet on the target).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TextIO

from app.core.config import Database, Settings
from app.files.settings import FilesBackendName
from app.core.db.databases import Databases
from app.files.backend import backend_for
from app.files.s3 import S3Objects
from app.files.service import FilesService

Target = FilesBackendName  # where ``--to`` sends the bytes: any files backend
PAGE = 100


@dataclass
class MoveReport:
    moved: int = 0
    moved_bytes: int = 0
    skipped: int = 0  # changed or deleted while being copied; a later run picks them up
    remaining: int = 0


class Progress:
    """A one-line progress bar on a terminal (a line per 5% elsewhere)."""

    def __init__(self, total_files: int, total_bytes: int, out: TextIO) -> None:
        self.total_files, self.total_bytes, self.out = total_files, total_bytes, out
        self.tty = out.isatty()
        self._last_step = -1
        self._started = time.monotonic()

    def show(self, files: int, done_bytes: int) -> None:
        if self.total_bytes:
            fraction = min(done_bytes / self.total_bytes, 1.0)
        else:
            fraction = files / self.total_files if self.total_files else 1.0
        step = int(fraction * 20)
        if not self.tty and step == self._last_step and files != self.total_files:
            return
        self._last_step = step
        elapsed = max(time.monotonic() - self._started, 1e-6)
        bar = "#" * step + "." * (20 - step)
        line = (f"[{bar}] {files}/{self.total_files} files, {done_bytes / 2**20:.1f}/"
                f"{self.total_bytes / 2**20:.1f} MiB, {done_bytes / 2**20 / elapsed:.1f} MiB/s")
        self.out.write(("\r" + line) if self.tty else line + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.tty:
            self.out.write("\n")


async def migrate_files(settings: Settings, to: Target, *, limit: int | None = None,
                        out: TextIO = sys.stderr) -> MoveReport:
    """Move every file not yet on ``to`` (at most ``limit`` of them)."""
    if to == "s3" and not settings.files.s3.bucket:
        raise ValueError("files.s3.bucket is not set: moving files to s3 needs the bucket")
    target = settings.model_copy(update={"files": settings.files.model_copy(update={"backend": to})})
    databases = Databases.open(target)
    # Files already in the bucket are read from it: without files.s3.bucket they stay where they are.
    objects = await S3Objects.open(target.files.s3) if target.files.s3.bucket else None
    try:
        if objects is not None:
            await objects.check()
        engine = databases.engine(Database.metadata)
        service = FilesService(engine, backend_for(databases.dialect(Database.metadata)), target, objects)
        async with engine.connect() as conn:
            total_files, total_bytes = await service.repo.move_totals(conn, target=to)
        if limit is not None:
            total_files = min(total_files, limit)
        report = MoveReport()
        progress = Progress(total_files, total_bytes, out)
        progress.show(0, 0)
        after: tuple[str, str, str] | None = None
        while limit is None or report.moved + report.skipped < limit:
            async with engine.connect() as conn:
                page = await service.repo.to_move(conn, target=to, after=after, limit=PAGE)
            if not page:
                break
            for namespace, collection, row in page:
                if limit is not None and report.moved + report.skipped >= limit:
                    break
                after = (namespace, collection, row.file_id)
                if await service.move(namespace, collection, row):
                    report.moved += 1
                    report.moved_bytes += row.size
                else:
                    report.skipped += 1
                progress.show(report.moved + report.skipped, report.moved_bytes)
        progress.close()
        async with engine.connect() as conn:
            report.remaining = (await service.repo.move_totals(conn, target=to))[0]
        return report
    finally:
        if objects is not None:
            await objects.close()
        await databases.close()

