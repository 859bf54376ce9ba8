"""A capability is one package and one registration: the counters capability (``tests/counters``),
written as ``docs/architecture.md`` says and served with one setting, gets everything the
built-in ones get, and no shared test names it.

This module's gateway serves it (``EXTRA_CAPABILITIES``, the ``server`` fixture below) and every
shared test (``tests/capability_checks.py``: the isolation matrix, same names, the scoping check,
schemathesis, OpenAPI entries, metrics, body limits, declared changes, delete-namespace, export
and import) runs here on it, on both backends. The tests below add the setting, auth scopes, a
database error of its own answered as its descriptor says (a sum past 64 bits: 422 on both
backends, nothing changed), and that a capability whose samples lack a part fails the shared
tests with a message saying what to write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from app.capabilities import BUILTIN, load
from app.core.config import Database, Settings
from app.core.db.databases import Databases
from app.core.errors import OutOfRange, database_problem
from app.core.samples import NO_SAMPLES, MissingSample, Samples
from app.main import create_app
from tests.capability_checks import *  # noqa: F403  (every shared test, run here on counters)
from tests.conftest import ADMIN_KEY, Backend, Server, serve_extra
from tests.counters.capability import CAPABILITY as COUNTERS
from tests.counters.samples import CountersSamples
from tests.test_isolation import make_key, test_isolation_matrix
from tests.test_migrations import settings_for
from tests.test_schemathesis import plan
from tests.test_scoping import test_every_statement_on_a_namespaced_table_is_scoped

EXTRA_CAPABILITIES = ("tests.counters.capability:CAPABILITY",)
INT64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def server(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_extra(backend, tmp_path_factory, EXTRA_CAPABILITIES)


def test_one_setting_registers_it() -> None:
    assert [c.name for c in load(EXTRA_CAPABILITIES)] == [*(c.name for c in BUILTIN), "counters"]
    with pytest.raises(ValueError, match="two capabilities"):
        load([*EXTRA_CAPABILITIES, *EXTRA_CAPABILITIES])
    with pytest.raises(TypeError, match="not a Capability"):
        load(["tests.counters.router:router"])


async def test_auth_scopes(http: httpx.AsyncClient, server: Server, namespace: str, tmp_path: Path) -> None:
    assert (await http.post(f"/v1/{namespace}/counters/c/increment", json={"n": 3})).json() == {"name": "c", "value": 3}
    reader = await make_key(http, namespace, "counters:read")
    writer = await make_key(http, namespace, "counters:write")
    kv_only = await make_key(http, namespace, "kv:*")
    async with httpx.AsyncClient(base_url=server.url) as anyone:
        def as_(key: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {key}"}

        url = f"/v1/{namespace}/counters/c"
        assert (await anyone.get(url, headers=as_(reader))).json() == {"name": "c", "value": 3}
        assert (await anyone.get(f"/v1/{namespace}/counters", headers=as_(reader))).status_code == 200
        assert (await anyone.post(f"{url}/increment", json={}, headers=as_(reader))).status_code == 403
        assert (await anyone.delete(url, headers=as_(reader))).status_code == 403
        assert (await anyone.post(f"{url}/increment", json={}, headers=as_(writer))).json()["value"] == 4
        assert (await anyone.get(url, headers=as_(kv_only))).status_code == 403
        assert (await anyone.get(url)).status_code == 401
    # A gateway that does not serve it refuses its scopes.
    settings = Settings(data_dir=tmp_path, auth={"admin_key": ADMIN_KEY})
    app = create_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ) as plain:
        r = await plain.post("/v1/admin/keys", json={"namespace": namespace, "scopes": ["counters:read"]})
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["loc"] == ["scopes", "0"], r.text


async def test_a_sum_past_64_bits_is_422_and_changes_nothing(http: httpx.AsyncClient, namespace: str) -> None:
    """The descriptor's error rules answer the database's refusal (SQLite: the CHECK on the REAL
    its sum became; PostgreSQL: BIGINT out of range, 22003) with the same 422."""
    url = f"/v1/{namespace}/counters"
    assert (await http.post(f"{url}/up/increment", json={"n": INT64_MAX})).json()["value"] == INT64_MAX
    assert (await http.post(f"{url}/down/increment", json={"n": -(2**63)})).json()["value"] == -(2**63)
    for name, n in (("up", 1), ("up", INT64_MAX), ("down", -1)):
        r = await http.post(f"{url}/{name}/increment", json={"n": n})
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "counter_out_of_range" and r.json()["errors"][0]["loc"] == ["n"], r.text
    assert (await http.get(f"{url}/up")).json()["value"] == INT64_MAX
    assert (await http.get(f"{url}/down")).json()["value"] == -(2**63)
    r = await http.post(f"{url}/up/increment", json={"n": 2**63})  # n itself: the body's schema
    assert r.status_code == 422 and r.json()["code"] == "invalid_input", r.text
    assert (await http.post(f"{url}/up/increment", json={"n": -1})).json()["value"] == INT64_MAX - 1


async def test_integers_beyond_64_bits_are_422_whatever_the_capability(backend: Backend) -> None:
    """The gateway's own rule, behind every capability's: PostgreSQL's 22003, and the
    ``OverflowError`` of binding such an integer to SQLite, are a 422 ``out_of_range``."""
    databases = Databases.open(settings_for(backend))
    try:
        async with databases.engine(Database.metadata).connect() as conn:
            with pytest.raises(Exception) as caught:  # noqa: PT011 - whichever the driver raises
                if backend.is_postgres:
                    await conn.execute(text("SELECT CAST(:x AS bigint) + 1"), {"x": INT64_MAX})
                else:
                    await conn.execute(text("SELECT :x"), {"x": 2**64})
    finally:
        await databases.close()
    problem = database_problem(caught.value)
    assert isinstance(problem, OutOfRange) and problem.status == 422, caught.value
    assert database_problem(ValueError("not a database error")) is None


class WithoutSeed(CountersSamples):
    seed = Samples.seed


class WithoutWorkload(CountersSamples):
    workload = Samples.workload


class MissingADelete(CountersSamples):
    async def workload(self, http: Any, ns: str) -> None:
        self.ok(await http.post(f"/v1/{ns}/counters/hits/increment", json={"n": 5}))
        self.ok(await http.get(f"/v1/{ns}/counters/hits"))
        self.ok(await http.get(f"/v1/{ns}/counters"))


async def test_missing_samples_fail_the_shared_tests_saying_what_to_write(
    server: Server, http: httpx.AsyncClient, namespace: str, backend: Backend, tmp_path: Path
) -> None:
    without_seed = dataclasses.replace(COUNTERS, samples=WithoutSeed())
    with pytest.raises(MissingSample, match=r"(?s)'counters' has no seed .*WithoutSeed.*async def seed\(self, http, ns\)"):
        await test_isolation_matrix(server, http, namespace, backend, without_seed)
    without_workload = dataclasses.replace(COUNTERS, samples=WithoutWorkload())
    with pytest.raises(MissingSample, match=r"(?s)'counters' has no workload .*async def workload\(self, http, ns\)"):
        await test_every_statement_on_a_namespaced_table_is_scoped(backend, server, namespace, tmp_path, without_workload)
    none_at_all = dataclasses.replace(COUNTERS, samples=NO_SAMPLES)
    with pytest.raises(MissingSample, match=r"(?s)no cursors .*a subclass of app.core.samples.Samples"):
        await plan(server, (none_at_all,), everything=False)
    # A workload that leaves a route out fails the scoping check, naming the route.
    short = dataclasses.replace(COUNTERS, samples=MissingADelete())
    with pytest.raises(AssertionError, match=r"calls no \['DELETE /v1/\{namespace\}/counters/\{name\}'\]: add a request"):
        await test_every_statement_on_a_namespaced_table_is_scoped(backend, server, namespace, tmp_path, short)
