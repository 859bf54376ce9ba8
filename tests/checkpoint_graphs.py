"""Small LangGraph graphs the checkpoint tests run, importable by a second client process
(``python -m tests.checkpoint_graphs URL NAMESPACE KEY THREAD RESUME``)."""

from __future__ import annotations

import asyncio
import json
import operator
import sys
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt


class State(TypedDict, total=False):
    steps: Annotated[list[str], operator.add]
    answer: str


def _plan(state: State) -> State:
    return {"steps": ["plan"]}


def _ask(state: State) -> State:
    answer = interrupt({"question": "what now?"})
    return {"steps": ["ask"], "answer": answer}


def _done(state: State) -> State:
    return {"steps": ["done"]}


def interrupting_graph(checkpointer: Any):  # noqa: ANN201
    """plan -> ask (interrupts for an answer) -> done."""
    g = StateGraph(State)
    g.add_node("plan", _plan)
    g.add_node("ask", _ask)
    g.add_node("done", _done)
    g.add_edge(START, "plan")
    g.add_edge("plan", "ask")
    g.add_edge("ask", "done")
    g.add_edge("done", END)
    return g.compile(checkpointer=checkpointer)


def graph_with_subgraph(checkpointer: Any):  # noqa: ANN201
    """plan -> inner (a subgraph: ask, which interrupts, then done) -> END."""
    inner = StateGraph(State)
    inner.add_node("ask", _ask)
    inner.add_node("done", _done)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", "done")
    inner.add_edge("done", END)
    outer = StateGraph(State)
    outer.add_node("plan", _plan)
    outer.add_node("inner", inner.compile())
    outer.add_edge(START, "plan")
    outer.add_edge("plan", "inner")
    outer.add_edge("inner", END)
    return outer.compile(checkpointer=checkpointer)


async def _resume(url: str, namespace: str, key: str, thread_id: str, answer: str) -> dict[str, Any]:
    from storage_gateway_client import GatewayClient

    async with GatewayClient(url, namespace=namespace, api_key=key or None) as gw:
        graph = interrupting_graph(gw.checkpointer())
        return await graph.ainvoke(Command(resume=answer), {"configurable": {"thread_id": thread_id}})


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_resume(*sys.argv[1:6]))))


class Grown(TypedDict, total=False):
    blobs: Annotated[list[str], operator.add]


def growing_graph(checkpointer: Any, size: int):  # noqa: ANN201
    """One node that adds ``size`` characters to the state each run."""
    g = StateGraph(Grown)
    g.add_node("grow", lambda state: {"blobs": ["x" * size]})
    g.add_edge(START, "grow")
    g.add_edge("grow", END)
    return g.compile(checkpointer=checkpointer)
