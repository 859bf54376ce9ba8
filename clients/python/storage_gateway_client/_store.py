"""``GatewayStore``: LangGraph's ``BaseStore`` (long-term memory, langgraph-checkpoint 4.x) on the
gateway's store capability: ``gw.store(index=..., ttl=...)``. Needs the ``langgraph`` extra.

An ``AsyncBatchedBaseStore``: the operations of one event-loop tick go to the gateway as one
request (``/store/get`` when they only get, ``/store/read`` when they only read, ``/store/batch``
otherwise), answered in order. Embeddings are computed here, with LangGraph's own helpers (``ensure_embeddings``,
``tokenize_path``, ``get_text_at_path``), the texts extracted exactly as ``AsyncPostgresStore``
extracts them (one vector per field path, ``path.i`` per text of a ``[*]`` path); the gateway
stores each item with its vectors in one transaction and ranks a query search by each item's
best field. TTLs are LangGraph's (minutes, ``refresh_on_read``, ``default_ttl``,
``omit_expired``); the gateway sweeps expired items itself, and ``sweep_ttl()`` sweeps this
namespace now.

The sync methods work from any thread but the event loop the store runs on (they submit to it,
as ``AsyncPostgresStore``'s do).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson
from langgraph.store.base import (
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
    validate_op_namespace,
)
from langgraph.store.base.batch import AsyncBatchedBaseStore

from ._exceptions import InvalidRequest

if TYPE_CHECKING:
    from ._client import GatewayClient
    from ._transport import Transport

log = logging.getLogger("storage_gateway_client.store")

MAX_OPS = 500  # operations per request (the gateway's store.max_ops is 1000 by default)
_LARGEST = 1.7976931348623157e308
_NOTHING: dict[str, Any] = {"$in": []}
_EVERYTHING: dict[str, Any] = {"$nin": []}


class InvalidStoreRequest(InvalidRequest, ValueError):
    """A 422/413 from the store (``ValueError``, as LangGraph's stores raise; ``code``
    ``invalid_filter_key`` for a filter key the gateway refuses: ``Invalid filter key``)."""


class InvalidStoreNamespace(InvalidRequest, InvalidNamespaceError):
    """A namespace the gateway refuses (LangGraph's ``InvalidNamespaceError``)."""


def _index_config(index: IndexConfig) -> tuple[Any, dict[str, Any]]:
    """LangGraph's index config as AsyncPostgresStore reads it: embeddings and tokenized fields."""
    config: dict[str, Any] = dict(index)
    fields = config.get("fields") or ["$"]
    if isinstance(fields, str):
        fields = [fields]
    if not isinstance(fields, list):
        raise ValueError(f"Text fields must be a list or a string. Got {fields}")
    config["__tokenized_fields"] = [(p, "$" if p == "$" else tokenize_path(p)) for p in fields]
    return ensure_embeddings(config.get("embed")), config


def _finite_filter(flt: dict[str, Any]) -> dict[str, Any]:
    """``flt`` with what JSON cannot carry (infinities, NaN) said in terms it can: ``$lt inf``
    is every number, ``$gt inf`` none, anything ``== NaN`` none."""

    def operand(op: str, value: Any) -> dict[str, Any] | None:
        if not isinstance(value, float) or math.isfinite(value):
            return None
        if math.isnan(value) or op in ("$eq", "$ne"):
            return _EVERYTHING if op == "$ne" else _NOTHING
        every = (op in ("$lt", "$lte")) == (value > 0)
        if not every:
            return _NOTHING
        return {"$gte": -_LARGEST} if op in ("$gt", "$gte") else {"$lte": _LARGEST}

    out: dict[str, Any] = {}
    extra: list[dict[str, Any]] = []
    for key, value in flt.items():
        if key in ("$and", "$or") and isinstance(value, list):
            out[key] = [_finite_filter(v) if isinstance(v, dict) else v for v in value]
        elif isinstance(value, dict) and value and all(isinstance(k, str) and k.startswith("$") for k in value):
            kept = {}
            for op, v in value.items():
                replaced = operand(op, v)
                if replaced is None:
                    kept[op] = v
                else:
                    extra.append({key: replaced})
            if kept:
                out[key] = kept
        elif isinstance(value, float) and not math.isfinite(value):
            extra.append({key: _NOTHING})
        else:
            out[key] = value
    if extra:
        out["$and"] = [*out.get("$and", []), *extra] if isinstance(out.get("$and"), list) else extra
    return out


def _dumps(body: Any) -> bytes:
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # an integer beyond 64 bits (which the gateway refuses, naming it)
        return json.dumps(body, default=str, separators=(",", ":")).encode()


def _item(data: dict[str, Any]) -> Item:
    return Item(
        value=data["value"], key=data["key"], namespace=tuple(data["namespace"]),
        created_at=datetime.fromisoformat(data["created_at"]), updated_at=datetime.fromisoformat(data["updated_at"]),
    )


def _search_item(data: dict[str, Any]) -> SearchItem:
    return SearchItem(
        namespace=tuple(data["namespace"]), key=data["key"], value=data["value"],
        created_at=datetime.fromisoformat(data["created_at"]), updated_at=datetime.fromisoformat(data["updated_at"]),
        score=data.get("score"),
    )


class GatewayStore(AsyncBatchedBaseStore):
    """LangGraph store keeping items in a gateway namespace: ``gw.store(index=..., ttl=...)``.

    ``index``: LangGraph's ``IndexConfig`` (``dims``, ``embed``, ``fields``; ``distance_type``
    ``cosine``, ``l2`` or ``inner_product`` as ``PostgresIndexConfig`` has it). ``ttl``:
    LangGraph's ``TTLConfig``.
    """

    supports_ttl = True

    def __init__(self, client: GatewayClient, *, index: IndexConfig | None = None, ttl: TTLConfig | None = None) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # made outside an event loop: bound to the first one that uses it
            self._unbound = True
            self._task = None
        else:
            self._unbound = False
            super().__init__()
        self._transport: Transport = client._transport
        self._prefix = f"/v1/{quote(client.namespace, safe='')}/store"
        self.index_config: dict[str, Any] | None = None
        self.embeddings: Any = None
        if index:
            self.embeddings, self.index_config = _index_config(index)
        self.ttl_config = ttl
        self._distance = (self.index_config or {}).get("distance_type", "cosine")
        if self._distance not in ("cosine", "l2", "inner_product"):
            raise ValueError(f"distance_type must be cosine, l2 or inner_product, not {self._distance!r}")
        self._sweeper: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def _ensure_task(self) -> None:
        if self._unbound:
            self._loop = asyncio.get_running_loop()
            self._aqueue = asyncio.Queue()
            self._unbound = False
        super()._ensure_task()

    async def setup(self) -> None:
        """Nothing to set up: the gateway migrates its own databases (for parity with LangGraph's stores)."""

    # --- the batch -----------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        if self._unbound:
            raise asyncio.InvalidStateError(
                "GatewayStore's sync methods run on the event loop it was first used on; use it from async code first"
            )
        return super().batch(ops)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        for op in ops:
            validate_op_namespace(op)
            if isinstance(op, PutOp) and op.value is not None and op.ttl is not None and op.ttl <= 0:
                raise ValueError(f"ttl must be positive (minutes), got {op.ttl}")
        wire = await self._wire(ops)
        results: list[Result] = []
        for start in range(0, len(wire), MAX_OPS):
            chunk = wire[start:start + MAX_OPS]
            kinds = {w["op"] for w in chunk}
            path = "/get" if kinds == {"get"} else "/batch" if "put" in kinds else "/read"
            body = {"ops": chunk, "omit_expired": bool((self.ttl_config or {}).get("omit_expired", False))}
            answer = await self._post(path, body)
            results.extend(self._result(op, r) for op, r in zip(ops[start:start + MAX_OPS], answer["results"], strict=True))
        return results

    async def _wire(self, ops: Sequence[Op]) -> list[dict[str, Any]]:
        """The operations as the gateway takes them, with the embeddings of puts and queries."""
        texts: list[tuple[int, str, str]] = []  # (op index, field path, text)
        queries: list[tuple[int, str]] = []
        wire: list[dict[str, Any]] = []
        for n, op in enumerate(ops):
            if isinstance(op, GetOp):
                wire.append({"op": "get", "namespace": list(op.namespace), "key": str(op.key), "refresh_ttl": op.refresh_ttl})
            elif isinstance(op, PutOp):
                put: dict[str, Any] = {"op": "put", "namespace": list(op.namespace), "key": str(op.key)}
                put["value"] = None if op.value is None else dict(op.value)
                if op.value is not None:
                    if op.ttl is not None:
                        put["ttl"] = op.ttl
                    texts.extend((n, path, text) for path, text in self._texts(op))
                wire.append(put)
            elif isinstance(op, SearchOp):
                search: dict[str, Any] = {
                    "op": "search", "namespace_prefix": list(op.namespace_prefix), "limit": op.limit,
                    "offset": op.offset, "refresh_ttl": op.refresh_ttl, "distance": self._distance,
                }
                if op.filter:
                    search["filter"] = _finite_filter(dict(op.filter))
                if op.query and self.embeddings is not None:
                    queries.append((n, op.query))
                wire.append(search)
            elif isinstance(op, ListNamespacesOp):
                wire.append({
                    "op": "list_namespaces", "max_depth": op.max_depth, "limit": op.limit, "offset": op.offset,
                    "match_conditions": [{"match_type": c.match_type, "path": list(c.path)} for c in op.match_conditions or ()],
                })
            else:
                raise ValueError(f"Unknown operation type: {type(op)}")
        if texts:
            vectors = await self.embeddings.aembed_documents([t for _, _, t in texts])
            for (n, path, _), vector in zip(texts, vectors, strict=True):
                wire[n].setdefault("vectors", []).append({"field": path, "vector": [float(x) for x in vector]})
        if queries:
            vectors = await self.embeddings.aembed_documents([q for _, q in queries])
            for (n, _), vector in zip(queries, vectors, strict=True):
                wire[n]["query_vector"] = [float(x) for x in vector]
        return wire

    def _texts(self, op: PutOp) -> list[tuple[str, str]]:
        """(field path, text) of each text the put embeds, as AsyncPostgresStore extracts them."""
        if self.index_config is None or op.index is False or op.value is None:
            return []
        if op.index is None:
            paths = self.index_config["__tokenized_fields"]
        else:
            paths = [(ix, tokenize_path(ix)) for ix in op.index]
        out = []
        for path, tokenized in paths:
            texts = get_text_at_path(op.value, tokenized)
            for i, text in enumerate(texts):
                out.append((f"{path}.{i}" if len(texts) > 1 else path, text))
        return out

    @staticmethod
    def _result(op: Op, result: Any) -> Result:
        if isinstance(op, GetOp):
            return _item(result) if result is not None else None
        if isinstance(op, SearchOp):
            return [_search_item(r) for r in result]
        if isinstance(op, ListNamespacesOp):
            return [tuple(ns) for ns in result]
        return None

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            response = await self._transport.request(
                "POST", self._prefix + path, idempotent=True, content=_dumps(body),
                headers={"Content-Type": "application/json"},
            )
        except InvalidRequest as exc:
            raise _store_error(exc) from None
        return orjson.loads(response.content)

    # --- beyond LangGraph: namespace subtrees, TTL sweeps ---------------------------------------------

    async def adelete_namespace(self, prefix: tuple[str, ...]) -> int:
        """Delete every item whose namespace starts with ``prefix`` (all of them: ``()``); how many."""
        total = 0
        while True:
            answer = await self._post("/namespaces/delete", {"prefix": list(prefix)})
            total += int(answer["deleted"])
            if answer["done"]:
                return total

    def delete_namespace(self, prefix: tuple[str, ...]) -> int:
        return asyncio.run_coroutine_threadsafe(self.adelete_namespace(prefix), self._loop).result()

    async def sweep_ttl(self) -> int:
        """Delete this namespace's expired items now; how many went."""
        total = 0
        while True:
            response = await self._transport.request("POST", self._prefix + "/sweep", idempotent=True)
            answer = response.json()
            total += int(answer["deleted"])
            if answer["done"]:
                return total

    async def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> asyncio.Task[None]:
        """Sweep every ``sweep_interval_minutes`` (the TTL config's, else 5) until ``stop_ttl_sweeper``."""
        if self._sweeper is not None and not self._sweeper.done():
            return self._sweeper
        interval = float(sweep_interval_minutes or (self.ttl_config or {}).get("sweep_interval_minutes") or 5)
        self._stop.clear()

        async def loop() -> None:
            while not self._stop.is_set():
                try:
                    await asyncio.wait_for(self._stop.wait(), timeout=interval * 60)
                    return
                except TimeoutError:
                    pass
                try:
                    await self.sweep_ttl()
                except Exception:  # the next round tries again
                    log.warning("store TTL sweep failed", exc_info=True)

        self._sweeper = asyncio.create_task(loop(), name="gateway-store-ttl-sweeper")
        return self._sweeper

    async def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        if self._sweeper is None or self._sweeper.done():
            return True
        self._stop.set()
        try:
            await asyncio.wait_for(self._sweeper, timeout=timeout)
        except TimeoutError:
            return False
        return True


def _store_error(exc: InvalidRequest) -> InvalidRequest:
    """The gateway's refusal as the exception LangGraph's stores raise for it."""
    locations = [str(part) for error in exc.problem.get("errors") or [] for part in error.get("loc") or []]
    namespaced = any(part in ("namespace", "namespace_prefix", "path", "prefix") for part in locations)
    cls = InvalidStoreNamespace if namespaced and exc.code == "invalid_input" else InvalidStoreRequest
    return cls(
        str(exc), status_code=exc.status_code, code=exc.code, problem=exc.problem,
        retry_after=exc.retry_after, request_id=exc.request_id,
    )
