"""The store capability: LangGraph long-term memory (``BaseStore``) in the vectors database.

Why the vectors database: an item and its vectors are written in one transaction, so they must
live in one database, and the vector search (sqlite-vec, pgvector) is there.
"""

from __future__ import annotations

import logging
import base64
import binascii
from array import array
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import orjson
from sqlalchemy import Text, bindparam, cast, delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.capability import Capability, Change, Periodic, expiry_sweep
from app.core.config import Database
from app.core.errors import ProblemError
from app.core.namespace_data import Blob, Context, Deleted, NamespaceData, RefusedLine, Rows, keyset_pages, writer
from app.core.state import GatewayState
from app.quotas.tables import Counted
from app.store.models import store_items, store_vectors
from app.store import platform  # noqa: F401 - LangGraph Platform's routes, on the store router
from app.store.repository import ItemWrite, StoreSql
from app.store.service import utcnow
from app.store.router import router
from app.store.samples import SAMPLES
from app.store.service import StoreService

log = logging.getLogger("app.store")


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[StoreService]:
    """The store service for the vectors database's backend. On PostgreSQL vectors travel in
    pgvector's binary form, through the codec the vectors capability installs on the engine."""
    settings = state.settings
    sql: StoreSql
    if state.databases.dialect(Database.vectors) == "postgresql":
        from app.store.postgres import PostgresStoreSql

        sql = PostgresStoreSql(settings.store.ef_search)
    else:
        from app.store.sqlite import SqliteStoreSql

        sql = SqliteStoreSql()
    yield StoreService(sql, settings.limits, settings.store, state.databases.engine(Database.vectors))


def periodic(service: StoreService, state: GatewayState) -> Iterator[Periodic]:
    engine = state.databases.engine(Database.vectors)
    yield expiry_sweep(
        "store-sweep", engine, service.sweep, service.settings.sweep_batch,
        service.settings.sweep_interval_seconds, log, "items",
    )
    from app.store.postgres import PostgresStoreSql

    if isinstance(service.sql, PostgresStoreSql):
        from app.store.indexes import IndexBuilder

        builder = IndexBuilder(engine, service.sql, service.settings, state.settings.vectors)
        yield Periodic("store-indexes", service.settings.index_sweep_seconds, builder.round, at_start=True)


class StoreData(NamespaceData[StoreService]):
    """A namespace's items and their vectors (``store_vectors``, keyed by the items' ids): deleted
    ``batch`` items a transaction, their vectors with them.

    Archive: part ``items``, one line per item with its vectors (field path, float32 in base64);
    depth, norms and dimensions are derived again on import, which writes through the store's
    own upsert (values checked and stored as a put stores them), then sets the times."""

    parts = ("items",)

    async def export(self, service: StoreService, conn: AsyncConnection, namespace: str, batch: int) -> AsyncIterator[Rows | Blob]:
        pages = keyset_pages(
            conn, list(store_items.c), [store_items.c.id], [store_items.c.namespace == namespace], batch,
            [cast(store_items.c.value, Text)],
        )
        async for page in pages:
            items = [SimpleNamespace(**row) for row in page]
            ids = [r.id for r in items]
            vectors: dict[int, list[dict[str, str]]] = {}
            found = await conn.execute(
                select(store_vectors.c.item_id, store_vectors.c.field, store_vectors.c.embedding)
                .where(store_vectors.c.item_id.in_(ids)).order_by(store_vectors.c.item_id, store_vectors.c.field)
            )
            for v in found:
                vectors.setdefault(v.item_id, []).append({"field": v.field, "embedding_b64": _b64(v.embedding)})
            yield Rows("items", tuple(
                {"labels": orjson.loads(r.labels), "key": r.key,
                 "value": r.value if isinstance(r.value, dict) else orjson.loads(r.value),
                 "created_at": r.created_at.isoformat(), "updated_at": r.updated_at.isoformat(),
                 "expires_at": r.expires_at.isoformat() if r.expires_at is not None else None,
                 "ttl_minutes": r.ttl_minutes, "vectors": vectors.get(r.id, [])}
                for r in items
            ))

    async def load(
        self, service: StoreService, conn: AsyncConnection, namespace: str, part: Rows, ctx: Context | None = None
    ) -> int:
        if part.table != "items":
            raise RefusedLine(f"no part {part.table!r} here (parts: items)")
        writes: list[ItemWrite] = []
        times: list[dict[str, Any]] = []
        try:
            for row in part.rows:
                labels = row["labels"]
                if not isinstance(labels, list):
                    raise RefusedLine("labels must be a list")
                prefix = service.namespace("labels", labels)
                key = service.key("key", row["key"])
                if not isinstance(row["value"], dict):
                    raise RefusedLine("value must be an object")
                ttl = row["ttl_minutes"]
                if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)):
                    raise RefusedLine("ttl_minutes must be a number")
                expires = datetime.fromisoformat(row["expires_at"]) if row["expires_at"] is not None else None
                vectors = []
                for v in row["vectors"]:
                    raw = base64.b64decode(v["embedding_b64"], validate=True)
                    if not raw or len(raw) % 4 or not isinstance(v["field"], str):
                        raise RefusedLine("a vector must be float32 bytes in base64 with a field path")
                    vectors.append((v["field"], array("f", raw)))
                writes.append(ItemWrite(
                    prefix=prefix, key=key, depth=len(labels), labels=orjson.dumps(labels).decode(),
                    value=service.stored_value("value", row["value"]), ttl_minutes=ttl, expires_at=expires, vectors=vectors,
                ))
                times.append({"p": prefix, "k": key, "c": datetime.fromisoformat(row["created_at"]),
                              "u": datetime.fromisoformat(row["updated_at"])})
        except (KeyError, TypeError, ValueError, binascii.Error, ProblemError) as exc:
            if isinstance(exc, RefusedLine):
                raise
            raise RefusedLine(f"items: {type(exc).__name__}: {exc}") from None
        for dims in sorted({len(vec) for w in writes for _, vec in w.vectors}):
            await service.sql.register_dims(conn, dims)
        await service.sql.upsert(conn, namespace, writes, utcnow())
        await conn.execute(
            update(store_items)
            .where(store_items.c.namespace == namespace, store_items.c.prefix == bindparam("p"),
                   store_items.c.key == bindparam("k"))
            .values(created_at=bindparam("c"), updated_at=bindparam("u")),
            times,
        )
        return len(writes)

    async def delete(
        self, service: StoreService, engine: AsyncEngine, namespace: str, batch: int
    ) -> AsyncGenerator[Deleted, None]:
        while True:
            async with writer(engine).begin() as conn:
                chosen = select(store_items.c.id).where(store_items.c.namespace == namespace).limit(batch)
                ids = list((await conn.execute(chosen)).scalars())
                vectors = 0
                if ids:  # their vectors first: not left to SQLite's foreign_keys pragma
                    vectors = (await conn.execute(delete(store_vectors).where(store_vectors.c.item_id.in_(ids)))).rowcount
                    await conn.execute(
                        delete(store_items).where(store_items.c.namespace == namespace, store_items.c.id.in_(ids))
                    )
            if not ids:
                return
            yield {"items": len(ids), "vectors": vectors or 0}
            if len(ids) < batch:
                return


def _b64(embedding: Any) -> str:
    """A stored embedding (SQLite: float32 bytes; PostgreSQL: the codec's array) as base64."""
    raw = embedding.tobytes() if isinstance(embedding, array) else bytes(embedding) if isinstance(embedding, bytes | memoryview) else array("f", embedding).tobytes()
    return base64.b64encode(raw).decode("ascii")


CAPABILITY = Capability(
    name="store",
    router=router,
    database=Database.vectors,
    lifecycle=lifecycle,
    periodic=periodic,
    # store_vectors rows are keyed by an item's id, which only a scoped store_items row hands out
    tables=(store_items,),
    samples=SAMPLES,
    data=StoreData(),
    usage=(Counted(store_items, length_of="value"),),  # items and their values' bytes (not their vectors)
    changes=(
        # a batch's puts with a value write items, those without one delete them
        Change("items_write", ("POST /batch", "PUT /langgraph/store/items", "DELETE /langgraph/store/items")),
        Change("subtree_delete", ("POST /namespaces/delete",)),
        Change("expire", ("POST /sweep",), job="store-sweep"),
    ),
    # no errors of its own: every limit is checked before a statement runs (values, namespaces,
    # vectors, dimensions within pgvector's 16,000), integers past 64 bits are the gateway's rule
    summary="LangGraph long-term memory: items under tuple namespaces with semantic search and TTL "
    "(the client's GatewayStore); LangGraph Platform's /store API under /v1/{namespace}/store/langgraph.",
)
