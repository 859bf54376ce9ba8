"""Deferred HNSW builds on PostgreSQL: a collection is created without its HNSW index, searched
exactly until it holds ``vectors.index_min_rows`` points and writes have been quiet for
``vectors.index_quiet_seconds``, and then indexed in the background (``CREATE INDEX
CONCURRENTLY``). Describe reports the state; SQLite collections say ``exact``.

Tests that stop and start gateway processes run on databases of their own, so that no other
process's builder or sweep takes part unasked.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import numpy as np
import pytest
from sqlalchemy.engine import make_url
from storage_gateway_client import GatewayClient

from app.vectors.pgvector import parse_version
from tests.conftest import (
    VECTOR_BACKENDS,
    Backend,
    Server,
    postgres_base_for,
    backend_env,
    create_postgres_databases,
    run_cli,
    start_server,
    stop_server,
)

pytestmark = pytest.mark.backends(*VECTOR_BACKENDS)

BUILT = "built the HNSW index of"
DROPPED_INVALID = "dropping the invalid index"


def clustered(n: int, dim: int, seed: int, centers: int = 50, latent: int = 12) -> np.ndarray:
    """Clusters in a low-dimensional latent space projected to ``dim``, as real embeddings are
    (points with ``dim`` independent dimensions of noise are all about equally far apart, and
    no ANN index finds their nearest neighbours reliably)."""
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centers, latent)) * 2.0
    points = c[rng.integers(0, centers, size=n)] + rng.normal(size=(n, latent))
    projection = rng.normal(size=(latent, dim)) / np.sqrt(latent)
    return (points @ projection + 0.05 * rng.normal(size=(n, dim))).astype(np.float32)


def cosine_top(data: np.ndarray, q: np.ndarray, k: int) -> tuple[list[int], np.ndarray]:
    d = data.astype(np.float64)
    dist = 1 - d @ q.astype(np.float64) / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))
    return np.argsort(dist)[:k].tolist(), dist


def recall(hits: list[dict], data: np.ndarray, q: np.ndarray, k: int) -> float:
    """Share of the true top k found (a result tied with the k-th counts as true)."""
    top, dist = cosine_top(data, q, k)
    kth = dist[top[-1]]
    return sum(1 for h in hits[:k] if dist[int(h["id"])] <= kth + 1e-6) / k


async def wait_for_state(gw: GatewayClient, collection: str, wanted: str, timeout: float = 120.0) -> dict:
    """Poll describe until the index state is ``wanted``; the last description."""
    deadline = time.monotonic() + timeout
    while True:
        info = await gw.vectors.describe_collection(collection)
        if info["index"]["state"] == wanted:
            return info
        assert time.monotonic() < deadline, f"{collection}: index state {info['index']['state']!r}, not {wanted!r}"
        await asyncio.sleep(0.05)


async def wait_until_indexed(gw: GatewayClient, server: Server, collection: str, timeout: float = 180.0) -> None:
    """On PostgreSQL, until the collection's HNSW index is ready; SQLite searches exactly."""
    await wait_for_state(gw, collection, "ready" if server.backend.is_postgres else "exact", timeout)


async def insert(gw: GatewayClient, collection: str, data: np.ndarray, start: int = 0, batch: int = 1000) -> None:
    for s in range(0, len(data), batch):
        chunk = data[s : s + batch]
        await gw.vectors.upsert_points(collection, chunk, ids=[str(start + s + i) for i in range(len(chunk))])


# --- direct looks at the vectors database ---------------------------------------------------------


async def pg_connect(backend: Backend) -> asyncpg.Connection:
    url = make_url(backend.urls["vectors"])
    return await asyncpg.connect(
        user=url.username, password=url.password or None, database=url.database,
        host=url.query.get("host") or url.host, port=url.port,
    )


async def table_of(conn: asyncpg.Connection, namespace: str, collection: str) -> str:
    cid = await conn.fetchval(
        "SELECT id FROM vector_collections WHERE namespace = $1 AND collection = $2", namespace, collection
    )
    assert cid is not None
    return f"vec_{cid}"


async def hnsw_index(conn: asyncpg.Connection, table: str) -> tuple[int, bool] | None:
    """(oid, valid) of the table's HNSW index, or None."""
    row = await conn.fetchrow(
        "SELECT i.indexrelid::int, i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)", f"{table}_hnsw"
    )
    return (row[0], row[1]) if row is not None else None


OPERATORS = {"cosine": "<=>", "l2": "<->", "ip": "<#>"}


async def pgvector_version(conn: asyncpg.Connection) -> tuple[int, ...]:
    """The pgvector version of the database ``conn`` is on, as the gateway parses it."""
    return parse_version(await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'"))


async def plan_uses_index(conn: asyncpg.Connection, table: str, dim: int, distance: str = "cosine") -> bool:
    """Whether PostgreSQL plans a nearest-neighbour query on ``table`` with its HNSW index.

    pgvector 0.8 costs an HNSW scan by the pages it expects to read, so PostgreSQL sorts a
    table of a few thousand rows instead; there the question is asked with sequential scans
    disabled (the index is still the only way to order by distance without a sort)."""
    q = "[" + ",".join(["0.5"] * dim) + "]"
    stmt = f"EXPLAIN SELECT id FROM {table} ORDER BY embedding {OPERATORS[distance]} '{q}'::vector LIMIT 10"
    async with conn.transaction():
        if await pgvector_version(conn) >= (0, 8):
            await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch(stmt))
    return f"{table}_hnsw" in plan


def log_lines(servers: list[Server], needle: str) -> list[str]:
    return [line for s in servers for line in s.log().splitlines() if needle in line]


def index_problems(server: Server) -> list[str]:
    """Warning and error lines about vector indexes in a server's (JSON) log."""
    out = []
    for line in server.log().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            record.get("level") in ("warning", "error", "critical")
            and ("index" in record.get("message", "") or record.get("logger") == "app.vectors")
        ):
            out.append(line)
    return out


# --- fixtures ---------------------------------------------------------------------------------------


def start_eager_builder(backend: Backend, log_path: Path, min_rows: int = 1200) -> Server:
    """A gateway on ``backend`` whose index builder acts at once: a build ``min_rows`` points in
    and 0.2 s after the last write, a sweep every second."""
    return start_server(
        backend, log_path, GATEWAY_VECTORS__INDEX_MIN_ROWS=str(min_rows),
        GATEWAY_VECTORS__INDEX_QUIET_SECONDS="0.2", GATEWAY_VECTORS__INDEX_SWEEP_SECONDS="1",
    )


@pytest.fixture(scope="module")
def own_backend(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """Migrated PostgreSQL databases no session-wide server uses (PostgreSQL only)."""
    assert backend.is_postgres, "mark the test postgres_only"
    urls = create_postgres_databases(postgres_base_for(backend), f"gwi_{uuid.uuid4().hex[:8]}")
    own = Backend(backend.name, backend_env(urls, tmp_path_factory.mktemp("data-index")), urls)
    result = run_cli(own, "migrate")
    assert result.returncode == 0, result.stderr
    yield own


@pytest.fixture
async def vdb(server: Server) -> AsyncIterator[asyncpg.Connection]:
    assert server.backend.is_postgres, "mark the test postgres_only"
    conn = await pg_connect(server.backend)
    try:
        yield conn
    finally:
        await conn.close()


# --- the state and the results around it ------------------------------------------------------------


async def test_index_is_built_once_the_collection_is_big_and_quiet(
    gw: GatewayClient, server: Server, namespace: str
) -> None:
    """Pending (and exact) below index_min_rows; ready after it, with the planner on the index;
    search results agree with numpy before and after."""
    dim, k = 32, 10
    data = clustered(1500, dim, seed=7)
    queries = clustered(10, dim, seed=8)
    created = await gw.vectors.setup_collection("c", dim)
    assert created["index"]["state"] == ("pending" if server.backend.is_postgres else "exact")
    assert (await gw.vectors.setup_collection("c", dim))["index"]["state"] == created["index"]["state"]
    await insert(gw, "c", data[:900])  # below index_min_rows (1000)

    async def check_exact(n: int) -> None:
        for q in queries:
            hits = await gw.vectors.search("c", q, k)
            top, dist = cosine_top(data[:n], q, k)
            assert [int(h["id"]) for h in hits] == top
            for h in hits:
                assert abs(h["score"] - (1 - dist[int(h["id"])])) < 1e-4

    await check_exact(900)
    if not server.backend.is_postgres:
        await insert(gw, "c", data[900:], start=900)
        await check_exact(1500)
        listed = await gw.vectors.list_collections()
        assert [c["index"]["state"] for c in listed["items"]] == ["exact"]
        assert (await gw.vectors.describe_collection("c"))["index"]["state"] == "exact"
        return
    conn = await pg_connect(server.backend)
    try:
        table = await table_of(conn, namespace, "c")
        # Quiet for longer than index_quiet_seconds, yet too small: no index.
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert (await gw.vectors.describe_collection("c"))["index"]["state"] == "pending"
            await asyncio.sleep(0.1)
        assert await hnsw_index(conn, table) is None
        assert not await plan_uses_index(conn, table, dim)
        await insert(gw, "c", data[900:], start=900)
        await check_exact(1500)  # pending or building: exact
        info = await wait_for_state(gw, "c", "ready")
        assert info["count"] == 1500 and info["index"]["ef_construction"] == 128
        found = await hnsw_index(conn, table)
        assert found is not None and found[1]
        assert await plan_uses_index(conn, table, dim)
        recalls = []
        for q in queries:
            hits = await gw.vectors.search("c", q, k)
            assert len(hits) == k
            recalls.append(recall(hits, data, q, k))
        assert np.mean(recalls) >= 0.95, recalls
        listed = await gw.vectors.list_collections()
        assert [c["index"]["state"] for c in listed["items"]] == ["ready"]
        assert log_lines([server], f"{BUILT} {namespace}/c ")
        # A reset empties the collection and drops the index with it (a reload is bulk-loaded).
        await gw.vectors.reset_collection("c")
        assert (await gw.vectors.describe_collection("c"))["index"]["state"] == "pending"
        assert await hnsw_index(conn, table) is None
        await insert(gw, "c", data)
        await wait_for_state(gw, "c", "ready")
    finally:
        await conn.close()


async def test_exact_collections_say_so(gw: GatewayClient, server: Server) -> None:
    info = await gw.vectors.setup_collection("e", 4, index={"kind": "exact"})
    assert info["index"]["kind"] == "exact" and info["index"]["state"] == "exact"
    await gw.vectors.upsert_points("e", [[1, 0, 0, 0]] * 3)
    assert (await gw.vectors.describe_collection("e"))["index"]["state"] == "exact"


@pytest.mark.postgres_only
async def test_drop_and_reset_do_not_wait_for_a_build(
    gw: GatewayClient, server: Server, namespace: str, vdb: asyncpg.Connection
) -> None:
    """A build of this size takes about 45 s here; reset and drop cancel it and return at once,
    the builder takes the cancellation as normal, and the name is usable again."""
    dim = 128
    heavy = {"m": 48, "ef_construction": 800}
    data = np.random.default_rng(3).normal(size=(20_000, dim)).astype(np.float32)
    await gw.vectors.setup_collection("big", dim, index=heavy)
    table = await table_of(vdb, namespace, "big")
    await insert(gw, "big", data)
    await wait_for_state(gw, "big", "building")
    t = time.monotonic()
    await gw.vectors.reset_collection("big")
    assert time.monotonic() - t < 5
    info = await gw.vectors.describe_collection("big")
    assert info["count"] == 0 and info["index"]["state"] == "pending"
    assert await hnsw_index(vdb, table) is None

    await insert(gw, "big", data)
    await wait_for_state(gw, "big", "building")
    t = time.monotonic()
    await gw.vectors.drop_collection("big")
    assert time.monotonic() - t < 5
    assert await vdb.fetchval("SELECT to_regclass($1)", table) is None
    deadline = time.monotonic() + 10
    while len(log_lines([server], f"index build of {namespace}/big cancelled")) < 2:
        assert time.monotonic() < deadline, "the builder did not report both cancelled builds"
        await asyncio.sleep(0.1)
    assert not index_problems(server)

    again = await gw.vectors.setup_collection("big", 8)
    assert again["vector_size"] == 8 and again["index"]["state"] == "pending"
    await gw.vectors.upsert_points("big", [[1, 0, 0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]], ids=["a", "b"])
    assert [h["id"] for h in await gw.vectors.search("big", [0.1, 1, 0, 0, 0, 0, 0, 0], 1)] == ["b"]


# --- several processes --------------------------------------------------------------------------------


@pytest.mark.postgres_only
async def test_an_interrupted_build_is_dropped_and_rebuilt(own_backend: Backend, tmp_path: Path) -> None:
    """Shutdown cancels a running build, which leaves an invalid index; the next process's
    start-up sweep drops it (nobody holds the build lock) and builds it again."""
    dim, n = 64, 10_000
    data = clustered(n, dim, seed=11)
    queries = clustered(5, dim, seed=12)
    ns = f"i{uuid.uuid4().hex[:10]}"
    first = start_server(own_backend, tmp_path / "first.log", GATEWAY_VECTORS__INDEX_QUIET_SECONDS="0.2")
    try:
        async with GatewayClient(first.url, ns, os.environ["GATEWAY_TEST_ADMIN_KEY"]) as gw:
            await gw.vectors.setup_collection("c", dim, index={"m": 32, "ef_construction": 400})
            await insert(gw, "c", data)
            await wait_for_state(gw, "c", "building")
    finally:
        assert stop_server(first) == 0
    assert not log_lines([first], BUILT)
    conn = await pg_connect(own_backend)
    try:
        table = await table_of(conn, ns, "c")
        stale = await hnsw_index(conn, table)
        assert stale is not None and stale[1] is False, "shutdown did not interrupt the build"
        assert not await plan_uses_index(conn, table, dim)
        second = start_server(own_backend, tmp_path / "second.log")
        try:
            async with GatewayClient(second.url, ns, os.environ["GATEWAY_TEST_ADMIN_KEY"]) as gw:
                # Invalid and nobody building it yet: pending until the sweep redoes it.
                assert (await gw.vectors.describe_collection("c"))["index"]["state"] in ("pending", "building", "ready")
                for q in queries:  # an invalid index is never used: exact meanwhile
                    top, _ = cosine_top(data, q, 10)
                    assert [int(h["id"]) for h in await gw.vectors.search("c", q, 10)] == top
                await wait_for_state(gw, "c", "ready")
                recalls = [recall(await gw.vectors.search("c", q, 10), data, q, 10) for q in queries]
                assert np.mean(recalls) >= 0.9, recalls
        finally:
            stop_server(second)
        rebuilt = await hnsw_index(conn, table)
        assert rebuilt is not None and rebuilt[1] and rebuilt[0] != stale[0]
        assert await plan_uses_index(conn, table, dim)
        assert len(log_lines([second], DROPPED_INVALID)) == 1
        assert len(log_lines([second], f"{BUILT} {ns}/c ")) == 1
        assert not index_problems(second)
    finally:
        await conn.close()


@pytest.mark.postgres_only
async def test_two_processes_build_once(own_backend: Backend, tmp_path: Path) -> None:
    """Writes through two processes schedule a check in each at the same moment; the advisory
    lock lets one build (about 4 s here) while the other leaves it alone."""
    dim, n = 64, 6000
    data = clustered(n, dim, seed=21)
    ns = f"t{uuid.uuid4().hex[:10]}"
    quiet = {"GATEWAY_VECTORS__INDEX_QUIET_SECONDS": "0.2"}
    a = start_server(own_backend, tmp_path / "a.log", **quiet)
    b = start_server(own_backend, tmp_path / "b.log", **quiet)
    key = os.environ["GATEWAY_TEST_ADMIN_KEY"]
    try:
        async with GatewayClient(a.url, ns, key) as ga, GatewayClient(b.url, ns, key) as gb:
            await ga.vectors.setup_collection("c", dim, index={"m": 32, "ef_construction": 400})
            half = n // 2
            await insert(ga, "c", data[: half - 500])
            await insert(gb, "c", data[half - 500 : n - 500], start=half - 500)
            # The last writes of each process land together: both checks come due together.
            await asyncio.gather(
                ga.vectors.upsert_points("c", data[n - 500 : n - 250], ids=[str(i) for i in range(n - 500, n - 250)]),
                gb.vectors.upsert_points("c", data[n - 250 :], ids=[str(i) for i in range(n - 250, n)]),
            )
            await wait_for_state(ga, "c", "ready")
            # Both checks came due 0.2 s after the last writes, long before the build ended.
            assert (await gb.vectors.describe_collection("c"))["count"] == n
    finally:
        stop_server(a)
        stop_server(b)
    assert len(log_lines([a, b], f"{BUILT} {ns}/c ")) == 1
    assert not log_lines([a, b], DROPPED_INVALID)
    assert not index_problems(a) and not index_problems(b)


@pytest.mark.postgres_only
async def test_a_collection_written_to_without_pause_is_indexed_by_the_sweep(
    own_backend: Backend, tmp_path: Path
) -> None:
    """The quiet period never comes while writes keep arriving; the periodic sweep builds the
    index anyway after MAX_BUSY_SWEEPS sweeps, so a busy collection is not left to exact scans
    for ever."""
    dim = 16
    data = clustered(3000, dim, seed=31)
    ns = f"w{uuid.uuid4().hex[:10]}"
    server = start_server(
        own_backend, tmp_path / "busy.log",
        GATEWAY_VECTORS__INDEX_QUIET_SECONDS="1.0", GATEWAY_VECTORS__INDEX_SWEEP_SECONDS="2",
    )
    try:
        async with GatewayClient(server.url, ns, os.environ["GATEWAY_TEST_ADMIN_KEY"]) as gw:
            await gw.vectors.setup_collection("c", dim)
            await insert(gw, "c", data[:2000])
            deadline = time.monotonic() + 60
            i = 2000
            while (await gw.vectors.describe_collection("c"))["index"]["state"] != "ready":
                assert time.monotonic() < deadline, "never indexed while written to"
                # A write every 0.1 s: never 1 s of quiet.
                await gw.vectors.upsert_points("c", data[i : i + 1], ids=[str(i)])
                i = i + 1 if i + 1 < len(data) else 2000
                await asyncio.sleep(0.1)
            assert len(log_lines([server], f"{BUILT} {ns}/c ")) == 1
    finally:
        stop_server(server)


@pytest.mark.postgres_only
async def test_a_bulk_load_through_another_process_is_not_indexed_half_way(
    own_backend: Backend, tmp_path: Path
) -> None:
    """Process B loads a collection for about eight seconds while process A, which receives no
    writes, sweeps every 3 s. A must see from PostgreSQL's counters that the collection is still
    being written to and leave it alone: an index built half way would take the rest of the load
    row by row into the graph. Once the load stops, it is built once.

    The batches are 0.3 s apart; B's quiet time (2.5 s) and A's sweep are wide of that, so that a
    batch slowed by a loaded machine (a 1 s quiet time flaked under a parallel build) is not a
    pause in the load."""
    dim = 16
    data = clustered(5000, dim, seed=41)
    ns = f"b{uuid.uuid4().hex[:10]}"
    key = os.environ["GATEWAY_TEST_ADMIN_KEY"]
    a = start_server(own_backend, tmp_path / "sweeper.log", GATEWAY_VECTORS__INDEX_SWEEP_SECONDS="3")
    b = start_server(own_backend, tmp_path / "loader.log", GATEWAY_VECTORS__INDEX_QUIET_SECONDS="2.5")
    try:
        async with GatewayClient(a.url, ns, key) as ga, GatewayClient(b.url, ns, key) as gb:
            await gb.vectors.setup_collection("c", dim)
            states = set()
            for start in range(0, len(data), 200):  # 25 batches, 0.3 s apart
                await gb.vectors.upsert_points(
                    "c", data[start : start + 200], ids=[str(i) for i in range(start, start + 200)]
                )
                states.add((await ga.vectors.describe_collection("c"))["index"]["state"])
                await asyncio.sleep(0.3)
            assert states == {"pending"}, f"indexed during the load: {states}"
            await wait_for_state(ga, "c", "ready", timeout=60)
    finally:
        stop_server(a)
        stop_server(b)
    assert len(log_lines([a, b], f"{BUILT} {ns}/c ")) == 1
    assert not index_problems(a) and not index_problems(b)


async def test_writes_during_a_build_do_not_pile_up_in_the_schedule() -> None:
    """Each write postpones its collection's check; the schedule keeps one entry for it
    however many writes arrive while the builder is busy (it used to keep one per write)."""
    from app.vectors.settings import VectorsSettings
    from app.vectors.backend import CollectionInfo
    from app.vectors.builder import IndexBuilder

    builder = IndexBuilder(engine=None, settings=VectorsSettings())  # type: ignore[arg-type]
    coll = CollectionInfo(7, "ns", "c", 8, "cosine", {"kind": "hnsw"}, None, None)  # type: ignore[arg-type]
    for _ in range(20_000):
        await builder.notice(coll)
    assert len(builder._heap) == 1 and list(builder._due) == [7]
    # The entry comes up before the latest due time and is pushed back, not run.
    when, _ = builder._heap[0]
    assert builder._due[7] >= when
