"""Real LangGraph graphs checkpointed through the gateway, on both backends: interrupt and
resume from another client process, state history, time travel, subgraphs (a non-empty
checkpoint_ns), the sync methods' rules, and namespaces that never see each other's threads."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from langgraph.types import Command

from storage_gateway_client import GatewayCheckpointSaver, GatewayClient
from tests.checkpoint_graphs import graph_with_subgraph, interrupting_graph
from tests.conftest import ROOT, Server


async def test_interrupt_then_resume_from_another_process(
    gw: GatewayClient, server: Server, namespace: str, api_key: str, client_transport: str
) -> None:
    graph = interrupting_graph(gw.checkpointer())
    config = {"configurable": {"thread_id": "conversation-1"}}
    first = await graph.ainvoke({"steps": []}, config)
    assert first["steps"] == ["plan"]
    assert first["__interrupt__"][0].value == {"question": "what now?"}
    assert (await graph.aget_state(config)).next == ("ask",)

    resumed = subprocess.run(
        [sys.executable, "-m", "tests.checkpoint_graphs", server.url, namespace, api_key or "", "conversation-1", "forty-two"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.strip().splitlines()[-1]) == {"steps": ["plan", "ask", "done"], "answer": "forty-two"}

    # this process, with its own client, sees what the other one wrote
    async with GatewayClient(server.url, namespace=namespace, api_key=api_key, transport=client_transport) as other:
        state = await interrupting_graph(other.checkpointer()).aget_state(config)
    assert state.values == {"steps": ["plan", "ask", "done"], "answer": "forty-two"}
    assert state.next == ()


async def test_state_history_and_time_travel(gw: GatewayClient) -> None:
    graph = interrupting_graph(gw.checkpointer())
    config = {"configurable": {"thread_id": "travel"}}
    await graph.ainvoke({"steps": []}, config)
    await graph.ainvoke(Command(resume="first"), config)
    history = [s async for s in graph.aget_state_history(config)]
    steps = [s.metadata["step"] for s in history]
    assert steps == sorted(steps, reverse=True) and len(history) >= 4  # newest first
    assert [s async for s in graph.aget_state_history(config, limit=2)] == history[:2]
    assert [s.config for s in [s async for s in graph.aget_state_history(config, before=history[1].config)]] == [
        s.config for s in history[2:]
    ]
    final_id = history[0].config["configurable"]["checkpoint_id"]

    # back to where the graph waited for the answer, and answer differently
    waiting = next(s for s in history if s.next == ("ask",))
    forked = await graph.ainvoke(None, waiting.config)
    assert "__interrupt__" in forked
    result = await graph.ainvoke(Command(resume="second"), config)
    assert result == {"steps": ["plan", "ask", "done"], "answer": "second"}
    assert (await graph.aget_state(config)).values["answer"] == "second"
    # the first branch is still there, under its own id
    old = await graph.aget_state({"configurable": {"thread_id": "travel", "checkpoint_id": final_id}})
    assert old.values["answer"] == "first"


async def test_subgraph_checkpoints_have_their_own_namespace(gw: GatewayClient) -> None:
    saver = gw.checkpointer()
    graph = graph_with_subgraph(saver)
    config = {"configurable": {"thread_id": "with-subgraph"}}
    first = await graph.ainvoke({"steps": []}, config)
    assert "__interrupt__" in first
    state = await graph.aget_state(config, subgraphs=True)
    assert state.next == ("inner",)
    inner_state = state.tasks[0].state
    assert inner_state.next == ("ask",)
    namespaces = {t.config["configurable"]["checkpoint_ns"] async for t in saver.alist({"configurable": {"thread_id": "with-subgraph"}})}
    assert "" in namespaces and any(ns.startswith("inner:") for ns in namespaces), namespaces
    result = await graph.ainvoke(Command(resume="deep"), config)
    assert result["answer"] == "deep" and result["steps"][0] == "plan" and result["steps"][-1] == "done"


async def test_sync_methods_work_from_other_threads_only(gw: GatewayClient) -> None:
    saver = gw.checkpointer()
    graph = interrupting_graph(saver)
    config = {"configurable": {"thread_id": "sync"}}
    await graph.ainvoke({"steps": []}, config)
    with pytest.raises(asyncio.InvalidStateError, match="only allowed from a different thread"):
        saver.get_tuple(config)
    found = await asyncio.to_thread(saver.get_tuple, config)
    assert found is not None and found.checkpoint["id"] == (await saver.aget_tuple(config)).checkpoint["id"]
    listed = await asyncio.to_thread(lambda: list(saver.list(config, limit=2)))
    assert len(listed) == 2


async def test_two_namespaces_with_the_same_thread_ids_never_meet(
    server: Server, namespace: str, api_key: str, client_transport: str
) -> None:
    async with (
        GatewayClient(server.url, namespace=f"{namespace}a", api_key=api_key, transport=client_transport) as a,
        GatewayClient(server.url, namespace=f"{namespace}b", api_key=api_key, transport=client_transport) as b,
    ):
        saver_a, saver_b = a.checkpointer(), b.checkpointer()
        config = {"configurable": {"thread_id": "shared"}}
        await interrupting_graph(saver_a).ainvoke({"steps": []}, config)
        assert await saver_b.aget_tuple(config) is None
        assert [t async for t in saver_b.alist(None)] == []
        await interrupting_graph(saver_b).ainvoke({"steps": []}, config)
        ids_a = [t.checkpoint["id"] async for t in saver_a.alist(config)]
        await saver_b.adelete_thread("shared")
        await saver_b.aprune(["shared"], strategy="delete")
        runs = {t.metadata.get("run_id") async for t in saver_a.alist(config)} - {None}
        await saver_b.adelete_for_runs([*runs, "run-1"])
        assert [t.checkpoint["id"] async for t in saver_a.alist(config)] == ids_a
        assert isinstance(saver_a, GatewayCheckpointSaver)
