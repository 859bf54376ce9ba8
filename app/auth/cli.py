"""``storage-gateway keys create|list|revoke``: key management from the operator's shell."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from app.core.config import Database, Settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

T = TypeVar("T")


async def _with_metadata(settings: Settings, action: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    from app.core.db.databases import Databases

    databases = Databases.open(settings)
    try:
        async with databases.engine(Database.metadata).begin() as conn:
            return await action(conn)
    finally:
        await databases.close()


def run(args: argparse.Namespace, settings: Settings) -> None:
    from app import capabilities
    from app.auth import service
    from app.core.errors import InvalidInput

    try:
        if args.keys_command == "create":
            names = [c.name for c in capabilities.load(settings.extra_capabilities)]
            issued = asyncio.run(_with_metadata(
                settings, lambda c: service.create_key(c, args.namespace, args.scope, args.description, names)
            ))
            print(f"key_id: {issued.key_id}")
            print(f"namespace: {issued.namespace_pattern}")
            print(f"scopes: {' '.join(issued.scopes)}")
            print(f"key: {issued.secret}")
            print("(the key is shown once; store it now)")
        elif args.keys_command == "list":
            rows = asyncio.run(_with_metadata(settings, lambda c: service.list_keys(c, None, 100_000)))
            for r in rows:
                state = f"revoked {r['revoked_at']:%Y-%m-%d}" if r["revoked_at"] else "active"
                print(f"{r['key_id']}  {state:<18} {r['namespace']:<24} {','.join(r['scopes'])}  {r['description']}")
        elif args.keys_command == "revoke":
            revoked = asyncio.run(_with_metadata(settings, lambda c: service.revoke_key(c, args.key_id)))
            print(f"revoked {args.key_id}" if revoked else f"{args.key_id}: no active key with that id")
            if not revoked:
                raise SystemExit(1)
    except InvalidInput as exc:
        raise SystemExit(f"storage-gateway: {exc.detail}") from None


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], config_help: str) -> None:
    keys = sub.add_parser("keys", help="create, list and revoke API keys")
    keys.add_argument("--config", default=None, help=config_help)
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    create = ksub.add_parser("create", help="issue a key; prints the secret once")
    create.add_argument("--namespace", required=True, help="exact namespace, `prefix*`, or `*`")
    create.add_argument("--scope", action="append", required=True,
                        help="CAP:ACTION (records|kv|files|vectors|* : read|write|*); repeatable")
    create.add_argument("--description", default="")
    ksub.add_parser("list", help="list keys (never their secrets)")
    revoke = ksub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
