"""The kv capability over HTTP: the seed's KeyValueStore plus ETags, conditional writes and TTLs."""

from __future__ import annotations

import builtins
import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from ._models import KvEntry, dump_json
from ._resource import Resource

_JSON_HEADERS = {"Content-Type": "application/json"}
PAGE_SIZE = 1000
BATCH = 1000  # keys per batch request: the gateway's default limits.max_batch_items


class KeyValueAPI(Resource):
    """``set``, ``get``, ``delete``, ``get_all`` as in the seed's KeyValueStore, and the extras."""

    capability = "kv"

    async def set(
        self,
        collection: str,
        key: str,
        value: Any,
        *,
        if_match: str | None = None,
        if_none_match: str | None = None,
        ttl_seconds: float | None = None,
    ) -> str:
        """Store ``value`` (any JSON); the new ETag.

        ``if_match=etag`` writes only over that version and ``if_none_match="*"`` only when the
        key does not exist; otherwise ``PreconditionFailed`` (412). ``ttl_seconds`` makes the entry
        expire. Conditional writes are not retried (a lost answer would turn into a 412).
        """
        headers = dict(_JSON_HEADERS)
        if if_match is not None:
            headers["If-Match"] = if_match
        if if_none_match is not None:
            headers["If-None-Match"] = if_none_match
        params = {"ttl_seconds": ttl_seconds} if ttl_seconds is not None else None
        conditional = if_match is not None or if_none_match is not None
        response = await self._transport.request(
            "PUT", self._path(collection, key), content=dump_json(value), headers=headers,
            params=params, idempotent=not conditional,
        )
        return response.headers["etag"]

    async def get(self, collection: str, key: str) -> Any | None:
        """The value, or ``None`` when the key is missing (a stored ``null`` is also ``None``)."""
        entry = await self.get_entry(collection, key)
        return entry.value if entry is not None else None

    async def get_entry(self, collection: str, key: str) -> KvEntry | None:
        """Value and ETag, or ``None`` when missing (tells a stored ``null`` from a missing key)."""
        response = await self._transport.request("GET", self._path(collection, key), ok=(404,))
        if response.status_code == 404:
            return None
        return KvEntry(key=key, value=json.loads(response.content), etag=response.headers["etag"])

    async def delete(self, collection: str, key: str) -> None:
        """Delete ``key``; deleting a missing key is a no-op."""
        await self._transport.request("DELETE", self._path(collection, key))

    # --- batches: many keys of one collection per request ----------------------------------

    async def get_many(self, collection: str, keys: Iterable[str]) -> dict[str, KvEntry]:
        """The live entries of ``keys`` by key (a missing key is absent). One request per
        ``BATCH`` distinct keys, and one more for the keys an answer left unread (its values
        reached the gateway's ``limits.max_page_bytes``)."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, KvEntry] = {}
        for start in range(0, len(wanted), BATCH):
            pending = wanted[start:start + BATCH]
            while pending:
                response = await self._transport.request(
                    "POST", self._path(collection, "get"), content=dump_json({"keys": pending}),
                    headers=_JSON_HEADERS, idempotent=True,
                )
                body = json.loads(response.content)
                for item in body["items"]:
                    found[item["key"]] = KvEntry.model_validate(item)
                pending = body["unread"]
        return found

    async def set_many(
        self, collection: str, items: Mapping[str, Any] | Iterable[tuple[str, Any]], *,
        ttl_seconds: float | None = None,
    ) -> dict[str, str]:
        """Set every entry in one request, atomically (all or none; a key given twice keeps its
        last value); the new ETags by key. At most the gateway's ``limits.max_batch_items``
        entries (1000 by default): more is ``InvalidRequest`` (413)."""
        pairs = dict(items.items() if isinstance(items, Mapping) else items)
        if not pairs:
            return {}
        body: dict[str, Any] = {"items": [{"key": k, "value": v} for k, v in pairs.items()]}
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        # Setting the same values again leaves the same state (new ETags): safe to retry.
        response = await self._transport.request(
            "POST", self._path(collection), content=dump_json(body), headers=_JSON_HEADERS, idempotent=True
        )
        return {item["key"]: item["etag"] for item in json.loads(response.content)["items"]}

    async def delete_many(self, collection: str, keys: Sequence[str]) -> None:
        """Delete ``keys`` (missing ones are no-ops): one request per ``BATCH`` distinct keys."""
        wanted = list(dict.fromkeys(keys))
        for start in range(0, len(wanted), BATCH):
            await self._transport.request(
                "POST", self._path(collection, "delete"), content=dump_json({"keys": wanted[start:start + BATCH]}),
                headers=_JSON_HEADERS, idempotent=True,
            )

    async def get_all(self, collection: str) -> list[Any]:
        """Every value of the collection, ordered by key (the seed's ``get_all``)."""
        return [entry.value async for entry in self.iter_entries(collection)]

    async def list(
        self, collection: str, *, prefix: str | None = None, limit: int | None = None,
        cursor: str | None = None, keys_only: bool = False,
    ) -> tuple[list[KvEntry], str | None]:
        """One page of entries sorted by key, and the cursor of the next page (None at the end)."""
        params: dict[str, Any] = {}
        if prefix:
            params["prefix"] = prefix
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        if keys_only:
            params["keys_only"] = "true"
        response = await self._transport.request("GET", self._path(collection), params=params)
        body = json.loads(response.content)
        return [KvEntry.model_validate(item) for item in body["items"]], body.get("next_cursor")

    async def iter_entries(
        self, collection: str, *, prefix: str | None = None, page_size: int = PAGE_SIZE,
        keys_only: bool = False,
    ) -> AsyncIterator[KvEntry]:
        """Every entry (optionally under ``prefix``) in key order, fetched a page at a time."""
        cursor: str | None = None
        while True:
            items, cursor = await self.list(
                collection, prefix=prefix, limit=page_size, cursor=cursor, keys_only=keys_only
            )
            for item in items:
                yield item
            if cursor is None:
                return

    async def keys(self, collection: str, *, prefix: str | None = None) -> builtins.list[str]:
        """Every key of the collection (optionally under ``prefix``) in key order."""
        return [e.key async for e in self.iter_entries(collection, prefix=prefix, keys_only=True)]

