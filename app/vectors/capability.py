"""The vectors capability: collections of points, filtered and hybrid search (pgvector or sqlite-vec)."""

from __future__ import annotations

import logging
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.capability import Capability, Change
from app.core.config import Database
from app.fairness.fairshare import HeavyWrites
from app.core.errors import ProblemError
from app.core.names import NAME_PATTERN
from app.core.namespace_data import (
    Blob,
    Context,
    Deleted,
    NamespaceData,
    RefusedLine,
    Rows,
    delete_rows,
    PAGE_BYTES,
    export_table,
    load_rows,
    writer,
)
from app.core.state import GatewayState
from app.quotas.tables import Kept
from app.vectors.backend import RegistryCache
from app.vectors.usage import recount
from app.vectors.models import vector_collections, vector_idempotency
from app.vectors.encoding import to_b64
from app.vectors.router import router
from app.vectors.schemas import CollectionCreate, PointsUpsert
from app.vectors.samples import SAMPLES
from app.vectors.service import VectorService

log = logging.getLogger("app.vectors")


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[VectorService]:
    """The vectors service for the process: the backend chosen once from the vectors database's
    dialect, the registry cache and, on PostgreSQL, the background HNSW builder
    (``app.vectors.builder``), run for as long as the app runs."""
    databases = state.databases
    settings = state.settings
    heavy = HeavyWrites(
        databases.engine(Database.vectors), databases.write_queues.get(Database.vectors), settings.fairness, Database.vectors.value
    )
    if databases.dialect(Database.vectors) != "postgresql":
        from app.vectors.sqlite_vec import SqliteVecIndex

        yield VectorService(SqliteVecIndex(), settings, RegistryCache(), heavy=heavy)
        return
    from app.vectors.pgvector import PgVectorIndex, detect_version, install_vector_codec

    engine = databases.engine(Database.vectors)
    async with engine.connect() as conn:
        version = await detect_version(conn)
    if version is None:
        log.warning("vectors database: the pgvector extension is not installed yet (run the migrations)")
    else:
        install_vector_codec(engine, settings.vectors.ef_search)
        await engine.dispose()  # connections opened before the codec existed are replaced
    index = PgVectorIndex(
        version or "0",
        exact_threshold=settings.vectors.exact_search_threshold,
        ef_search=settings.vectors.ef_search,
        calibrated=settings.vectors.target_recall > 0,
    )
    from app.vectors.builder import IndexBuilder

    builder = IndexBuilder(engine, settings.vectors, index.forget)
    builder.start()
    try:
        yield VectorService(index, settings, RegistryCache(), builder, heavy)
    finally:
        await builder.stop()


class VectorsData(NamespaceData[VectorService]):
    """A namespace's collections, each with the tables and indexes of its points (dropped as a
    DELETE of the collection drops them, one collection a transaction), and its
    Idempotency-Key answers.

    Archive: ``collections`` (settings: size, distance, index options with the payload indexes,
    text field and language, created_at), ``points`` (collection, id, float32 vector in base64,
    payload JSON text) in id order, and ``vector_idempotency`` rows. An import creates each
    collection and writes its points through the API's own paths (checks, text terms), so every
    index the collection has is the importing backend's; PostgreSQL's HNSW builder is told after."""

    parts = ("collections", "points", "vector_idempotency")

    async def export(self, service: VectorService, conn: AsyncConnection, namespace: str, batch: int) -> AsyncIterator[Rows | Blob]:
        rows = (await conn.execute(
            select(vector_collections).where(vector_collections.c.namespace == namespace)
            .order_by(vector_collections.c.collection)
        )).all()
        for start in range(0, len(rows), batch):
            yield Rows("collections", tuple(
                {"collection": r.collection, "vector_size": r.vector_size, "distance": r.distance,
                 "index": json.loads(r.index_options), "text_field": r.text_field, "text_language": r.text_language,
                 "created_at": r.created_at.isoformat()}
                for r in rows[start:start + batch]
            ))
        for r in rows:
            info = service.info_of(r)
            after: str | None = None
            while True:
                points, _ = await service.index.list(conn, info, None, after, batch, True, budget=PAGE_BYTES, dimension_bytes=8)
                if not points:
                    break
                yield Rows("points", tuple(
                    {"collection": r.collection, "id": p.id,
                     "vector_b64": to_b64(p.vector) if p.vector is not None else None, "payload": p.payload_json}
                    for p in points
                ))
                after = points[-1].id
        async for part in export_table(conn, vector_idempotency, namespace, batch):
            yield part

    async def load(
        self, service: VectorService, conn: AsyncConnection, namespace: str, part: Rows, ctx: Context | None = None
    ) -> int:
        ctx = ctx if ctx is not None else {}
        if part.table == "vector_idempotency":
            return await load_rows(conn, vector_idempotency, namespace, part.rows)
        try:
            if part.table == "collections":
                from_sqlite = (ctx.get("source") or {}).get("backends", {}).get("vectors") == "sqlite"
                for row in part.rows:
                    await _create(service, conn, namespace, row, from_sqlite)
            elif part.table == "points":
                await _upsert(service, conn, namespace, part.rows, ctx)
            else:
                raise RefusedLine(f"no part {part.table!r} here (parts: {', '.join(self.parts)})")
        except (ValidationError, ProblemError, KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, RefusedLine):
                raise
            raise RefusedLine(f"{part.table}: {_message(exc)}") from None
        return len(part.rows)

    async def finish(self, service: VectorService, engine: AsyncEngine, namespace: str, ctx: Context) -> None:
        if service.builder is not None:
            async with engine.connect() as conn:
                for name in sorted(ctx.get("written", ())):
                    await service.builder.notice(await service.get(conn, namespace, name))

    async def delete(
        self, service: VectorService, engine: AsyncEngine, namespace: str, batch: int
    ) -> AsyncGenerator[Deleted, None]:
        first = (
            select(vector_collections.c.collection)
            .where(vector_collections.c.namespace == namespace).order_by(vector_collections.c.collection).limit(1)
        )
        while True:
            async with writer(engine).begin() as conn:
                name = (await conn.execute(first)).scalar_one_or_none()
                info = await service.find(conn, namespace, name, lock=True) if name is not None else None
                points = await service.index.count(conn, info) if info is not None else 0
                if name is not None:
                    await service.drop(conn, namespace, name)
            if name is None:
                break
            yield {"collections": 1, "points": points}
        async for deleted in delete_rows(engine, vector_idempotency, namespace, batch):
            yield deleted


def _message(exc: BaseException) -> str:
    if isinstance(exc, ProblemError):
        errors = getattr(exc, "errors", None)
        return f"{exc} {errors}" if errors else str(exc)
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return f"{type(exc).__name__}: {exc}"


async def _create(service: VectorService, conn: AsyncConnection, namespace: str, row: dict[str, Any], from_sqlite: bool) -> None:
    """The collection as created through the API. SQLite records every collection as ``exact``
    (it searches exactly whatever was asked), so from a SQLite archive the index is left to this
    backend's default, as a create without ``index`` gets."""
    index = dict(row["index"])
    kind = index.get("kind", "hnsw")
    body = CollectionCreate.model_validate({
        "vector_size": row["vector_size"], "distance": row["distance"],
        "index": None if from_sqlite else {
            "kind": "exact" if kind == "exact" else "hnsw", "m": index.get("m"), "ef_construction": index.get("ef_construction"),
        },
        "text_field": row["text_field"], "text_language": row["text_language"],
        "payload_indexes": index.get("payload_indexes"),
    })
    name = row["collection"]
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise RefusedLine(f"collection {name!r:.80} is not a collection name")
    _, created = await service.create(conn, namespace, name, body)
    if not created:
        raise RefusedLine(f"collection {name!r} appears twice")
    await conn.execute(
        update(vector_collections)
        .where(vector_collections.c.namespace == namespace, vector_collections.c.collection == name)
        .values(created_at=datetime.fromisoformat(row["created_at"]))
    )


async def _upsert(service: VectorService, conn: AsyncConnection, namespace: str, rows: tuple[dict[str, Any], ...], ctx: Context) -> None:
    step = service.settings.limits.max_batch_items
    by_collection: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_collection.setdefault(row["collection"], []).append(row)
    for name, points in by_collection.items():
        for start in range(0, len(points), step):
            chunk = points[start:start + step]
            body = PointsUpsert.model_validate({
                "ids": [p["id"] for p in chunk],
                "vectors_b64": [p["vector_b64"] for p in chunk],
                "payloads": [json.loads(p["payload"]) for p in chunk],
            })
            await service.upsert(conn, namespace, name, body, b"", None)
        ctx.setdefault("written", set()).add(name)


CAPABILITY = Capability(
    name="vectors",
    router=router,
    database=Database.vectors,
    lifecycle=lifecycle,
    # each collection's points live in a table of its own, named from its registry id, which
    # only a scoped vector_collections row hands out
    tables=(vector_collections, vector_idempotency),
    usage=(Kept(recount),),  # points and their bytes, kept by the service (no namespace column to trigger on)
    summary="Collections of vectors with JSON payloads: filtered, hybrid and batched search.",
    samples=SAMPLES,
    data=VectorsData(),
    changes=(
        Change("collection_create", ("PUT /{collection}",)),
        Change("collection_drop", ("DELETE /{collection}",)),
        Change("points_upsert", ("POST /{collection}/points", "PATCH /{collection}/points/{point_id}")),
        Change("points_delete", (
            "POST /{collection}/points/delete", "DELETE /{collection}/points/{point_id}", "POST /{collection}/reset",
        )),
    ),
)
