"""``storage-gateway quotas show|set|reset|reconcile``: a namespace's quotas from the operator's shell.

The same rules as ``/v1/admin/quotas`` (``app.quotas.usage``); run against the databases the
settings name, with the gateway running or not.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

from app.core.config import Settings

if TYPE_CHECKING:
    from app.quotas.usage import Usage
    from app.core.state import GatewayState

T = TypeVar("T")


@asynccontextmanager
async def _state(settings: Settings) -> AsyncIterator[GatewayState]:
    from app import capabilities
    from app.auth.ratelimit import RateLimiter
    from app.core.db.databases import Databases
    from app.core.state import GatewayState

    state = GatewayState(
        settings=settings, capabilities=capabilities.load(settings.extra_capabilities),
        rate_limiter=RateLimiter(0, 1), namespace_limiter=RateLimiter(0, 1),
    )
    state.databases = Databases.open(settings)
    try:
        yield state
    finally:
        await state.databases.close()


def _with_state(settings: Settings, action: Callable[[GatewayState], Awaitable[T]]) -> T:
    async def run() -> T:
        async with _state(settings) as state:
            return await action(state)

    return asyncio.run(run())


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _print(usage: dict[str, Usage]) -> None:
    print(f"{'capability':<12} {'items':>12} {'max_items':>12} {'bytes':>16} {'max_bytes':>16}")
    for cap, u in usage.items():
        limit = _limit
        print(f"{cap:<12} {u.items:>12} {limit(u.max_items):>12} {u.bytes:>16} {limit(u.max_bytes):>16}")


def run(args: argparse.Namespace, settings: Settings) -> None:
    from app.quotas import usage as quotas
    from app.core.errors import InvalidInput, ProblemError
    from app.core.names import NAME_PATTERN

    try:
        namespace = args.namespace
        if not re.fullmatch(NAME_PATTERN, namespace):  # what a namespace path segment may be
            raise InvalidInput("namespace", "must be 1-128 characters of A-Z a-z 0-9 _ . - starting with a letter or digit")
        if args.quotas_command == "set":
            limits = quotas.Limits(args.max_bytes, args.max_items)
            _with_state(settings, lambda s: quotas.set_quota(s, namespace, args.capability, limits))
        elif args.quotas_command == "reset":
            _with_state(settings, lambda s: quotas.set_quota(s, namespace, args.capability, None))
        elif args.quotas_command == "reconcile":
            _with_state(settings, lambda s: quotas.reconcile_namespace(s, namespace))
        _print(_with_state(settings, lambda s: quotas.usage_of(s, namespace)))
    except ProblemError as exc:
        raise SystemExit(f"storage-gateway: {exc.detail}") from None


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], config_help: str) -> None:
    parser = sub.add_parser("quotas", help="show and set a namespace's quotas")
    parser.add_argument("--config", default=None, help=config_help)
    qsub = parser.add_subparsers(dest="quotas_command", required=True)
    show = qsub.add_parser("show", help="a namespace's usage and quotas, by capability")
    show.add_argument("namespace")
    put = qsub.add_parser("set", help="a namespace's own quota of one capability (an omitted limit: the default)")
    put.add_argument("namespace")
    put.add_argument("capability", help="kv, records, files, checkpoints")
    put.add_argument("--max-bytes", type=int, default=None)
    put.add_argument("--max-items", type=int, default=None)
    reset = qsub.add_parser("reset", help="back to the default quota of one capability")
    reset.add_argument("namespace")
    reset.add_argument("capability")
    recount = qsub.add_parser("reconcile", help="recount a namespace's usage now")
    recount.add_argument("namespace")
