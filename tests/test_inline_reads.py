"""SQLite statements of one-statement requests on the event loop's thread (``app.core.fast.inline_sqlite``).

Through the real server: kv and record reads are answered inline (no pooled connection, no
hand-off to aiosqlite's thread), see what was just written, and a read past its budget is sent
through the pool with the same answer. On the reader itself: the loop is never held past the
budget, a lock is never waited for, a write never runs, and another thread never uses it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.fast.inline_sqlite import (
    CHECKPOINT_EVERY, CHECKPOINT_EVERY_BYTES, LOCK_TRIES, SKIP_AFTER_OVER_BUDGET, InlineStatements, LockHeld,
)
from app.core.db.sqlite import SQLITE
from app.core.ops import metrics
from tests.conftest import ADMIN_KEY, Backend, Server, run_cli, start_server, stop_server
from tests.test_ops_telemetry import parse_metrics, value

pytestmark = pytest.mark.sqlite_only

INLINE = "gateway_sqlite_inline_reads_total"


def outcomes(client: httpx.Client) -> dict[str, float]:
    samples = parse_metrics(client.get("/metrics").text)
    return {o: value(samples, INLINE, outcome=o) for o in ("inline", "over_budget", "skipped", "busy", "error")}


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {o: after[o] - before[o] for o in after if after[o] != before[o]}


def test_kv_and_record_reads_run_inline_and_see_every_write(server: Server, namespace: str) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        before = outcomes(client)
        for i in range(20):  # each read right after the write it must see
            assert client.put(f"/v1/{namespace}/kv/c/k", json={"i": i}).status_code in (200, 201, 204)
            assert client.get(f"/v1/{namespace}/kv/c/k").json() == {"i": i}
            assert client.put(f"/v1/{namespace}/records/r/k", json={"i": i}).is_success
            assert client.get(f"/v1/{namespace}/records/r/k").json()["value"] == {"i": i}
        assert client.get(f"/v1/{namespace}/kv/c/missing").status_code == 404
        counted = moved(before, outcomes(client))  # one worker: every read, nothing else
    # A loaded machine may push a read past its budget: it is answered through the pool, and the
    # next SKIP_AFTER_OVER_BUDGET reads skip the inline try. Every read is counted either way.
    assert set(counted) <= {"inline", "over_budget", "skipped"} and sum(counted.values()) == 41, counted
    assert counted.get("skipped", 0) <= SKIP_AFTER_OVER_BUDGET * counted.get("over_budget", 0), counted
    assert counted["inline"] >= 41 - (SKIP_AFTER_OVER_BUDGET + 1) * counted.get("over_budget", 0), counted


def test_a_read_past_its_budget_is_answered_through_the_pool(backend: Backend, tmp_path: Path) -> None:
    """A budget of 1 us interrupts any statement that reaches SQLite's first progress check: a
    page of 500 records (a point read finishes before it). The answer is the pool's, the same."""
    assert run_cli(backend, "migrate").returncode == 0
    server = start_server(
        backend, tmp_path / "gateway.log", GATEWAY_DATABASES__CHECKPOINTS__INLINE_BUDGET_MS="0.001",
    )
    ns = f"budget{time.monotonic_ns()}"
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30) as client:
            batch = {"records": [{"key": f"{i:05d}", "value": {"i": i}} for i in range(500)]}
            assert client.post(f"/v1/{ns}/records/r", json=batch).is_success
            before = outcomes(client)
            page = client.get(f"/v1/{ns}/records/r", params={"limit": 500}).json()
            assert [item["key"] for item in page["items"]] == [f"{i:05d}" for i in range(500)]
            assert client.get(f"/v1/{ns}/records/r/00007").json()["value"] == {"i": 7}
            assert moved(before, outcomes(client)) == {"over_budget": 1, "inline": 1}
    finally:
        stop_server(server)


def _database(tmp_path: Path) -> Path:
    path = tmp_path / "inline.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"v{i}") for i in range(100)])
    conn.commit()
    conn.close()
    return path


def _count(database: str, outcome: str) -> float:
    return metrics.REGISTRY.get_sample_value(INLINE, {"database": database, "outcome": outcome}) or 0.0


def test_the_reader_never_holds_the_loop_past_its_budget(tmp_path: Path) -> None:
    reader = InlineStatements(_database(tmp_path), "budget-test", budget_seconds=0.002)
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    try:
        assert reader.read("SELECT v FROM t WHERE k = ?", [7]) == [("v7",)]
        started = time.perf_counter()
        assert reader.read(endless, []) is None
        assert time.perf_counter() - started < 0.05
        assert _count("budget-test", "over_budget") == 1 and _count("budget-test", "inline") == 1
        assert reader.read("SELECT v FROM t WHERE k = ?", [8]) == [("v8",)]  # usable after
        # The same SQL goes straight to the pool for its next SKIP_AFTER_OVER_BUDGET runs.
        started = time.perf_counter()
        assert all(reader.read(endless, []) is None for _ in range(SKIP_AFTER_OVER_BUDGET))
        assert time.perf_counter() - started < 0.01
        assert _count("budget-test", "skipped") == SKIP_AFTER_OVER_BUDGET
        assert reader.read(endless, []) is None and _count("budget-test", "over_budget") == 2
    finally:
        reader.close()


def test_the_reader_never_waits_for_a_lock_and_never_writes(tmp_path: Path) -> None:
    path = _database(tmp_path)
    reader = InlineStatements(path, "lock-test", budget_seconds=0.5)
    holder = SQLITE.connect(path, isolation_level=None)
    try:
        assert reader.read("UPDATE t SET v = 'x' WHERE k = 1 RETURNING v", []) is None  # query_only
        assert reader.read("SELECT v FROM t WHERE k = 1", []) == [("v1",)]
        # An exclusive lock (locking_mode=EXCLUSIVE keeps it after the write) shuts readers out;
        # the holder can take it only while no other connection is open.
        reader.close()
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("UPDATE t SET v = 'held' WHERE k = 2")
        started = time.perf_counter()
        assert reader.read("SELECT v FROM t WHERE k = 2", []) is None
        assert time.perf_counter() - started < 0.05  # busy_timeout 0: refused, not waited for
        assert _count("lock-test", "busy") == 1 and _count("lock-test", "error") == 1
    finally:
        holder.close()
        reader.close()


def test_the_reader_is_used_by_the_first_thread_only(tmp_path: Path) -> None:
    reader = InlineStatements(_database(tmp_path), "thread-test", budget_seconds=0.5)
    try:
        assert reader.read("SELECT v FROM t WHERE k = ?", [1]) == [("v1",)]
        other: list[object] = []
        thread = threading.Thread(target=lambda: other.append(reader.read("SELECT v FROM t WHERE k = ?", [1])))
        thread.start()
        thread.join()
        assert other == [None]
    finally:
        reader.close()


# --- writes -----------------------------------------------------------------------------------

WRITES = "gateway_sqlite_inline_writes_total"
CHECKPOINTS = "gateway_sqlite_checkpoints_total"


def write_outcomes(client: httpx.Client) -> dict[str, float]:
    samples = parse_metrics(client.get("/metrics").text)
    counts = {o: value(samples, WRITES, outcome=o) for o in ("inline", "over_budget", "skipped", "busy", "error")}
    counts["checkpoints"] = value(samples, CHECKPOINTS)
    return counts


def test_kv_and_record_writes_commit_inline_and_the_wal_is_checkpointed_through_the_pool(
    server: Server, namespace: str
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        before = write_outcomes(client)
        for i in range(CHECKPOINT_EVERY + 5):  # kv and records live in two databases
            assert client.put(f"/v1/{namespace}/kv/w/k{i}", json={"i": i}).is_success
            assert client.put(f"/v1/{namespace}/records/w/{i:05d}", json={"i": i}).is_success
        assert client.get(f"/v1/{namespace}/kv/w/k7").json() == {"i": 7}
        assert client.get(f"/v1/{namespace}/records/w/00007").json()["value"] == {"i": 7}
        deadline = time.monotonic() + 5
        while True:  # the checkpoint task runs beside the requests
            after = write_outcomes(client)
            if after["checkpoints"] > before["checkpoints"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert after["inline"] - before["inline"] == 2 * (CHECKPOINT_EVERY + 5)
        assert after["checkpoints"] - before["checkpoints"] >= 1


def test_large_inline_writes_ask_for_checkpoints_by_bytes_too(tmp_path: Path) -> None:
    asked: list[int] = []
    reader = InlineStatements(_database(tmp_path), "bytes-test", budget_seconds=0.5, checkpoint=lambda: asked.append(1))
    try:
        value = "x" * (CHECKPOINT_EVERY_BYTES // 4)
        for i in range(4):
            assert reader.write("INSERT INTO t (k, v) VALUES (?, ?)", [1000 + i, value]) == 1
        assert asked == [1]  # after 4 writes of a quarter each, not after CHECKPOINT_EVERY
    finally:
        reader.close()


def test_a_write_that_meets_a_held_lock_waits_for_it_through_the_pool(server: Server, namespace: str) -> None:
    """Another connection holds SQLite's write lock: the inline write is refused at once (never
    waited for on the loop's thread) and sent through the pool, which waits for the lock as
    before; it succeeds once the lock is gone, and other requests are answered meanwhile."""
    path = server.backend.urls["metadata"].split(":///", 1)[1]
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    holder = SQLITE.connect(path, isolation_level=None, check_same_thread=False)  # (released by a timer)
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        assert client.put(f"/v1/{namespace}/kv/l/k", json=0).is_success
        before = write_outcomes(client)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.5, holder.execute, ("COMMIT",))
        release.start()
        try:
            with httpx.Client(base_url=server.url, headers=headers, timeout=30) as other:
                started = time.monotonic()
                result: list[httpx.Response] = []
                writer = threading.Thread(target=lambda: result.append(other.put(f"/v1/{namespace}/kv/l/k", json=1)))
                writer.start()
                time.sleep(0.1)
                assert client.get(f"/v1/{namespace}/kv/l/k").json() == 0  # the loop is not held
                writer.join()
            assert result[0].is_success and time.monotonic() - started >= 0.4
            assert client.get(f"/v1/{namespace}/kv/l/k").json() == 1
            assert write_outcomes(client)["busy"] - before["busy"] == 1
        finally:
            release.join()
            holder.close()


def test_an_inline_write_that_fails_or_runs_over_changes_nothing(tmp_path: Path) -> None:
    path = _database(tmp_path)
    reader = InlineStatements(path, "write-test", budget_seconds=0.002, checkpoint=lambda: None)
    endless = (
        "INSERT INTO t (k, v) WITH RECURSIVE c(x) AS (SELECT 1000 UNION ALL SELECT x + 1 FROM c) "
        "SELECT x, 'n' FROM c"
    )
    try:
        assert reader.write("UPDATE t SET v = 'w' WHERE k = ?", [3]) == 1
        assert reader.write("INSERT INTO t (k, v) VALUES (?, ?)", [3, "dup"]) is None  # constraint
        started = time.perf_counter()
        assert reader.write(endless, []) is None
        assert time.perf_counter() - started < 0.05
        assert _count("write-test", "error") == 0  # (reads' counter: writes have their own)
        check = sqlite3.connect(path)
        assert check.execute("SELECT v FROM t WHERE k = 3").fetchall() == [("w",)]
        assert check.execute("SELECT count(*) FROM t").fetchone() == (100,)  # the interrupted insert left nothing
        check.close()
        writes = metrics.REGISTRY.get_sample_value
        assert writes(WRITES, {"database": "write-test", "outcome": "over_budget"}) == 1
        assert writes(WRITES, {"database": "write-test", "outcome": "error"}) == 1
    finally:
        reader.close()


@pytest.mark.parametrize("trigger", [False, True], ids=["plain", "trigger"])
def test_an_inline_write_interrupted_after_its_commit_is_answered_as_committed(tmp_path: Path, trigger: bool) -> None:
    """SQLite calls the progress handler once more after a statement's last step, when its
    autocommit is done, and answers "interrupted" if the budget is spent by then. Such a write
    must be answered as the commit it is: sent again through the pool, a compare-and-swap was
    refused by its own change and retried by its client, one increment counted twice (CI, the
    200 increments through nginx ended at 201). With no budget at all, every progress check
    interrupts; each write is reported applied exactly when it was. With a trigger that writes
    a row of its own (as app.quotas' do), total_changes moves before the statement is done, and
    a trigger's RAISE refuses the write: only the statement's own changes() tells."""
    path = _database(tmp_path)
    if trigger:
        setup = sqlite3.connect(path)
        setup.executescript(
            "CREATE TABLE log (v TEXT); CREATE TRIGGER t_log AFTER UPDATE ON t BEGIN "
            "INSERT INTO log VALUES (NEW.v); SELECT RAISE(ABORT, 'refused') WHERE NEW.v = 'refused'; END"
        )
        setup.close()
    reader = InlineStatements(path, "after-commit-test", budget_seconds=0.0, checkpoint=lambda: None)
    refusing = InlineStatements(path, "refused-test", budget_seconds=1.0, checkpoint=lambda: None)
    sql = "UPDATE t SET v = CAST(CAST(v AS INTEGER) + 1 AS TEXT) WHERE k = ?"
    applied = 0
    try:
        reader.write("UPDATE t SET v = '0' WHERE k = ?", [5])
        check = sqlite3.connect(path)
        logged = check.execute("SELECT count(*) FROM log").fetchone()[0] if trigger else 0
        # Each run adds its steps to the statement's own counter, so the checks (every
        # CHECK_EVERY steps) fall at every point of a run in turn, its end included.
        for _ in range(2000):
            count = reader.write(sql, [5])
            applied += bool(count)
            stored = int(check.execute("SELECT v FROM t WHERE k = 5").fetchone()[0])
            assert stored == applied, "a write was answered as not applied but it was (or the reverse)"
        assert 0 < applied < 2000  # some ran through, some were interrupted before their end
        if trigger:
            assert check.execute("SELECT count(*) FROM log").fetchone() == (logged + applied,)
            assert refusing.write("UPDATE t SET v = 'refused' WHERE k = ?", [5]) is None
            assert check.execute("SELECT v FROM t WHERE k = 5").fetchone() == (str(applied),)
            assert check.execute("SELECT count(*) FROM log").fetchone() == (logged + applied,)
            refused = metrics.REGISTRY.get_sample_value(WRITES, {"database": "refused-test", "outcome": "error"})
            assert refused == 1
        check.close()
    finally:
        reader.close()
        refusing.close()


def test_an_inline_transaction_commits_all_or_nothing_and_never_waits(tmp_path: Path) -> None:
    """``InlineStatements.transaction``: the body's statements commit together; an error of the
    body rolls them back and propagates; a spent budget or a SQLite error answers None (the
    caller's pooled path runs it) and a held lock ``LockHeld``, with nothing written, and
    nothing waited for."""
    path = _database(tmp_path)
    writer = InlineStatements(path, "txn-test", budget_seconds=0.05, checkpoint=lambda: None)
    check = sqlite3.connect(path)

    def value(k: int) -> str:
        return str(check.execute("SELECT v FROM t WHERE k = ?", [k]).fetchone()[0])

    def swap(execute: Any) -> str:
        old = execute("SELECT v FROM t WHERE k = 1", []).fetchone()[0]
        execute("UPDATE t SET v = ? WHERE k = 1", [old + "+"])
        execute("UPDATE t SET v = ? WHERE k = 2", ["moved"])
        return str(old)

    try:
        assert writer.transaction(swap) == "v1"
        assert (value(1), value(2)) == ("v1+", "moved")

        def refused(execute: Any) -> None:
            execute("UPDATE t SET v = 'half' WHERE k = 3", [])
            raise LookupError("a precondition failed")

        with pytest.raises(LookupError):
            writer.transaction(refused)
        assert value(3) == "v3" and not writer.in_transaction

        def constraint(execute: Any) -> None:
            execute("UPDATE t SET v = 'half' WHERE k = 4", [])
            execute("INSERT INTO t (k, v) VALUES (5, 'dup')", [])

        assert writer.transaction(constraint) is None and value(4) == "v4"

        endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
        started = time.perf_counter()
        assert writer.transaction(lambda execute: (execute("UPDATE t SET v = 'x' WHERE k = 6", []),
                                                   execute(endless, []).fetchone())) is None
        assert time.perf_counter() - started < 0.5 and value(6) == "v6"

        holder = SQLITE.connect(path, isolation_level=None)  # (the same SQLite library: its locks)
        holder.execute("BEGIN IMMEDIATE")
        started = time.perf_counter()
        with pytest.raises(LockHeld):  # the lock is held: refused at once
            writer.transaction(swap)
        assert time.perf_counter() - started < 0.05
        holder.execute("COMMIT")
        holder.close()
        assert value(1) == "v1+"
        writes = metrics.REGISTRY.get_sample_value
        assert writes(WRITES, {"database": "txn-test", "outcome": "inline"}) == 1
        assert writes(WRITES, {"database": "txn-test", "outcome": "busy"}) == 1
        assert writes(WRITES, {"database": "txn-test", "outcome": "over_budget"}) == 1
        assert writes(WRITES, {"database": "txn-test", "outcome": "error"}) == 1
    finally:
        check.close()
        writer.close()


async def test_an_inline_transaction_tries_again_while_the_lock_is_briefly_held(tmp_path: Path) -> None:
    """``transaction_soon``: a lock that another connection lets go of 2 ms later is waited for
    on the loop (a millisecond or so between tries), not handed to the pool at once; a lock
    held through every try answers None."""
    path = _database(tmp_path)
    writer = InlineStatements(path, "soon-test", budget_seconds=0.05, checkpoint=lambda: None)
    holder = SQLITE.connect(path, isolation_level=None)

    def bump(execute: Any) -> str:
        execute("UPDATE t SET v = 'bumped' WHERE k = 9", [])
        return "done"

    try:
        holder.execute("BEGIN IMMEDIATE")
        asyncio.get_running_loop().call_later(0.002, holder.execute, "COMMIT")
        assert await writer.transaction_soon(bump) == "done"
        writes = metrics.REGISTRY.get_sample_value
        assert writes(WRITES, {"database": "soon-test", "outcome": "busy"}) >= 1
        assert writes(WRITES, {"database": "soon-test", "outcome": "inline"}) == 1
        holder.execute("BEGIN IMMEDIATE")  # held through every try
        started = time.perf_counter()
        assert await writer.transaction_soon(bump) is None
        assert time.perf_counter() - started < 0.5
        assert writes(WRITES, {"database": "soon-test", "outcome": "busy"}) >= 1 + LOCK_TRIES
        holder.execute("ROLLBACK")
    finally:
        holder.close()
        writer.close()
