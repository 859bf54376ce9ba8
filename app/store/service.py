"""The rules of the store capability: what a namespace, key, value, TTL and vector may be, and
running a batch of LangGraph operations in order in one transaction.

Operations are answered in the order sent, and each sees the ones before it (a get after a put of
the same key reads the put). Consecutive operations of one kind go to the database together: a
run of gets is one statement, a run of puts keeps the last put of each key (nothing in between
could read the others). Everything is checked before anything is written, so a refused batch
changes nothing. A refreshed TTL (``refresh_ttl``) restarts at the read: on a read-only
request in a transaction of its own, after the reads, so that a key allowed to read may keep
alive what it reads without the request holding SQLite's write lock.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.config import LimitsSettings
from app.store.settings import StoreSettings
from app.core.namespace_data import writer
from app.core.errors import InvalidInput, PayloadTooLarge
from app.core.fast.fixed_statements import StatementConnection
from app.core.jsonvalue import encode_value, is_unicode, jsonb_text
from app.core.names import key_problem
from app.store import schemas
from app.store.filters import parse_filter
from app.store.repository import ItemWrite, Scope, StoredItem, StoreSql
from app.vectors.encoding import MAX_NORM
from app.vectors.filters import WIDE_INTEGER


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class BatchOutcome:
    """A batch's results (JSON-ready), and what the caller must do after the transaction."""

    results: list[Any] = field(default_factory=list)
    refresh: list[StoredItem] = field(default_factory=list)  # read items whose TTL restarts
    new_dims: set[int] = field(default_factory=set)

    @property
    def body(self) -> bytes:
        return orjson.dumps({"results": self.results})


def item_json(item: StoredItem, with_score: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "namespace": item.namespace, "key": item.key, "value": orjson.Fragment(item.value),
        "created_at": item.created_at.isoformat(), "updated_at": item.updated_at.isoformat(),
    }
    if with_score:
        out["score"] = item.score
    return out


class StoreService:
    def __init__(
        self, sql: StoreSql, limits: LimitsSettings, settings: StoreSettings, engine: AsyncEngine | None = None,
    ) -> None:
        self.sql = sql
        self.limits = limits
        self.settings = settings
        self.engine = engine  # for TTL refreshes after a read-only batch
        self.known_dims: set[int] = set()

    # --- checks ------------------------------------------------------------------------------------

    def namespace(self, where: str, labels: Sequence[str], *, allow_empty: bool = False) -> str:
        """The namespace as stored (labels joined by ``.``), or 422 naming what is wrong."""
        s = self.settings
        if not labels and not allow_empty:
            raise InvalidInput(where, "must hold at least one label")
        if len(labels) > s.max_namespace_depth:
            raise InvalidInput(where, f"must hold at most {s.max_namespace_depth} labels")
        for n, label in enumerate(labels):
            if not label:
                raise InvalidInput(f"{where}.{n}", "labels must not be empty")
            if "." in label or "\x00" in label:
                raise InvalidInput(f"{where}.{n}", "labels must not contain '.' or NUL")
            if not is_unicode(label):
                raise InvalidInput(f"{where}.{n}", "must be valid Unicode")
            if len(label.encode()) > s.max_label_bytes:
                raise InvalidInput(f"{where}.{n}", f"labels must be at most {s.max_label_bytes} bytes of UTF-8")
        joined = ".".join(labels)
        if len(joined.encode()) > s.max_namespace_bytes:
            raise InvalidInput(where, f"must be at most {s.max_namespace_bytes} bytes of UTF-8, labels joined by '.'")
        return joined

    @staticmethod
    def key(where: str, key: str) -> str:
        problem = key_problem(key)
        if problem:
            raise InvalidInput(where, problem)
        return key

    def stored_value(self, where: str, value: dict[str, Any]) -> str:
        text = encode_value(where, value, self.limits.max_value_bytes)
        stored = jsonb_text(text, value)
        if stored.wide:
            raise InvalidInput(where, f"{WIDE_INTEGER} (store a larger one as a string)")
        if len(stored.text) + stored.growth > self.limits.max_value_bytes:
            raise PayloadTooLarge(
                f"{where}: {len(stored.text) + stored.growth} bytes of JSON (numbers written out in full) exceed "
                f"the limit of {self.limits.max_value_bytes} bytes",
                errors=[{"loc": where.split("."), "msg": "too large"}],
            )
        return stored.text

    def _ttl(self, where: str, ttl: float | None, now: datetime) -> datetime | None:
        if ttl is None:
            return None
        if not 0 < ttl <= self.settings.max_ttl_minutes:
            raise InvalidInput(where, f"must be more than 0 and at most {self.settings.max_ttl_minutes} minutes")
        return now + timedelta(minutes=ttl)

    def _vectors(self, where: str, vectors: list[schemas.VectorIn] | None) -> list[tuple[str, array[float]]]:
        if not vectors:
            return []
        s = self.settings
        if len(vectors) > s.max_vectors_per_item:
            raise PayloadTooLarge(
                f"{where}: {len(vectors)} vectors exceed the limit of {s.max_vectors_per_item} per item",
                errors=[{"loc": where.split("."), "msg": "too many vectors"}],
            )
        out: list[tuple[str, array[float]]] = []
        seen: set[str] = set()
        dims = len(vectors[0].vector)
        for n, v in enumerate(vectors):
            here = f"{where}.{n}"
            if key_problem(v.field) or not is_unicode(v.field):
                raise InvalidInput(f"{here}.field", "must be 1-1024 bytes of UTF-8 without control characters")
            if v.field in seen:
                raise InvalidInput(f"{here}.field", "each field path once")
            seen.add(v.field)
            if len(v.vector) != dims:
                raise InvalidInput(f"{here}.vector", f"has {len(v.vector)} dimensions where the item's first has {dims}")
            if dims > s.max_dimensions:
                raise InvalidInput(f"{here}.vector", f"must have at most {s.max_dimensions} dimensions")
            out.append((v.field, self._finite(f"{here}.vector", v.vector)))
        return out

    def _query(self, where: str, vector: list[float] | None) -> array[float] | None:
        if vector is None:
            return None
        if len(vector) > self.settings.max_dimensions:
            raise InvalidInput(where, f"must have at most {self.settings.max_dimensions} dimensions")
        return self._finite(where, vector)

    @staticmethod
    def _finite(where: str, values: list[float]) -> array[float]:
        """float32 numbers whose distances stay finite (``app.vectors.encoding.MAX_NORM``)."""
        vector = array("f", values)
        if not math.hypot(*vector) <= MAX_NORM:
            raise InvalidInput(where, f"must hold finite float32 numbers with a norm of at most {MAX_NORM:g}")
        return vector

    def _page(self, where: str, limit: int, offset: int, max_limit: int) -> None:
        if limit > max_limit:
            raise InvalidInput(f"{where}.limit", f"must be at most {max_limit}")
        if offset > self.settings.max_offset:
            raise InvalidInput(f"{where}.offset", f"must be at most {self.settings.max_offset}")

    def check(self, ops: Sequence[Any]) -> list[Any]:
        """Every operation checked (422/413 naming the first problem), as the runs take them."""
        if len(ops) > self.settings.max_ops:
            raise PayloadTooLarge(
                f"ops: {len(ops)} operations exceed the limit of {self.settings.max_ops} per request",
                errors=[{"loc": ["ops"], "msg": "too many operations"}],
            )
        now = utcnow()
        checked: list[Any] = []
        for n, op in enumerate(ops):
            where = f"ops.{n}"
            if isinstance(op, schemas.GetOp):
                checked.append(("get", self.namespace(f"{where}.namespace", op.namespace, allow_empty=True) if op.namespace else "",
                                self.key(f"{where}.key", op.key), op.refresh_ttl))
            elif isinstance(op, schemas.PutOp):
                prefix = self.namespace(f"{where}.namespace", op.namespace)
                key = self.key(f"{where}.key", op.key)
                if op.value is None:
                    checked.append(("put", prefix, key, None))
                    continue
                write = ItemWrite(
                    prefix=prefix, key=key, depth=len(op.namespace), labels=orjson.dumps(op.namespace).decode(),
                    value=self.stored_value(f"{where}.value", op.value), ttl_minutes=op.ttl,
                    expires_at=self._ttl(f"{where}.ttl", op.ttl, now), vectors=self._vectors(f"{where}.vectors", op.vectors),
                )
                checked.append(("put", prefix, key, write))
            elif isinstance(op, schemas.SearchOp):
                self.namespace(f"{where}.namespace_prefix", op.namespace_prefix, allow_empty=True)
                self._page(where, op.limit, op.offset, self.settings.max_search_limit)
                flt = parse_filter(
                    op.filter, field=f"{where}.filter", max_depth=self.limits.max_filter_depth,
                    max_terms=self.limits.max_filter_terms,
                )
                checked.append(("search", op, flt, self._query(f"{where}.query_vector", op.query_vector)))
            else:
                for c, condition in enumerate(op.match_conditions):
                    self.namespace(f"{where}.match_conditions.{c}.path", condition.path, allow_empty=True)
                self._page(where, op.limit, op.offset, self.limits.max_page_size)
                if op.max_depth is not None and op.max_depth > self.settings.max_namespace_depth:
                    op.max_depth = self.settings.max_namespace_depth
                checked.append(("list", op))
        return checked

    # --- running a batch --------------------------------------------------------------------------

    async def run(self, conn: AsyncConnection, ns: str, ops: Sequence[Any], omit_expired: bool, *, writes: bool) -> BatchOutcome:
        """Run the checked ``ops`` in order on ``conn`` (one transaction, or each statement on its
        own where the backend gains by it: reads, ``StoreSql.reading``, and puts it writes in one
        statement, ``StoreSql.one_statement``); the results."""
        now = utcnow()
        if not writes:
            await self.sql.reading(conn, [(op[3], op[1].distance) for op in ops if op[0] == "search" and op[3] is not None])
        elif self._one_statement(ops):
            await self.sql.autocommit(conn)  # atomic alone: no BEGIN and COMMIT round trips
        results: list[Any] = [None] * len(ops)
        outcome = BatchOutcome(results)
        i = 0
        while i < len(ops):
            kind = ops[i][0]
            j = i
            while j < len(ops) and ops[j][0] == kind and kind in ("get", "put"):
                j += 1
            if kind == "get":
                await self._gets(conn, ns, ops[i:j], i, omit_expired, now, outcome)
            elif kind == "put":
                await self._puts(conn, ns, ops[i:j], now, outcome)
            elif kind == "search":
                _, op, flt, query = ops[i]
                scope = Scope(tuple(op.namespace_prefix), flt, omit_expired, now)
                items = await self.sql.search(
                    conn, ns, scope, op.limit, op.offset, (query, op.distance) if query is not None else None,
                    self.settings.exact_search_threshold,
                )
                results[i] = [item_json(item, with_score=True) for item in items]
                if op.refresh_ttl:
                    outcome.refresh.extend(item for item in items if item.ttl_minutes is not None)
                j = i + 1
            else:
                op = ops[i][1]
                conditions = [(c.match_type, c.path) for c in op.match_conditions]
                results[i] = await self.sql.list_namespaces(
                    conn, ns, conditions, op.max_depth, op.limit, op.offset, omit_expired, now
                )
                j = i + 1
            i = j
        if writes and outcome.refresh:
            await self.sql.refresh(conn, ns, outcome.refresh, now)
            outcome.refresh = []
        return outcome

    def _one_statement(self, ops: Sequence[Any]) -> bool:
        """Whether a batch is puts alone (no deletes) that ``upsert`` writes in one statement, of
        embedding sizes already registered."""
        if not all(op[0] == "put" and op[3] is not None for op in ops):
            return False
        writes = [op[3] for op in ops]
        return not {len(v) for w in writes for _, v in w.vectors} - self.known_dims and self.sql.one_statement(writes)

    async def get(self, conn: StatementConnection, ns: str, ops: Sequence[Any], omit_expired: bool) -> BatchOutcome:
        """Checked gets alone (``/get``): one statement; the TTLs they refresh are the caller's to
        restart after the answer (``refresh_after``)."""
        outcome = BatchOutcome([None] * len(ops))
        await self._gets(conn, ns, ops, 0, omit_expired, utcnow(), outcome)
        return outcome

    async def _gets(
        self, conn: StatementConnection, ns: str, run: Sequence[Any], start: int, omit_expired: bool, now: datetime,
        outcome: BatchOutcome,
    ) -> None:
        found = await self.sql.get_many(conn, ns, [(op[1], op[2]) for op in run], omit_expired, now)
        for n, op in enumerate(run, start=start):
            item = found.get((op[1], op[2]))
            outcome.results[n] = item_json(item) if item is not None else None
            if item is not None and op[3] and item.ttl_minutes is not None:
                outcome.refresh.append(item)

    async def _puts(self, conn: AsyncConnection, ns: str, run: Sequence[Any], now: datetime, outcome: BatchOutcome) -> None:
        last: dict[tuple[str, str], ItemWrite | None] = {}
        for _, prefix, key, write in run:
            last.pop((prefix, key), None)  # keep the order of the last put of each key
            last[(prefix, key)] = write
        deletes = [k for k, w in last.items() if w is None]
        writes = [w for w in last.values() if w is not None]
        if deletes:
            await self.sql.delete(conn, ns, deletes)
        if writes:
            for dims in {len(v) for w in writes for _, v in w.vectors} - self.known_dims:
                await self.sql.register_dims(conn, dims)
                outcome.new_dims.add(dims)
            await self.sql.upsert(conn, ns, writes, now)

    def dims_committed(self, dims: set[int]) -> None:
        """Embedding sizes a committed write registered (no need to register them again)."""
        self.known_dims |= dims

    async def refresh_after(self, ns: str, items: list[StoredItem]) -> None:
        """Restart the TTL of ``items`` in a write transaction of its own (after a read-only batch)."""
        if self.engine is None or not any(item.ttl_minutes is not None for item in items):
            return
        async with writer(self.engine).begin() as conn:
            await self.sql.refresh(conn, ns, items, utcnow())

    # --- whole namespaces ----------------------------------------------------------------------------

    async def delete_subtree(self, conn: AsyncConnection, ns: str, prefix: list[str]) -> tuple[int, bool]:
        self.namespace("prefix", prefix, allow_empty=True)
        deleted = await self.sql.delete_subtree(conn, ns, prefix, self.settings.delete_batch)
        return deleted, deleted < self.settings.delete_batch

    async def sweep_namespace(self, conn: AsyncConnection, ns: str) -> tuple[int, bool]:
        deleted = await self.sql.sweep_namespace(conn, ns, utcnow(), self.settings.delete_batch)
        return deleted, deleted < self.settings.delete_batch

    async def sweep(self, conn: AsyncConnection) -> int:
        return await self.sql.sweep(conn, utcnow(), self.settings.sweep_batch)
