"""LangChain on the gateway (the ``langchain`` extra: langchain-core 1.x and numpy).

- ``GatewayVectorStore`` (``VectorStore``) on a vectors collection: a document is a point whose
  payload is its metadata with its text under ``text_key``, so metadata reads back with its JSON
  types and filters (``filter=``, the gateway's filter language) apply to it as stored.
- ``GatewayByteStore`` (``BaseStore[str, bytes]``) on a kv collection: each value is stored as a
  base64 string (kv values are JSON), through the kv batch routes: a ``mget`` of 100 keys is one
  request.
- ``GatewayChatMessageHistory`` (``BaseChatMessageHistory``) on a records collection per
  session: each message is a record whose key sorts in the order it was added, in this process
  and across processes (``_MessageKeys``); ``add_messages`` is one atomic records batch.

The async methods are the adapters' own: they await the ``GatewayClient`` given, on the caller's
event loop. The sync methods run the same coroutines on one event loop on a daemon thread of
this module (``_Portal``) with a sibling of that client (``GatewayClient.sibling``), so they work
from any thread, with or without a running loop; ``close()`` releases the sibling's connections.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import os
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any, Literal, Self, TypeVar

import numpy as np
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from langchain_core.stores import BaseStore
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance

from ._client import GatewayClient
from ._exceptions import NotFound
from ._models import PayloadIndex, SortOrder

T = TypeVar("T")
Distance = Literal["cosine", "l2", "ip"]
BATCH = 1000  # keys, ids or entries per request: the gateway's default limits.max_batch_items
GET_CONCURRENCY = 8  # point reads of get_by_ids in flight at a time
_SEARCH_OPTIONS = ("filter", "ef_search", "hybrid")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # a collection name (the gateway's rule)


class _Portal:
    """One event loop on a daemon thread per process, where the sync methods run their
    coroutines (started on first use, and again in a forked child)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="storage-gateway-langchain", daemon=True)
                thread.start()
                self._loop, self._thread, self._pid = loop, thread, os.getpid()
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        loop = self.loop()
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a sync method of a storage-gateway LangChain adapter ran on the adapters' own loop")
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()


_PORTAL = _Portal()


class _Clients:
    """The caller's client, for the async methods, and its sibling on the portal, for the sync ones."""

    def __init__(self, client: GatewayClient) -> None:
        self.client = client
        self._sync_client: GatewayClient | None = None
        self._sync_pid = 0
        self._sync_lock = threading.Lock()

    def _sync(self, call: Callable[[GatewayClient], Coroutine[Any, Any, T]]) -> T:
        with self._sync_lock:
            if self._sync_client is None or self._sync_pid != os.getpid():
                self._sync_client, self._sync_pid = self.client.sibling(), os.getpid()
            client = self._sync_client
        return _PORTAL.run(call(client))

    def _take_sync_client(self) -> GatewayClient | None:
        with self._sync_lock:
            client, self._sync_client = self._sync_client, None
        return client

    def close(self) -> None:
        """Release the connections the sync methods opened (the client given stays open: it is the caller's)."""
        client = self._take_sync_client()
        if client is not None:
            _PORTAL.run(client.close())

    async def aclose(self) -> None:
        """``close()`` for async code."""
        client = self._take_sync_client()
        if client is not None:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(client.close(), _PORTAL.loop()))


def _missing_collection(exc: NotFound) -> bool:
    return exc.code == "collection_not_found"


# --- VectorStore ------------------------------------------------------------------------------


class GatewayVectorStore(_Clients, VectorStore):
    """A LangChain ``VectorStore`` on the vectors collection ``collection`` of the client's namespace.

    The collection is created on the first write, with the embedding's dimension, ``distance``
    (``cosine``, ``l2`` or ``ip``; an existing collection must have the same settings, else
    ``Conflict``), and, with ``hybrid=True``, ``text_key`` as its full-text field: searches by
    text then fuse the vector and the full-text rankings (``hybrid=False`` per call: vectors
    only). ``payload_indexes`` declares metadata fields to index for filters.

    A document's payload is its metadata (any JSON: an int reads back an int) and its text under
    ``text_key``; a metadata key equal to ``text_key`` is refused. ``filter=`` takes the gateway's
    filter language on metadata fields (``{"topic": "tea", "year": {"$gte": 2020}}``, ``$in``,
    ``$or`` ...). ``similarity_search_with_score`` answers the raw distance (lower is nearer;
    ``-inner product`` for ``ip``); the relevance scores are LangChain's functions of it for the
    collection's distance. ``max_marginal_relevance_search`` reads the ``fetch_k`` candidates with
    their vectors in the same search request. Searching, reading or deleting in a collection that
    does not exist yet finds nothing.
    """

    def __init__(
        self,
        client: GatewayClient,
        collection: str,
        embedding: Embeddings,
        *,
        distance: Distance = "cosine",
        hybrid: bool = False,
        text_key: str = "page_content",
        payload_indexes: Sequence[PayloadIndex | dict[str, Any]] | None = None,
        batch_size: int = 500,
    ) -> None:
        super().__init__(client)
        if distance not in ("cosine", "l2", "ip"):
            raise ValueError(f"distance must be cosine, l2 or ip, not {distance!r}")
        self.collection = collection
        self.embedding = embedding
        self.distance: Distance = distance
        self.hybrid = hybrid
        self.text_key = text_key
        self.payload_indexes = list(payload_indexes) if payload_indexes is not None else None
        self.batch_size = batch_size
        self._created = False  # the collection is known to exist with these settings

    @property
    def embeddings(self) -> Embeddings:
        return self.embedding

    # --- documents as points -----------------------------------------------------------------

    def _payload(self, text: str, metadata: dict[str, Any] | None, i: int) -> dict[str, Any]:
        metadata = metadata or {}
        if self.text_key in metadata:
            raise ValueError(
                f"metadatas[{i}] has the key {self.text_key!r}, under which the document's text is stored "
                "(choose another text_key)"
            )
        return {**metadata, self.text_key: text}

    def _document(self, point_id: str, payload: dict[str, Any] | None) -> Document:
        metadata = dict(payload or {})
        text = metadata.pop(self.text_key, "")
        return Document(id=point_id, page_content=text if isinstance(text, str) else str(text), metadata=metadata)

    def _search_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(kwargs) - set(_SEARCH_OPTIONS))
        if unknown:
            raise TypeError(f"GatewayVectorStore searches take {', '.join(_SEARCH_OPTIONS)}; not {', '.join(unknown)}")
        return kwargs

    # --- the requests, for either client -------------------------------------------------------

    async def _ensure(self, client: GatewayClient, dimension: int) -> None:
        if not self._created:
            await client.vectors.create_collection(
                self.collection, dimension, self.distance,
                text_field=self.text_key if self.hybrid else None, payload_indexes=self.payload_indexes,
            )
            self._created = True

    async def _add(
        self, client: GatewayClient, texts: list[str], metadatas: list[dict[str, Any]] | None,
        ids: Sequence[str | None] | None, vectors: list[list[float]],
    ) -> list[str]:
        n = len(texts)
        if metadatas is not None and len(metadatas) != n:
            raise ValueError(f"{len(metadatas)} metadatas for {n} texts")
        if ids is not None and len(ids) != n:
            raise ValueError(f"{len(ids)} ids for {n} texts")
        if len(vectors) != n:
            raise ValueError(f"the embedding returned {len(vectors)} vectors for {n} texts")
        if n == 0:
            return []
        payloads = [self._payload(t, metadatas[i] if metadatas else None, i) for i, t in enumerate(texts)]
        point_ids = [None if i is None else str(i) for i in ids] if ids is not None else None
        await self._ensure(client, len(vectors[0]))
        try:
            return await client.vectors.upsert_points(
                self.collection, vectors, payloads, point_ids, batch_size=self.batch_size
            )
        except NotFound as exc:  # dropped since this store created it: create it again, once
            if not _missing_collection(exc):
                raise
            self._created = False
            await self._ensure(client, len(vectors[0]))
            return await client.vectors.upsert_points(
                self.collection, vectors, payloads, point_ids, batch_size=self.batch_size
            )

    async def _search(
        self, client: GatewayClient, vector: list[float], k: int, query: str | None, options: dict[str, Any],
        *, with_vectors: bool = False,
    ) -> list[dict[str, Any]]:
        options = self._search_options(options)
        if k <= 0:
            return []
        hybrid = options.get("hybrid")
        text = query if (self.hybrid if hybrid is None else hybrid) else None
        try:
            return await client.vectors.search(
                self.collection, vector, k, query=text, filters=options.get("filter"),
                ef_search=options.get("ef_search"), with_vectors=with_vectors,
            )
        except NotFound as exc:
            if _missing_collection(exc):
                return []
            raise

    async def _scored(
        self, client: GatewayClient, vector: list[float], k: int, query: str | None, options: dict[str, Any]
    ) -> list[tuple[Document, float]]:
        hits = await self._search(client, vector, k, query, options)
        return [(self._document(h["id"], h["payload"]), float(h["distance"])) for h in hits]

    async def _mmr(
        self, client: GatewayClient, vector: list[float], k: int, fetch_k: int, lambda_mult: float,
        query: str | None, options: dict[str, Any],
    ) -> list[Document]:
        hits = await self._search(client, vector, max(k, fetch_k), query, options, with_vectors=True)
        if not hits:
            return []
        chosen = maximal_marginal_relevance(
            np.asarray(vector, dtype=np.float32), [h["vector"] for h in hits], lambda_mult=lambda_mult, k=k
        )
        return [self._document(hits[i]["id"], hits[i]["payload"]) for i in chosen]

    async def _get(self, client: GatewayClient, ids: Sequence[str]) -> list[Document]:
        gate = asyncio.Semaphore(GET_CONCURRENCY)

        async def read(point_id: str) -> dict[str, Any] | None:
            async with gate:
                return await client.vectors.get_point(self.collection, point_id, with_vector=False)

        try:
            points = await asyncio.gather(*(read(str(i)) for i in dict.fromkeys(ids)))
        except NotFound as exc:
            if _missing_collection(exc):
                return []
            raise
        return [self._document(p["id"], p.get("payload")) for p in points if p is not None]

    async def _delete(self, client: GatewayClient, ids: list[str] | None, kwargs: dict[str, Any]) -> bool:
        unknown = sorted(set(kwargs) - {"filter"})
        if unknown:
            raise TypeError(f"GatewayVectorStore.delete takes ids and filter; not {', '.join(unknown)}")
        filters = kwargs.get("filter")
        try:
            if ids is None:  # LangChain's rule: no ids deletes everything (here: what `filter` matches)
                await client.vectors.delete_points(self.collection, filters=filters or {})
            else:
                listed = [str(i) for i in ids]
                for start in range(0, len(listed), BATCH):
                    await client.vectors.delete_points(self.collection, ids=listed[start:start + BATCH], filters=filters)
        except NotFound as exc:
            if not _missing_collection(exc):
                raise
        return True

    async def _drop(self, client: GatewayClient) -> None:
        await client.vectors.drop_collection(self.collection)
        self._created = False

    # --- VectorStore: async --------------------------------------------------------------------

    async def aadd_texts(
        self, texts: Iterable[str], metadatas: list[dict[str, Any]] | None = None, *,
        ids: list[str] | None = None, **kwargs: Any,
    ) -> list[str]:
        """Embed and upsert ``texts`` (a point per text; a given id replaces the point with it)."""
        if kwargs:
            raise TypeError(f"GatewayVectorStore.add_texts takes metadatas and ids; not {', '.join(sorted(kwargs))}")
        texts = list(texts)
        vectors = await self.embedding.aembed_documents(texts) if texts else []
        return await self._add(self.client, texts, metadatas, ids, vectors)

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete the points ``ids`` (missing ones are no-ops); without ids, every point matching
        ``filter`` (without both: every point)."""
        return await self._delete(self.client, ids, kwargs)

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        return await self._get(self.client, ids)

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, **kwargs)]

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        vector = await self.embedding.aembed_query(query)
        return await self._scored(self.client, vector, k, query, kwargs)

    async def asimilarity_search_by_vector(self, embedding: list[float], k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in await self._scored(self.client, embedding, k, None, kwargs)]

    async def asimilarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return await self._scored(self.client, embedding, k, None, kwargs)

    async def amax_marginal_relevance_search(
        self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, **kwargs: Any
    ) -> list[Document]:
        vector = await self.embedding.aembed_query(query)
        return await self._mmr(self.client, vector, k, fetch_k, lambda_mult, query, kwargs)

    async def amax_marginal_relevance_search_by_vector(
        self, embedding: list[float], k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, **kwargs: Any
    ) -> list[Document]:
        return await self._mmr(self.client, embedding, k, fetch_k, lambda_mult, None, kwargs)

    async def adelete_collection(self) -> None:
        """Drop the collection and every point in it (a write creates it again)."""
        await self._drop(self.client)

    @classmethod
    async def afrom_texts(
        cls, texts: list[str], embedding: Embeddings, metadatas: list[dict[str, Any]] | None = None, *,
        ids: list[str] | None = None, client: GatewayClient | None = None, collection: str | None = None,
        **kwargs: Any,
    ) -> Self:
        """A store on ``collection`` of ``client``'s namespace (both required), with ``texts`` added."""
        store = cls(*_client_and_collection(client, collection), embedding, **kwargs)
        await store.aadd_texts(texts, metadatas, ids=ids)
        return store

    # --- VectorStore: sync ---------------------------------------------------------------------

    def add_texts(
        self, texts: Iterable[str], metadatas: list[dict[str, Any]] | None = None, *,
        ids: list[str] | None = None, **kwargs: Any,
    ) -> list[str]:
        """Embed and upsert ``texts`` (a point per text; a given id replaces the point with it)."""
        if kwargs:
            raise TypeError(f"GatewayVectorStore.add_texts takes metadatas and ids; not {', '.join(sorted(kwargs))}")
        texts = list(texts)
        vectors = self.embedding.embed_documents(texts) if texts else []
        return self._sync(lambda c: self._add(c, texts, metadatas, ids, vectors))

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete the points ``ids`` (missing ones are no-ops); without ids, every point matching
        ``filter`` (without both: every point)."""
        return self._sync(lambda c: self._delete(c, ids, kwargs))

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        return self._sync(lambda c: self._get(c, ids))

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, **kwargs)]

    def similarity_search_with_score(self, query: str, k: int = 4, **kwargs: Any) -> list[tuple[Document, float]]:
        vector = self.embedding.embed_query(query)
        return self._sync(lambda c: self._scored(c, vector, k, query, kwargs))

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, **kwargs)]

    def similarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return self._sync(lambda c: self._scored(c, embedding, k, None, kwargs))

    def max_marginal_relevance_search(
        self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, **kwargs: Any
    ) -> list[Document]:
        vector = self.embedding.embed_query(query)
        return self._sync(lambda c: self._mmr(c, vector, k, fetch_k, lambda_mult, query, kwargs))

    def max_marginal_relevance_search_by_vector(
        self, embedding: list[float], k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, **kwargs: Any
    ) -> list[Document]:
        return self._sync(lambda c: self._mmr(c, embedding, k, fetch_k, lambda_mult, None, kwargs))

    def delete_collection(self) -> None:
        """Drop the collection and every point in it (a write creates it again)."""
        self._sync(self._drop)

    @classmethod
    def from_texts(
        cls, texts: list[str], embedding: Embeddings, metadatas: list[dict[str, Any]] | None = None, *,
        ids: list[str] | None = None, client: GatewayClient | None = None, collection: str | None = None,
        **kwargs: Any,
    ) -> Self:
        """A store on ``collection`` of ``client``'s namespace (both required), with ``texts`` added."""
        store = cls(*_client_and_collection(client, collection), embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """LangChain's relevance in [0, 1] of the collection's distance."""
        return {
            "cosine": self._cosine_relevance_score_fn,
            "l2": self._euclidean_relevance_score_fn,
            "ip": self._max_inner_product_relevance_score_fn,
        }[self.distance]


def _client_and_collection(client: GatewayClient | None, collection: str | None) -> tuple[GatewayClient, str]:
    if client is None or collection is None:
        raise TypeError("GatewayVectorStore.from_texts needs client= (a GatewayClient) and collection=")
    return client, collection


# --- ByteStore --------------------------------------------------------------------------------


def _decode(key: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"kv entry {key!r} is not a GatewayByteStore value (a base64 string)")
    return base64.b64decode(value, validate=True)


class GatewayByteStore(_Clients, BaseStore[str, bytes]):
    """A LangChain ``ByteStore`` on the kv collection ``collection`` of the client's namespace.

    Each value is stored as the base64 string of its bytes (kv values are JSON; base64 is
    lossless and decoded strictly). ``mget``, ``mset`` and ``mdelete`` take one request per
    1,000 keys (the gateway's kv batch routes; a ``mget`` whose values pass the gateway's
    ``limits.max_page_bytes`` takes one more for the rest); each ``mset`` request is atomic.
    ``yield_keys`` pages through the keys, 1,000 a request, in key order.
    """

    def __init__(self, client: GatewayClient, collection: str) -> None:
        super().__init__(client)
        self.collection = collection

    async def _mget(self, client: GatewayClient, keys: Sequence[str]) -> list[bytes | None]:
        found = await client.kv.get_many(self.collection, keys)
        return [_decode(k, found[k].value) if k in found else None for k in keys]

    async def _mset(self, client: GatewayClient, pairs: Sequence[tuple[str, bytes]]) -> None:
        values = {k: base64.b64encode(v).decode("ascii") for k, v in pairs}  # a key twice: its last value
        items = list(values.items())
        for start in range(0, len(items), BATCH):
            await client.kv.set_many(self.collection, items[start:start + BATCH])

    async def _mdelete(self, client: GatewayClient, keys: Sequence[str]) -> None:
        if keys:
            await client.kv.delete_many(self.collection, keys)

    async def _page(
        self, client: GatewayClient, *, prefix: str | None, cursor: str | None
    ) -> tuple[list[str], str | None]:
        entries, cursor = await client.kv.list(
            self.collection, prefix=prefix, limit=BATCH, cursor=cursor, keys_only=True
        )
        return [e.key for e in entries], cursor

    async def amget(self, keys: Sequence[str]) -> list[bytes | None]:
        return await self._mget(self.client, keys)

    async def amset(self, key_value_pairs: Sequence[tuple[str, bytes]]) -> None:
        await self._mset(self.client, key_value_pairs)

    async def amdelete(self, keys: Sequence[str]) -> None:
        await self._mdelete(self.client, keys)

    async def ayield_keys(self, *, prefix: str | None = None) -> AsyncIterator[str]:
        cursor: str | None = None
        while True:
            keys, cursor = await self._page(self.client, prefix=prefix, cursor=cursor)
            for key in keys:
                yield key
            if cursor is None:
                return

    def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        return self._sync(lambda c: self._mget(c, keys))

    def mset(self, key_value_pairs: Sequence[tuple[str, bytes]]) -> None:
        self._sync(lambda c: self._mset(c, key_value_pairs))

    def mdelete(self, keys: Sequence[str]) -> None:
        self._sync(lambda c: self._mdelete(c, keys))

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        cursor: str | None = None
        while True:
            keys, cursor = self._sync(functools.partial(self._page, prefix=prefix, cursor=cursor))
            yield from keys
            if cursor is None:
                return


# --- chat message history ---------------------------------------------------------------------


class _MessageKeys:
    """Record keys that sort in the order messages are added: nanoseconds since the epoch (20
    digits), strictly increasing within this process (the clock read, or one past the last key's
    time when the clock has not moved on or went back), then this process's random token, so two
    processes writing in the same nanosecond never write the same key. Across processes the order
    is the wall clock's (of one machine, or of machines whose clocks agree)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0
        self._pid = 0
        self._token = ""

    def take(self, n: int) -> list[str]:
        with self._lock:
            if self._pid != os.getpid():  # a forked child draws its own token
                self._pid, self._token = os.getpid(), secrets.token_hex(8)
            first = max(time.time_ns(), self._last + 1)
            self._last = first + n - 1
            token = self._token
        return [f"{first + i:020d}.{token}" for i in range(n)]


_KEYS = _MessageKeys()


def _session_collection(prefix: str, session_id: str) -> str:
    """The records collection of a session: ``prefix + session_id`` when that is a collection
    name, else ``prefix`` and a hash of the session id."""
    name = prefix + session_id
    if _NAME.match(name):
        return name
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]
    name = f"{prefix}sha256.{digest}"
    if not _NAME.match(name):
        raise ValueError(f"collection_prefix {prefix!r} does not make a collection name")
    return name


class GatewayChatMessageHistory(_Clients, BaseChatMessageHistory):
    """A LangChain chat message history: the session ``session_id``'s messages in a records
    collection of the client's namespace (``collection_prefix`` + the session id, or a hash of it
    when that is not a collection name).

    Messages come back in the order they were added, across concurrent writers and processes;
    ``add_messages`` is one records batch, stored whole or not at all. ``window=N`` keeps the
    history to its last N messages: reads answer at most those, and each ``add_messages`` then
    trims the rest (one request more). ``trim(N)`` does that once; ``clear()`` deletes the session.
    """

    def __init__(
        self, client: GatewayClient, session_id: str, *, collection_prefix: str = "chat.", window: int | None = None
    ) -> None:
        super().__init__(client)
        if window is not None and window < 1:
            raise ValueError("window must be at least 1")
        self.session_id = session_id
        self.collection = _session_collection(collection_prefix, session_id)
        self.window = window

    async def _read(self, client: GatewayClient) -> list[BaseMessage]:
        if self.window is None:
            records = await client.records.get_ordered_records(self.collection)
        else:
            newest = await client.records.get_ordered_records(self.collection, self.window, SortOrder.DESCENDING)
            records = newest[::-1]
        return messages_from_dict([value for _, value in records])

    async def _add(self, client: GatewayClient, messages: Sequence[BaseMessage]) -> None:
        if not messages:
            return
        keys = _KEYS.take(len(messages))
        await client.records.upsert_records(self.collection, zip(keys, map(message_to_dict, messages), strict=True))
        if self.window is not None:
            await client.records.trim(self.collection, keep_last=self.window)

    async def _trim(self, client: GatewayClient, keep_last: int) -> int:
        return await client.records.trim(self.collection, keep_last=keep_last)

    async def aget_messages(self) -> list[BaseMessage]:
        return await self._read(self.client)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await self._add(self.client, messages)

    async def aclear(self) -> None:
        await self._trim(self.client, 0)

    async def atrim(self, keep_last: int) -> int:
        """Keep only the last ``keep_last`` messages; how many were deleted."""
        return await self._trim(self.client, keep_last)

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]  # a property where the base declares an attribute
        return self._sync(self._read)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self._sync(lambda c: self._add(c, messages))

    def clear(self) -> None:
        self._sync(lambda c: self._trim(c, 0))

    def trim(self, keep_last: int) -> int:
        """Keep only the last ``keep_last`` messages; how many were deleted."""
        return self._sync(lambda c: self._trim(c, keep_last))
