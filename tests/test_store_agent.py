"""A real agent keeps its long-term memory and its threads in the gateway: one process tells a
``StateGraph`` (``tests/store_agent.py``) two things in one thread; this process, with a client of
its own, asks in another thread and gets the one that means what it asks about back."""

from __future__ import annotations

import subprocess
import sys

import httpx

from storage_gateway_client import GatewayClient
from tests.conftest import ROOT, Server
from tests.store_agent import INDEX, build
from tests.test_isolation import make_key


async def test_an_agent_recalls_by_meaning_in_another_thread_and_process(
    server: Server, http: httpx.AsyncClient, namespace: str
) -> None:
    key = await make_key(http, namespace, "store:write", "checkpoints:write")  # the agent's own, scoped key
    told = subprocess.run(
        [sys.executable, "-m", "tests.store_agent", server.url, namespace, key, "thread-1", "ada",
         "remember: I love green tea", "remember: my cat is named Tom"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert told.returncode == 0 and told.stdout.split() == ["noted", "noted"], told.stderr[-3000:]

    async with GatewayClient(server.url, namespace, key) as gw:
        graph = build(gw.store(index=INDEX), gw.checkpointer())
        asked = {"configurable": {"thread_id": "thread-2", "user_id": "ada"}}
        answer = await graph.ainvoke({"messages": [("user", "Which beverage should I order for me?")]}, asked)
        assert answer["messages"][-1].content == "As you told me: I love green tea"
        answer = await graph.ainvoke({"messages": [("user", "What is my pet animal called?")]}, asked)
        assert answer["messages"][-1].content == "As you told me: my cat is named Tom"
        other = {"configurable": {"thread_id": "thread-3", "user_id": "bob"}}
        assert (await graph.ainvoke({"messages": [("user", "Which beverage?")]}, other))["messages"][-1].content == "I don't know."
        # the first process's thread is in the checkpoints: both exchanges, in order
        first = await graph.aget_state({"configurable": {"thread_id": "thread-1"}})
        assert [m.content for m in first.values["messages"]] == [
            "remember: I love green tea", "noted", "remember: my cat is named Tom", "noted",
        ]
        assert len((await graph.aget_state(asked)).values["messages"]) == 4
