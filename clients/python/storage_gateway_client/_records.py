"""The records capability over HTTP: the seed's RecordStore plus batches, cursors and trim options."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from ._models import SortOrder, dump_json
from ._resource import Resource

_JSON_HEADERS = {"Content-Type": "application/json"}
PAGE_SIZE = 1000


class RecordsAPI(Resource):
    """``upsert_record``, ``get_ordered_records``, ``delete_record``, ``trim_records_before`` as in
    the seed's RecordStore, and the extras."""

    capability = "records"

    async def upsert_record(self, collection: str, key: str, value: Any) -> None:
        """Store ``value`` (any JSON) as the record ``key``, replacing any record with that key."""
        await self._transport.request(
            "PUT", self._path(collection, key), content=dump_json(value), headers=_JSON_HEADERS
        )

    async def upsert_records(
        self, collection: str, records: Mapping[str, Any] | Iterable[tuple[str, Any]]
    ) -> int:
        """Upsert many records atomically (all or none); how many were written."""
        pairs = records.items() if isinstance(records, Mapping) else records
        body = {"records": [{"key": k, "value": v} for k, v in pairs]}
        # Upserting the same batch twice leaves the same state: safe to retry.
        response = await self._transport.request(
            "POST", self._path(collection), content=dump_json(body), headers=_JSON_HEADERS, idempotent=True
        )
        return int(response.json()["upserted"])

    async def get_record(self, collection: str, key: str) -> Any | None:
        """The record's value, or ``None`` when it does not exist."""
        response = await self._transport.request("GET", self._path(collection, key), ok=(404,))
        if response.status_code == 404:
            return None
        return json.loads(response.content)["value"]

    async def get_ordered_records(
        self,
        collection: str,
        limit: int | None = None,
        order: SortOrder = SortOrder.ASCENDING,
    ) -> list[tuple[str, Any]]:
        """``(key, value)`` pairs in key order; ``DESCENDING`` with ``limit`` n gives the n largest
        keys, largest first. ``limit=None`` returns every record (fetched page by page)."""
        if limit is not None and limit <= 0:
            return []
        out: list[tuple[str, Any]] = []
        async for item in self.iter_records(collection, order=order, limit=limit):
            out.append(item)
        return out

    async def list(
        self,
        collection: str,
        *,
        order: SortOrder = SortOrder.ASCENDING,
        limit: int | None = None,
        after: str | None = None,
        before: str | None = None,
        cursor: str | None = None,
    ) -> tuple[list[tuple[str, Any]], str | None]:
        """One page of ``(key, value)`` pairs and the cursor of the next page (None at the end);
        ``after``/``before`` are exclusive bounds."""
        params: dict[str, Any] = {"order": SortOrder(order).value}
        if limit is not None:
            params["limit"] = limit
        if after is not None:
            params["after"] = after
        if before is not None:
            params["before"] = before
        if cursor is not None:
            params["cursor"] = cursor
        response = await self._transport.request("GET", self._path(collection), params=params)
        body = json.loads(response.content)
        return [(item["key"], item["value"]) for item in body["items"]], body.get("next_cursor")

    async def iter_records(
        self,
        collection: str,
        *,
        order: SortOrder = SortOrder.ASCENDING,
        after: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        page_size: int = PAGE_SIZE,
    ) -> AsyncIterator[tuple[str, Any]]:
        """``(key, value)`` pairs in key order, fetched a page at a time through cursors."""
        remaining = limit
        cursor: str | None = None
        while remaining is None or remaining > 0:
            size = page_size if remaining is None else min(page_size, remaining)
            items, cursor = await self.list(
                collection, order=order, limit=size, after=after, before=before, cursor=cursor
            )
            for item in items:
                yield item
            if remaining is not None:
                remaining -= len(items)
            if cursor is None:
                return

    async def delete_record(self, collection: str, key: str) -> None:
        """Delete the record ``key``; a missing record is a no-op."""
        await self._transport.request("DELETE", self._path(collection, key))

    async def trim_records_before(self, collection: str, cutoff_key: str) -> int:
        """Delete every record whose key is strictly below ``cutoff_key`` (that key itself stays);
        how many were deleted. Nothing is below the empty key: ``""`` deletes nothing (no request)."""
        if cutoff_key == "":
            return 0
        return await self.trim(collection, before=cutoff_key)

    async def trim(self, collection: str, *, before: str | None = None, keep_last: int | None = None) -> int:
        """Delete keys below ``before`` and/or all but the ``keep_last`` largest (given both, a
        record goes only when both say so); how many were deleted."""
        body: dict[str, Any] = {}
        if before is not None:
            body["before"] = before
        if keep_last is not None:
            body["keep_last"] = keep_last
        # Trimming again deletes nothing more: safe to retry.
        response = await self._transport.request(
            "POST", self._path(collection, "trim"), content=dump_json(body), headers=_JSON_HEADERS,
            idempotent=True,
        )
        return int(response.json()["deleted"])
