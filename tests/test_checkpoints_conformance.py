"""LangGraph's own conformance suite (``langgraph-checkpoint-conformance``) against
``GatewayCheckpointSaver`` talking to a real gateway process, on both backends: every base
capability and the extended ones (``delete_for_runs``, ``copy_thread``, ``prune``) must pass."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from storage_gateway_client import GatewayCheckpointSaver, GatewayClient
from tests.conftest import Server


async def test_conformance_suite_passes_in_full(
    server: Server, namespace: str, api_key: str | None, client_transport: str
) -> None:
    @checkpointer_test(name=f"GatewayCheckpointSaver[{server.backend.name}]")
    async def gateway_saver() -> AsyncIterator[GatewayCheckpointSaver]:
        # a fresh namespace per capability suite: the suites reuse thread ids such as "thread-0"
        ns = f"{namespace}-{uuid.uuid4().hex[:6]}"
        async with GatewayClient(server.url, namespace=ns, api_key=api_key, transport=client_transport) as gw:
            yield gw.checkpointer()

    report = await validate(gateway_saver, progress=ProgressCallbacks.verbose())
    report.print_report()
    results = report.to_dict()["results"]
    assert set(results) == {c.value for c in ALL_CAPABILITIES}
    failures = {name: r["failures"] for name, r in results.items() if r["passed"] is not True}
    assert not failures, failures
    assert report.conformance_level() == "FULL"
    assert sum(r["tests_passed"] for r in results.values()) >= 80
