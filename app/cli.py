"""``storage-gateway``: serve the API, migrate its databases, or move files between backends.

Start-up problems (a wrong setting, an unreachable database, an unwritable data directory) end
the process with exit code 2 and one line on stderr naming the problem.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import NoReturn, get_args

from app.core.config import CONFIG_ENV, Database, Settings, describe_settings_error

EXIT_BAD_SETUP = 2


def _fail(message: str) -> NoReturn:
    print(f"storage-gateway: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_SETUP)


def load_settings(config: str | None) -> Settings:
    if config:
        os.environ[CONFIG_ENV] = config
    try:
        return Settings()
    except Exception as exc:  # noqa: BLE001 - any settings error becomes one message and exit 2
        _fail(describe_settings_error(exc))


async def _preflight(settings: Settings, migrate_all: bool) -> list[str]:
    """Open every database once: check it answers, migrate what should be, report what ran."""
    from app.core.db import migrations
    from app.core.db.databases import Databases, DatabaseSetupError
    from app.main import describe_connect_error

    try:
        databases = Databases.open(settings)
    except DatabaseSetupError as exc:
        _fail(str(exc))
    done = []
    try:
        for db in Database:
            try:
                await databases.check(db)
            except Exception as exc:  # noqa: BLE001 - any connect failure becomes one message
                _fail(describe_connect_error(settings, db, exc))
            if migrate_all or settings.migrates_at_startup(db):
                await migrations.upgrade(databases, db)
                done.append(db.value)
    finally:
        await databases.close()
    return done


def cmd_serve(args: argparse.Namespace) -> None:
    import uvicorn

    from app.core.http.server import PROTOCOL
    from app.core.http.workers import STARTUP_FAILURE, Workers, bind_sockets, exit_cleanly

    # The address is part of the settings (auth may only be off on loopback), and workers
    # re-read settings from the environment.
    if args.host:
        os.environ["GATEWAY_HOST"] = args.host
    if args.port is not None:
        os.environ["GATEWAY_PORT"] = str(args.port)
    settings = load_settings(args.config)
    host, port = settings.host, settings.port
    # Logging is configured once, here, and handed to uvicorn so that every worker logs the same way.
    from app.core.ops.logs import configure_logging

    log_config = configure_logging(settings.log_level, settings.log_format)
    migrated = asyncio.run(_preflight(settings, migrate_all=False))
    if migrated:
        logging.getLogger("app").info("migrated at start-up: %s", ", ".join(migrated))
    # (after the preflight: a start-up failure stays one line on stderr)
    logging.getLogger("app").info(
        "starting storage-gateway on %s:%s", host, port,
        extra={"workers": args.workers, "root_path": settings.root_path or "/"},
    )
    # Migrations already ran once here; workers must not race to run them again.
    os.environ["GATEWAY_AUTO_MIGRATE"] = "false"
    # uvicorn re-raises the signal that stopped it once it has shut down gracefully; a
    # graceful stop is a success, so exit 0 instead of dying by that signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, exit_cleanly)
    config = uvicorn.Config(
        "app.main:app_factory",
        factory=True,
        host=host,
        port=port,
        workers=args.workers,
        proxy_headers=True,
        forwarded_allow_ips=args.forwarded_allow_ips or settings.forwarded_allow_ips,
        root_path=settings.root_path,
        log_level=settings.log_level,
        log_config=log_config,
        access_log=False,  # app.access writes one JSON line per request instead
        # uvicorn annotates these two as int; it hands them to call_later and wait_for (floats)
        timeout_keep_alive=settings.limits.keep_alive_seconds,  # type: ignore[arg-type]
        # Connection limits, head limits and deadlines, problem+json refusals (app.core.http.server);
        # uvicorn's own limit_concurrency would count idle keep-alive connections and answer in text.
        http=PROTOCOL,
        ws="none",
        timeout_graceful_shutdown=(
            args.graceful_timeout if args.graceful_timeout is not None else settings.shutdown_grace_seconds  # type: ignore[arg-type]
        ),
    )
    if args.workers <= 1:
        server = uvicorn.Server(config)
        server.run()
        if not server.started:
            raise SystemExit(STARTUP_FAILURE)
        return
    # Several workers: each accepts from a socket of its own (app.core.http.workers), not all
    # from one as under uvicorn's supervisor, so connections are spread over them.
    try:
        sockets = bind_sockets(host, port, args.workers, config.backlog)
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    raise SystemExit(Workers(config, sockets).run())


def cmd_migrate(args: argparse.Namespace) -> None:
    settings = load_settings(args.config)
    done = asyncio.run(_preflight(settings, migrate_all=True))
    print(f"migrated to head: {', '.join(done)}")


def cmd_keys(args: argparse.Namespace) -> None:
    from app.auth import cli as keys_cli

    settings = load_settings(args.config)
    asyncio.run(_preflight(settings, migrate_all=False))
    keys_cli.run(args, settings)


def cmd_quotas(args: argparse.Namespace) -> None:
    from app.quotas import cli as quotas_cli

    settings = load_settings(args.config)
    asyncio.run(_preflight(settings, migrate_all=False))
    quotas_cli.run(args, settings)


def cmd_files_migrate(args: argparse.Namespace) -> None:
    from app.files.migrate import migrate_files
    from app.files.s3 import ObjectStoreUnavailable

    settings = load_settings(args.config)
    if args.to == "s3" and not settings.files.s3.bucket:
        _fail("files migrate: files.s3.bucket is not set (moving files to s3 needs the bucket)")
    asyncio.run(_preflight(settings, migrate_all=False))
    try:
        report = asyncio.run(migrate_files(settings, args.to, limit=args.limit))
    except (ValueError, ObjectStoreUnavailable) as exc:
        _fail(f"files migrate: {exc}")
    print(
        f"moved {report.moved} files ({report.moved_bytes / 2**20:.1f} MiB) to {args.to}; "
        f"{report.skipped} changed while copied; {report.remaining} not yet on {args.to}"
    )


def cmd_delete_namespace(args: argparse.Namespace) -> None:
    import json
    import re

    from app.core.names import NAME_PATTERN
    from app.core.namespace_data import delete_namespace
    from app.main import services

    if not re.fullmatch(NAME_PATTERN, args.namespace):
        _fail(f"delete-namespace: {args.namespace!r} is not a namespace name")
    if args.batch < 1 or (args.max_batches is not None and args.max_batches < 1):
        _fail("delete-namespace: --batch and --max-batches must be at least 1")
    settings = load_settings(args.config)
    asyncio.run(_preflight(settings, migrate_all=False))

    async def run() -> dict[str, object]:
        async with services(settings) as state:
            report = await delete_namespace(state, args.namespace, batch=args.batch, max_batches=args.max_batches)
        return {"namespace": report.namespace, "deleted": report.deleted, "done": report.done}

    print(json.dumps(asyncio.run(run())))


def build_parser() -> argparse.ArgumentParser:
    from app.files.migrate import Target

    parser = argparse.ArgumentParser(prog="storage-gateway", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP API (uvicorn)")
    serve.add_argument("--host", default=None, help="address to bind (default: GATEWAY_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default: GATEWAY_PORT or 8000)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes")
    serve.add_argument("--config", default=None, help=f"YAML settings file (or {CONFIG_ENV})")
    serve.add_argument(
        "--forwarded-allow-ips",
        default=os.environ.get("FORWARDED_ALLOW_IPS"),
        help="proxy addresses whose X-Forwarded-* headers are trusted "
        "(default: GATEWAY_FORWARDED_ALLOW_IPS or 127.0.0.1)",
    )
    serve.add_argument("--graceful-timeout", type=float, default=None,
                       help="seconds to let in-flight requests finish on SIGTERM "
                       "(default: GATEWAY_SHUTDOWN_GRACE_SECONDS or 30)")
    serve.set_defaults(func=cmd_serve)

    migrate = sub.add_parser("migrate", help="upgrade all three databases to the latest schema")
    migrate.add_argument("--config", default=None, help=f"YAML settings file (or {CONFIG_ENV})")
    migrate.set_defaults(func=cmd_migrate)

    files = sub.add_parser("files", help="operate on stored files")
    files_sub = files.add_subparsers(dest="files_command", required=True)
    move = files_sub.add_parser(
        "migrate", help="move stored file bytes to another backend (resumable; reads keep working)"
    )
    move.add_argument("--to", required=True, choices=list(get_args(Target)), help="where the bytes should be")
    move.add_argument("--limit", type=int, default=None, help="move at most this many files, then stop")
    move.add_argument("--config", default=None, help=f"YAML settings file (or {CONFIG_ENV})")
    move.set_defaults(func=cmd_files_migrate)

    forget = sub.add_parser(
        "delete-namespace",
        help="delete every capability's data of one namespace, in batches (resumable: run it again "
        "after an interruption); prints what was deleted, by capability, as JSON",
    )
    forget.add_argument("namespace", help="the namespace whose data to delete")
    forget.add_argument("--batch", type=int, default=500, help="items deleted per transaction")
    forget.add_argument("--max-batches", type=int, default=None,
                        help="stop after this many batches (\"done\": false; run again to go on)")
    forget.add_argument("--config", default=None, help=f"YAML settings file (or {CONFIG_ENV})")
    forget.set_defaults(func=cmd_delete_namespace)

    from app.portability.cli import add_parsers as add_portability_parsers

    add_portability_parsers(sub, f"YAML settings file (or {CONFIG_ENV})", load_settings, _preflight)

    from app.auth.cli import add_parser as add_keys_parser

    add_keys_parser(sub, f"YAML settings file (or {CONFIG_ENV})")
    sub.choices["keys"].set_defaults(func=cmd_keys)
    from app.quotas.cli import add_parser as add_quotas_parser

    add_quotas_parser(sub, f"YAML settings file (or {CONFIG_ENV})")
    sub.choices["quotas"].set_defaults(func=cmd_quotas)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
