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

from pathlib import Path

from storage_gateway_client import Conflict, GatewayCheckpointSaver, GatewayClient, InvalidRequest
from tests.checkpoint_graphs import graph_with_subgraph, growing_graph, interrupting_graph
from tests.conftest import ROOT, Backend, Server, start_server, stop_server


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


async def test_a_graph_whose_state_outgrows_the_limits(
    gw: GatewayClient, server: Server, backend: Backend, namespace: str, api_key: str | None, tmp_path: Path,
    client_transport: str,
) -> None:
    """A graph whose state grows by 100 KB a run, on a gateway that keeps a checkpoint with its
    values under 250 KB: the third run's checkpoint is refused (``InvalidRequest``, a 413) and the
    thread stays at the last one stored. State grown further through a gateway with the default
    limits is a ``Conflict`` (409) to read through the small one (its reads answer 400 KB), never
    a tuple built whole."""
    tight = start_server(
        backend, tmp_path / "tight.log", **({"GATEWAY_AUTH__ADMIN_KEY": api_key} if api_key else {}),
        GATEWAY_CHECKPOINTS__MAX_CHECKPOINT_BYTES="250000", GATEWAY_CHECKPOINTS__MAX_PENDING_BYTES="150000",
        GATEWAY_CHECKPOINTS__MAX_PAGE_BYTES="400000",
    )
    config = {"configurable": {"thread_id": "growing"}}
    try:
        async with GatewayClient(tight.url, namespace=namespace, api_key=api_key, transport=client_transport) as small:
            graph = growing_graph(small.checkpointer(), 100_000)
            for _ in range(2):
                await graph.ainvoke({"blobs": []}, config)
            with pytest.raises(InvalidRequest) as refused:
                await graph.ainvoke({"blobs": []}, config)
            assert refused.value.status_code == 413 and "max_checkpoint_bytes" in str(refused.value)
            # the newest checkpoint stored is where the third run began its step (two blobs) with
            # the node's pending write: the run's last checkpoint, which would hold three, was not
            stored = await small.checkpointer().aget_tuple(config)
            assert stored is not None and stored.metadata["source"] == "loop"
            assert len(stored.checkpoint["channel_values"]["blobs"]) == 2 and len(stored.pending_writes or []) == 1

            roomy = growing_graph(gw.checkpointer(), 100_000)
            for _ in range(2):
                await roomy.ainvoke({"blobs": []}, config)
            assert len((await roomy.aget_state(config)).values["blobs"]) == 4
            with pytest.raises(Conflict) as heavy:
                await graph.aget_state(config)
            assert heavy.value.status_code == 409 and "max_page_bytes" in str(heavy.value)
    finally:
        stop_server(tight)
