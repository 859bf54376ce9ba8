"""The service skeleton: health, readiness, problem+json everywhere, settings, start-up failures."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from app.core.config import Database, Settings
from tests.conftest import Backend, free_port, in_process_settings, run_cli, start_server, stop_server


async def test_healthz(http: httpx.AsyncClient) -> None:
    r = await http.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


async def test_readyz_reports_every_database(http: httpx.AsyncClient, backend: Backend) -> None:
    r = await http.get("/readyz")
    assert r.status_code == 200
    body = r.json()
    assert body["ready"] is True
    assert set(body["databases"]) == {"metadata", "vectors", "checkpoints"}
    expected = "postgresql" if backend.is_postgres else "sqlite"
    for status in body["databases"].values():
        assert status["reachable"] and status["migrated"]
        assert status["backend"] == expected
        assert status["revision"] == status["head"]


async def test_probes_that_arrive_together_share_one_readiness_check(
    backend: Backend, server: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/readyz`` needs no key, and a check is a statement on each database (and a request to
    the bucket): 50 probes at once were 150 statements. Probes that arrive while a check runs
    share its answer; one that arrives after it gets a check of its own (never a stale answer)."""
    import asyncio

    from app.core.ops import health
    from app.main import create_app

    real = health.current_revision
    calls = 0

    async def slow_revision(*args: object) -> str | None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.3)
        return await real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(health, "current_revision", slow_revision)
    app = create_app(in_process_settings(backend, tmp_path))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            answers = await asyncio.gather(*(client.get("/readyz") for _ in range(50)))
            assert {r.status_code for r in answers} == {200} and calls == 3  # one check: one statement a database
            assert (await client.get("/readyz")).json()["ready"] is True and calls == 6  # a new one


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/no/such/route", 404, "not_found"),
        ("POST", "/healthz", 405, "method_not_allowed"),
        ("DELETE", "/readyz", 405, "method_not_allowed"),
    ],
)
async def test_unknown_routes_and_methods_are_problems(
    http: httpx.AsyncClient, method: str, path: str, status: int, code: str
) -> None:
    r = await http.request(method, path)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == status and body["code"] == code and body["title"]


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/bad%20ns/kv/c/k", "namespace"),
        ("/v1/-leading-dash/kv/c/k", "namespace"),
        ("/v1/ns/kv/" + "c" * 129 + "/k", "collection"),
        ("/v1/ns/kv/c%24/k", "collection"),
    ],
)
async def test_invalid_names_are_422_naming_the_field(http: httpx.AsyncClient, path: str, field: str) -> None:
    r = await http.get(path)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["code"] == "invalid_input"
    assert field in body["detail"]
    assert any(field in e["loc"] for e in body["errors"])


async def test_openapi_and_docs_are_served(http: httpx.AsyncClient) -> None:
    spec = (await http.get("/openapi.json")).json()
    assert spec["info"]["title"] == "storage-gateway"
    assert "/readyz" in spec["paths"]
    docs = await http.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


# --- settings -----------------------------------------------------------------------------

SEED_BLOCK = """\
persistence:
  vector_store_backend: pgvector        # or sqlite_vec
  postgres_base_dsn: postgresql://user:pass@host:5432
  postgres_databases: {metadata: soothe_metadata, vectors: soothe_vectors, checkpoints: soothe_checkpoints}
  vector_sqlite_path: ~/.soothe/vectors.db
  metadata_sqlite_path: ~/.soothe/metadata.db
"""


def _settings_from(tmp_path: Path, yaml_text: str, monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for key in list(os.environ):
        if key.startswith("GATEWAY_"):
            monkeypatch.delenv(key)
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml_text)
    monkeypatch.setenv("GATEWAY_CONFIG", str(config))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings()


def test_seed_persistence_block_is_accepted_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings_from(tmp_path, SEED_BLOCK, monkeypatch)
    assert s.database_url(Database.metadata) == "postgresql+asyncpg://user:pass@host:5432/soothe_metadata"
    assert s.database_url(Database.vectors) == "postgresql+asyncpg://user:pass@host:5432/soothe_vectors"
    assert s.database_url(Database.checkpoints) == "postgresql+asyncpg://user:pass@host:5432/soothe_checkpoints"


def test_sqlite_vec_backend_uses_the_vector_sqlite_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings_from(tmp_path, SEED_BLOCK.replace("pgvector ", "sqlite_vec"), monkeypatch)
    assert s.database_url(Database.vectors) == f"sqlite+aiosqlite:///{Path('~/.soothe/vectors.db').expanduser()}"
    assert s.database_url(Database.metadata).startswith("postgresql+asyncpg://")


def test_env_overrides_yaml_and_full_urls_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings_from(
        tmp_path, SEED_BLOCK, monkeypatch,
        GATEWAY_PERSISTENCE__POSTGRES_BASE_DSN="postgresql://other:5433",
        GATEWAY_DATABASES__CHECKPOINTS__URL="postgres://ck-host/ck",
    )
    assert s.database_url(Database.metadata) == "postgresql+asyncpg://other:5433/soothe_metadata"
    assert s.database_url(Database.checkpoints) == "postgresql+asyncpg://ck-host/ck"


def test_defaults_are_sqlite_files_under_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings_from(tmp_path, "{}", monkeypatch, GATEWAY_DATA_DIR=str(tmp_path / "d"))
    for db in Database:
        assert s.database_url(db) == f"sqlite+aiosqlite:///{tmp_path / 'd' / (db.value + '.db')}"
        assert s.migrates_at_startup(db)
    assert (s.host, s.port) == ("127.0.0.1", 8000)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"GATEWAY_PERSISTENCE__VECTOR_STORE_BACKEND": "weaviate"}, "vector_store_backend"),
        ({"GATEWAY_LIMITS__MAX_PAGE_SIZE": "lots"}, "limits.max_page_size"),
        ({"GATEWAY_AUTH__MODE": "disabled", "GATEWAY_HOST": "0.0.0.0"}, "auth.mode"),
        ({"GATEWAY_DATABASES__METADATA__URL": "mysql://x/y"}, "databases.metadata.url"),
        ({"GATEWAY_DATABASES__VECTORS__POOL_SIZE": "0"}, "databases.vectors.pool_size"),
        ({"GATEWAY_VECTORS__HNSW_M": "100"}, "vectors.hnsw_ef_construction"),  # pgvector builds none
        # S3 takes 10,000 parts; the parts column is 32-bit (and two parts are buffered an upload)
        ({"GATEWAY_FILES__BACKEND": "s3", "GATEWAY_FILES__S3__BUCKET": "b", "GATEWAY_LIMITS__MAX_FILE_BYTES": str(10**12)},
         "limits.max_file_bytes"),
        ({"GATEWAY_FILES__S3__PART_BYTES": str(2**31)}, "files.s3.part_bytes"),
    ],
)
def test_bad_settings_stop_startup_with_one_line(tmp_path: Path, env: dict[str, str], needle: str) -> None:
    backend = Backend("sqlite", {"GATEWAY_DATA_DIR": str(tmp_path)})
    result = run_cli(backend, "serve", "--port", str(free_port()), timeout=60, **env)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert needle in lines[0] and "Traceback" not in result.stderr


def test_unwritable_data_dir_stops_startup_with_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    backend = Backend("sqlite", {"GATEWAY_DATA_DIR": str(blocker / "data")})
    result = run_cli(backend, "serve", "--port", str(free_port()), timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "metadata database" in lines[0] and str(blocker) in lines[0]


def test_unreachable_postgres_stops_startup_with_one_line(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    backend = Backend("postgres", {
        "GATEWAY_DATA_DIR": str(tmp_path),
        "GATEWAY_PERSISTENCE__POSTGRES_BASE_DSN": f"postgresql://u:p@127.0.0.1:{port}",
        "GATEWAY_DATABASES__METADATA__CONNECT_TIMEOUT": "2",
    })
    result = run_cli(backend, "serve", "--port", str(free_port()), timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "metadata database" in lines[0] and f"127.0.0.1:{port}" in lines[0]
    assert "p@" not in lines[0], "the password must not be printed"


def test_serve_with_yaml_config_flag(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(f"data_dir: {tmp_path / 'yaml-data'}\n")
    backend = Backend("sqlite", {})
    server = start_server(backend, tmp_path / "log", "--config", str(config))
    try:
        assert httpx.get(f"{server.url}/readyz").status_code == 200
        assert (tmp_path / "yaml-data" / "metadata.db").exists()
    finally:
        assert stop_server(server) == 0


def test_sqlite_without_extension_loading_is_handled(tmp_path: Path) -> None:
    """Pythons differ: the gateway uses the interpreter's sqlite3 when it can load sqlite-vec,
    otherwise a drop-in build (sqlean-py); with neither it stops with one line saying so."""
    import subprocess
    import sys

    from app.core.db.sqlite import SQLITE

    probe = subprocess.run(
        [sys.executable, "-c", "import sqlite3; c = sqlite3.connect(':memory:'); c.enable_load_extension(True)"],
        capture_output=True, text=True,
    )
    stdlib_loads = probe.returncode == 0
    assert (SQLITE.__name__ == "sqlite3") == stdlib_loads  # the drop-in only when needed
    # Hide the drop-in builds: what a Python with a limited sqlite3 and no sqlean looks like.
    script = (
        "import sys; sys.modules['sqlean'] = None; sys.modules['pysqlite3'] = None; "
        "from app.cli import main; main(sys.argv[1:])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["GATEWAY_DATA_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", script, "migrate"], env=env, capture_output=True, text=True, timeout=120
    )
    if stdlib_loads:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 2
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, result.stderr
        assert "vectors database" in lines[0] and "sqlean-py" in lines[0]
