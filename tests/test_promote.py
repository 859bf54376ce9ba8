"""``storage-gateway promote`` (issue #47): a SQLite deployment's namespaces, every capability,
copied into a throwaway PostgreSQL; a gateway on it answers as the source did; run again it copies
nothing; a namespace left incomplete on the target is copied again; the source is only read."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import httpx
import pytest

from app.core.config import Database

from tests.conftest import (
    ADMIN_KEY,
    Backend,
    Server,
    backend_env,
    create_postgres_databases,
    run_cli,
    start_server,
    stop_server,
)
from tests.test_portability import _answers, _same, _seed

pytestmark = pytest.mark.backends("sqlite")


async def test_promote_sqlite_to_postgres(
    server: Server, backend: Backend, http: httpx.AsyncClient, namespace: str, postgres_base_url: str, tmp_path: Path
) -> None:
    names = [f"{namespace}{i}" for i in range(3)]
    for ns in names:
        await _seed(server, http, ns)
    key = (await http.post("/v1/admin/keys", json={"namespace": names[0], "scopes": ["kv:read"]})).json()["key"]
    before = {ns: await _answers(server, http, ns) for ns in names}
    urls = await asyncio.to_thread(create_postgres_databases, postgres_base_url, f"gwpr_{uuid.uuid4().hex[:8]}")
    to = tmp_path / "target.yaml"
    to.write_text(json.dumps({"databases": {db: {"url": url} for db, url in urls.items()}}))

    def promote() -> dict[str, dict[str, object]]:
        done = run_cli(backend, "promote", "--to", str(to), "--namespaces", *names, timeout=300)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout.splitlines()[0])
        assert "GATEWAY_DATABASES__METADATA__URL=postgresql://" in done.stdout and "GATEWAY_FILES__BACKEND=database" in done.stdout
        return report["namespaces"]  # type: ignore[no-any-return]

    first = promote()
    assert {ns: r["action"] for ns, r in first.items()} == dict.fromkeys(names, "copied")
    target = Backend("postgres", {**backend_env(urls, tmp_path), "GATEWAY_FILES__BACKEND": "database"}, urls)
    srv = start_server(target, tmp_path / "target.log")
    try:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as there:
            for ns in names:
                _same(await _answers(srv, there, ns), before[ns], same_backend=False)
            # the key was copied: it reads on the target
            r = await there.get(f"/v1/{names[0]}/kv/ttl/k", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
            # run again: nothing to do
            assert {ns: r["action"] for ns, r in promote().items()} == dict.fromkeys(names, "skipped")
            # a namespace left incomplete on the target (an interrupted promote) is copied again
            assert (await there.delete(f"/v1/{names[1]}/kv/ttl/k")).status_code < 300
            again = promote()
            assert again[names[1]]["action"] == "recopied" and again[names[0]]["action"] == "skipped"
            _same(await _answers(srv, there, names[1]), before[names[1]], same_backend=False)
    finally:
        stop_server(srv)
    for ns in names:  # the source is unchanged
        _same(await _answers(server, http, ns), before[ns])


def test_promote_refuses_a_target_that_is_not_postgres(tmp_path: Path) -> None:
    from app.core.config import Settings
    from app.portability.promote import PromoteError, target_settings

    source = Settings(data_dir=tmp_path)
    to = tmp_path / "t.yaml"
    to.write_text(json.dumps({"databases": {db: {"url": f"sqlite:///{tmp_path}/{db}.db"} for db in ("metadata", "vectors", "checkpoints")}}))
    for target, why in ((str(to), "must be PostgreSQL"), (str(tmp_path / "nowhere.yaml"), "neither")):
        with pytest.raises(PromoteError, match=why):
            target_settings(source, target)
    dsn = target_settings(source, "postgresql://u:p@db:5432")
    assert dsn.database_url(Database.vectors) == "postgresql+asyncpg://u:p@db:5432/soothe_vectors"
    assert dsn.files_backend() == "database" and source.database_url(Database.vectors).startswith("sqlite")
