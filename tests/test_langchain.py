"""The client's LangChain adapters against a live gateway on both backends, beyond LangChain's
standard suites (tests/test_langchain_standard.py): a RAG chain end to end, what the vector store
adds (metadata types, the filter language, relevance, MMR, hybrid search), the ByteStore's round
trips, and the chat history's order across concurrent writers and two processes, its window, and
``RunnableWithMessageHistory``."""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnablePassthrough
from langchain_core.runnables.history import RunnableWithMessageHistory

from storage_gateway_client import (
    Conflict,
    GatewayByteStore,
    GatewayChatMessageHistory,
    GatewayClient,
    GatewayVectorStore,
)
from tests.conftest import ADMIN_KEY, ROOT, Server


class WordsEmbedding(Embeddings):
    """Offline and deterministic: the words of a text hashed into 64 dimensions (and a constant
    one, so no vector is zero), of unit length, so texts that share words are near."""

    def _embed(self, text: str) -> list[float]:
        vector = [0.0] * 64 + [0.1]
        for word in re.findall(r"\w+", text.lower()):
            vector[int(hashlib.sha256(word.encode()).hexdigest(), 16) % 64] += 1.0
        norm = math.sqrt(sum(x * x for x in vector))
        return [x / norm for x in vector]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._embed(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._embed(text)


@pytest.fixture
async def gw(server: Server, namespace: str) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(server.url, namespace, ADMIN_KEY) as client:
        yield client


DOCS = [
    Document("Green tea is brewed at 80 degrees", metadata={"topic": "tea", "year": 2024}, id="tea-2024"),
    Document("Black tea is brewed at 95 degrees", metadata={"topic": "tea", "year": 2019}, id="tea-2019"),
    Document("Espresso is brewed under pressure", metadata={"topic": "coffee", "year": 2024}, id="coffee-2024"),
    Document("Cold brew coffee steeps for hours", metadata={"topic": "coffee", "year": 2023}, id="coffee-2023"),
]


async def test_a_rag_chain_retrieves_the_right_documents(gw: GatewayClient) -> None:
    store = await GatewayVectorStore.afrom_documents(DOCS, WordsEmbedding(), client=gw, collection="kb")
    retriever = store.as_retriever(search_kwargs={"k": 2, "filter": {"topic": "tea", "year": {"$gte": 2020}}})
    prompt = ChatPromptTemplate.from_template("Answer from the context.\nContext:\n{context}\nQuestion: {question}")
    chain = (
        {"context": retriever | (lambda docs: "\n".join(f"[{d.id}] {d.page_content}" for d in docs)),
         "question": RunnablePassthrough()}
        | prompt
    )
    text = (await chain.ainvoke("How hot is tea brewed?")).to_string()
    assert "[tea-2024] Green tea is brewed at 80 degrees" in text
    assert "tea-2019" not in text and "coffee" not in text.lower()  # the filter held; k=2 found one match
    # without a filter, the nearest by words; with a threshold, only the close ones; sync as async
    assert [d.id for d in store.as_retriever(search_kwargs={"k": 2}).invoke("black tea brewed")] == ["tea-2019", "tea-2024"]
    strict = store.as_retriever(search_type="similarity_score_threshold", search_kwargs={"score_threshold": 0.99, "k": 4})
    assert [d.id for d in await strict.ainvoke("Espresso is brewed under pressure")] == ["coffee-2024"]
    assert [(d.id, d.metadata) for d in store.get_by_ids(["coffee-2023", "nope"])] == [("coffee-2023", DOCS[3].metadata)]
    await store.aclose()


async def test_the_vector_store_keeps_metadata_types_and_takes_the_filter_language(gw: GatewayClient) -> None:
    store = GatewayVectorStore(gw, "types", WordsEmbedding())
    metadata = {"i": 1, "big": 2**62, "f": 1.5, "b": True, "n": None, "s": "ü 🎉", "l": [1, "x", None], "d": {"k": {"j": 2}}}
    docs = [Document("tea one", metadata=metadata), Document("tea two", metadata={"i": 2}, id="given")]
    ids = await store.aadd_documents(docs)
    assert ids[1] == "given" and docs[0].id is None and docs[0].metadata == metadata  # inputs untouched
    [found] = await store.aget_by_ids([ids[0]])
    assert found.metadata == metadata and type(found.metadata["i"]) is int and type(found.metadata["f"]) is float
    assert [d.id for d in await store.asimilarity_search("tea", k=4, filter={"$or": [{"i": {"$gt": 1}}, {"b": False}]})] == ["given"]
    assert [d.id for d in await store.asimilarity_search("tea", k=4, filter={"i": {"$in": [1, 3]}, "n": None})] == [ids[0]]
    with pytest.raises(ValueError, match="page_content"):
        await store.aadd_texts(["x"], metadatas=[{"page_content": "clash"}])
    with pytest.raises(TypeError, match="filters"):
        await store.asimilarity_search("tea", filters={"i": 1})  # a typo is an error, not ignored
    assert await store.adelete(filter={"i": 2}) and [d.id for d in await store.asimilarity_search("tea", k=4)] == [ids[0]]
    assert await store.adelete() and await store.asimilarity_search("tea", k=4) == []  # no ids: everything
    with pytest.raises(Conflict):  # the collection exists with another distance
        await GatewayVectorStore(gw, "types", WordsEmbedding(), distance="l2").aadd_texts(["x"])


@pytest.mark.parametrize("distance", ["cosine", "l2", "ip"])
@pytest.mark.filterwarnings("ignore:Relevance scores must be between 0 and 1")  # 1.0000001: float32's rounding
async def test_relevance_and_mmr_per_distance(gw: GatewayClient, distance: str) -> None:
    store = GatewayVectorStore(gw, f"mmr-{distance}", WordsEmbedding(), distance=distance)  # type: ignore[arg-type]
    await store.aadd_texts(["green tea leaves", "green tea leaves", "black coffee beans"], ids=["a", "a2", "c"])
    scored = await store.asimilarity_search_with_score("green tea leaves", k=3)
    assert {d.id for d, _ in scored[:2]} == {"a", "a2"} and scored[2][0].id == "c"
    relevance = await store.asimilarity_search_with_relevance_scores("green tea leaves", k=3)
    assert [round(r, 6) for _, r in relevance] == [round(store._select_relevance_score_fn()(s), 6) for _, s in scored]
    assert relevance[0][1] == pytest.approx(1.0, abs=1e-5)  # unit vectors: an exact match is fully relevant
    assert all(0 <= r <= 1 + 1e-6 for _, r in relevance)
    # MMR trades the duplicate for something different; plain similarity keeps both
    diverse = await store.amax_marginal_relevance_search("green tea leaves", k=2, fetch_k=3, lambda_mult=0.1)
    assert {d.id for d in diverse} in ({"a", "c"}, {"a2", "c"})
    assert {d.id for d in store.max_marginal_relevance_search("green tea leaves", k=2, fetch_k=3, lambda_mult=1.0)} == {"a", "a2"}
    mmr = store.as_retriever(search_type="mmr", search_kwargs={"k": 2, "fetch_k": 3, "lambda_mult": 0.1})
    assert "c" in {d.id for d in await mmr.ainvoke("green tea leaves")}
    store.close()


async def test_hybrid_search_ranks_the_words_of_the_query(gw: GatewayClient) -> None:
    """Random vectors (``DeterministicFakeEmbedding``) rank by chance; the full-text half of a
    hybrid search puts the one document with the query's word first."""
    texts = [f"note number {i}" for i in range(30)] + ["earl grey has bergamot"]
    store = GatewayVectorStore(gw, "hybrid", DeterministicFakeEmbedding(size=16), hybrid=True)
    ids = await store.aadd_texts(texts)
    for _ in range(3):
        assert (await store.asimilarity_search("bergamot", k=3))[0].id == ids[-1]
    assert store.similarity_search("bergamot", k=1)[0].id == ids[-1]
    vector_only = await store.asimilarity_search("bergamot", k=31, hybrid=False)
    assert len(vector_only) == 31
    store.close()


async def test_the_byte_store_reads_100_keys_in_one_request(server: Server, namespace: str) -> None:
    requests: list[str] = []

    async def count(request: httpx.Request) -> None:
        requests.append(f"{request.method} {request.url.path}")

    http = httpx.AsyncClient(event_hooks={"request": [count]})
    async with GatewayClient(server.url, namespace, ADMIN_KEY, http_client=http) as gw:
        store = GatewayByteStore(gw, "cache")
        pairs = [(f"k{i:03}", bytes([i]) * i) for i in range(100)]
        await store.amset(pairs)
        requests.clear()
        assert await store.amget([k for k, _ in pairs] + ["missing"]) == [v for _, v in pairs] + [None]
        assert requests == [f"POST /v1/{namespace}/kv/cache/get"]
        await store.amset([(f"p{i:04}", b"") for i in range(1001)])  # two requests: 1,000 keys a request
        assert [k async for k in store.ayield_keys(prefix="p")] == [f"p{i:04}" for i in range(1001)]
        assert sum(1 for _ in store.yield_keys(prefix="k0")) == 100
        await gw.kv.set("cache", "text", "not base64!")
        with pytest.raises(ValueError):
            await store.amget(["text"])
        store.close()
    await http.aclose()


def texts_of(messages: list[BaseMessage]) -> list[str]:
    return [str(m.content) for m in messages]


@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
async def test_chat_history_order_window_and_runnable(gw: GatewayClient) -> None:
    # concurrent writers: stored in the order the batches were added, each batch whole
    history = GatewayChatMessageHistory(gw, "user:42 ü")  # not a collection name: a hash of it is
    added: list[str] = []

    async def writer(w: int) -> None:
        for b in range(5):
            batch = [HumanMessage(f"{w}.{b}.{i}") for i in range(3)]
            added.extend(texts_of(batch))  # the key is taken before the request is sent
            await history.aadd_messages(batch)

    await asyncio.gather(*(writer(w) for w in range(8)))
    assert texts_of(await history.aget_messages()) == added and len(added) == 120
    assert texts_of(history.messages) == added
    await history.aclear()
    assert await history.aget_messages() == []

    # a window: reads answer the last N, writes trim the rest away
    window = GatewayChatMessageHistory(gw, "windowed", window=4)
    for i in range(3):
        window.add_messages([HumanMessage(f"q{i}"), AIMessage(f"a{i}")])
    assert texts_of(await window.aget_messages()) == ["q1", "a1", "q2", "a2"]
    assert [k for k, _ in await gw.records.get_ordered_records(window.collection)] == sorted(
        k for k, _ in await gw.records.get_ordered_records(window.collection)
    ) and len(await gw.records.get_ordered_records(window.collection)) == 4
    assert await window.atrim(1) == 3 and texts_of(await window.aget_messages()) == ["a2"]

    # RunnableWithMessageHistory, async then sync, on one session
    model = GenericFakeChatModel(messages=iter([AIMessage("one"), AIMessage("two")]))
    prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{question}")])
    chat = RunnableWithMessageHistory(
        prompt | model, lambda session_id: GatewayChatMessageHistory(gw, session_id),
        input_messages_key="question", history_messages_key="history",
    )
    config = {"configurable": {"session_id": "conversation"}}
    await chat.ainvoke({"question": "first"}, config)
    await asyncio.to_thread(chat.invoke, {"question": "second"}, config)
    stored = await GatewayChatMessageHistory(gw, "conversation").aget_messages()
    assert [(m.type, m.content) for m in stored] == [("human", "first"), ("ai", "one"), ("human", "second"), ("ai", "two")]


WRITER = """
import pathlib, sys, time
from langchain_core.messages import HumanMessage
from storage_gateway_client import GatewayChatMessageHistory, GatewayClient

url, namespace, key, who, turns, flags = sys.argv[1:]
who, turns, flags = int(who), int(turns), pathlib.Path(flags)
history = GatewayChatMessageHistory(GatewayClient(url, namespace, key), "shared")

def wait_for(i):
    deadline = time.monotonic() + 60
    while not (flags / str(i)).exists():
        assert time.monotonic() < deadline, f"no turn {i}"
        time.sleep(0.002)

for i in range(who, turns, 2):  # taking turns: message i after message i - 1, from the other process
    if i:
        wait_for(i - 1)
    history.add_messages([HumanMessage(f"turn {i}")])
    (flags / str(i)).touch()
wait_for(turns - 1)
for b in range(20):  # then both at once
    history.add_messages([HumanMessage(f"{who} {b} 0"), HumanMessage(f"{who} {b} 1")])
history.close()
"""


async def test_two_processes_write_one_session_in_order(gw: GatewayClient, server: Server, namespace: str, tmp_path: Path) -> None:
    turns = 10
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, server.url, namespace, ADMIN_KEY, str(who), str(turns), str(tmp_path)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        for who in (0, 1)
    ]
    for process in processes:
        out, _ = await asyncio.to_thread(process.communicate, timeout=120)
        assert process.returncode == 0, out.decode()
    messages = texts_of(await GatewayChatMessageHistory(gw, "shared").aget_messages())
    assert messages[:turns] == [f"turn {i}" for i in range(turns)]
    rest = messages[turns:]
    assert len(rest) == 80
    batches = [tuple(rest[i:i + 2]) for i in range(0, 80, 2)]
    for who in (0, 1):  # each batch whole, each process's batches in its order
        assert [b for b in batches if b[0].startswith(f"{who} ")] == [(f"{who} {b} 0", f"{who} {b} 1") for b in range(20)]


async def test_the_async_methods_never_go_through_an_executor(gw: GatewayClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """LangChain's defaults for async methods run the sync ones in a thread (``run_in_executor``);
    every adapter's async path is its own."""
    import langchain_core.chat_history
    import langchain_core.stores
    import langchain_core.vectorstores.base

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"run_in_executor{args[1:2]}")

    for module in (langchain_core.vectorstores.base, langchain_core.stores, langchain_core.chat_history):
        monkeypatch.setattr(module, "run_in_executor", refuse)
    store = await GatewayVectorStore.afrom_documents(DOCS, DeterministicFakeEmbedding(size=8), client=gw, collection="native")
    assert len(await store.asimilarity_search_with_relevance_scores("tea", k=2)) == 2
    assert len(await store.amax_marginal_relevance_search("tea", k=2, fetch_k=4)) == 2
    assert len(await store.asimilarity_search_by_vector([0.5] * 8, k=1)) == 1
    assert [d.id for d in await store.aget_by_ids(["tea-2024"])] == ["tea-2024"]
    await store.adelete(["tea-2024"])
    await store.adelete_collection()
    cache = GatewayByteStore(gw, "native")
    await cache.amset([("k", b"v")])
    assert await cache.amget(["k"]) == [b"v"] and [k async for k in cache.ayield_keys()] == ["k"]
    await cache.amdelete(["k"])
    history = GatewayChatMessageHistory(gw, "native")
    await history.aadd_messages([HumanMessage("x")])
    assert len(await history.aget_messages()) == 1
    await history.aclear()
