"""The rules of the vectors capability: collections, checked points, search and hybrid fusion.

SQL on per-collection tables is the backend's (``VectorIndex``); this module owns the registry
rows, validation (sizes, finiteness, limits), ids, idempotent inserts, the terms of each point's
text (``app.vectors.text``: the same on both backends) and the fusion of a hybrid search's two
rankings, and never looks at the dialect.

Hybrid search (a ``query`` with terms, on a collection with a text field) is one path for every
caller (the HTTP API, the client's vector store, the memory store and LangChain adapters built
on it): the vector half's ``pool`` nearest points and the text half's ``pool`` best BM25 matches,
both filtered before their limits, fused by

- ``rrf`` (the default): the sum over the halves of ``1 / (RRF_K + rank)`` (a half that did not
  rank the point adds nothing);
- ``weighted``: ``alpha * v + (1 - alpha) * t``, where ``v`` is the vector score min-max
  normalised over the candidates (both halves' points: the best 1, the worst 0; 1 for all when
  they all score the same) and ``t`` the BM25 score divided by the best candidate's (a point
  without any of the terms 0).

Ties go to the nearer point, then the smaller id. ``explain`` gives each hit a ``debug`` object
with its rank and score on each half (and the normalised scores of ``weighted``).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from dataclasses import dataclass
import json
import uuid
from array import array
from collections.abc import Sequence
from datetime import datetime, timedelta, UTC
from typing import TYPE_CHECKING, Any

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.config import Database, Settings
from app.core.errors import Conflict, InvalidInput, NotFound
from app.fairness.fairshare import HeavyWrites
from app.core.jsonvalue import LITERAL_YIELD_CHARS, LONE_SURROGATE, find_invalid, jsonb_text
from app.core.names import key_problem
from app.core.http.pagination import decode_cursor, encode_cursor
from app.vectors import encoding, telemetry
from app.vectors.text import DEFAULT_LANGUAGE, document_terms, query_terms, text_of
from app.vectors.backend import (
    CollectionInfo,
    Hit,
    MissingTable,
    PayloadIndexState,
    PointIn,
    PointOut,
    RegistryCache,
    TextRanking,
    VectorIndex,
)
from app.vectors.filters import WIDE_INTEGER, Node, find_wide_integer, parse_filter
from app.vectors.planner import Plan, ef_for
from app.vectors.payload_index import declared_value_problem
from app.vectors.recall import K, Calibration
from app.vectors import repository
from app.quotas import usage as quotas
from app.vectors.schemas import (
    CollectionCreate,
    PointsDelete,
    PointsList,
    PointsUpsert,
    PointUpdate,
    SearchRequest,
)

if TYPE_CHECKING:
    from app.vectors.builder import IndexBuilder

RRF_K = 60
HYBRID_POOL_FACTOR = 4
VECTOR_ANSWER_BYTES = {"b64": 6, "json": 24}  # what a dimension of a vector counts in a search answer (with_vectors)
IDEMPOTENCY_KEY_MAX = 255
# A batch's texts are split into terms in a worker thread past this many characters (1 MB of
# text is about 0.1 s of stemming), inline below it.
TERMS_INLINE_CHARS = 16 * 1024


def _now() -> datetime:
    return datetime.now(UTC)


def _score(distance_name: str, distance: float) -> float:
    """Higher is better: cosine 1 - d; ip: the inner product (d is its negation); l2: -d."""
    if distance_name == "cosine":
        return 1.0 - distance
    return -distance


class VectorService:
    """The vectors capability's rules, built once per process by its lifecycle.

    It holds what the requests of one process share: the backend chosen from the vectors
    database's dialect, the settings, the collection registry cache and (PostgreSQL) the HNSW
    builder. The request's connection and namespace are arguments of each call; a write
    returns the collection whose points it wrote, for the index builder after commit.
    """

    def __init__(
        self,
        index: VectorIndex,
        settings: Settings,
        registry: RegistryCache | None = None,
        builder: IndexBuilder | None = None,
        heavy: HeavyWrites | None = None,
    ) -> None:
        self.index = index
        self.settings = settings
        self.registry = registry if registry is not None else RegistryCache()
        self.builder = builder
        """The background HNSW builder (PostgreSQL), told of writes once they are committed."""
        self.heavy: HeavyWrites = heavy  # type: ignore[assignment]  # (set by the lifecycle; unused by tests that build one)
        """The turns of batch upserts (``app.fairness.fairshare``)."""

    # --- collections ---------------------------------------------------------------------------

    def info_of(self, row: Any) -> CollectionInfo:
        return CollectionInfo(
            id=row.id,
            namespace=row.namespace,
            collection=row.collection,
            vector_size=row.vector_size,
            distance=row.distance,
            index=json.loads(row.index_options),
            text_field=row.text_field,
            created_at=row.created_at,
            text_language=row.text_language,
        )

    async def find(
        self, conn: AsyncConnection, namespace: str, collection: str, *, lock: bool = False
    ) -> CollectionInfo | None:
        row = await repository.find_collection(conn, namespace, collection, lock=lock)
        return self.info_of(row) if row is not None else None

    async def get(
        self, conn: AsyncConnection, namespace: str, collection: str, *, lock: bool = False
    ) -> CollectionInfo:
        info = await self.find(conn, namespace, collection, lock=lock)
        if info is None:
            raise NotFound(f"vector collection {collection!r} does not exist", code="collection_not_found")
        return info

    async def cached(self, conn: AsyncConnection, namespace: str, collection: str) -> CollectionInfo:
        """The registry row from this process's cache (read and cached on a miss)."""
        info = self.registry.get(namespace, collection)
        if info is None:
            info = await self.get(conn, namespace, collection)
            self.registry.put(info)
        return info

    def read(
        self,
        info: CollectionInfo,
        state: str,
        count: int | None = None,
        payload_states: Sequence[PayloadIndexState] | None = None,
        progress: dict[str, Any] | None = None,
        plans: dict[str, int] | None = None,
        subgraphs: dict[int, tuple[int, int]] | None = None,
        calibration: Calibration | None = None,
    ) -> dict[str, Any]:
        idx = dict(info.index)
        kind = idx.get("kind", "exact")
        states = payload_states or [PayloadIndexState("pending")] * len(info.payload_indexes)
        return {
            "collection": info.collection,
            "vector_size": info.vector_size,
            "distance": info.distance,
            "text_field": info.text_field,
            "text_language": info.text_language,
            "index": {
                "kind": kind,
                "m": idx.get("m") if kind != "exact" else None,
                "ef_construction": idx.get("ef_construction") if kind != "exact" else None,
                "ef_search": (
                    None if kind == "exact" else ef_for(count or 0, K, self.settings.vectors.ef_search, calibration)
                ),
                "calibration": calibration.as_read() if calibration else None,
                "backend": self.index.name,
                "state": state,
                "progress": progress,
                "plans": plans,
            },
            "payload_indexes": [
                {**p.as_option(), "state": st.state, "error": st.error, "build": st.build,
                 "subgraphs": _subgraphs_read((subgraphs or {}).get(p.position))}
                for p, st in zip(info.payload_indexes, states, strict=True)
            ],
            "count": count,
            "created_at": info.created_at.isoformat(),
        }

    async def create(
        self, conn: AsyncConnection, namespace: str, collection: str, body: CollectionCreate
    ) -> tuple[CollectionInfo, bool]:
        """Create the collection, or return the existing one when its settings agree (else 409)."""
        limit = self.settings.limits.max_vector_dimensions
        if body.vector_size > limit:
            raise InvalidInput("vector_size", f"must be at most {limit}")
        if body.text_field is not None and key_problem(body.text_field):
            raise InvalidInput("text_field", key_problem(body.text_field) or "")
        if body.text_language is not None and body.text_field is None:
            raise InvalidInput("text_language", "applies to the text field: give text_field too")
        declared = [p.model_dump() for p in body.payload_indexes or []]
        seen: set[str] = set()
        for i, p in enumerate(declared):
            if p["field"] in seen:
                raise InvalidInput(f"payload_indexes.{i}.field", f"declares {p['field']!r} twice")
            seen.add(p["field"])
        existing = await self.find(conn, namespace, collection)
        if existing is not None:
            self._check_same(existing, body)
            return existing, False
        vs = self.settings.vectors
        requested = body.index.kind if body.index else "hnsw"
        m = (body.index.m if body.index and body.index.m else None) or vs.hnsw_m
        ef_construction = (
            body.index.ef_construction if body.index and body.index.ef_construction else None
        ) or vs.hnsw_ef_construction
        if requested != "exact" and ef_construction < 2 * m:
            # pgvector refuses such a build, and the builder would retry it forever: a 422 on
            # every backend (SQLite searches exactly, but the same request gets the same answer).
            raise InvalidInput("index.ef_construction", f"must be at least twice m ({2 * m}); got {ef_construction}")
        # Each collection is a table with its indexes: on SQLite every connection reads the whole
        # schema again after any change to it, so an unbounded number slowed every tenant.
        if await repository.count_collections_locked(conn, namespace) >= vs.max_collections_per_namespace:
            raise Conflict(
                f"namespace {namespace!r} has {vs.max_collections_per_namespace} collections, the most it may "
                "(vectors.max_collections_per_namespace); drop one first", code="too_many_collections",
            )
        kind = self.index.index_kind(body.vector_size, requested)
        options: dict[str, Any] = {"kind": kind}
        if kind != "exact":
            options["m"] = m
            options["ef_construction"] = ef_construction
        if declared:
            options["payload_indexes"] = declared
        new_id = await repository.insert_collection(
            conn,
            namespace=namespace,
            collection=collection,
            vector_size=body.vector_size,
            distance=body.distance,
            index_options=json.dumps(options, sort_keys=True),
            text_field=body.text_field,
            text_language=(body.text_language or DEFAULT_LANGUAGE) if body.text_field is not None else None,
            created_at=_now(),
        )
        if new_id is None:
            # Created concurrently: the same rules apply to the winner's settings.
            existing = await self.get(conn, namespace, collection)
            self._check_same(existing, body)
            return existing, False
        info = await self.get(conn, namespace, collection)
        assert info.id == new_id
        await self.index.create(conn, info)
        return info, True

    def _check_same(self, existing: CollectionInfo, body: CollectionCreate) -> None:
        differences = []
        if existing.vector_size != body.vector_size:
            differences.append(f"vector_size {existing.vector_size}")
        if existing.distance != body.distance:
            differences.append(f"distance {existing.distance}")
        if body.text_field is not None and body.text_field != existing.text_field:
            differences.append(f"text_field {existing.text_field!r}")
        if body.text_language is not None and body.text_language != existing.text_language:
            differences.append(f"text_language {existing.text_language!r}")
        if body.payload_indexes is not None:
            wanted = [p.model_dump() for p in body.payload_indexes]
            have = [p.as_option() for p in existing.payload_indexes]
            if wanted != have:
                differences.append(f"payload_indexes {have!r}")
        if differences:
            raise Conflict(
                f"vector collection {existing.collection!r} exists with {', '.join(differences)}; "
                "drop it first to change that (data is never dropped implicitly)",
                code="collection_conflict",
            )

    async def list_collections(
        self, conn: AsyncConnection, namespace: str, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        after = decode_cursor(cursor, "after")["after"] if cursor else None
        rows = await repository.page_of_collections(conn, namespace, after, limit + 1)
        infos = [self.info_of(r) for r in rows[:limit]]
        states = await self.index.index_states(conn, infos)
        payload_states = await self.index.payload_index_states(conn, infos)
        items = [self.read(info, states[info.id], None, payload_states[info.id]) for info in infos]
        next_cursor = encode_cursor({"after": rows[limit - 1].collection}) if len(rows) > limit else None
        return {"items": items, "next_cursor": next_cursor}

    async def describe(self, conn: AsyncConnection, namespace: str, collection: str) -> dict[str, Any]:
        info = await self.get(conn, namespace, collection)
        state = await self.state(conn, info)
        progress = await self.index.build_progress(conn, info) if state in ("building", "pending") else None
        return self.read(
            info, state, await self.index.count(conn, info),
            (await self.index.payload_index_states(conn, [info]))[info.id], progress,
            telemetry.plans_of(info.id), (await self.index.subgraph_states(conn, [info])).get(info.id),
            await self.index.calibration(conn, info) if state == "ready" else None,
        )

    async def read_created(self, conn: AsyncConnection, info: CollectionInfo) -> dict[str, Any]:
        """The answer to a create: settings and index states."""
        payload_states = (await self.index.payload_index_states(conn, [info]))[info.id]
        return self.read(info, await self.state(conn, info), None, payload_states)

    async def state(self, conn: AsyncConnection, info: CollectionInfo) -> str:
        """The collection's index state (see ``VectorIndex.index_states``)."""
        return (await self.index.index_states(conn, [info]))[info.id]

    async def drop(self, conn: AsyncConnection, namespace: str, collection: str) -> None:
        info = await self.find(conn, namespace, collection, lock=True)
        if info is None:
            return
        self.registry.forget(namespace, collection)
        self.index.forget(info.id, learned=True)
        before = await self._stored(conn, info)
        await self.index.drop(conn, info)
        await repository.delete_collection(conn, namespace, collection)
        await self._keep(conn, info, before, (0, 0))

    async def reset(self, conn: AsyncConnection, namespace: str, collection: str) -> None:
        info = await self.get(conn, namespace, collection, lock=True)
        self.index.forget(info.id, learned=True)
        before = await self._stored(conn, info)
        await self.index.reset(conn, info)
        await self._keep(conn, info, before, (0, 0))

    # --- quotas (app.vectors.usage) ------------------------------------------------------------

    async def _stored(
        self, conn: AsyncConnection, info: CollectionInfo, ids: list[str] | None = None, flt: Node | None = None
    ) -> tuple[int, int]:
        """(points, bytes) the quotas count of ``info``'s points among ``ids`` / matching ``flt``
        (nothing read with quota accounting off)."""
        return await self.index.stored(conn, info, ids, flt) if self.settings.quotas.accounting else (0, 0)

    async def _keep(self, conn: AsyncConnection, info: CollectionInfo, before: tuple[int, int], after: tuple[int, int]) -> None:
        """The difference added to the namespace's usage in ``conn``'s transaction (507 past a quota)."""
        await quotas.keep(
            conn, self.settings.quotas, Database.vectors, info.namespace, "vectors",
            after[0] - before[0], after[1] - before[1],
        )

    # --- points ------------------------------------------------------------------------------------

    def _filter(self, raw: Any, field: str = "filters") -> Node | None:
        limits = self.settings.limits
        return parse_filter(raw, field=field, max_depth=limits.max_filter_depth, max_terms=limits.max_filter_terms)

    def _payload_json(self, info: CollectionInfo, payload: dict[str, Any] | None, where: str) -> str:
        """The payload as stored JSON, or 422: its declared fields' values fit their indexes
        (``_check_declared``), and it fits ``limits.max_value_bytes``."""
        _check_declared(info, payload, where)
        try:
            text = json.dumps(payload or {}, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
        except ValueError:
            raise InvalidInput(where, "must be JSON without NaN or infinity") from None
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:  # the gate refuses these first (app.core.jsonvalue)
            raise InvalidInput(*(find_invalid(payload, where) or (where, LONE_SURROGATE))) from None
        limit = self.settings.limits.max_value_bytes
        if size > limit:
            raise InvalidInput(where, f"must be at most {limit} bytes of JSON")
        stored = jsonb_text(text, payload or {})
        if stored.wide:
            wide = find_wide_integer(payload, where)
            raise InvalidInput(wide or where, f"{WIDE_INTEGER}, as in filters; store a larger one as a string")
        if stored.text is not text:
            size = len(stored.text.encode("utf-8"))
        if size + stored.growth > limit:
            raise InvalidInput(where, f"must be at most {limit} bytes of JSON with its numbers written out in full "
                               "(1e-300 is 302 characters)")
        return stored.text

    def _point(self, info: CollectionInfo, pid: str | None, vec: array[float], payload: dict[str, Any] | None, where: str) -> PointIn:
        if pid is None:
            pid = uuid.uuid4().hex
        else:
            problem = key_problem(pid)
            if problem:
                raise InvalidInput(f"{where}.id", problem)
        return PointIn(
            id=pid,
            vector=vec,
            payload_json=self._payload_json(info, payload, f"{where}.payload"),
            text=text_of(payload, info.text_field),
            norm=encoding.norm(vec),
        )

    async def _points(self, info: CollectionInfo, body: PointsUpsert) -> list[PointIn]:
        """The batch's points, checked and encoded, the event loop served between them every
        ``LITERAL_YIELD_CHARS`` of payload JSON (8.4 MB of payloads in 7 points held it 355-369 ms)."""
        dim = info.vector_size
        nonzero = info.distance == "cosine"
        columnar = body.vectors is not None or body.vectors_b64 is not None
        if body.points is not None and (columnar or body.payloads is not None or body.ids is not None):
            raise InvalidInput("points", "send either `points` or the parallel lists, not both")
        out: list[PointIn] = []
        since = 0

        async def add(point: PointIn) -> None:
            nonlocal since
            out.append(point)
            since += len(point.payload_json) + 4 * dim
            if since >= LITERAL_YIELD_CHARS:
                since = 0
                await asyncio.sleep(0)

        if body.points is not None:
            self._check_batch("points", len(body.points))
            for i, p in enumerate(body.points):
                where = f"points.{i}"
                if (p.vector is None) == (p.vector_b64 is None):
                    raise InvalidInput(f"{where}.vector", "give exactly one of vector or vector_b64")
                if p.vector is not None:
                    vec = encoding.from_numbers(p.vector, dim, f"{where}.vector", nonzero=nonzero)
                else:
                    vec = encoding.from_b64(p.vector_b64 or "", dim, f"{where}.vector_b64", nonzero=nonzero)
                await add(self._point(info, p.id, vec, p.payload, where))
            return out
        if body.vectors is not None and body.vectors_b64 is not None:
            raise InvalidInput("vectors", "give exactly one of vectors or vectors_b64")
        if body.vectors is not None:
            self._check_batch("vectors", len(body.vectors))
            vecs = [
                encoding.from_numbers(v, dim, f"vectors.{i}", nonzero=nonzero) for i, v in enumerate(body.vectors)
            ]
        elif body.vectors_b64 is not None:
            self._check_batch("vectors_b64", len(body.vectors_b64))
            vecs = [
                encoding.from_b64(v, dim, f"vectors_b64.{i}", nonzero=nonzero)
                for i, v in enumerate(body.vectors_b64)
            ]
        else:
            raise InvalidInput("points", "required (or the parallel lists vectors / vectors_b64)")
        n = len(vecs)
        if body.payloads is not None and len(body.payloads) != n:
            raise InvalidInput("payloads", f"has {len(body.payloads)} items for {n} vectors; lengths must match")
        if body.ids is not None and len(body.ids) != n:
            raise InvalidInput("ids", f"has {len(body.ids)} items for {n} vectors; lengths must match")
        for i in range(n):
            payload = body.payloads[i] if body.payloads is not None else None
            await add(self._point(info, body.ids[i] if body.ids is not None else None, vecs[i], payload, f"points.{i}"))
        return out

    async def _with_terms(self, info: CollectionInfo, points: list[PointIn]) -> None:
        """Each point's terms, from its text (a collection with a text field)."""
        if info.text_field is None:
            return
        language = info.text_language or DEFAULT_LANGUAGE

        def split() -> None:
            for p in points:
                p.terms = document_terms(p.text, language)

        if sum(len(p.text) for p in points if p.text) > TERMS_INLINE_CHARS:
            await anyio.to_thread.run_sync(split)
        else:
            split()

    def _check_batch(self, field: str, n: int) -> None:
        limit = self.settings.limits.max_batch_items
        if n > limit:
            raise InvalidInput(field, f"holds {n} points; at most {limit} per request")

    async def upsert(
        self,
        conn: AsyncConnection,
        namespace: str,
        collection: str,
        body: PointsUpsert,
        raw_body: bytes,
        idempotency_key: str | None,
    ) -> tuple[dict[str, Any], CollectionInfo | None]:
        """The answer, and the collection written (``None`` for a replayed answer)."""
        info = await self.get(conn, namespace, collection, lock=True)
        if idempotency_key is not None:
            replay = await self._claim_key(conn, namespace, collection, idempotency_key, raw_body)
            if replay is not None:
                return replay, None
        points = await self._points(info, body)
        await self._with_terms(info, points)
        # One statement per batch; a repeated id in the batch: the last one wins.
        unique: dict[str, PointIn] = {}
        for p in points:
            unique.pop(p.id, None)
            unique[p.id] = p
        ids = list(unique)
        before = await self._stored(conn, info, ids)
        await self.index.upsert(conn, info, list(unique.values()))
        await self._keep(conn, info, before, await self._stored(conn, info, ids))
        answer = {"ids": [p.id for p in points]}
        if idempotency_key is not None:
            await repository.record_answer(
                conn, namespace, collection, idempotency_key, json.dumps(answer)
            )
        return answer, info

    async def _claim_key(
        self, conn: AsyncConnection, namespace: str, collection: str, key: str, raw_body: bytes
    ) -> dict[str, Any] | None:
        """Record ``key`` as ours, or return the answer recorded for it by an earlier request."""
        if not key or len(key) > IDEMPOTENCY_KEY_MAX or not key.isprintable():
            raise InvalidInput("Idempotency-Key", f"must be 1-{IDEMPOTENCY_KEY_MAX} printable characters")
        digest = hashlib.sha256(raw_body).hexdigest()
        now = _now()
        ttl = timedelta(seconds=self.settings.vectors.idempotency_ttl_seconds)
        await repository.forget_keys_before(conn, namespace, collection, now - ttl)
        if await repository.claim_key(conn, namespace, collection, key, digest, now):
            return None
        row = await repository.claimed_key(conn, namespace, collection, key)
        if row is None or row.response is None or row.request_hash != digest:
            raise Conflict(
                "Idempotency-Key was already used with a different request body",
                code="idempotency_key_reused",
            )
        response: dict[str, Any] = json.loads(row.response)
        return response

    def _point_read(self, p: PointOut, vector_format: str = "json") -> dict[str, Any]:
        out: dict[str, Any] = {"id": p.id, "payload": encoding.raw_json(p.payload_json)}
        if p.vector is not None:
            if vector_format == "b64":
                out["vector_b64"] = encoding.to_b64(p.vector)
            else:
                out["vector"] = p.vector.tolist()
        return out

    async def get_point(
        self,
        conn: AsyncConnection,
        namespace: str,
        collection: str,
        point_id: str,
        with_vector: bool,
        vector_format: str,
    ) -> dict[str, Any]:
        info = await self.get(conn, namespace, collection)
        point = await self.index.get(conn, info, point_id, with_vector)
        if point is None:
            raise NotFound(f"point {point_id!r} does not exist in {collection!r}", code="point_not_found")
        return self._point_read(point, vector_format)

    async def update_point(
        self, conn: AsyncConnection, namespace: str, collection: str, point_id: str, body: PointUpdate
    ) -> tuple[dict[str, Any], CollectionInfo]:
        """The point as updated, and the collection written."""
        info = await self.get(conn, namespace, collection, lock=True)
        new_vector: PointIn | None = None
        nonzero = info.distance == "cosine"
        if body.vector is not None and body.vector_b64 is not None:
            raise InvalidInput("vector", "give at most one of vector or vector_b64")
        if body.vector is not None:
            vec = encoding.from_numbers(body.vector, info.vector_size, "vector", nonzero=nonzero)
        elif body.vector_b64 is not None:
            vec = encoding.from_b64(body.vector_b64, info.vector_size, "vector_b64", nonzero=nonzero)
        else:
            vec = None
        if vec is not None:
            new_vector = PointIn(point_id, vec, "", None, encoding.norm(vec))
        payload_json = self._payload_json(info, body.payload, "payload") if body.payload is not None else None
        changed = PointIn(point_id, array("f"), "", text_of(body.payload, info.text_field))
        await self._with_terms(info, [changed])
        before = await self._stored(conn, info, [point_id])
        found = await self.index.update(conn, info, point_id, new_vector, payload_json, changed.terms)
        if not found:
            raise NotFound(f"point {point_id!r} does not exist in {collection!r}", code="point_not_found")
        await self._keep(conn, info, before, await self._stored(conn, info, [point_id]))
        point = await self.index.get(conn, info, point_id, False)
        assert point is not None
        return self._point_read(point), info

    async def delete_point(
        self, conn: AsyncConnection, namespace: str, collection: str, point_id: str
    ) -> CollectionInfo | None:
        """The collection written (``None`` when it does not exist)."""
        info = await self.find(conn, namespace, collection, lock=True)
        if info is not None:
            before = await self._stored(conn, info, [point_id])
            await self.index.delete(conn, info, [point_id], None)
            await self._keep(conn, info, before, (0, 0))
        return info

    async def delete_points(
        self, conn: AsyncConnection, namespace: str, collection: str, body: PointsDelete
    ) -> tuple[dict[str, int], CollectionInfo]:
        """How many points went, and the collection written."""
        if body.ids is None and body.filters is None:
            raise InvalidInput("ids", "give `ids`, `filters` or both")
        flt = self._filter(body.filters) if body.filters is not None else None
        if body.ids is not None:
            self._check_batch("ids", len(body.ids))
            for i, pid in enumerate(body.ids):
                if key_problem(pid):
                    raise InvalidInput(f"ids.{i}", key_problem(pid) or "")
        info = await self.get(conn, namespace, collection, lock=True)
        before = await self._stored(conn, info, body.ids, flt)
        deleted = await self.index.delete(conn, info, body.ids, flt)
        await self._keep(conn, info, before, (0, 0))
        return {"deleted": deleted}, info

    async def list_points(
        self, conn: AsyncConnection, namespace: str, collection: str, body: PointsList
    ) -> dict[str, Any]:
        limits = self.settings.limits
        limit = body.limit or limits.default_page_size
        if limit > limits.max_page_size:
            raise InvalidInput("limit", f"must be at most {limits.max_page_size}")
        flt = self._filter(body.filters)
        after = decode_cursor(body.cursor, "after")["after"] if body.cursor else None
        info = await self.get(conn, namespace, collection)
        points, cut = await self.index.list(
            conn, info, flt, after, limit + 1, body.with_vectors, budget=limits.max_page_bytes,
            # a float as JSON text is up to ~24 characters, and 32 bytes as a Python float in a list
            dimension_bytes=32 if body.vector_format == "json" else 8,
        )
        more = cut or len(points) > limit  # cut at the byte budget, or more than asked
        points = points[:limit]
        items = [self._point_read(p, body.vector_format) for p in points]
        next_cursor = encode_cursor({"after": points[-1].id}) if more and points else None
        return {"items": items, "next_cursor": next_cursor}

    # --- search ------------------------------------------------------------------------------------

    async def search(
        self, conn: AsyncConnection, namespace: str, collection: str, body: SearchRequest
    ) -> dict[str, Any]:
        limits = self.settings.limits
        if body.limit > limits.max_page_size:
            raise InvalidInput("limit", f"must be at most {limits.max_page_size}")
        flt = self._filter(body.filters)
        try:
            return await self._search(conn, await self.cached(conn, namespace, collection), body, flt)
        except MissingTable:
            # Dropped (and maybe re-created) by another process since this one cached it, or
            # since this request read its registry row: then the failed statement aborted the
            # transaction that read began, and the row is read again in a new one.
            self.registry.forget(namespace, collection)
            if conn.in_transaction():
                await conn.rollback()
            return await self._search(conn, await self.cached(conn, namespace, collection), body, flt)

    async def _search(
        self, conn: AsyncConnection, info: CollectionInfo, body: SearchRequest, flt: Node | None
    ) -> dict[str, Any]:
        limits = self.settings.limits
        nonzero = info.distance == "cosine"
        if (body.vector is None) == (body.vector_b64 is None):
            raise InvalidInput("vector", "give exactly one of vector or vector_b64")
        if body.vector is not None:
            query_vec = encoding.from_numbers(body.vector, info.vector_size, "vector", nonzero=nonzero)
        else:
            query_vec = encoding.from_b64(body.vector_b64 or "", info.vector_size, "vector_b64", nonzero=nonzero)
        if body.alpha is not None and body.fusion != "weighted":
            raise InvalidInput("alpha", 'weighs the halves of fusion "weighted": give "fusion": "weighted" too')
        if body.with_vectors:
            per_dimension = VECTOR_ANSWER_BYTES[body.vector_format]
            weight = body.limit * info.vector_size * per_dimension
            if weight > limits.max_page_bytes:
                raise InvalidInput(
                    "with_vectors",
                    f"an answer carries at most {limits.max_page_bytes} bytes of vectors (limits.max_page_bytes); "
                    f"{body.limit} hits of {info.vector_size} dimensions count {weight} ({per_dimension} a dimension "
                    f"as {body.vector_format}): ask for at most {max(1, limits.max_page_bytes // (info.vector_size * per_dimension))}",
                )
        ef = body.ef_search
        terms = query_terms(body.query, info.text_language or DEFAULT_LANGUAGE) if body.query and info.text_field else []
        threshold = body.score_threshold
        text_plan: dict[str, Any] | None = None
        if not terms:
            hits, plan = await self.index.search(conn, info, query_vec, body.limit, flt, ef, limits.max_page_bytes)
            results = []
            for h in hits:
                score = _score(info.distance, h.distance)
                if threshold is not None and score < threshold:
                    continue
                results.append(self._hit(h, score))
        else:
            results, plan, text_plan = await self._hybrid(conn, info, query_vec, terms, body, flt)
        if body.with_vectors:
            results = await self._with_vectors(conn, info, results, body.vector_format)
        telemetry.count_plan(info.id, plan)
        if body.explain:
            explained = plan.as_dict()
            if text_plan is not None:
                explained["text"] = text_plan
            return {"results": results, "plan": explained}
        return {"results": results}

    async def _with_vectors(
        self, conn: AsyncConnection, info: CollectionInfo, results: list[dict[str, Any]], vector_format: str
    ) -> list[dict[str, Any]]:
        """``results`` with their stored vectors, read in one statement after the search; a point
        deleted in between is left out."""
        vectors = await self.index.vectors(conn, info, [r["id"] for r in results])
        out = []
        for hit in results:
            vec = vectors.get(hit["id"])
            if vec is not None:
                hit["vector_b64" if vector_format == "b64" else "vector"] = (
                    encoding.to_b64(vec) if vector_format == "b64" else vec.tolist()
                )
                out.append(hit)
        return out

    def _hit(self, h: Hit, score: float) -> dict[str, Any]:
        if h.payload_json is None:  # past the answer's byte budget
            return {"id": h.id, "score": score, "distance": h.distance, "payload": None, "payload_omitted": True}
        return {"id": h.id, "score": score, "distance": h.distance, "payload": encoding.raw_json(h.payload_json)}

    async def _hybrid(
        self,
        conn: AsyncConnection,
        info: CollectionInfo,
        vector: array[float],
        terms: list[str],
        body: SearchRequest,
        flt: Node | None,
    ) -> tuple[list[dict[str, Any]], Plan, dict[str, Any]]:
        """The fusion (module docstring) of the vector ranking and the BM25 ranking of ``terms``,
        and what the text half did. The rankings come without payloads; the answer's payloads are
        read once it is ranked, in its order, up to the byte budget (``VectorIndex.payloads``). A
        point deleted meanwhile comes without its payload, as one past the budget does (the
        client reads it, and leaves it out)."""
        limits = self.settings.limits
        pool = min(limits.max_page_size, max(body.limit * HYBRID_POOL_FACTOR, 20))
        vector_hits, plan = await self.index.search(conn, info, vector, pool, flt, body.ef_search, 0)
        ranking = await self.index.text_search(conn, info, terms, pool, flt, also=[h.id for h in vector_hits])
        by_id: dict[str, Hit] = {h.id: h for h in vector_hits}
        missing = [pid for pid, _ in ranking.hits if pid not in by_id]
        for h in await self.index.distances(conn, info, vector, missing):
            by_id[h.id] = h
        # a point the text search found and a delete took before its distance was read is not ranked
        fused = _fuse(info, vector_hits, ranking, by_id, body.fusion, 0.5 if body.alpha is None else body.alpha)
        ranked = sorted(fused, key=lambda pid: (-fused[pid].fused, by_id[pid].distance, pid))
        threshold = body.score_threshold
        chosen: list[Hit] = []
        for pid in ranked:
            h = by_id[pid]
            if threshold is not None and _score(info.distance, h.distance) < threshold:
                continue
            chosen.append(h)
            if len(chosen) == body.limit:
                break
        payloads = await self.index.payloads(conn, info, [h.id for h in chosen], limits.max_page_bytes)
        out = []
        for h in chosen:
            h.payload_json = payloads.get(h.id)
            hit = self._hit(h, fused[h.id].fused)
            if body.explain:
                hit["debug"] = fused[h.id].debug(body.fusion)
            out.append(hit)
        return out, plan, {"terms": terms, "fusion": body.fusion, "matched": len(ranking.hits), "exact": ranking.exact}


@dataclass
class _Halves:
    """How one candidate of a hybrid search scored on each half, and fused."""

    vector_rank: int | None
    vector_score: float
    text_rank: int | None
    text_score: float
    vector_normalised: float = 0.0
    text_normalised: float = 0.0
    alpha: float = 0.0
    fused: float = 0.0

    def debug(self, fusion: str) -> dict[str, Any]:
        vector: dict[str, Any] = {"rank": self.vector_rank, "score": self.vector_score}
        text: dict[str, Any] = {"rank": self.text_rank, "score": self.text_score}
        out: dict[str, Any] = {"fusion": fusion, "vector": vector, "text": text}
        if fusion == "weighted":
            vector["normalised"] = self.vector_normalised
            text["normalised"] = self.text_normalised
            out["alpha"] = self.alpha
        return out


def _fuse(
    info: CollectionInfo, vector_hits: list[Hit], ranking: TextRanking, by_id: dict[str, Hit], fusion: str, alpha: float
) -> dict[str, _Halves]:
    """Each candidate (a point of either ranking whose distance is known) with its fused score."""
    text_scores = {**ranking.scores, **dict(ranking.hits)}
    vector_rank = {h.id: i + 1 for i, h in enumerate(vector_hits)}
    text_rank = {pid: i + 1 for i, (pid, _) in enumerate(ranking.hits)}
    out = {
        pid: _Halves(vector_rank.get(pid), _score(info.distance, by_id[pid].distance), text_rank.get(pid), text_scores.get(pid, 0.0))
        for pid in dict.fromkeys([*vector_rank, *text_rank]) if pid in by_id
    }
    if fusion == "rrf":
        for c in out.values():
            c.fused = sum(1.0 / (RRF_K + r) for r in (c.vector_rank, c.text_rank) if r is not None)
        return out
    lo = min((c.vector_score for c in out.values()), default=0.0)
    hi = max((c.vector_score for c in out.values()), default=0.0)
    best_text = max((c.text_score for c in out.values()), default=0.0)
    for c in out.values():
        c.vector_normalised = (c.vector_score - lo) / (hi - lo) if hi > lo and math.isfinite(hi - lo) else 1.0
        c.text_normalised = c.text_score / best_text if best_text > 0 else 0.0
        c.alpha = alpha
        c.fused = alpha * c.vector_normalised + (1 - alpha) * c.text_normalised
    return out


def _subgraphs_read(counts: tuple[int, int] | None) -> dict[str, int] | None:
    return None if counts is None else {"built": counts[0], "building": counts[1]}


def _check_declared(info: CollectionInfo, payload: dict[str, Any] | None, where: str) -> None:
    """422 for a value of a declared payload field its index cannot hold (``declared_value_problem``)."""
    if not payload:
        return
    for index in info.payload_indexes:
        if index.field in payload:
            problem = declared_value_problem(payload[index.field])
            if problem is not None:
                raise InvalidInput(f"{where}.{index.field}", problem)
