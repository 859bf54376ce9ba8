"""``app.files.writequeue``: write transactions on a SQLite file take turns, and the next one is
woken when the last lets go (no sleeping retries), across tasks and across processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.files.writequeue import WriteQueue


async def test_tasks_take_turns_in_order(tmp_path: Path) -> None:
    queue = WriteQueue(tmp_path / "metadata.db", wait_seconds=5)
    order: list[tuple[str, int]] = []

    async def writer(i: int) -> None:
        async with queue.held():
            order.append(("in", i))
            await asyncio.sleep(0.01)
            order.append(("out", i))

    await asyncio.gather(*(writer(i) for i in range(5)))
    assert order == [(step, i) for i in range(5) for step in ("in", "out")]  # one at a time, FIFO
    assert (tmp_path / "metadata.db-writelock").exists()
    queue.close()


async def test_another_process_holding_it_is_waited_for_and_the_wait_ends_when_it_lets_go(tmp_path: Path) -> None:
    database = tmp_path / "metadata.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(database) + '-writelock'!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(0.5)\n"
            "fcntl.flock(fd, fcntl.LOCK_UN)\n"
            "print(time.time(), flush=True)\n"
            "time.sleep(2)\n"
        )],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        queue = WriteQueue(database, wait_seconds=5)
        started = time.time()
        async with queue.held():
            got = time.time()
        released = float(holder.stdout.readline())
        assert got - started >= 0.4  # it waited for the other process
        assert got - released < 0.1  # and was woken when the lock went, not after a sleep
        queue.close()
    finally:
        holder.kill()
        holder.wait()


async def test_a_turn_that_does_not_come_in_time_is_a_timeout(tmp_path: Path) -> None:
    queue = WriteQueue(tmp_path / "metadata.db", wait_seconds=0.2)
    release = asyncio.Event()

    async def slow() -> None:
        async with queue.held():
            await release.wait()

    task = asyncio.create_task(slow())
    await asyncio.sleep(0.05)
    with pytest.raises(TimeoutError):
        async with queue.held():
            pass
    release.set()
    await task
    async with queue.held():  # the queue still works afterwards
        pass
    queue.close()
