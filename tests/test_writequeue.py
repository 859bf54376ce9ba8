"""``app.fairness.writequeue``: write transactions on a SQLite file take turns, and the next one is
woken when the last lets go (no sleeping retries), across tasks and across processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.fairness.writequeue import WriteQueue


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


async def test_a_heavy_turn_gives_way_to_a_single_write_that_waits(tmp_path: Path) -> None:
    """Issue 44: a heavy write's turn begins only once no single write wants the lock (here,
    one of this process; another process's is seen through the shared flock), and a single
    write told of the turn in progress is woken when it ends."""
    queue = WriteQueue(tmp_path / "checkpoints.db", wait_seconds=5)
    order: list[str] = []

    async def heavy(i: int) -> None:
        async with queue.heavy(yield_seconds=5):
            order.append(f"heavy{i}")
            await asyncio.sleep(0.05)

    async def single() -> None:
        with queue.wanting():
            await queue.after_heavy_turn()  # the turn in progress ends first
            order.append("single")
            await asyncio.sleep(0.05)

    first = asyncio.create_task(heavy(0))
    await asyncio.sleep(0.01)
    await asyncio.gather(first, single(), heavy(1), heavy(2))
    assert order == ["heavy0", "single", "heavy1", "heavy2"], order

    other = subprocess.Popen(
        [sys.executable, "-c", (
            "import fcntl, os, time\n"
            f"fd = os.open({str(queue.want_path)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_SH)\n"
            "print('wants', flush=True)\n"
            "time.sleep(0.5)\n"
        )],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "wants"
        assert queue.others_want()
        started = time.monotonic()
        async with queue.heavy(yield_seconds=5):
            waited = time.monotonic() - started
        assert waited >= 0.2  # until the other process's write stopped wanting the lock
    finally:
        other.kill()
        other.wait()
    queue.close()
