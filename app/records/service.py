"""The rules of the records capability: values, batches, ordered pages with cursors, trim."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Literal

from app.core.config import LimitsSettings
from app.fairness.fairshare import HeavyWrites
from app.core.errors import NotFound, PayloadTooLarge
from app.core.jsonvalue import LITERAL_YIELD_CHARS, encode_value, json_string, literal_members, parse_value
from app.core.names import validate_key
from app.core.http.pagination import decode_cursor, encode_cursor, invalid_cursor
from app.core.fast.fixed_statements import StatementConnection
from app.records.repository import RecordsRepository
from app.records.schemas import RecordCreate, SortOrder

_dumps = json.dumps


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _record_json(key: str, value: str) -> str:
    """``{"key": ..., "value": ...}`` with the stored value text embedded verbatim."""
    return '{"key":' + json_string(key) + ',"value":' + value + "}"


class RecordsService:
    def __init__(self, repository: RecordsRepository, limits: LimitsSettings, heavy: HeavyWrites) -> None:
        self.repo = repository
        self.limits = limits
        self.heavy = heavy

    async def upsert(self, conn: StatementConnection, ns: str, c: str, k: str, body: bytes) -> None:
        value = parse_value("value", body, self.limits.max_value_bytes)
        await self.repo.upsert(conn, ns, c, k, value, _utcnow())

    async def upsert_batch(self, ns: str, c: str, records: list[RecordCreate], body: bytes = b"") -> int:
        """Validate every record first, then write them all in one transaction: past a turn's
        bytes a heavy write's turn (``app.fairness.fairshare``: on SQLite it begins after the single
        writes waiting; one batch is bounded by ``limits.max_body_bytes``). ``body`` (the
        request's JSON) gives the values with their numbers as written."""
        limit = self.limits.max_batch_items
        if len(records) > limit:
            message = f"at most {limit} records per batch (got {len(records)})"
            raise PayloadTooLarge(f"records: {message}", errors=[{"loc": ["records"], "msg": message}])
        # A record of more than three times a value's bound of JSON text (whitespace, escapes) is a 413:
        # no parse of it holds the event loop longer than that much text takes.
        literal = await literal_members(body, "records", 3 * self.limits.max_value_bytes + LITERAL_YIELD_CHARS)
        values = [r.value for r in records]
        if literal is not None and len(literal) == len(values) and all(isinstance(item, dict) for item in literal):
            values = [item["value"] for item in literal]
        items = []
        since = 0
        for i, (record, value) in enumerate(zip(records, values, strict=True)):
            key = validate_key(f"records.{i}.key", record.key)
            items.append((key, encode_value(f"records.{i}.value", value, self.limits.max_value_bytes)))
            since += len(items[-1][1])
            if since >= LITERAL_YIELD_CHARS:  # the event loop's turn between values, as between their parses
                since = 0
                await asyncio.sleep(0)
        async with self.heavy.batch(ns, sum(len(k) + len(v) for k, v in items)) as conn:
            await self.repo.upsert_many(conn, ns, c, items, _utcnow())
        return len(items)

    async def get(self, conn: StatementConnection, ns: str, c: str, k: str) -> str:
        """The record as JSON text, or 404."""
        value = await self.repo.get(conn, ns, c, k)
        if value is None:
            raise NotFound(f"record {k!r} does not exist in collection {c!r}")
        return _record_json(k, value)

    async def delete(self, conn: StatementConnection, ns: str, c: str, k: str) -> None:
        await self.repo.delete(conn, ns, c, k)

    async def page(
        self, conn: StatementConnection, ns: str, c: str, *, order: SortOrder | None, limit: int,
        after: str | None, before: str | None, cursor: str | None,
    ) -> str:
        """A page ``{"items": [...], "next_cursor": ...}`` as JSON text."""
        if cursor is not None:
            position = decode_cursor(cursor, "k", o=Literal["asc", "desc"])
            last, cursor_order = position["k"], position["o"]
            if order is not None and order != cursor_order:
                raise invalid_cursor(f"was made for order={cursor_order}, not order={order.value}")
            order = SortOrder(cursor_order)
            # The cursor narrows the exclusive bounds (str order is code point = UTF-8 byte order).
            if order is SortOrder.asc:
                after = last if after is None else max(after, last)
            else:
                before = last if before is None else min(before, last)
        order = order or SortOrder.asc
        rows, cut = await self.repo.page(
            conn, ns, c, descending=order is SortOrder.desc, limit=limit + 1, after=after, before=before,
            budget=self.limits.max_page_bytes,
        )
        more = cut or len(rows) > limit  # cut at the byte budget, or more than asked
        rows = rows[:limit]
        next_cursor = encode_cursor({"k": rows[-1][0], "o": order.value}) if more and rows else None
        items = ",".join(_record_json(k, v) for k, v in rows)
        return '{"items":[' + items + '],"next_cursor":' + _dumps(next_cursor) + "}"

    async def trim(
        self, conn: StatementConnection, ns: str, c: str, *, before: str | None, keep_last: int | None
    ) -> int:
        if before is not None:  # a bound is a key: the same text rule (no control characters)
            before = validate_key("before", before)
        return await self.repo.trim(conn, ns, c, before=before, keep_last=keep_last)
