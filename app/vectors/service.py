"""The rules of the vectors capability: collections, checked points, search and hybrid fusion.

SQL on per-collection tables is the backend's (``VectorIndex``); this module owns the registry
rows, validation (sizes, finiteness, limits), ids, idempotent inserts and rank fusion, and never
looks at the dialect.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import re
import uuid
from array import array
from collections.abc import Sequence
from datetime import datetime, timedelta, UTC
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.config import Settings
from app.core.errors import Conflict, InvalidInput, NotFound
from app.core.jsonvalue import LITERAL_YIELD_CHARS, LONE_SURROGATE, find_invalid, jsonb_text
from app.core.names import key_problem
from app.core.http.pagination import decode_cursor, encode_cursor
from app.vectors import encoding, telemetry
from app.vectors.backend import (
    CollectionInfo,
    Hit,
    MissingTable,
    PayloadIndexState,
    PointIn,
    PointOut,
    RegistryCache,
    VectorIndex,
)
from app.vectors.filters import WIDE_INTEGER, Node, find_wide_integer, parse_filter
from app.vectors.planner import Plan, ef_for
from app.vectors.payload_index import declared_value_problem
from app.vectors.recall import K, Calibration
from app.vectors import repository
from app.vectors.schemas import (
    MAX_QUERY_WORDS,
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
_WORD = re.compile(r"\w+", re.UNICODE)
IDEMPOTENCY_KEY_MAX = 255


def _now() -> datetime:
    return datetime.now(UTC)


def _score(distance_name: str, distance: float) -> float:
    """Higher is better: cosine 1 - d; ip: the inner product (d is its negation); l2: -d."""
    if distance_name == "cosine":
        return 1.0 - distance
    return -distance


def _text_of(payload: dict[str, Any] | None, field: str | None) -> str | None:
    if field is None or not payload:
        return None
    value = payload.get(field)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " ".join(value)
    return None


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
    ) -> None:
        self.index = index
        self.settings = settings
        self.registry = registry if registry is not None else RegistryCache()
        self.builder = builder
        """The background HNSW builder (PostgreSQL), told of writes once they are committed."""

    # --- collections ---------------------------------------------------------------------------

    def _info(self, row: Any) -> CollectionInfo:
        return CollectionInfo(
            id=row.id,
            namespace=row.namespace,
            collection=row.collection,
            vector_size=row.vector_size,
            distance=row.distance,
            index=json.loads(row.index_options),
            text_field=row.text_field,
            created_at=row.created_at,
        )

    async def find(
        self, conn: AsyncConnection, namespace: str, collection: str, *, lock: bool = False
    ) -> CollectionInfo | None:
        row = await repository.find_collection(conn, namespace, collection, lock=lock)
        return self._info(row) if row is not None else None

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
                {**p.as_option(), "state": st.state, "error": st.error,
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
        infos = [self._info(r) for r in rows[:limit]]
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
        await self.index.drop(conn, info)
        await repository.delete_collection(conn, namespace, collection)

    async def reset(self, conn: AsyncConnection, namespace: str, collection: str) -> None:
        info = await self.get(conn, namespace, collection, lock=True)
        await self.index.reset(conn, info)

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
            text=_text_of(payload, info.text_field),
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
        # One statement per batch; a repeated id in the batch: the last one wins.
        unique: dict[str, PointIn] = {}
        for p in points:
            unique.pop(p.id, None)
            unique[p.id] = p
        await self.index.upsert(conn, info, list(unique.values()))
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
        found = await self.index.update(
            conn, info, point_id, new_vector, payload_json, _text_of(body.payload, info.text_field)
        )
        if not found:
            raise NotFound(f"point {point_id!r} does not exist in {collection!r}", code="point_not_found")
        point = await self.index.get(conn, info, point_id, False)
        assert point is not None
        return self._point_read(point), info

    async def delete_point(
        self, conn: AsyncConnection, namespace: str, collection: str, point_id: str
    ) -> CollectionInfo | None:
        """The collection written (``None`` when it does not exist)."""
        info = await self.find(conn, namespace, collection, lock=True)
        if info is not None:
            await self.index.delete(conn, info, [point_id], None)
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
        deleted = await self.index.delete(conn, info, body.ids, flt)
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
        # the first words only: a query's length is bounded, but not every word need be split out
        words = [m[0] for m in itertools.islice(_WORD.finditer(body.query or ""), MAX_QUERY_WORDS)] if info.text_field else []
        threshold = body.score_threshold
        if not words:
            hits, plan = await self.index.search(conn, info, query_vec, body.limit, flt, ef, limits.max_page_bytes)
            results = []
            for h in hits:
                score = _score(info.distance, h.distance)
                if threshold is not None and score < threshold:
                    continue
                results.append(self._hit(h, score))
        else:
            results, plan = await self._hybrid(conn, info, query_vec, words, body.limit, flt, ef, threshold)
        if body.with_vectors:
            results = await self._with_vectors(conn, info, results, body.vector_format)
        telemetry.count_plan(info.id, plan)
        if body.explain:
            return {"results": results, "plan": plan.as_dict()}
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
        words: list[str],
        limit: int,
        flt: Node | None,
        ef: int | None,
        threshold: float | None,
    ) -> tuple[list[dict[str, Any]], Plan]:
        """Reciprocal rank fusion (k=60) of the vector ranking and the full-text ranking. The
        rankings come without payloads; the answer's payloads are read once it is ranked, in its
        order, up to the byte budget (``VectorIndex.payloads``). A point deleted meanwhile comes
        without its payload, as one past the budget does (the client reads it, and leaves it out)."""
        limits = self.settings.limits
        pool = min(limits.max_page_size, max(limit * HYBRID_POOL_FACTOR, 20))
        vector_hits, plan = await self.index.search(conn, info, vector, pool, flt, ef, 0)
        text_ids = await self.index.text_search(conn, info, words, pool, flt)
        by_id: dict[str, Hit] = {h.id: h for h in vector_hits}
        fused: dict[str, float] = {}
        for rank, h in enumerate(vector_hits):
            fused[h.id] = fused.get(h.id, 0.0) + 1.0 / (RRF_K + rank + 1)
        for rank, pid in enumerate(text_ids):
            fused[pid] = fused.get(pid, 0.0) + 1.0 / (RRF_K + rank + 1)
        missing = [pid for pid in text_ids if pid not in by_id]
        for h in await self.index.distances(conn, info, vector, missing):
            by_id[h.id] = h
        # a point the text search found and a delete took before its distance was read is not ranked
        ranked = sorted((pid for pid in fused if pid in by_id), key=lambda pid: (-fused[pid], by_id[pid].distance, pid))
        chosen: list[Hit] = []
        for pid in ranked:
            h = by_id[pid]
            if threshold is not None and _score(info.distance, h.distance) < threshold:
                continue
            chosen.append(h)
            if len(chosen) == limit:
                break
        payloads = await self.index.payloads(conn, info, [h.id for h in chosen], limits.max_page_bytes)
        out = []
        for h in chosen:
            h.payload_json = payloads.get(h.id)
            out.append(self._hit(h, fused[h.id]))
        return out, plan


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
