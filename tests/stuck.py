"""A test that hangs fails instead of stalling the run, and says where its tasks were waiting.

A hung asyncio test sits in an idle event loop (``select``): the thread dump of ``faulthandler``
shows only that. After ``STUCK_SECONDS`` this plugin runs, on every running event loop, a
callback that prints each pending task's stack (captured into the failing test's report) and
cancels them, so the test fails with the stacks beside it and the suite goes on.
"""

from __future__ import annotations

import asyncio
import gc
import io
import os
import sys
import threading
from collections.abc import Iterator

import pytest

STUCK_SECONDS = float(os.environ.get("GATEWAY_TEST_STUCK_SECONDS", "420"))


def _unstick(loop: asyncio.AbstractEventLoop, nodeid: str) -> None:
    out = io.StringIO()
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    print(f"\n=== {nodeid} stuck for {STUCK_SECONDS:g} s: {len(tasks)} pending tasks ===", file=out)
    for task in tasks:
        print(f"--- {task!r}", file=out)
        task.print_stack(limit=30, file=out)
    sys.stderr.write(out.getvalue())
    for task in tasks:
        task.cancel(f"stuck for {STUCK_SECONDS:g} s")


def _fire(nodeid: str) -> None:
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.AbstractEventLoop) and obj.is_running() and not obj.is_closed():
            obj.call_soon_threadsafe(_unstick, obj, nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    timer = threading.Timer(STUCK_SECONDS, _fire, args=(item.nodeid,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
