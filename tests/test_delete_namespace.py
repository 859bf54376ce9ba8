"""``storage-gateway delete-namespace NS``: every capability's data of one namespace, wherever it is.

The shared test (``tests/test_capabilities.py``) checks each capability's namespaced rows; this
one runs the command on a namespace seeded in every built-in capability and checks what no
namespace column marks: file chunks by blob id, a collection's own points table, a thread's
checkpoints, values and pending writes by its id, a store item's vectors by its id; and that it
stops and resumes.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from sqlalchemy import func, inspect, select

from app.cli import main
from app.checkpoints.models import checkpoint_blobs, checkpoint_threads, checkpoint_writes, checkpoints
from app.core.config import Database
from app.core.db.databases import Databases
from app.files.models import file_chunks, files
from app.store.models import store_items, store_vectors
from app.vectors.models import vector_collections
from tests.conftest import Backend, Server, run_cli
from tests.test_migrations import settings_for


async def _what_only_ids_hold(backend: Backend, ns: str, item_ids: list[int]) -> dict[str, int]:
    """Rows of ``ns`` in the tables keyed by ids its registry rows hand out, its points tables, and
    the vectors of the store items ``item_ids``."""
    databases = Databases.open(settings_for(backend))
    try:
        out: dict[str, int] = {}
        async with databases.engine(Database.metadata).connect() as conn:
            blobs = select(files.c.blob_id).where(files.c.namespace == ns).scalar_subquery()
            query = select(func.count()).select_from(file_chunks).where(file_chunks.c.blob_id.in_(blobs))
            out["file_chunks"] = (await conn.execute(query)).scalar_one()
        async with databases.engine(Database.checkpoints).connect() as conn:
            pks = select(checkpoint_threads.c.pk).where(checkpoint_threads.c.namespace == ns).scalar_subquery()
            for table in (checkpoints, checkpoint_blobs, checkpoint_writes):
                query = select(func.count()).select_from(table).where(table.c.thread_pk.in_(pks))
                out[table.name] = (await conn.execute(query)).scalar_one()
        async with databases.engine(Database.vectors).connect() as conn:
            ids = list((await conn.execute(select(vector_collections.c.id).where(vector_collections.c.namespace == ns))).scalars())
            names = set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))
            out["points tables"] = len({f"vec_{i}" for i in ids} & names)
            query = select(func.count()).select_from(store_vectors).where(store_vectors.c.item_id.in_(item_ids))
            out["store_vectors"] = (await conn.execute(query)).scalar_one()
        return out
    finally:
        await databases.close()


async def _store_items(backend: Backend, ns: str) -> list[int]:
    databases = Databases.open(settings_for(backend))
    try:
        async with databases.engine(Database.vectors).connect() as conn:
            return list((await conn.execute(select(store_items.c.id).where(store_items.c.namespace == ns))).scalars())
    finally:
        await databases.close()


async def test_the_command_deletes_everything_of_one_namespace(
    server: Server, http: httpx.AsyncClient, namespace: str, backend: Backend
) -> None:
    for capability in server.capabilities:
        await capability.samples_for("seed").seed(http, namespace)
    item_ids = await _store_items(backend, namespace)
    before = await _what_only_ids_hold(backend, namespace, item_ids)
    assert all(before.values()), before
    if backend.chunks_in_database:
        assert before["file_chunks"] > 0

    first = await asyncio.to_thread(run_cli, backend, "delete-namespace", namespace, "--batch", "1", "--max-batches", "2")
    assert first.returncode == 0, first.stderr
    partial = json.loads(first.stdout)
    assert partial["done"] is False and sum(n for c in partial["deleted"].values() for n in c.values()) == 2, partial
    rest = await asyncio.to_thread(run_cli, backend, "delete-namespace", namespace)
    assert rest.returncode == 0, rest.stderr
    report = json.loads(rest.stdout)
    assert report["done"] is True and report["namespace"] == namespace
    assert set(report["deleted"]) == {c.name for c in server.capabilities}
    deleted = {name: {**partial["deleted"].get(name, {})} for name in report["deleted"]}
    for name, counts in report["deleted"].items():
        for what, n in counts.items():
            deleted[name][what] = deleted[name].get(what, 0) + n
    assert deleted["files"] == {"files": 1, "bytes": len(b"file-bytes")}, deleted
    assert deleted["vectors"] == {"collections": 1, "points": 1}, deleted  # its Idempotency-Key answers with it
    assert deleted["checkpoints"] == {"threads": 1, "checkpoints": 1, "checkpoint_retention": 1}, deleted
    assert deleted["kv"] == {"kv_entries": 1} and deleted["records"] == {"records": 1}, deleted
    assert deleted["store"] == {"items": 1, "vectors": 1}, deleted
    assert await _what_only_ids_hold(backend, namespace, item_ids) == dict.fromkeys(before, 0)
    assert await _store_items(backend, namespace) == []
    assert (await http.get(f"/v1/{namespace}/files/c1/f1")).status_code == 404
    assert (await http.get(f"/v1/{namespace}/vectors/c1")).status_code == 404


def test_the_command_refuses_what_is_not_a_namespace(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["../etc"], ["ns", "--batch", "0"], ["ns", "--max-batches", "0"]):
        with pytest.raises(SystemExit) as exit_:
            main(["delete-namespace", *args])
        assert exit_.value.code == 2
        assert "delete-namespace: " in capsys.readouterr().err
