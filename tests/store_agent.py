"""A LangGraph agent whose memory is a ``GatewayStore`` and whose threads a ``GatewayCheckpointSaver``
keeps: a ``StateGraph`` that remembers what it is told ("remember: ...") in one thread and recalls
it by meaning in another, answering through a deterministic chat model of langchain-core.

``python -m tests.store_agent URL NAMESPACE KEY THREAD USER MESSAGE...`` runs it in a process of
its own (``tests/test_store_agent.py``).
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
import uuid
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models.fake_chat_models import ParrotFakeChatModel
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.store.base import BaseStore

from storage_gateway_client import GatewayClient

# Words that mean the same thing, and the meaning they carry: the embedding of a text is the
# direction of its meanings, so "beverage" finds "tea" and no word need be shared.
MEANINGS = {
    "drink": {"tea", "coffee", "drink", "beverage", "juice", "order", "thirsty"},
    "pet": {"cat", "dog", "pet", "animal", "kitten", "named"},
    "place": {"live", "city", "paris", "town", "home"},
}


class MeaningEmbeddings(Embeddings):
    dims = len(MEANINGS) + 1

    def _one(self, text: str) -> list[float]:
        words = set(re.findall(r"[a-z]+", text.lower()))
        vector = [float(len(words & synonyms)) for synonyms in MEANINGS.values()] + [0.1]
        norm = math.sqrt(sum(x * x for x in vector))
        return [x / norm for x in vector]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._one(text)


INDEX: Any = {"dims": MeaningEmbeddings.dims, "embed": MeaningEmbeddings(), "fields": ["text"]}
model = ParrotFakeChatModel()  # answers with the prompt it is given: what the agent recalled shows


async def agent(state: MessagesState, config: RunnableConfig, *, store: BaseStore) -> dict[str, Any]:
    namespace = ("memories", config["configurable"]["user_id"])
    said = str(state["messages"][-1].content)
    if said.lower().startswith("remember:"):
        await store.aput(namespace, uuid.uuid4().hex, {"text": said.split(":", 1)[1].strip()})
        return {"messages": [("ai", "noted")]}
    found = await store.asearch(namespace, query=said, limit=1)
    prompt = f"As you told me: {found[0].value['text']}" if found and (found[0].score or 0) > 0.5 else "I don't know."
    return {"messages": [await model.ainvoke([HumanMessage(prompt)])]}


def build(store: BaseStore, checkpointer: Any) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", END)
    return graph.compile(store=store, checkpointer=checkpointer)


async def main(url: str, namespace: str, key: str, thread: str, user: str, *messages: str) -> None:
    async with GatewayClient(url, namespace, key) as gw:
        graph = build(gw.store(index=INDEX), gw.checkpointer())
        for message in messages:
            result = await graph.ainvoke({"messages": [("user", message)]}, {"configurable": {"thread_id": thread, "user_id": user}})
            print(result["messages"][-1].content, flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
