"""The per-process key cache: cheap checks, and revocation bounded on every process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from app.auth import cache as cache_module
from app.auth.cache import KeyCache
from app.auth.service import Principal
from tests.conftest import ADMIN_KEY, Backend, Server, start_server, stop_server

KEY = "sgw_0123456789abcdef_" + "s" * 43
PRINCIPAL = Principal("0123456789abcdef", "ns", frozenset({"kv:read"}))


class FakeEngine:
    @asynccontextmanager
    async def connect(self) -> Any:
        yield object()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def database(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the fake keys table answers, and how often it was asked."""
    db: dict[str, Any] = {"principal": PRINCIPAL, "state": (0, None), "lookups": 0}

    async def verify(conn: object, presented: str) -> Principal | None:
        db["lookups"] += 1
        return db["principal"]

    async def revocation_state(conn: object) -> tuple[object, ...]:
        return db["state"]

    monkeypatch.setattr(cache_module.service, "verify", verify)
    monkeypatch.setattr(cache_module.service, "revocation_state", revocation_state)
    return db


async def test_a_checked_key_is_not_looked_up_again_while_fresh(database: dict[str, Any]) -> None:
    clock = Clock()
    keys = KeyCache(FakeEngine(), 1.0, clock)  # type: ignore[arg-type]
    await keys.check()
    for _ in range(5):
        assert await keys.principal(KEY) == PRINCIPAL
    assert database["lookups"] == 1
    assert await keys.principal("not-a-key") is None and database["lookups"] == 1  # malformed: never looked up


async def test_a_revocation_seen_by_the_check_empties_the_cache(database: dict[str, Any]) -> None:
    clock = Clock()
    keys = KeyCache(FakeEngine(), 1.0, clock)  # type: ignore[arg-type]
    await keys.check()
    assert await keys.principal(KEY) == PRINCIPAL
    database["state"], database["principal"] = (1, "t"), None
    await keys.check()
    assert await keys.principal(KEY) is None
    assert database["lookups"] == 2


async def test_without_a_recent_check_every_request_looks_its_key_up(database: dict[str, Any]) -> None:
    clock = Clock()
    keys = KeyCache(FakeEngine(), 1.0, clock)  # type: ignore[arg-type]
    await keys.check()
    await keys.principal(KEY)
    clock.now += 1.99
    await keys.principal(KEY)
    assert database["lookups"] == 1
    clock.now += 0.02  # 2 x check_seconds since the last check that succeeded: not trusted
    await keys.principal(KEY)
    await keys.principal(KEY)
    assert database["lookups"] == 3


async def test_a_lookup_racing_a_revocation_is_not_kept(database: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    keys = KeyCache(FakeEngine(), 1.0, clock)  # type: ignore[arg-type]
    await keys.check()

    async def verify_while_revoked(conn: object, presented: str) -> Principal | None:
        database["lookups"] += 1
        keys.forget_all()  # a revocation lands while this lookup is in flight
        return PRINCIPAL

    monkeypatch.setattr(cache_module.service, "verify", verify_while_revoked)
    assert await keys.principal(KEY) == PRINCIPAL
    assert await keys.principal(KEY) == PRINCIPAL
    assert database["lookups"] == 2  # the first answer was not cached


@pytest.fixture(scope="module")
def second_server(backend: Backend, server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Another gateway process on the same databases (a second replica)."""
    srv = start_server(backend, tmp_path_factory.mktemp("replica") / "log")
    yield srv
    stop_server(srv)


def test_a_key_revoked_on_one_process_is_refused_on_another_within_the_bound(
    server: Server, second_server: Server, namespace: str
) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.url, headers=admin) as first:
        made = first.post("/v1/admin/keys", json={"namespace": namespace, "scopes": ["kv:read"]}).json()
        with httpx.Client(base_url=second_server.url, headers={"Authorization": f"Bearer {made['key']}"}) as other:
            for _ in range(3):  # checked once, then answered from the second process's cache
                assert other.get(f"/v1/{namespace}/kv/c/k").status_code == 404
            assert first.delete(f"/v1/admin/keys/{made['key_id']}").status_code == 204
            revoked_at = time.monotonic()
            while other.get(f"/v1/{namespace}/kv/c/k").status_code != 401:
                assert time.monotonic() - revoked_at < 2.0 + 0.5, "still accepted past 2 x revocation_check_seconds"
                time.sleep(0.05)
