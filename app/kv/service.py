"""The rules of the kv capability: parsing values, expiry, versions and conditional writes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, UTC

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.http.conditions import WriteConditions, quote_etag
from app.core.config import KvSettings, LimitsSettings
from app.core.errors import InvalidInput, NotFound, PreconditionFailed
from app.core.jsonvalue import json_string, parse_value
from app.core.http.pagination import CursorText, decode_cursor, encode_cursor, invalid_cursor
from app.core.db.statements import StatementConnection
from app.kv.repository import KvRepository


def _utcnow() -> datetime:
    return datetime.now(UTC)


def etag_of(version: int) -> str:
    return quote_etag(str(version))


_MAX_VERSION = 2**63 - 1  # versions are BIGINT


def _versions(tags: list[str]) -> list[int]:
    """The versions named by ETags; tags that are not ours (not ASCII digits, or beyond any
    version) cannot match anything."""
    out = []
    for tag in tags:
        # 19 digits at most before int(): a longer tag is no version (and Python refuses to
        # read more than 4,300 digits: a 500 before)
        if tag.isascii() and tag.isdigit() and len(tag) <= 19 and int(tag) <= _MAX_VERSION:
            out.append(int(tag))
    return out


@dataclass(frozen=True)
class KvListPage:
    """Entries as ready-made JSON text (the values are embedded verbatim)."""

    body: str


class KvService:
    def __init__(self, repository: KvRepository, limits: LimitsSettings, settings: KvSettings) -> None:
        self.repo = repository
        self.limits = limits
        self.settings = settings

    def _expiry(self, now: datetime, ttl_seconds: float | None) -> datetime | None:
        if ttl_seconds is None:
            return None
        if not ttl_seconds > 0:
            raise InvalidInput("ttl_seconds", "must be greater than 0")
        if ttl_seconds > self.settings.max_ttl_seconds:
            raise InvalidInput("ttl_seconds", f"must be at most {self.settings.max_ttl_seconds}")
        return now + timedelta(seconds=ttl_seconds)

    async def get(self, conn: StatementConnection, ns: str, c: str, k: str) -> tuple[str, str]:
        """The value's JSON text and ETag, or 404."""
        found = await self.repo.get(conn, ns, c, k, _utcnow())
        if found is None:
            raise NotFound(f"kv entry {k!r} does not exist in collection {c!r}")
        return found[0], etag_of(found[1])

    async def set(
        self, conn: StatementConnection, ns: str, c: str, k: str, body: bytes, *,
        ttl_seconds: float | None, conditions: WriteConditions,
    ) -> str:
        """Store the raw JSON ``body``; the new ETag. 412 when a condition does not hold."""
        value = parse_value("value", body, self.limits.max_value_bytes)
        now = _utcnow()
        expires = self._expiry(now, ttl_seconds)
        if conditions.if_match is not None:
            any_match = "*" in conditions.if_match
            inm = conditions.if_none_match
            if inm is not None and "*" in inm:
                raise PreconditionFailed("If-Match and If-None-Match: * can never both hold")
            version = await self.repo.replace_if(
                conn, ns, c, k, value, now, expires,
                versions=None if any_match else _versions(conditions.if_match),
                not_versions=_versions(inm) if inm else None,
            )
            if version is None:
                raise PreconditionFailed("If-Match: the entry does not exist or its version differs")
        elif conditions.if_none_match is not None:
            version = await self.repo.create_or_replace_unless(
                conn, ns, c, k, value, now, expires,
                any_version="*" in conditions.if_none_match,
                versions=_versions(conditions.if_none_match),
            )
            if version is None:
                raise PreconditionFailed("If-None-Match: the entry already exists in a matching version")
        else:
            version = await self.repo.upsert(conn, ns, c, k, value, now, expires)
        return etag_of(version)

    async def delete(self, conn: StatementConnection, ns: str, c: str, k: str) -> None:
        await self.repo.delete(conn, ns, c, k)

    async def list(
        self, conn: StatementConnection, ns: str, c: str, *, prefix: str | None, limit: int,
        cursor: str | None, keys_only: bool = False,
    ) -> KvListPage:
        after = None
        if cursor is not None:
            position = decode_cursor(cursor, "k", p=CursorText | None)
            after = position["k"]
            if position["p"] != prefix:
                raise invalid_cursor("is not a cursor returned by this list (prefix differs)")
        rows, cut = await self.repo.list(
            conn, ns, c, _utcnow(), prefix=prefix, after=after, limit=limit + 1, with_values=not keys_only,
            budget=self.limits.max_page_bytes,
        )
        more = cut or len(rows) > limit  # cut at the byte budget, or more than asked
        rows = rows[:limit]
        if keys_only:
            items = [f'{{"key":{json_string(r.key)},"etag":"\\"{r.version}\\""}}' for r in rows]
        else:
            items = [f'{{"key":{json_string(r.key)},"value":{r.value},"etag":"\\"{r.version}\\""}}' for r in rows]
        next_cursor = encode_cursor({"k": rows[-1].key, "p": prefix}) if more and rows else None
        return KvListPage(
            '{"items":[' + ",".join(items) + '],"next_cursor":' + json.dumps(next_cursor) + "}"
        )

    async def sweep(self, conn: AsyncConnection) -> int:
        return await self.repo.sweep_expired(conn, _utcnow(), self.settings.sweep_batch)
