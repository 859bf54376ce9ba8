"""The rules of the kv capability: parsing values, expiry, versions and conditional writes."""

from __future__ import annotations

import asyncio
import builtins
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, UTC

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.http.conditions import WriteConditions, quote_etag
from app.core.config import LimitsSettings
from app.kv.settings import KvSettings
from app.core.errors import InvalidInput, NotFound, PayloadTooLarge, PreconditionFailed
from app.core.jsonvalue import LITERAL_YIELD_CHARS, encode_value, json_string, literal_members, parse_value
from app.core.names import validate_key
from app.core.http.pagination import CursorText, decode_cursor, encode_cursor, invalid_cursor
from app.core.fast.fixed_statements import StatementConnection
from app.kv.repository import KvRepository
from app.kv.schemas import KvItemWrite


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

    # --- batches ---------------------------------------------------------------------------

    def _batch_size(self, field: str, n: int) -> None:
        limit = self.limits.max_batch_items
        if n > limit:
            message = f"at most {limit} per batch (got {n})"
            raise PayloadTooLarge(f"{field}: {message}", errors=[{"loc": [field], "msg": message}])

    def _keys(self, keys: Sequence[str]) -> builtins.list[str]:
        """The keys checked, each once, in the order first named."""
        self._batch_size("keys", len(keys))
        return list(dict.fromkeys(validate_key(f"keys.{i}", k) for i, k in enumerate(keys)))

    async def get_many(self, conn: AsyncConnection, ns: str, c: str, keys: Sequence[str]) -> str:
        """``{"items": [...], "missing": [...], "unread": [...]}`` as JSON text: the entries found
        in the order asked, up to ``limits.max_page_bytes`` of values (the keys past it unread)."""
        wanted = self._keys(keys)
        rows, cut = await self.repo.get_many(
            conn, ns, c, sorted(wanted), _utcnow(), budget=self.limits.max_page_bytes
        )
        found = {r.key: r for r in rows}
        # keys sort in the database as Python sorts str (UTF-8 byte order, COLLATE "C")
        unread = [k for k in wanted if cut is not None and k >= cut]
        missing = [k for k in wanted if k not in found and (cut is None or k < cut)]
        items = [
            f'{{"key":{json_string(r.key)},"value":{r.value},"etag":"\\"{r.version}\\""}}'
            for r in (found[k] for k in wanted if k in found)
        ]
        return (
            '{"items":[' + ",".join(items) + '],"missing":' + json.dumps(missing, ensure_ascii=False)
            + ',"unread":' + json.dumps(unread, ensure_ascii=False) + "}"
        )

    async def set_many(
        self, conn: AsyncConnection, ns: str, c: str, items: builtins.list[KvItemWrite], body: bytes, *,
        ttl_seconds: float | None,
    ) -> builtins.list[tuple[str, str]]:
        """Validate every entry first, then write them all in the request's transaction;
        ``(key, etag)`` of each. ``body`` (the request's JSON) gives the values with their
        numbers as written."""
        self._batch_size("items", len(items))
        now = _utcnow()
        expires = self._expiry(now, ttl_seconds)
        max_value = self.limits.max_value_bytes
        # An item of more than three times a value's bound of JSON text is a 413 (as in records).
        literal = await literal_members(body, "items", 3 * max_value + LITERAL_YIELD_CHARS)
        values = [item.value for item in items]
        if literal is not None and len(literal) == len(values) and all(isinstance(x, dict) for x in literal):
            values = [x["value"] for x in literal]
        pairs: builtins.list[tuple[str, str]] = []
        seen: set[str] = set()
        since = 0
        for i, (item, value) in enumerate(zip(items, values, strict=True)):
            key = validate_key(f"items.{i}.key", item.key)
            if key in seen:
                raise InvalidInput(f"items.{i}.key", "names a key already in this batch (each key at most once)")
            seen.add(key)
            pairs.append((key, encode_value(f"items.{i}.value", value, max_value)))
            since += len(pairs[-1][1])
            if since >= LITERAL_YIELD_CHARS:  # the event loop's turn between values, as between their parses
                since = 0
                await asyncio.sleep(0)
        versions = await self.repo.upsert_many(conn, ns, c, pairs, now, expires)
        return [(k, etag_of(v)) for (k, _), v in zip(pairs, versions, strict=True)]

    async def delete_many(self, conn: AsyncConnection, ns: str, c: str, keys: Sequence[str]) -> None:
        await self.repo.delete_many(conn, ns, c, self._keys(keys))

    async def sweep(self, conn: AsyncConnection) -> int:
        return await self.repo.sweep_expired(conn, _utcnow(), self.settings.sweep_batch)
