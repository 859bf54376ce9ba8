"""Retention of checkpoints, on both backends: keep-latest and idle TTL, per namespace or per
thread, applied by the background sweep, deleting what they should and nothing else; values no
checkpoint uses any more go with them; a thread with a DeltaChannel keeps its chain back to the
last snapshot (through the sweep and through ``aprune``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import httpx
import orjson
import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from sqlalchemy import func, insert, select, text, true
from storage_gateway_client import GatewayCheckpointSaver, GatewayClient

from app.checkpoints.models import checkpoint_blobs, checkpoint_threads, checkpoint_writes
from app.core.config import Database, Settings
from app.core.state import gateway_state
from app.main import create_app
from tests.conftest import Backend, Server

SWEEP = 0.1


class Gateway:
    def __init__(self, app: Any, transport: httpx.ASGITransport) -> None:
        self.app, self.transport = app, transport

    def client(self, namespace: str) -> GatewayClient:
        return GatewayClient("http://gw", namespace=namespace, transport=self.transport)

    async def rows(self, table: Any, namespace: str, thread_id: str) -> int:
        """Rows of ``table`` that belong to the thread (the registry row itself for the registry)."""
        t = checkpoint_threads
        pk = select(t.c.pk).where(t.c.namespace == namespace, t.c.thread_id == thread_id).scalar_subquery()
        where = t.c.pk == pk if table is t else table.c.thread_pk == pk
        async with gateway_state(self.app).databases.engine(Database.checkpoints).connect() as conn:
            return (await conn.execute(select(func.count()).select_from(table).where(where))).scalar_one()


@pytest.fixture
async def gateway(backend: Backend, server: Server, tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = Settings(
        databases={db: {"url": url} for db, url in backend.urls.items()}, data_dir=tmp_path,
        auth={"mode": "disabled"}, auto_migrate=False, checkpoints={"sweep_interval_seconds": SWEEP},
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield Gateway(app, httpx.ASGITransport(app=app))


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError("the sweep did not get there in time")
        await asyncio.sleep(SWEEP)


async def put_steps(saver: GatewayCheckpointSaver, thread_id: str, n: int, ns: str = "") -> list[str]:
    """``n`` checkpoints in a chain: channel ``a`` changes every step, ``b`` is written once
    (both stored as values: lists), ``c`` is a primitive (kept inside the checkpoint); each
    checkpoint gets one pending write."""
    config: dict = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
    ids = []
    for i in range(n):
        cp = empty_checkpoint()
        cp["channel_values"] = {"a": [f"a{i}" * 50], "b": ["constant"], "c": i}
        cp["channel_versions"] = {"a": i + 1, "b": 1, "c": i + 1}
        new_versions = {"a": i + 1, "c": i + 1, **({"b": 1} if i == 0 else {})}
        config = await saver.aput(config, cp, {"source": "loop", "step": i}, new_versions)
        await saver.aput_writes(config, [("a", f"w{i}")], f"task{i}")
        ids.append(cp["id"])
    return ids


async def ids_of(saver: GatewayCheckpointSaver, thread_id: str, ns: str = "") -> list[str]:
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
    return [t.checkpoint["id"] async for t in saver.alist(config)]


async def test_keep_latest_per_namespace_and_thread_override(gateway: Gateway, namespace: str) -> None:
    ns, other = f"{namespace}r", f"{namespace}o"
    async with gateway.client(ns) as gw, gateway.client(other) as gw_other:
        saver, saver_other = gw.checkpointer(), gw_other.checkpointer()
        ids = await put_steps(saver, "t1", 5)
        sub = await put_steps(saver, "t1", 3, ns="child:1")
        kept_whole = await put_steps(saver, "t2", 4)
        untouched = await put_steps(saver_other, "t1", 4)
        assert await gateway.rows(checkpoint_blobs, ns, "t1") == 5 + 1 + 3 + 1
        await gw._transport.request("PUT", f"/v1/{ns}/checkpoints/retention", json={"thread_id": "t2", "keep_latest": 0})
        await gw._transport.request("PUT", f"/v1/{ns}/checkpoints/retention", json={"keep_latest": 2})
        assert (await gw._transport.request("GET", f"/v1/{ns}/checkpoints/retention")).json()["keep_latest"] == 2

        async def trimmed() -> bool:
            return len(await ids_of(saver, "t1")) == 2
        await eventually(trimmed)
        assert await ids_of(saver, "t1") == ids[:-3:-1]
        assert await ids_of(saver, "t1", "child:1") == sub[:-3:-1]
        # values only the deleted checkpoints used went with them; `b` (still used) stayed
        assert await gateway.rows(checkpoint_blobs, ns, "t1") == (2 + 1) * 2
        assert await gateway.rows(checkpoint_writes, ns, "t1") == 2 * 2
        latest = await saver.aget_tuple({"configurable": {"thread_id": "t1", "checkpoint_ns": ""}})
        assert latest.checkpoint["channel_values"] == {"a": ["a4" * 50], "b": ["constant"], "c": 4}
        assert [w[2] for w in latest.pending_writes] == ["w4"]
        # the thread that turned retention off, and the other namespace, kept everything
        assert await ids_of(saver, "t2") == kept_whole[::-1]
        assert await ids_of(saver_other, "t1") == untouched[::-1]
        # new checkpoints are trimmed again on a later sweep
        more = await put_steps(saver, "t1", 2)
        await eventually(trimmed)
        assert await ids_of(saver, "t1") == more[::-1]


async def test_idle_ttl_deletes_idle_threads_only(gateway: Gateway, namespace: str) -> None:
    ns, other = f"{namespace}i", f"{namespace}k"
    async with gateway.client(ns) as gw, gateway.client(other) as gw_other:
        saver = gw.checkpointer()
        await put_steps(saver, "idle", 2)
        await put_steps(saver, "pinned", 2)
        await put_steps(gw_other.checkpointer(), "idle", 2)
        await gw._transport.request("PUT", f"/v1/{ns}/checkpoints/retention", json={"thread_id": "pinned", "idle_ttl_seconds": 0})
        await gw._transport.request("PUT", f"/v1/{ns}/checkpoints/retention", json={"idle_ttl_seconds": 1.0})

        async def gone() -> bool:
            return await gateway.rows(checkpoint_threads, ns, "idle") == 0
        await eventually(gone)
        for table in (checkpoint_blobs, checkpoint_writes):
            assert await gateway.rows(table, ns, "idle") == 0
        assert await ids_of(saver, "idle") == []
        assert len(await ids_of(saver, "pinned")) == 2
        assert len(await ids_of(gw_other.checkpointer(), "idle")) == 2
        # a thread written again is no longer idle
        await put_steps(saver, "busy", 1)
        for _ in range(5):
            await asyncio.sleep(0.3)
            await put_steps(saver, "busy", 1)
        assert len(await ids_of(saver, "busy")) == 6  # never idle for a second: all still there


def _append(state: list, writes: list) -> list:
    return [*state, *(x for w in writes for x in w)]


class DeltaState(TypedDict, total=False):
    items: Annotated[list, DeltaChannel(_append, snapshot_frequency=3)]
    n: int


def delta_graph(checkpointer: Any):  # noqa: ANN201
    def step(state: DeltaState) -> DeltaState:
        return {"items": [state.get("n", 0)], "n": state.get("n", 0) + 1}

    g = StateGraph(DeltaState)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] < 8 else END)
    return g.compile(checkpointer=checkpointer)


@pytest.mark.parametrize("how", ["aprune", "sweep"])
async def test_a_delta_channel_keeps_its_chain(gateway: Gateway, namespace: str, how: str) -> None:
    async with gateway.client(namespace) as gw:
        saver = gw.checkpointer()
        graph = delta_graph(saver)
        config = {"configurable": {"thread_id": "delta"}}
        result = await graph.ainvoke({"n": 0}, config)
        assert result["items"] == list(range(8))
        before = len(await ids_of(saver, "delta"))
        head = await saver.aget_tuple(config)
        assert head.metadata.get("counters_since_delta_snapshot"), "the head must not be a snapshot"
        if how == "aprune":
            await saver.aprune(["delta"], strategy="keep_latest")
        else:
            await gw._transport.request("PUT", f"/v1/{namespace}/checkpoints/retention", json={"keep_latest": 1})

            async def trimmed() -> bool:
                return len(await ids_of(saver, "delta")) < before
            await eventually(trimmed)
        kept = await ids_of(saver, "delta")
        assert 1 < len(kept) < before  # the head, and its ancestors back to the snapshot
        assert kept[0] == head.checkpoint["id"]
        state = await delta_graph(saver).aget_state(config)
        assert state.values == {"items": list(range(8)), "n": 8}
        # a copy carries the whole chain too
        await saver.acopy_thread("delta", "delta-copy")
        copied = await delta_graph(saver).aget_state({"configurable": {"thread_id": "delta-copy"}})
        assert copied.values == state.values


async def test_a_prune_of_more_checkpoints_than_a_statement_holds(gateway: Gateway, namespace: str) -> None:
    """A thread of 11,001 checkpoints pruned to its latest: the deletes name at most
    ``DELETE_CHUNK`` keys a statement. Whole, they were 33,003 parameters, which asyncpg refuses
    (32,767 at most): the prune answered 503 on every retry (SQLite refuses 250,000).

    The table is analyzed with the thread at one checkpoint, and the 11,000 written after, as a
    bulk load leaves the statistics: PostgreSQL then joined the thread's checkpoints with those
    to delete by a nested loop that computed the set again for each row, until the statement
    timeout (30 s, a 503; seen once in a full run). ``hash_joins`` makes it 21 ms."""
    from app.checkpoints.models import checkpoints

    async with gateway.client(namespace) as gw:
        put = {"thread_id": "many", "checkpoint_id": "z", "checkpoint": {"type": "bytes", "data": "AA=="}}
        assert (await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/put", json=put)).status_code == 200
        engine = gateway_state(gateway.app).databases.engine(Database.checkpoints)
        # IMMEDIATE (SQLite): a transaction that has read cannot wait for the write lock (SQLITE_BUSY at
        # once), and the gateway's background work (a WAL checkpoint, a new pooled connection) takes it now and then
        async with engine.execution_options(sqlite_begin="IMMEDIATE").begin() as conn:
            await conn.execute(text("ANALYZE checkpoints"))
        async with engine.execution_options(sqlite_begin="IMMEDIATE").begin() as conn:
            t = checkpoint_threads
            mine = select(t.c.pk).where(t.c.namespace == namespace, t.c.thread_id == "many").scalar_subquery()
            row = (await conn.execute(select(checkpoints).where(checkpoints.c.thread_pk == mine))).mappings().one()
            await conn.execute(insert(checkpoints), [{**row, "checkpoint_id": f"c{i:05}"} for i in range(11_000)])
        started = time.monotonic()
        answer = await gw._transport.request(
            "POST", f"/v1/{namespace}/checkpoints/prune", json={"thread_ids": ["many"], "strategy": "keep_latest"}
        )
        assert answer.status_code == 200 and answer.json()["deleted"] == 11_000, (answer.text, time.monotonic() - started)
        assert await gateway.rows(checkpoints, namespace, "many") == 1


@pytest.mark.postgres_only  # SQLite's hash_joins sets nothing
async def test_the_join_settings_of_a_bulk_delete_are_set_back_after_it(gateway: Gateway) -> None:
    """``hash_joins`` turns nested loop and merge joins off for the delete, and back on for the
    rest of the transaction (a prune goes on with other threads, whose keyed deletes need the
    nested loop of index lookups), and after a failed statement the rollback does."""
    repo = gateway.app.state.gateway.services["checkpoints"].repo
    engine = gateway_state(gateway.app).databases.engine(Database.checkpoints)

    async def joins(conn: Any) -> tuple[str, str]:
        row = (await conn.execute(text("SELECT current_setting('enable_nestloop'), current_setting('enable_mergejoin')"))).one()
        return row[0], row[1]

    async with engine.begin() as conn:
        async with repo.backend.hash_joins(conn):
            assert await joins(conn) == ("off", "off")
        assert await joins(conn) == ("on", "on")
    with pytest.raises(Exception, match="division by zero"):
        async with engine.begin() as conn:
            async with repo.backend.hash_joins(conn):
                await conn.execute(text("SELECT 1 / 0"))
    async with engine.connect() as conn:
        assert await joins(conn) == ("on", "on")


async def test_a_checkpoint_written_while_its_idle_thread_is_swept_is_kept(gateway: Gateway, namespace: str) -> None:
    """The sweep finds an idle thread, and a checkpoint is written to it before the sweep
    deletes it: the write waits for the sweep (the thread's row is locked with its selection)
    and lands in the thread made again, so the acknowledged checkpoint is kept. Before, on
    PostgreSQL, the write went through and the sweep deleted it with the thread."""
    from app.checkpoints.models import checkpoints

    service = gateway.app.state.gateway.services["checkpoints"]
    found_idle = service.repo.idle_threads
    late: list[asyncio.Task] = []

    async with gateway.client(namespace) as gw:
        put = {"thread_id": "idle", "checkpoint_id": "c1", "checkpoint": {"type": "bytes", "data": "AA=="}}
        assert (await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/put", json=put)).status_code == 200
        t = checkpoint_threads
        async with gateway_state(gateway.app).databases.engine(Database.checkpoints).connect() as conn:
            mine = (await conn.execute(select(t.c.pk).where(t.c.namespace == namespace, t.c.thread_id == "idle"))).scalar_one()

        async def idle_threads(conn: Any, now: float, batch: int) -> list[int]:
            pks = await found_idle(conn, now, batch)
            # The write lands between the sweep's look and its delete (of this thread: the sweep
            # goes over every namespace, and other tests' threads may be idle too).
            if mine in pks and not late:
                again = {**put, "checkpoint_id": "c2"}
                late.append(asyncio.ensure_future(
                    gw._transport.request("POST", f"/v1/{namespace}/checkpoints/put", json=again)
                ))
                await asyncio.wait(late, timeout=1.0)
            return pks

        service.repo.idle_threads = idle_threads
        try:
            await gw._transport.request("PUT", f"/v1/{namespace}/checkpoints/retention", json={"idle_ttl_seconds": 0.5})

            async def written() -> bool:
                return bool(late) and late[0].done()
            await eventually(written)
        finally:
            service.repo.idle_threads = found_idle
        assert late[0].result().status_code == 200
        await gw._transport.request("PUT", f"/v1/{namespace}/checkpoints/retention", json={"idle_ttl_seconds": 0})
        tuple_ = await gw._transport.request("GET", f"/v1/{namespace}/checkpoints/tuple", params={"thread_id": "idle"})
        assert tuple_.status_code == 200 and tuple_.json()["checkpoint_id"] == "c2", tuple_.text
        assert await gateway.rows(checkpoints, namespace, "idle") == 1


async def test_a_prune_without_delta_channels_reads_no_checkpoint_out(
    gateway: Gateway, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keep-latest of a thread without delta channels deletes in the database: no checkpoint's
    versions or metadata are read into the gateway. Before, every prune and every sweep's trim
    read each checkpoint's channel_versions and whole metadata (up to 64 KiB each) into memory:
    a thread of 100,000 checkpoints with large metadata took gigabytes, in a background sweep."""
    from app.checkpoints.models import checkpoints
    from app.checkpoints.repository import CheckpointsRepository

    async with gateway.client(namespace) as gw:
        big = {"source": "loop", "notes": "n" * 60_000}
        for ns in ("", "sub"):
            put = {"thread_id": "wide", "checkpoint_ns": ns, "checkpoint_id": "z", "parent_checkpoint_id": "c199", "metadata": big,
                   "checkpoint": {"type": "bytes", "data": "AA=="}}
            assert (await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/put", json=put)).status_code == 200
        engine = gateway_state(gateway.app).databases.engine(Database.checkpoints)
        async with engine.execution_options(sqlite_begin="IMMEDIATE").begin() as conn:
            t = checkpoint_threads
            mine = select(t.c.pk).where(t.c.namespace == namespace, t.c.thread_id == "wide").scalar_subquery()
            for row in (await conn.execute(select(checkpoints).where(checkpoints.c.thread_pk == mine))).mappings().all():
                await conn.execute(insert(checkpoints), [
                    {**row, "checkpoint_id": f"c{i:03}", "parent_checkpoint_id": f"c{i - 1:03}" if i else None}
                    for i in range(200)
                ])

        async def no_lineage(*args: object) -> None:
            raise AssertionError("a prune without delta channels read the thread's lineage")
        monkeypatch.setattr(CheckpointsRepository, "lineage", no_lineage)
        answer = await gw._transport.request(
            "POST", f"/v1/{namespace}/checkpoints/prune", json={"thread_ids": ["wide"], "strategy": "keep_latest"}
        )
        assert answer.status_code == 200 and answer.json()["deleted"] == 400, answer.text
        for ns in ("", "sub"):
            r = await gw._transport.request(
                "POST", f"/v1/{namespace}/checkpoints/search", json={"thread_id": "wide", "checkpoint_ns": ns}
            )
            kept = r.json()["items"]
            assert [c["checkpoint_id"] for c in kept] == ["z"]  # the newest of each checkpoint_ns
            assert kept[0]["parent_checkpoint_id"] is None  # its parent went: it is a chain root now


def _reference_kept_ids(rows: list[Any], keep: int, stored: set[tuple[str, str, str]]) -> set[str]:
    """kept_ids as it was before its walks were shared: each head walks alone."""
    by_id = {r.checkpoint_id: r for r in rows}

    def has_value(r: Any, channel: str) -> bool:
        version = r.channel_versions.get(channel)
        return version is not None and (r.checkpoint_ns, channel, str(version)) in stored

    kept: set[str] = set()
    for head in rows[:keep]:
        kept.add(head.checkpoint_id)
        needed = {ch for ch in head.delta_channels if not has_value(head, ch)}
        seen = {head.checkpoint_id}
        cur = by_id.get(head.parent_checkpoint_id or "")
        while needed and cur is not None and cur.checkpoint_id not in seen:
            seen.add(cur.checkpoint_id)
            kept.add(cur.checkpoint_id)
            needed = {ch for ch in needed if not has_value(cur, ch)}
            cur = by_id.get(cur.parent_checkpoint_id or "")
    return kept


def test_the_walks_of_every_head_keep_what_each_walk_alone_kept() -> None:
    import random

    from app.checkpoints.lineage import kept_ids
    from app.checkpoints.repository import Lineage

    rng = random.Random(18)
    for _ in range(400):
        n = rng.randint(1, 30)
        ids = [f"c{i:03}" for i in range(n)]
        channels = ["a", "b", "c"]
        rows, stored = [], set()
        for i, cid in enumerate(ids):
            # mostly a chain to the previous, sometimes a fork, a missing parent or a cycle
            parent = rng.choice([ids[i - 1] if i else None] * 4 + [rng.choice(ids), None, "gone"])
            versions = {ch: rng.randint(1, 3) for ch in channels if rng.random() < 0.8}
            for ch, v in versions.items():
                if rng.random() < 0.3:
                    stored.add(("", ch, str(v)))
            delta = frozenset(ch for ch in channels if rng.random() < 0.5)
            rows.append(Lineage("", cid, parent, versions, delta))
        rows.reverse()  # newest first
        keep = rng.randint(1, n)
        assert kept_ids(rows, keep, stored) == _reference_kept_ids(rows, keep, stored)


def test_the_walks_of_every_head_visit_a_checkpoint_once_per_channel() -> None:
    """Found by attack: a delta channel whose value is never stored made each kept head walk the
    whole chain (keep x checkpoints: a retention of keep_latest 29,999 on a thread of 30,000 was
    about 160 s of the event loop, every sweep). Now a walk stops where an earlier one went on."""
    from app.checkpoints.lineage import kept_ids
    from app.checkpoints.repository import Lineage

    class Counting(set[tuple[str, str, str]]):
        lookups = 0

        def __contains__(self, key: object) -> bool:
            Counting.lookups += 1
            return super().__contains__(key)

    n = 3000
    rows = [
        Lineage("", f"c{i:05}", f"c{i - 1:05}" if i else None, {"d": i}, frozenset({"d"}))
        for i in reversed(range(n))
    ]
    assert kept_ids(rows, n - 1, Counting()) == {r.checkpoint_id for r in rows}
    assert Counting.lookups <= 2 * n  # each checkpoint looked at once as a head, once on a walk


async def test_a_thread_with_too_many_delta_channels_keeps_every_ancestor_and_reads_no_versions(
    gateway: Gateway, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning reads a thread's lineage with its delta channels' versions only (before, every
    checkpoint's whole channel_versions, up to 16 MiB each, went into memory at once: gigabytes
    for a long thread); past MAX_DELTA_CHANNELS names, none, and every ancestor of a kept
    checkpoint stays (nothing a delta channel could need is lost)."""
    from app.checkpoints import lineage as lineage_module
    from app.checkpoints.repository import MAX_DELTA_CHANNELS

    seen: list[list[Any]] = []
    real = lineage_module.kept_ids

    def spy(rows: Any, keep: int, stored: Any) -> set[str]:
        seen.append(list(rows))
        return real(rows, keep, stored)

    monkeypatch.setattr(lineage_module, "kept_ids", spy)

    async def put(thread: str, i: int, counters: dict[str, int]) -> None:
        body = {
            "thread_id": thread, "checkpoint_id": f"c{i:02}", "parent_checkpoint_id": f"c{i - 1:02}" if i else None,
            "checkpoint": {"type": "bytes", "data": "AA=="},
            "channel_versions": {"d": str(i), "other": str(i), "wide": "w" * 1000},
            "blobs": [{"channel": "d", "version": str(i), "type": "bytes", "data": "AA=="}] if i == 2 else [],
            "metadata": {"counters_since_delta_snapshot": counters},
        }
        r = await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/put", json=body)
        assert r.status_code == 200, r.text

    async def prune(thread: str) -> list[str]:
        r = await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/prune", json={"thread_ids": [thread]})
        assert r.status_code == 200, r.text
        r = await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/search", json={"thread_id": thread})
        return sorted(c["checkpoint_id"] for c in r.json()["items"])

    async with gateway.client(namespace) as gw:
        for i in range(6):
            await put("few", i, {"d": 1})
            await put("many", i, {f"ch{i}-{k}": 1 for k in range(MAX_DELTA_CHANNELS)} | {"d": 1})
        # "few": the head's chain back to c02, which stores d's value
        assert await prune("few") == ["c02", "c03", "c04", "c05"]
        # of the delta channels' versions, only those with a stored value stay (c02's d)
        assert [sorted(r.channel_versions) for r in seen[-1]] == [[], [], [], ["d"], [], []]
        # "many": every ancestor of the head, no versions read
        assert await prune("many") == [f"c{i:02}" for i in range(6)]
        assert [r.channel_versions for r in seen[-1]] == [{}] * 6


async def test_a_run_across_more_threads_than_a_statement_has_parameters_is_deleted(gateway: Gateway, namespace: str) -> None:
    """Found by attack: deleting a run locked its threads in one statement of one parameter a
    thread; past 32,767 threads the driver refused it, answered as a retryable 503 that never
    succeeded. The locks now go in chunks."""
    from app.checkpoints.models import checkpoint_metadata_terms, checkpoints

    n = 33_000
    async with gateway.client(namespace) as gw:
        body = {"thread_id": "template", "checkpoint_id": "c1", "checkpoint": {"type": "bytes", "data": "AA=="},
                "metadata": {"run_id": "wide"}}
        assert (await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/put", json=body)).status_code == 200
        engine = gateway_state(gateway.app).databases.engine(Database.checkpoints)
        async with engine.execution_options(sqlite_begin="IMMEDIATE").begin() as conn:
            t = checkpoint_threads
            await conn.execute(insert(t), [{"namespace": namespace, "thread_id": f"x{i:05}", "touched_at": 0.0} for i in range(n)])
            template = select(t.c.pk).where(t.c.namespace == namespace, t.c.thread_id == "template").scalar_subquery()
            copies = t.alias("copies")
            for table in (checkpoints, checkpoint_metadata_terms):
                columns = [c for c in table.c if c.name != "thread_pk"]
                rows = select(copies.c.pk, *columns).select_from(copies.join(table, true())).where(
                    copies.c.namespace == namespace, copies.c.thread_id.like("x%"), table.c.thread_pk == template,
                )
                await conn.execute(insert(table).from_select(["thread_pk", *(c.name for c in columns)], rows))
        r = await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/runs/delete", json={"run_ids": ["wide"]})
        assert r.status_code == 200 and r.json() == {"deleted": n + 1}, r.text[:500]


async def test_a_prune_of_a_long_delta_thread_leaves_the_event_loop_its_turns(
    gateway: Gateway, namespace: str, backend: Backend
) -> None:
    """Found by attack: keep-latest of a thread of 7,000 checkpoints counting 64 delta channels
    walked its chains on the event loop (checkpoints x channels, pure Python): a /healthz sent
    meanwhile waited 528 ms, and the lineage took 60 MiB. The walk now runs in a worker thread on
    a lineage that keeps only what the walk asks (the versions that have a stored value), the
    walk shares one set of channels between the checkpoints it passes (not a tuple per checkpoint
    and channel), and the loop gets a turn every few hundred rows read: other requests go on.
    What is kept is the same: the head and its ancestors back to the snapshot of every channel.
    (Measured on 2 cores: /healthz waited about 400 ms before, about 30 ms now.)"""
    from app.checkpoints.models import checkpoints

    n, channels = 5000, 64
    snapshot = 10  # stores a value of every channel: what is older goes

    def row(i: int) -> dict[str, Any]:
        return {
            "checkpoint_ns": "", "checkpoint_id": f"c{i:05}", "parent_checkpoint_id": f"c{i - 1:05}" if i else None,
            "type": "bytes", "checkpoint": b"",
            "channel_versions": json({f"ch{k}": f"{i:032}.0.1" for k in range(channels)}),
            "metadata": json({"counters_since_delta_snapshot": {f"ch{k}": 1 for k in range(channels)}}),
        }

    def json(value: dict[str, Any]) -> Any:  # JSONB takes the value, SQLite's column its text
        return value if backend.is_postgres else orjson.dumps(value).decode()

    async with gateway.client(namespace) as gw:
        head = {"thread_id": "long", "checkpoint_id": "z", "parent_checkpoint_id": f"c{n - 1:05}",
                "checkpoint": {"type": "bytes", "data": ""}}
        assert (await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/put", json=head)).status_code == 200
        engine = gateway_state(gateway.app).databases.engine(Database.checkpoints)
        async with engine.execution_options(sqlite_begin="IMMEDIATE").begin() as conn:
            t = checkpoint_threads
            pk = (await conn.execute(select(t.c.pk).where(t.c.namespace == namespace, t.c.thread_id == "long"))).scalar_one()
            z = row(n) | {"checkpoint_id": "z", "thread_pk": pk}
            await conn.execute(checkpoints.delete().where(checkpoints.c.thread_pk == pk))
            await conn.execute(insert(checkpoints), [z, *({**row(i), "thread_pk": pk} for i in range(n))])
            await conn.execute(insert(checkpoint_blobs), [
                {"thread_pk": pk, "checkpoint_ns": "", "channel": f"ch{k}", "version": f"{snapshot:032}.0.1",
                 "type": "bytes", "blob": b"v"} for k in range(channels)
            ])

        async with httpx.AsyncClient(transport=gateway.transport, base_url="http://gw") as probe:
            waits: list[float] = []
            pruned = asyncio.ensure_future(gw._transport.request(
                "POST", f"/v1/{namespace}/checkpoints/prune", json={"thread_ids": ["long"], "strategy": "keep_latest"}
            ))
            while not pruned.done():
                # a /healthz due every 10 ms: how late its answer came (in-process, the request
                # itself never leaves the loop: the prune runs during the sleep)
                due = time.perf_counter() + 0.01
                await asyncio.sleep(0.01)
                assert (await probe.get("/healthz")).status_code == 200
                waits.append(time.perf_counter() - due)
            answer = await pruned
        assert answer.status_code == 200 and answer.json()["deleted"] == snapshot, answer.text
        assert len(waits) > 5, waits  # the prune took a while, and /healthz was answered meanwhile
        assert max(waits) < 0.15, f"/healthz waited {max(waits) * 1000:.0f} ms during the prune"
        r = await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/search", json={"thread_id": "long", "limit": 1})
        assert r.json()["items"][0]["checkpoint_id"] == "z"
        assert await gateway.rows(checkpoints, namespace, "long") == n - snapshot + 1
        async with engine.connect() as conn:
            oldest = select(func.min(checkpoints.c.checkpoint_id)).where(checkpoints.c.thread_pk == pk)
            assert (await conn.execute(oldest)).scalar_one() == f"c{snapshot:05}"


async def test_a_long_run_is_deleted_a_page_of_keys_at_a_time(gateway: Gateway, namespace: str) -> None:
    """Deleting a run read the keys of all its checkpoints before deleting any: memory grew with
    the run (30,000 checkpoints: a peak of 7.6 MiB on SQLite, 10.4 on PostgreSQL, under
    tracemalloc). Now the run's threads are locked, then its keys are read and deleted
    ``DELETE_CHUNK`` at a time; another run's checkpoint in the same thread stays, with the
    value it references."""
    import tracemalloc

    from app.checkpoints.models import checkpoint_metadata_terms, checkpoints

    n = 30_000
    async with gateway.client(namespace) as gw:
        for cid, run, version in (("a0", "long", "1"), ("b0", "kept", "2")):
            body = {"thread_id": "t", "checkpoint_id": cid, "checkpoint": {"type": "bytes", "data": "AA=="},
                    "metadata": {"run_id": run}, "channel_versions": {"ch": version},
                    "blobs": [{"channel": "ch", "version": version, "type": "json", "data": "MQ=="}]}
            r = await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/put", json=body)
            assert r.status_code == 200, r.text
        engine = gateway_state(gateway.app).databases.engine(Database.checkpoints)
        async with engine.execution_options(sqlite_begin="IMMEDIATE").begin() as conn:
            t = checkpoint_threads
            mine = select(t.c.pk).where(t.c.namespace == namespace, t.c.thread_id == "t").scalar_subquery()
            for table in (checkpoints, checkpoint_metadata_terms):
                template = (await conn.execute(
                    select(table).where(table.c.thread_pk == mine, table.c.checkpoint_id == "a0"))).mappings().all()
                if template:  # PostgreSQL keeps no terms
                    rows = [{**row, "checkpoint_id": f"a{i:05}"} for i in range(1, n + 1) for row in template]
                    await conn.execute(insert(table), rows)
        tracemalloc.start()
        try:
            r = await gw._transport.request("POST", f"/v1/{namespace}/checkpoints/runs/delete", json={"run_ids": ["long"]})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert r.status_code == 200 and r.json() == {"deleted": n + 1}, r.text[:500]
        assert peak < PEAK_BOUND, f"{peak / 2**20:.1f} MiB"
        async with engine.connect() as conn:
            left = (await conn.execute(select(checkpoints.c.checkpoint_id).where(checkpoints.c.thread_pk == mine))).all()
        assert [r[0] for r in left] == ["b0"]
        assert await gateway.rows(checkpoint_blobs, namespace, "t") == 1  # run "long"'s value went with it


PEAK_BOUND = 5 * 2**20  # new: 1.7 MiB (SQLite), 2.8 (PostgreSQL); old: 7.6, 10.4
