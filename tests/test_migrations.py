"""Migrations: up, down, up again on both backends; models and migrations agree; readiness."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

import app.models  # noqa: F401
from app.core.config import Database, Settings
from app.core.db.databases import Databases
from app.core.db.migrations import current_revision, head_revision, include_object, upgrade
from app.core.db.tables import METADATA
from tests.conftest import ROOT, Backend, gateway_env, start_server, stop_server


def alembic(backend: Backend, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "alembic", *args], cwd=ROOT, env=gateway_env(backend),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result


def settings_for(backend: Backend) -> Settings:
    return Settings(
        databases={db: {"url": url} for db, url in backend.urls.items()},
        data_dir=Path(backend.env["GATEWAY_DATA_DIR"]),
    )


async def revisions(backend: Backend) -> dict[str, str | None]:
    dbs = Databases.open(settings_for(backend))
    try:
        return {db.value: await current_revision(dbs, db) for db in Database}
    finally:
        await dbs.close()


async def schema_differences(backend: Backend) -> dict[str, list]:
    dbs = Databases.open(settings_for(backend))

    def diff(conn, db: Database) -> list:  # noqa: ANN001
        ctx = MigrationContext.configure(conn, opts={"include_object": include_object, "compare_type": True})
        return compare_metadata(ctx, METADATA[db])

    try:
        out = {}
        for db in Database:
            async with dbs.engine(db).connect() as conn:
                out[db.value] = await conn.run_sync(diff, db)
        return out
    finally:
        await dbs.close()


def test_upgrade_downgrade_upgrade(fresh_backend: Backend) -> None:
    head = head_revision()
    alembic(fresh_backend, "upgrade", "head")
    assert asyncio.run(revisions(fresh_backend)) == {db.value: head for db in Database}
    alembic(fresh_backend, "downgrade", "base")
    assert asyncio.run(revisions(fresh_backend)) == {db.value: None for db in Database}
    alembic(fresh_backend, "upgrade", "head")
    assert asyncio.run(revisions(fresh_backend)) == {db.value: head for db in Database}


def test_one_database_migrates_independently(fresh_backend: Backend) -> None:
    head = head_revision()
    alembic(fresh_backend, "upgrade", "head")
    alembic(fresh_backend, "-x", "db=vectors", "downgrade", "base")
    assert asyncio.run(revisions(fresh_backend)) == {"metadata": head, "vectors": None, "checkpoints": head}
    alembic(fresh_backend, "-x", "db=vectors", "upgrade", "head")
    assert asyncio.run(revisions(fresh_backend))["vectors"] == head


def test_models_and_migrations_agree(fresh_backend: Backend) -> None:
    alembic(fresh_backend, "upgrade", "head")
    assert asyncio.run(schema_differences(fresh_backend)) == {db.value: [] for db in Database}


def test_readyz_is_503_until_operators_migrate_postgres(fresh_backend: Backend, tmp_path: Path) -> None:
    """With PostgreSQL nothing migrates itself: /readyz says which database is behind."""
    if not fresh_backend.is_postgres:
        # The embedded default migrates itself at start-up instead.
        server = start_server(fresh_backend, tmp_path / "log")
        try:
            assert httpx.get(f"{server.url}/readyz").json()["ready"] is True
        finally:
            stop_server(server)
        return
    server = start_server_unready(fresh_backend, tmp_path / "log")
    try:
        r = httpx.get(f"{server.url}/readyz")
        assert r.status_code == 503
        assert all(not s["migrated"] and s["reachable"] for s in r.json()["databases"].values())
        alembic(fresh_backend, "upgrade", "head")
        r = httpx.get(f"{server.url}/readyz")
        assert r.status_code == 200 and r.json()["ready"] is True
    finally:
        stop_server(server)


def start_server_unready(backend: Backend, log_path: Path):  # noqa: ANN201
    """Start a server and wait for /healthz only (its databases are not migrated yet)."""
    import time

    from tests.conftest import BIN, Server, free_port

    port = free_port()
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [str(BIN / "storage-gateway"), "serve", "--port", str(port)],
        env=gateway_env(backend), stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return Server(backend, url, process, log_path)
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(log_path.read_text())


def test_text_collections_are_indexed_again_by_0009(fresh_backend: Backend, tmp_path: Path) -> None:
    """A collection with a text field made before 0009 (its layout as 0009's downgrade leaves
    it: ``tsv`` on PostgreSQL, a porter FTS5 table on SQLite) is indexed again with the
    gateway's terms, and ranks as one made after it; its statistics go on from there."""
    import sqlalchemy as sa
    from app.main import create_app
    from tests.conftest import in_process_settings
    from tests.test_vectors_bm25 import reference

    texts = {f"p{i}": f"note {i} about {'zeppelins' if i % 4 == 0 else 'the garden'}" for i in range(12)}
    texts["l"] = "zeppelin zeppelin"

    async def gateway(points: dict[str, str]) -> tuple[dict, dict]:
        app = create_app(in_process_settings(fresh_backend, tmp_path))
        async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw"
        ) as http:
            path = "/v1/ns/vectors/t"
            assert (await http.put(path, json={"vector_size": 2, "text_field": "text"})).status_code in (200, 201)
            if points:
                body = {"ids": list(points), "vectors": [[1, i] for i in range(len(points))],
                        "payloads": [{"text": t if p != "l" else t.split()} for p, t in points.items()]}
                assert (await http.post(f"{path}/points", json=body)).status_code == 200
            r = await http.post(f"{path}/search", json={"vector": [1, 0], "query": "zeppelin garden", "limit": 20,
                                                         "fusion": "weighted", "alpha": 0, "explain": True})
            return {h["id"]: h["debug"]["text"]["score"] for h in r.json()["results"]}, (await http.get(path)).json()

    async def columns() -> str:
        dbs = Databases.open(settings_for(fresh_backend))
        try:
            async with dbs.engine(Database.vectors).connect() as conn:
                if fresh_backend.is_postgres:
                    found = await conn.execute(sa.text("SELECT string_agg(column_name, ',' ORDER BY column_name) FROM "
                                                       "information_schema.columns WHERE table_name = 'vec_1'"))
                else:
                    found = await conn.execute(sa.text("SELECT sql FROM sqlite_master WHERE name = 'fts_1'"))
                return str(found.scalar())
        finally:
            await dbs.close()

    alembic(fresh_backend, "upgrade", "head")
    before, _ = asyncio.run(gateway(texts))
    alembic(fresh_backend, "-x", "db=vectors", "downgrade", "0008")
    assert "tsv" in asyncio.run(columns()) if fresh_backend.is_postgres else "porter" in asyncio.run(columns())
    alembic(fresh_backend, "-x", "db=vectors", "upgrade", "head")
    after, described = asyncio.run(gateway({}))
    assert described["text_language"] == "english" and described["count"] == len(texts)
    assert after == pytest.approx(before) and {p for p, s in after.items() if s > 0} == {p for p, s in reference(texts, "zeppelin garden").items() if s > 0}
    more, _ = asyncio.run(gateway({"z": "zeppelin"}))
    expected = reference({**texts, "z": "zeppelin"}, "zeppelin garden")
    assert {p: s for p, s in more.items() if s > 0} == pytest.approx({p: s for p, s in expected.items() if s > 0})


# What a new capability's table looks like to autogenerate, registered only in the subprocess.
PROBE = """
import sys
import sqlalchemy as sa
from alembic.config import main
from app.core.config import Database
from app.core.db.tables import METADATA

sa.Table(
    "autogen_probe", METADATA[Database.checkpoints],
    sa.Column("namespace", sa.String(128), primary_key=True),
    sa.Column("n", sa.BigInteger(), nullable=False),
)
main(argv=sys.argv[1:], prog="alembic")
"""


def test_autogenerate_writes_a_new_table_into_its_database(fresh_backend: Backend, tmp_path: Path) -> None:
    """``alembic revision --autogenerate -x db=checkpoints`` writes the table a capability added
    into ``upgrade_checkpoints()`` / ``downgrade_checkpoints()`` of the new revision, and nothing
    into the other databases' functions; the revision then runs both ways."""
    asyncio.run(upgrade_one(fresh_backend, Database.checkpoints))
    versions = tmp_path / "versions"
    versions.mkdir()
    ini = tmp_path / "alembic.ini"  # the repository's, with the new revision kept out of the tree
    ini.write_text((ROOT / "alembic.ini").read_text().replace(
        "script_location = %(here)s/migrations",
        f"script_location = {ROOT / 'migrations'}\nversion_locations = {ROOT / 'migrations' / 'versions'} {versions}",
    ).replace("path_separator = os", "path_separator = space"))
    args = ["-c", str(ini), "-x", "db=checkpoints", "revision", "--autogenerate", "-m", "probe",
            "--rev-id", "probe", "--version-path", str(versions)]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=ROOT, env=gateway_env(fresh_backend),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    [written] = versions.glob("probe_*.py")
    source = written.read_text()
    functions = dict(re.findall(r"\ndef (\w+)\(\) -> None:\n(.*?)(?=\n\n\ndef |\Z)", source, flags=re.S))
    assert "op.create_table('autogen_probe'" in functions["upgrade_checkpoints"], source
    assert "op.drop_table('autogen_probe')" in functions["downgrade_checkpoints"], source
    for db in ("metadata", "vectors"):
        assert functions[f"upgrade_{db}"].strip() == "pass" and functions[f"downgrade_{db}"].strip() == "pass", source
    alembic(fresh_backend, "-c", str(ini), "-x", "db=checkpoints", "upgrade", "head")
    assert asyncio.run(revisions(fresh_backend))["checkpoints"] == "probe"
    assert "autogen_probe" in asyncio.run(table_names(fresh_backend, Database.checkpoints))
    alembic(fresh_backend, "-c", str(ini), "-x", "db=checkpoints", "downgrade", "-1")
    assert asyncio.run(revisions(fresh_backend))["checkpoints"] == head_revision()
    assert "autogen_probe" not in asyncio.run(table_names(fresh_backend, Database.checkpoints))


async def upgrade_one(backend: Backend, db: Database) -> None:
    dbs = Databases.open(settings_for(backend))
    try:
        await upgrade(dbs, db)
    finally:
        await dbs.close()


async def table_names(backend: Backend, db: Database) -> list[str]:
    dbs = Databases.open(settings_for(backend))
    try:
        async with dbs.engine(db).connect() as conn:
            return await conn.run_sync(lambda sync: inspect(sync).get_table_names())
    finally:
        await dbs.close()
