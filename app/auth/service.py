"""API keys: issuing, listing, revoking, and deciding what a key may do.

A key reads ``sgw_<key_id>_<secret>``. Only the sha256 of the whole key is stored; checks
compare digests in constant time. ``app.auth.cache`` keeps checked keys per process and
bounds how long a revocation takes to hold everywhere (``revocation_state``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable
from typing import Any
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth import repository
from app.core.errors import InvalidInput
from app.core.names import NAME_PATTERN

ACTIONS = ("read", "write")
KEY_PREFIX = "sgw_"
_KEY_RE = re.compile(r"^sgw_([0-9a-f]{16})_([A-Za-z0-9_-]{32,128})$")
_NAME_RE = re.compile(NAME_PATTERN)
_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,126}\*$")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the admin, a key, or nobody (auth disabled)."""

    key_id: str
    namespace_pattern: str
    scopes: frozenset[str]
    is_admin: bool = False

    def allows_namespace(self, namespace: str) -> bool:
        return namespace_matches(self.namespace_pattern, namespace)

    def allows(self, capability: str, action: str) -> bool:
        if self.is_admin:
            return True
        wanted = {f"{capability}:{action}", f"*:{action}", f"{capability}:*", "*:*"}
        if action == "read":  # a write scope includes reading
            wanted |= {f"{capability}:write", "*:write"}
        return bool(wanted & self.scopes)

    def administers(self, namespace: str) -> bool:
        """May export or import ``namespace`` as a whole: the admin, or ``namespace:admin`` on it."""
        return self.is_admin or (NAMESPACE_ADMIN in self.scopes and self.allows_namespace(namespace))


NAMESPACE_ADMIN = "namespace:admin"
"""The scope of a whole namespace (export, import); ``*:*`` does not include it."""


ADMIN = Principal("admin", "*", frozenset({"*:*"}), is_admin=True)
ANONYMOUS = Principal("anonymous", "*", frozenset({"*:*"}))


def namespace_matches(pattern: str, namespace: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return namespace.startswith(pattern[:-1])
    return namespace == pattern


def validate_pattern(pattern: str) -> str:
    if pattern == "*" or _NAME_RE.fullmatch(pattern) or _PREFIX_RE.fullmatch(pattern):
        return pattern
    raise InvalidInput("namespace", "must be a namespace, a prefix ending in `*` (e.g. `team-*`), or `*`")


def validate_scopes(scopes: list[str], capabilities: Iterable[str]) -> list[str]:
    """``scopes`` as stored: each ``CAP:ACTION`` with CAP one of ``capabilities`` (the names the
    gateway serves, ``app.capabilities``) or ``*``."""
    known = (*capabilities, "*")
    if not scopes:
        raise InvalidInput("scopes", "at least one CAP:ACTION scope is required")
    out = []
    for i, scope in enumerate(scopes):
        if scope == NAMESPACE_ADMIN:
            out.append(scope)
            continue
        cap, sep, action = scope.partition(":")
        if not sep or cap not in known or action not in (*ACTIONS, "*"):
            raise InvalidInput(
                f"scopes.{i}",
                f"{scope!r} is not CAP:ACTION with CAP in {', '.join(known)} "
                f"and ACTION in read, write, *, or {NAMESPACE_ADMIN}",
            )
        out.append(scope)
    return sorted(set(out))


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def same_secret(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


@dataclass(frozen=True)
class IssuedKey:
    key_id: str
    secret: str
    namespace_pattern: str
    scopes: list[str]
    description: str
    created_at: datetime


async def create_key(
    conn: AsyncConnection, namespace_pattern: str, scopes: list[str], description: str, capabilities: Iterable[str]
) -> IssuedKey:
    pattern = validate_pattern(namespace_pattern)
    scopes = validate_scopes(scopes, capabilities)
    key_id = secrets.token_hex(8)
    secret = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    now = datetime.now(UTC)
    await repository.insert_key(conn, key_id, digest(secret), pattern, scopes, description, now)
    return IssuedKey(key_id, secret, pattern, scopes, description, now)


async def list_keys(conn: AsyncConnection, after: str | None, limit: int) -> list[dict[str, Any]]:
    rows = await repository.page_of_keys(conn, after, limit)
    return [
        {
            "key_id": r["key_id"],
            "namespace": r["namespace_pattern"],
            "scopes": json.loads(r["scopes"]),
            "description": r["description"],
            "created_at": r["created_at"],
            "revoked_at": r["revoked_at"],
        }
        for r in rows
    ]


async def revoke_key(conn: AsyncConnection, key_id: str) -> bool:
    return await repository.revoke(conn, key_id, datetime.now(UTC))


def well_formed(presented: str) -> bool:
    return _KEY_RE.fullmatch(presented) is not None


async def revocation_state(conn: AsyncConnection) -> tuple[object, ...]:
    """What changes whenever a key is revoked: how many are, and the latest revocation time."""
    return await repository.revocation_state(conn)


async def verify(conn: AsyncConnection, presented: str) -> Principal | None:
    """The principal for a presented key, or None when unknown, malformed or revoked."""
    match = _KEY_RE.fullmatch(presented)
    if match is None:
        return None
    row = await repository.key_for_check(conn, match.group(1))
    expected = row.secret_hash if row is not None else "0" * 64  # same work for unknown ids
    if not same_secret(expected, digest(presented)) or row is None or row.revoked_at is not None:
        return None
    return Principal(match.group(1), row.namespace_pattern, frozenset(json.loads(row.scopes)))
