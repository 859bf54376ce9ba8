"""Background jobs stop when their app stops, even when a job's cleanup turns the cancel into
another error: before, such a job slept and went on, and the app's shutdown waited for it forever
(a store index round cancelled mid-``CREATE INDEX``, whose ``finally`` failed on the broken
connection, hung in-process apps on PostgreSQL in CI)."""

from __future__ import annotations

import asyncio

from app.core.capability import Periodic, running


class CleanupFails(RuntimeError):
    pass


async def test_a_job_whose_cleanup_fails_on_cancel_still_stops() -> None:
    started = asyncio.Event()
    rounds = 0

    async def run() -> None:
        nonlocal rounds
        rounds += 1
        started.set()
        try:
            await asyncio.sleep(3600)  # a long statement
        finally:
            raise CleanupFails("the connection the cancel broke")  # replaces the CancelledError

    async with asyncio.timeout(10):
        async with running([Periodic("failing-cleanup", 0.01, run, at_start=True)]):
            await started.wait()
    assert rounds == 1


async def test_a_job_that_fails_on_its_own_runs_again() -> None:
    """The stop rule does not turn an ordinary failure into a stop: the next round runs."""
    rounds = 0
    again = asyncio.Event()

    async def run() -> None:
        nonlocal rounds
        rounds += 1
        if rounds >= 3:
            again.set()
        raise CleanupFails("a failed round")

    async with asyncio.timeout(10):
        async with running([Periodic("failing", 0.01, run, at_start=True)]):
            await again.wait()
    assert rounds >= 3
