"""The vectors capability over HTTP: the seed's VectorStore plus the full collection/point API.

Vectors are sent in the compact wire form (base64 of little-endian float32) unless a vector
cannot be packed that way, in which case it is sent as JSON numbers and the gateway names the bad
one. Point inserts carry an ``Idempotency-Key`` so they can be retried safely.
"""

from __future__ import annotations

import asyncio
import base64
import sys
import uuid
from array import array
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ._exceptions import NotFound
from ._models import PayloadIndex
from ._resource import Resource

DEFAULT_BATCH = 500
FILL_CONCURRENCY = 8  # reads of payloads a search answer left out, at a time
_LITTLE = sys.byteorder == "little"


def pack_vector(vector: Any) -> str | None:
    """base64 of little-endian float32, or None when ``vector`` is not a plain sequence of numbers."""
    try:
        if hasattr(vector, "astype") and hasattr(vector, "tobytes"):  # numpy arrays
            return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        if any(isinstance(x, bool) for x in vector):
            return None
        packed = array("f", vector)
    except (TypeError, ValueError, OverflowError):
        return None
    if not _LITTLE:  # pragma: no cover
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def unpack_vector(data: str) -> list[float]:
    out = array("f")
    out.frombytes(base64.b64decode(data))
    if not _LITTLE:  # pragma: no cover
        out.byteswap()
    return out.tolist()


def _as_list(vector: Any) -> list[Any]:
    return vector.tolist() if hasattr(vector, "tolist") else list(vector)


class VectorsAPI(Resource):
    """``gw.vectors``: VectorStore (setup_collection, insert_vectors, search_vectors,
    delete_vectors) and the whole HTTP surface of vector collections."""

    capability = "vectors"

    # --- the seed's VectorStore --------------------------------------------------------------

    async def setup_collection(
        self,
        collection: str,
        vector_size: int,
        distance: str = "cosine",
        *,
        text_field: str | None = None,
        index: Mapping[str, Any] | None = None,
        payload_indexes: Sequence[PayloadIndex | Mapping[str, Any]] | None = None,
        text_language: str | None = None,
    ) -> dict[str, Any]:
        """Create the collection, or ensure it exists with these settings (``Conflict`` if not).

        ``payload_indexes``: payload fields to index for filters, e.g.
        ``[PayloadIndex(field="user_id", kind="keyword")]`` or ``[{"field": "user_id", "kind": "keyword"}]``.
        ``text_language``: the stemmer of ``text_field`` (default ``english``; ``none``: no stemming).
        """
        return await self.create_collection(
            collection, vector_size, distance, text_field=text_field, index=index, payload_indexes=payload_indexes,
            text_language=text_language,
        )

    async def insert_vectors(self, collection: str, items: Sequence[Mapping[str, Any]]) -> list[str]:
        """Insert JSON objects carrying an ``"embedding"`` (and optionally an ``"id"``; the rest is payload)."""
        vectors, payloads, ids = [], [], []
        for i, item in enumerate(items):
            if "embedding" not in item:
                raise ValueError(f"items[{i}] has no 'embedding'")
            vectors.append(item["embedding"])
            ids.append(None if item.get("id") is None else str(item["id"]))
            payloads.append({k: v for k, v in item.items() if k not in ("embedding", "id")})
        return await self.upsert_points(collection, vectors, payloads, ids)

    async def search_vectors(
        self, collection: str, vector: Sequence[float], limit: int = 10, **options: Any
    ) -> list[dict[str, Any]]:
        """The stored objects most similar first: payload fields plus ``id`` and ``score``."""
        hits = await self.search(collection, vector, limit, **options)
        return [{**h["payload"], "id": h["id"], "score": h["score"]} for h in hits]

    async def delete_vectors(self, collection: str, filter_field: str, filter_value: Any) -> int:
        """Delete the points whose payload field ``filter_field`` equals ``filter_value``."""
        return await self.delete_points(collection, filters={filter_field: filter_value})

    # --- collections ---------------------------------------------------------------------------

    async def create_collection(
        self,
        collection: str,
        vector_size: int,
        distance: str = "cosine",
        *,
        text_field: str | None = None,
        index: Mapping[str, Any] | None = None,
        payload_indexes: Sequence[PayloadIndex | Mapping[str, Any]] | None = None,
        text_language: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"vector_size": vector_size, "distance": distance}
        if text_field is not None:
            body["text_field"] = text_field
        if text_language is not None:
            body["text_language"] = text_language
        if index is not None:
            body["index"] = dict(index)
        if payload_indexes is not None:
            # Mappings go as they are: the gateway checks them and names what is wrong.
            body["payload_indexes"] = [
                p.model_dump() if isinstance(p, PayloadIndex) else dict(p) for p in payload_indexes
            ]
        response = await self._transport.request("PUT", self._path(collection), json=body)
        created: dict[str, Any] = response.json()
        return created

    async def describe_collection(self, collection: str) -> dict[str, Any]:
        described: dict[str, Any] = (await self._transport.request("GET", self._path(collection))).json()
        return described

    async def list_collections(self, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        page: dict[str, Any] = (await self._transport.request("GET", self._path(), params=params)).json()
        return page

    async def drop_collection(self, collection: str) -> None:
        await self._transport.request("DELETE", self._path(collection))

    async def reset_collection(self, collection: str) -> None:
        await self._transport.request("POST", self._path(collection, "reset"), idempotent=True)

    # --- points ------------------------------------------------------------------------------------

    async def upsert_points(
        self,
        collection: str,
        vectors: Sequence[Any],
        payloads: Sequence[Mapping[str, Any] | None] | None = None,
        ids: Sequence[str | None] | None = None,
        *,
        batch_size: int = DEFAULT_BATCH,
        idempotency_key: str | None = None,
    ) -> list[str]:
        """Insert or update points in batches; returns every point's id (generated where absent)."""
        n = len(vectors)
        mismatched = (payloads is not None and len(payloads) != n) or (ids is not None and len(ids) != n)
        if mismatched or n <= batch_size:
            return await self._upsert_batch(collection, vectors, payloads, ids, idempotency_key)
        out: list[str] = []
        for start in range(0, n, batch_size):
            stop = start + batch_size
            key = f"{idempotency_key}:{start}" if idempotency_key else None
            out += await self._upsert_batch(
                collection,
                vectors[start:stop],
                payloads[start:stop] if payloads is not None else None,
                ids[start:stop] if ids is not None else None,
                key,
            )
        return out

    async def _upsert_batch(
        self,
        collection: str,
        vectors: Sequence[Any],
        payloads: Sequence[Mapping[str, Any] | None] | None,
        ids: Sequence[str | None] | None,
        idempotency_key: str | None,
    ) -> list[str]:
        packed = [pack_vector(v) for v in vectors]
        body: dict[str, Any] = {}
        if all(p is not None for p in packed):
            body["vectors_b64"] = packed
        else:
            body["vectors"] = [_as_list(v) for v in vectors]
        if payloads is not None:
            body["payloads"] = [dict(p) if p is not None else None for p in payloads]
        if ids is not None:
            body["ids"] = list(ids)
        # The key makes the POST safe to retry after a lost answer.
        headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        response = await self._transport.request(
            "POST", self._path(collection, "points"), json=body, headers=headers, idempotent=True
        )
        stored: list[str] = response.json()["ids"]
        return stored

    async def search(
        self,
        collection: str,
        vector: Sequence[float],
        limit: int = 10,
        *,
        query: str | None = None,
        filters: Mapping[str, Any] | None = None,
        score_threshold: float | None = None,
        ef_search: int | None = None,
        fusion: str | None = None,
        alpha: float | None = None,
        with_vectors: bool = False,
    ) -> list[dict[str, Any]]:
        """Results ``{id, score, distance, payload}`` by descending score. With ``query`` on a
        collection with a text field the search is hybrid: ``fusion`` ``rrf`` (the default) or
        ``weighted``, with ``alpha`` the vector half's weight (0 to 1). ``with_vectors``: each
        with its stored ``vector`` too (a list of floats)."""
        results: list[dict[str, Any]] = (
            await self.search_explained(
                collection, vector, limit, query=query, filters=filters, score_threshold=score_threshold,
                ef_search=ef_search, fusion=fusion, alpha=alpha, explain=False, with_vectors=with_vectors,
            )
        )["results"]
        return results

    async def search_explained(
        self,
        collection: str,
        vector: Sequence[float],
        limit: int = 10,
        *,
        query: str | None = None,
        filters: Mapping[str, Any] | None = None,
        score_threshold: float | None = None,
        ef_search: int | None = None,
        fusion: str | None = None,
        alpha: float | None = None,
        explain: bool = True,
        with_vectors: bool = False,
    ) -> dict[str, Any]:
        """The whole answer ``{results, plan}``: ``plan`` says how the gateway searched
        (``kind``: exact_scan, filter_first, hnsw, hnsw_iterative or hnsw_subgraph; ``ef_search``; ``fallback``;
        hybrid: ``text``, the query's terms as searched), and each hybrid hit's ``debug`` its rank
        and score on each half. ``with_vectors``: each hit comes with its stored ``vector`` (at
        most the gateway's ``limits.max_page_bytes`` of vectors per answer: ``limit`` x dimensions x 6 bytes).

        An answer carries at most the gateway's ``limits.max_page_bytes`` of payloads; the hits
        past it come with ``payload_omitted``, and their payloads are read here point by point
        (a hit whose point was deleted in between is left out)."""
        body: dict[str, Any] = {"limit": limit}
        packed = pack_vector(vector)
        if packed is not None:
            body["vector_b64"] = packed
        else:
            body["vector"] = _as_list(vector)
        if query is not None:
            body["query"] = query
        if filters is not None:
            body["filters"] = dict(filters)
        if score_threshold is not None:
            body["score_threshold"] = score_threshold
        if ef_search is not None:
            body["ef_search"] = ef_search
        if fusion is not None:
            body["fusion"] = fusion
        if alpha is not None:
            body["alpha"] = alpha
        if explain:
            body["explain"] = True
        if with_vectors:
            body["with_vectors"] = True
            body["vector_format"] = "b64"
        response = await self._transport.request(
            "POST", self._path(collection, "search"), json=body, idempotent=True
        )
        explained: dict[str, Any] = response.json()
        if with_vectors:
            for hit in explained["results"]:
                hit["vector"] = unpack_vector(hit.pop("vector_b64"))
        if any(hit.get("payload_omitted") for hit in explained["results"]):
            explained["results"] = await self._with_payloads(collection, explained["results"])
        return explained

    async def _with_payloads(self, collection: str, hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``hits`` with each omitted payload read (``FILL_CONCURRENCY`` reads at a time): as the
        point is now, which a write since the search may have changed; a point deleted since is
        left out."""
        gate = asyncio.Semaphore(FILL_CONCURRENCY)

        async def read(hit: dict[str, Any]) -> dict[str, Any] | None:
            if not hit.get("payload_omitted"):
                return hit
            async with gate:
                point = await self.get_point(collection, hit["id"], with_vector=False)
            if point is None:
                return None
            return {k: v for k, v in hit.items() if k != "payload_omitted"} | {"payload": point.get("payload") or {}}

        return [hit for hit in await asyncio.gather(*(read(h) for h in hits)) if hit is not None]

    async def get_point(self, collection: str, point_id: str, *, with_vector: bool = True) -> dict[str, Any] | None:
        """``{id, payload, vector}``, or None when the point does not exist (``NotFound`` for a
        missing collection)."""
        try:
            response = await self._transport.request(
                "GET",
                self._path(collection, "points", point_id),
                params={"vector_format": "b64", "with_vector": "true" if with_vector else "false"},
            )
        except NotFound as exc:
            if exc.code == "point_not_found":
                return None
            raise
        point: dict[str, Any] = response.json()
        if "vector_b64" in point:
            point["vector"] = unpack_vector(point.pop("vector_b64"))
        return point

    async def update_point(
        self,
        collection: str,
        point_id: str,
        vector: Sequence[float] | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Replace the vector and/or payload (None keeps it); ``NotFound`` when the point is missing."""
        body: dict[str, Any] = {}
        if vector is not None:
            packed = pack_vector(vector)
            if packed is not None:
                body["vector_b64"] = packed
            else:
                body["vector"] = _as_list(vector)
        if payload is not None:
            body["payload"] = dict(payload)
        response = await self._transport.request(
            "PATCH", self._path(collection, "points", point_id), json=body, idempotent=True
        )
        updated: dict[str, Any] = response.json()
        return updated

    async def delete_point(self, collection: str, point_id: str) -> None:
        await self._transport.request("DELETE", self._path(collection, "points", point_id))

    async def delete_points(
        self,
        collection: str,
        ids: Sequence[str] | None = None,
        filters: Mapping[str, Any] | None = None,
    ) -> int:
        """Delete the points in ``ids`` and/or matching ``filters``; returns how many went."""
        body: dict[str, Any] = {}
        if ids is not None:
            body["ids"] = list(ids)
        if filters is not None:
            body["filters"] = dict(filters)
        response = await self._transport.request(
            "POST", self._path(collection, "points", "delete"), json=body, idempotent=True
        )
        return int(response.json()["deleted"])

    async def list_points(
        self,
        collection: str,
        filters: Mapping[str, Any] | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        *,
        with_vectors: bool = False,
    ) -> dict[str, Any]:
        """One page ``{items: [{id, payload, vector?}], next_cursor}``, by id."""
        body: dict[str, Any] = {"with_vectors": with_vectors, "vector_format": "b64"}
        if filters is not None:
            body["filters"] = dict(filters)
        if limit is not None:
            body["limit"] = limit
        if cursor is not None:
            body["cursor"] = cursor
        response = await self._transport.request(
            "POST", self._path(collection, "points", "list"), json=body, idempotent=True
        )
        page: dict[str, Any] = response.json()
        for item in page["items"]:
            if "vector_b64" in item:
                item["vector"] = unpack_vector(item.pop("vector_b64"))
        return page

    async def iter_points(
        self,
        collection: str,
        filters: Mapping[str, Any] | None = None,
        *,
        page_size: int | None = None,
        with_vectors: bool = False,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every matching point, following cursors."""
        cursor = None
        while True:
            page = await self.list_points(collection, filters, page_size, cursor, with_vectors=with_vectors)
            for item in page["items"]:
                yield item
            cursor = page.get("next_cursor")
            if not cursor:
                return
