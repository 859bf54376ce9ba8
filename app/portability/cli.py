"""``storage-gateway export NS -o FILE``, ``import NS FILE`` and ``promote --to TARGET``, in-process.

They act on the configured databases directly (``app.main.services``), as ``delete-namespace``
does, with a progress bar per capability on stderr (rich; nothing live when stderr is not a
terminal). The export writes ``FILE.partial`` and renames it at the end, so an interrupted export
leaves no archive; the import prints what it loaded as JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from app.core.names import NAME_PATTERN

PIECE = 1024 * 1024


def _fail(message: str) -> NoReturn:
    print(f"storage-gateway: {message}", file=sys.stderr)
    raise SystemExit(1)


def _bars(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(), DownloadColumn(binary_units=True),
        TransferSpeedColumn(), TimeRemainingColumn(), console=console, transient=False,
    )


class _Tasks:
    """One bar per capability (items from the manifest) and one for all bytes."""

    def __init__(self, bars: Progress, manifest: dict[str, Any]) -> None:
        self.bars = bars
        self.tasks: dict[str, TaskID] = {}
        for cap, entry in manifest.get("capabilities", {}).items():
            total = sum(p.get("count", 0) for name, p in entry.get("parts", {}).items() if name != "blobs")
            self.tasks[cap] = bars.add_task(cap, total=total or None)
        self.all = bars.add_task("bytes", total=manifest.get("totals", {}).get("bytes") or None)

    def advance(self, cap: str, lines: int, n_bytes: int) -> None:
        if cap in self.tasks:
            self.bars.advance(self.tasks[cap], lines)
        self.bars.advance(self.all, n_bytes)


def _check_name(command: str, namespace: str) -> None:
    if not re.fullmatch(NAME_PATTERN, namespace):
        print(f"storage-gateway {command}: {namespace!r} is not a namespace name", file=sys.stderr)
        raise SystemExit(2)


def cmd_export(args: argparse.Namespace, load_settings: Callable[[str | None], Any], preflight: Callable[..., Any]) -> None:
    from app.main import services
    from app.portability.exporter import export_archive

    _check_name("export", args.namespace)
    settings = load_settings(args.config)
    asyncio.run(preflight(settings, migrate_all=False))
    path = Path(args.output or f"{args.namespace}.sgw.tar")
    partial = path.with_name(path.name + ".partial")
    console = Console(stderr=True)

    async def run() -> int:
        written = 0
        out = await asyncio.to_thread(open, partial, "wb")
        with _bars(console) as bars, out:
            tasks: list[_Tasks] = []
            async with services(settings) as state:
                body = export_archive(
                    state, args.namespace, on_manifest=lambda m: tasks.append(_Tasks(bars, m)),
                    progress=lambda cap, lines, n: tasks[0].advance(cap, lines, n),
                )
                async for piece in body:
                    await asyncio.to_thread(out.write, piece)
                    written += len(piece)
        os.replace(partial, path)
        return written

    try:
        written = asyncio.run(run())
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    print(json.dumps({"namespace": args.namespace, "archive": str(path), "bytes": written}))


def cmd_import(args: argparse.Namespace, load_settings: Callable[[str | None], Any], preflight: Callable[..., Any]) -> None:
    from app.core.errors import ProblemError
    from app.main import services
    from app.portability.importer import import_archive

    _check_name("import", args.namespace)
    path = Path(args.archive)
    if not path.is_file():
        _fail(f"import: {path} is not a file")
    settings = load_settings(args.config)
    asyncio.run(preflight(settings, migrate_all=False))
    console = Console(stderr=True)
    size = path.stat().st_size

    async def run() -> dict[str, Any]:
        f = await asyncio.to_thread(open, path, "rb")
        with _bars(console) as bars, f:
            read = bars.add_task("archive", total=size)

            async def pieces() -> AsyncIterator[bytes]:
                while piece := await asyncio.to_thread(f.read, PIECE):
                    bars.advance(read, len(piece))
                    yield piece

            async with services(settings) as state:
                return await import_archive(state, args.namespace, pieces())

    try:
        report = asyncio.run(run())
    except ProblemError as exc:
        _fail(f"import: {exc}")
    print(json.dumps(report))


def cmd_promote(args: argparse.Namespace, load_settings: Callable[[str | None], Any], preflight: Callable[..., Any]) -> None:
    from app.core.errors import ProblemError
    from app.main import services
    from app.portability.promote import (
        PromoteError,
        copy_settings_tables,
        namespaces_of,
        promote_namespace,
        switch_to,
        target_settings,
    )

    source = load_settings(args.config)
    try:
        target = target_settings(source, args.to, args.files)
    except (PromoteError, ValueError) as exc:
        print(f"storage-gateway promote: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    asyncio.run(preflight(source, migrate_all=False))
    asyncio.run(preflight(target, migrate_all=True))  # Alembic upgrade head on the target's three databases
    console = Console(stderr=True)

    async def run() -> dict[str, Any]:
        results = []
        async with services(source) as src, services(target) as dst:
            names = await namespaces_of(src)
            if args.namespaces:
                names = [n for n in names if n in set(args.namespaces)]
            with _bars(console) as bars:
                overall = bars.add_task("namespaces", total=len(names))
                for namespace in names:
                    tasks: list[_Tasks] = []

                    def on_manifest(manifest: dict[str, Any], tasks: list[_Tasks] = tasks) -> None:
                        tasks.append(_Tasks(bars, manifest))

                    def progress(cap: str, lines: int, n: int, tasks: list[_Tasks] = tasks) -> None:
                        tasks[0].advance(cap, lines, n)

                    result = await promote_namespace(src, dst, namespace, on_manifest=on_manifest, progress=progress)
                    for task in (tasks[0].tasks.values() if tasks else ()):
                        bars.remove_task(task)
                    if tasks:
                        bars.remove_task(tasks[0].all)
                    bars.advance(overall)
                    console.print(f"{namespace}: {result.action}, {result.items} items, {result.seconds} s")
                    results.append(result)
            copied = await copy_settings_tables(src, dst)
        return {
            "namespaces": {r.namespace: {"action": r.action, "items": r.items, "bytes": r.bytes, "seconds": r.seconds}
                           for r in results},
            "copied": copied,
        }

    try:
        report = asyncio.run(run())
    except (ProblemError, PromoteError) as exc:
        _fail(f"promote: {exc} (the source is unchanged; run promote again to go on)")
    report["switch_to"] = switch_to(target, args.show_secrets)
    print(json.dumps(report))
    print("\n# the source is unchanged; to serve from PostgreSQL, stop the gateway, run promote once more, and set:",
          *report["switch_to"], sep="\n")


def add_parsers(sub: Any, config_help: str, load_settings: Callable[[str | None], Any], preflight: Callable[..., Any]) -> None:
    export = sub.add_parser("export", help="write one namespace's data, every capability, as an archive (docs/archive-format.md)")
    export.add_argument("namespace", help="the namespace to export")
    export.add_argument("-o", "--output", default=None, help="the archive to write (default: NAMESPACE.sgw.tar)")
    export.add_argument("--config", default=None, help=config_help)
    export.set_defaults(func=lambda args: cmd_export(args, load_settings, preflight))

    load = sub.add_parser("import", help="load an archive into an empty namespace; prints what was loaded as JSON")
    load.add_argument("namespace", help="the namespace to load into (must hold no data)")
    load.add_argument("archive", help="the archive file")
    load.add_argument("--config", default=None, help=config_help)
    load.set_defaults(func=lambda args: cmd_import(args, load_settings, preflight))

    promote = sub.add_parser(
        "promote", help="copy every namespace into PostgreSQL (migrated first), verified namespace by namespace; "
        "resumable, the source is only read; prints the settings to switch to",
    )
    promote.add_argument("--to", required=True, help="the target: a postgresql:// base DSN (databases named as "
                         "persistence.postgres_databases) or a YAML file with persistence:/databases: (and files:)")
    promote.add_argument("--files", choices=("database", "directory", "s3"), default=None,
                         help="where the target keeps file bytes (default: the file's files.backend, else database)")
    promote.add_argument("--namespaces", nargs="+", default=None, help="only these namespaces")
    promote.add_argument("--show-secrets", action="store_true", help="print the target's password in the settings")
    promote.add_argument("--config", default=None, help=config_help)
    promote.set_defaults(func=lambda args: cmd_promote(args, load_settings, preflight))
