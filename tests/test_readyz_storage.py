"""``/readyz`` needs no key, so where file bytes are kept is for the admin key only.

``storage.files.location`` is the files directory or the bucket, and the detailed ``error`` can
name either ("<path> is not writable", "bucket 'x' does not exist"). A caller without a key, with
a wrong one or with a key that is not the admin's gets the backend, ``reachable`` and a short
reason that names neither; the admin key (or anyone, with auth disabled: there are no keys) the
whole answer. The status and ``ready`` are the same for everyone. The gateways here run in the
test's process on fresh SQLite files (migrated at start-up).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from app.core.config import Settings
from tests.conftest import ADMIN_KEY, TEST_BUCKET

if TYPE_CHECKING:
    from tests.s3server import SeaweedS3

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
WRONG = {"Authorization": "Bearer sgw_0123456789abcdef_" + "x" * 40}


def gateway_settings(tmp_path: Path, files: dict[str, Any], **auth: Any) -> Settings:
    return Settings(
        data_dir=tmp_path / "data", files=files,  # type: ignore[arg-type]
        auth=auth or {"admin_key": ADMIN_KEY},  # type: ignore[arg-type]
    )


@asynccontextmanager
async def gateway(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    from app.main import create_app

    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield client


async def readyz_as_everyone(client: httpx.AsyncClient) -> tuple[httpx.Response, list[httpx.Response]]:
    """``/readyz`` with the admin key, and as each caller that must not see more: no key, a
    wrong key, a valid key that is not the admin's."""
    r = await client.post("/v1/admin/keys", json={"namespace": "*", "scopes": ["*:*"]}, headers=ADMIN)
    assert r.status_code == 201, r.text
    scoped = {"Authorization": f"Bearer {r.json()['key']}"}
    admin = await client.get("/readyz", headers=ADMIN)
    others = [await client.get("/readyz", headers=headers) for headers in ({}, WRONG, scoped)]
    return admin, others


def assert_redacted(admin: httpx.Response, others: list[httpx.Response], *secrets: str) -> dict[str, Any]:
    """Every other caller: the admin's status and ``ready``, no ``secrets`` anywhere in the body."""
    files = admin.json()["storage"]["files"]
    for r in others:
        assert (r.status_code, r.json()["ready"]) == (admin.status_code, admin.json()["ready"])
        for secret in secrets:
            assert secret not in r.text, r.text
        assert r.json()["storage"]["files"]["location"] is None
        assert r.json()["storage"]["files"]["reachable"] is files["reachable"]
    assert others[0].json() == others[1].json() == others[2].json()
    redacted: dict[str, Any] = others[0].json()["storage"]["files"]
    return redacted


async def test_the_files_directory_is_shown_to_the_admin_key_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.health")
    blocker = tmp_path / "hidden-dir-name"
    directory = blocker / "files"  # created with the first file written
    async with gateway(gateway_settings(tmp_path, {"backend": "directory", "directory": {"path": str(directory)}})) as client:
        admin, others = await readyz_as_everyone(client)
        assert admin.status_code == 200 and admin.json()["storage"]["files"] == {
            "backend": "directory", "reachable": True, "location": str(directory), "error": None}
        assert assert_redacted(admin, others, str(tmp_path), "hidden-dir-name") == {
            "backend": "directory", "reachable": True, "location": None, "error": None}

        # Not writable (a regular file where the directory's parent should be): the admin key
        # gets the path, everyone else the reason alone; logged once, however many probes.
        blocker.write_text("not a directory")
        admin, others = await readyz_as_everyone(client)
        files = admin.json()["storage"]["files"]
        assert admin.status_code == 200 and files["reachable"] is False and files["location"] == str(directory)
        assert files["error"] == f"{blocker} is not writable"
        assert assert_redacted(admin, others, str(tmp_path), "hidden-dir-name") == {
            "backend": "directory", "reachable": False, "location": None,
            "error": "the files directory is not writable"}
        warnings = [r.getMessage() for r in caplog.records if r.name == "app.health" and r.levelno == logging.WARNING]
        assert warnings == [f"files storage (directory {directory}) is unreachable: {blocker} is not writable"]

        blocker.unlink()
        assert (await client.get("/readyz")).json()["storage"]["files"]["reachable"] is True
        assert (await client.get("/readyz")).json()["storage"]["files"]["reachable"] is True
        logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "app.health"]
        assert logged[1:] == [(logging.INFO, f"files storage (directory {directory}) is reachable again")]


async def test_the_bucket_is_shown_to_the_admin_key_only(
    tmp_path: Path, seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.health")
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)

    def s3(bucket: str) -> dict[str, Any]:
        return {"backend": "s3", "s3": {"endpoint_url": seaweed.endpoint, "bucket": bucket,
                                        "prefix": f"readyz-{uuid.uuid4().hex[:6]}/"}}

    async with gateway(gateway_settings(tmp_path / "a", s3(TEST_BUCKET))) as client:
        admin, others = await readyz_as_everyone(client)
        assert admin.status_code == 200 and admin.json()["storage"]["files"] == {
            "backend": "s3", "reachable": True, "location": TEST_BUCKET, "error": None}
        assert assert_redacted(admin, others, TEST_BUCKET) == {
            "backend": "s3", "reachable": True, "location": None, "error": None}

    # A bucket that does not exist: its name is in the admin's error only. Down from the start:
    # logged once; created meanwhile: logged once more, as reachable again.
    missing = f"readyz-hidden-{uuid.uuid4().hex[:8]}"
    async with gateway(gateway_settings(tmp_path / "b", s3(missing))) as client:
        admin, others = await readyz_as_everyone(client)
        files = admin.json()["storage"]["files"]
        assert admin.status_code == 200 and files["reachable"] is False and files["location"] == missing
        assert files["error"] == f"bucket {missing!r} does not exist"
        assert assert_redacted(admin, others, missing, "readyz-hidden") == {
            "backend": "s3", "reachable": False, "location": None, "error": "the bucket does not exist"}
        health = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "app.health"]
        assert health == [(logging.WARNING, f"files storage (s3 {missing}) is unreachable: bucket {missing!r} does not exist")]

        await asyncio.to_thread(seaweed.create_bucket, missing)
        assert (await client.get("/readyz")).json()["storage"]["files"]["reachable"] is True
        health = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "app.health"]
        assert health[1:] == [(logging.INFO, f"files storage (s3 {missing}) is reachable again")]


async def test_with_auth_disabled_everyone_gets_the_whole_answer(tmp_path: Path) -> None:
    directory = tmp_path / "files-here"
    settings = gateway_settings(tmp_path, {"backend": "directory", "directory": {"path": str(directory)}},
                                mode="disabled")
    async with gateway(settings) as client:
        r = await client.get("/readyz")
        assert r.status_code == 200 and r.json()["auth"] == "disabled"
        assert r.json()["storage"]["files"]["location"] == str(directory)


def test_the_openapi_document_never_shows_the_public_error() -> None:
    """``public_error`` is what a redacted answer shows in ``error``; it is never a field of its own."""
    from app.main import create_app

    schema = create_app(Settings()).openapi()["components"]["schemas"]["StorageStatus"]
    assert set(schema["properties"]) == {"backend", "reachable", "location", "error"}
