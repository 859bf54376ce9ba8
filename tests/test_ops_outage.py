"""A PostgreSQL outage under load: fast 503s with Retry-After, /readyz 503, recovery on its own.

The test runs its own throwaway PostgreSQL (pgserver's bundled binaries), so stopping it hurts no
other test. The gateway is never restarted: it must notice the database is back by itself, and
every write it acknowledged before, during and after the outage must be there at the end.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_KEY, Backend, Server, backend_env, create_postgres_databases, run_cli, start_server, stop_server

# Short timeouts so that the outage is answered quickly; the bound below is derived from them.
CONNECT_TIMEOUT = 2.0
POOL_TIMEOUT = 2.0
ANSWER_BOUND = CONNECT_TIMEOUT + POOL_TIMEOUT + 3.0  # + slack for a loaded 2-core machine


class Postgres:
    """A throwaway PostgreSQL that can be stopped (immediately, like a crash) and started again."""

    def __init__(self, pgdata: Path) -> None:
        import pgserver

        self.pgdata = pgdata
        self.server = pgserver.get_server(pgdata, cleanup_mode="stop")

    def uri(self) -> str:
        return self.server.get_uri()

    def stop(self) -> None:
        from pgserver._commands import pg_ctl

        pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=self.pgdata, user=self.server.system_user, timeout=30)

    def start(self) -> None:
        self.server.ensure_postgres_running()

    def cleanup(self) -> None:
        self.server.cleanup()


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[Postgres]:
    pgdata = Path(tempfile.mkdtemp(prefix="gw-outage-pg-"))
    pg = Postgres(pgdata)
    try:
        yield pg
    finally:
        try:
            pg.start()  # cleanup expects a running server if a test failed mid-outage
        except Exception:
            pass
        pg.cleanup()
        shutil.rmtree(pgdata, ignore_errors=True)


@pytest.fixture
def outage_gateway(own_postgres: Postgres, tmp_path: Path) -> Iterator[Server]:
    """A gateway on the throwaway PostgreSQL, with short connect and pool timeouts."""
    urls = create_postgres_databases(own_postgres.uri(), f"gwo_{uuid.uuid4().hex[:8]}")
    backend = Backend("postgres", backend_env(urls, tmp_path), urls)
    timeouts = {}
    for db in ("METADATA", "VECTORS", "CHECKPOINTS"):
        timeouts[f"GATEWAY_DATABASES__{db}__CONNECT_TIMEOUT"] = str(CONNECT_TIMEOUT)
        timeouts[f"GATEWAY_DATABASES__{db}__POOL_TIMEOUT"] = str(POOL_TIMEOUT)
    result = run_cli(backend, "migrate")
    assert result.returncode == 0, result.stderr
    server = start_server(backend, tmp_path / "gateway.log", **timeouts)
    yield server
    if server.process.poll() is None:
        stop_server(server)


@pytest.mark.parametrize("db_backend", ["postgres"])
async def test_postgres_outage_is_503_then_recovers_without_losing_acknowledged_writes(
    own_postgres: Postgres, outage_gateway: Server, db_backend: str
) -> None:
    server = outage_gateway
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    ns = f"outage{uuid.uuid4().hex[:8]}"
    acknowledged: dict[str, int] = {}
    outcomes: list[tuple[str, int, float, dict]] = []  # (phase, status, seconds, problem)
    phase = "before"
    stop = asyncio.Event()

    async def writer(client: httpx.AsyncClient, w: int) -> None:
        i = 0
        while not stop.is_set():
            key, i = f"w{w}-{i}", i + 1
            started = time.monotonic()
            at = phase
            try:
                r = await client.put(f"/v1/{ns}/kv/acks/{key}", json={"w": w, "i": i})
            except httpx.TransportError as exc:  # the gateway itself must never drop a connection
                at = at if at == phase else "transition"
                outcomes.append((at, -1, time.monotonic() - started, {"error": repr(exc)}))
                continue
            took = time.monotonic() - started
            at = at if at == phase else "transition"  # answered in another phase than it was sent
            if r.status_code in (200, 201, 204):
                acknowledged[key] = i
                outcomes.append((at, r.status_code, took, {}))
            else:
                problem = r.json() if r.headers.get("content-type") == "application/problem+json" else {}
                problem["retry_after"] = r.headers.get("retry-after")
                outcomes.append((at, r.status_code, took, problem))
                await asyncio.sleep(0.05)

    try:
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client:
            writers = [asyncio.create_task(writer(client, w)) for w in range(6)]
            deadline = time.monotonic() + 10
            while len(acknowledged) < 20:
                assert time.monotonic() < deadline, f"no writes before the outage: {outcomes[:5]}"
                await asyncio.sleep(0.1)

            phase = "outage"
            await asyncio.to_thread(own_postgres.stop)
            await asyncio.sleep(2.5)
            started = time.monotonic()
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert time.monotonic() - started < ANSWER_BOUND
            assert ready.headers.get("retry-after")
            assert ready.json()["ready"] is False
            # What does not need the database keeps working.
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/metrics")).status_code == 200

            phase = "restarting"
            await asyncio.to_thread(own_postgres.start)
            deadline = time.monotonic() + 30
            while (await client.get("/readyz")).status_code != 200:
                assert time.monotonic() < deadline, "the gateway did not recover by itself"
                await asyncio.sleep(0.2)
            phase = "after"
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.gather(*writers)

            # Every write that was acknowledged is there, with the value that was acknowledged.
            missing = []
            for key, i in acknowledged.items():
                r = await client.get(f"/v1/{ns}/kv/acks/{key}")
                if r.status_code != 200 or r.json()["i"] != i:
                    missing.append((key, r.status_code))
            assert not missing, f"acknowledged writes lost: {missing[:10]}"
    finally:
        stop.set()
        code = stop_server(server)
    log = server.log()

    phases = ("before", "outage", "transition", "restarting", "after")
    by_phase = {p: [o for o in outcomes if o[0] == p] for p in phases}
    assert all(o[1] in (200, 201, 204) for o in by_phase["before"]), by_phase["before"][:5]
    outage = by_phase["outage"] + by_phase["transition"] + by_phase["restarting"]
    assert any(o[1] == 503 for o in outage), "no 503 while the database was down"
    for _, status, took, problem in outage:
        assert status in (200, 201, 204, 503), (status, problem)  # never a 500, never a dropped connection
        assert took < ANSWER_BOUND, f"an answer took {took:.1f}s during the outage"
        if status == 503:
            assert problem["code"] == "database_unavailable" and problem["retry_after"], problem
    assert any(o[1] in (200, 201, 204) for o in by_phase["after"]), "writes did not succeed after recovery"
    assert all(o[1] in (200, 201, 204) for o in by_phase["after"]), by_phase["after"][:5]
    assert code == 0, log[-3000:]
    assert '"status": 500' not in log and '"level": "error"' not in log, log[-5000:]
    assert '"message": "database unavailable: ' in log


HUNG_READS = {  # capability -> (database, set-up requests, the read that meets the hung database)
    "kv": ("metadata", [("PUT", "/v1/hung/kv/c/k", {"v": 1})], ("GET", "/v1/hung/kv/c/k", None)),
    "vectors": (
        "vectors",
        [("PUT", "/v1/hung/vectors/v", {"vector_size": 2, "distance": "cosine"}),
         ("POST", "/v1/hung/vectors/v/points", {"points": [{"id": "p", "vector": [1, 0]}]})],
        ("POST", "/v1/hung/vectors/v/search", {"vector": [1, 0], "limit": 1}),
    ),
}


@pytest.mark.parametrize("db_backend", ["postgres"])
@pytest.mark.parametrize("capability", sorted(HUNG_READS))
def test_a_hung_database_is_503_within_the_statement_timeout_then_recovers(
    own_postgres: Postgres, tmp_path: Path, db_backend: str, capability: str
) -> None:
    """A network that silently drops packets (here: the gateway's PostgreSQL backends stopped
    with SIGSTOP) is bounded by the statement timeout and answered 503, never 500; the stalled
    connections are not used again once the database answers. kv reads run on the driver
    path of app.core.fast.fixed_statements, vector searches on pgvector's."""
    import os
    import signal

    import asyncpg

    urls = create_postgres_databases(own_postgres.uri(), f"gwh_{uuid.uuid4().hex[:8]}")
    backend = Backend("postgres", backend_env(urls, tmp_path), urls)
    assert run_cli(backend, "migrate").returncode == 0
    database, setup, (method, path, body) = HUNG_READS[capability]
    server = start_server(backend, tmp_path / "gateway.log", **{f"GATEWAY_DATABASES__{database.upper()}__STATEMENT_TIMEOUT": "1"})
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    db_name = urls[database].rsplit("/", 1)[-1].split("?")[0]
    stopped: list[int] = []

    async def exercise() -> None:
        nonlocal stopped
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client:
                for m, p, b in setup:
                    assert (await client.request(m, p, json=b)).status_code < 300
                answers = await asyncio.gather(*(client.request(method, path, json=body) for _ in range(8)))  # several pooled
                assert all(a.status_code == 200 for a in answers)
                admin = await asyncpg.connect(own_postgres.uri().replace("postgresql+asyncpg://", "postgresql://"))
                try:
                    stopped = [r["pid"] for r in await admin.fetch(
                        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = 'storage-gateway'",
                        db_name,
                    )]
                finally:
                    await admin.close()
                assert stopped
                for pid in stopped:
                    os.kill(pid, signal.SIGSTOP)
                started = time.monotonic()
                r = await client.request(method, path, json=body)
                took = time.monotonic() - started
                assert r.status_code == 503, r.text
                assert r.json()["code"] == "database_unavailable" and r.headers.get("retry-after")
                assert took < 1 + POOL_TIMEOUT + 3, took
                for pid in stopped:
                    os.kill(pid, signal.SIGCONT)
                stopped = []
                deadline = time.monotonic() + 20
                while (r := await client.request(method, path, json=body)).status_code != 200:
                    assert r.status_code == 503, r.text
                    assert time.monotonic() < deadline, "the gateway did not recover"
                    await asyncio.sleep(0.2)
                assert r.json() == {"v": 1} if capability == "kv" else r.json()["results"][0]["id"] == "p"

    try:
        asyncio.run(exercise())
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        stop_server(server)
    assert '"status": 500' not in server.log(), server.log()[-3000:]
