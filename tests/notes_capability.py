"""A capability that exists only for the tests: short text notes by id, in one file.

``tests/test_capability_model.py`` serves it with one line of configuration
(``GATEWAY_EXTRA_CAPABILITIES='["tests.notes_capability:CAPABILITY"]'``) and shows that it gets
auth scopes, the isolation matrix, the scoping check, metrics, body limits and OpenAPI entries
without any shared list being edited. Its table is its own (not in the gateway's migrations), so
its lifecycle creates it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import Column, MetaData, String, Table, delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.capability import Capability
from app.core.config import Database
from app.core.db.databases import SQLITE_BEGIN_OPTION
from app.core.dependencies import NamespacePath, PageLimit
from app.core.errors import NotFound
from app.core.http.planning import served_by_fastapi
from app.core.http.limits import Body, accepts
from app.core.http.routing import CapabilityRouter
from app.core.db.scoping import in_scope
from app.core.state import GatewayState, service_of
from app.core.db.upsert import insert_builder

notes = Table(
    "test_notes",
    MetaData(),
    Column("namespace", String(128), primary_key=True),
    Column("note_id", String(64), primary_key=True),
    Column("text", String(4096), nullable=False),
)

NoteId = Annotated[str, Path(pattern=r"^[a-z0-9]{1,64}$")]


class Note(BaseModel):
    text: str = Field(max_length=4096)


class NoteSearch(BaseModel):
    contains: str = Field(max_length=100)


class NotesService:
    def __init__(self, engine: AsyncEngine, dialect: str) -> None:
        self.engine = engine
        self.insert = insert_builder(dialect)

    async def put(self, namespace: str, note_id: str, text: str) -> None:
        statement = self.insert(notes).values(namespace=namespace, note_id=note_id, text=text)
        statement = statement.on_conflict_do_update(index_elements=["namespace", "note_id"], set_={"text": text})
        async with self.engine.begin() as conn:
            await conn.execute(statement)

    async def get(self, namespace: str, note_id: str) -> str | None:
        async with self.engine.connect() as conn:
            query = select(notes.c.text).where(in_scope(notes, namespace), notes.c.note_id == note_id)
            return (await conn.execute(query)).scalar_one_or_none()

    async def list(self, namespace: str, limit: int, contains: str = "") -> list[str]:
        query = select(notes.c.note_id).where(in_scope(notes, namespace)).order_by(notes.c.note_id).limit(limit)
        if contains:
            query = query.where(notes.c.text.contains(contains, autoescape=True))
        async with self.engine.connect() as conn:
            return list((await conn.execute(query)).scalars())

    async def delete(self, namespace: str, note_id: str) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(delete(notes).where(in_scope(notes, namespace), notes.c.note_id == note_id))


router = CapabilityRouter("notes", tags=["notes"])


def _service(request: Request) -> NotesService:
    service: NotesService = service_of(request, "notes")
    return service


@router.put("/{note_id}", status_code=204, summary="Write a note")
@served_by_fastapi("a request body model")
@accepts(Body.JSON)
async def put_note(request: Request, namespace: NamespacePath, note_id: NoteId, body: Note) -> Response:
    await _service(request).put(namespace, note_id, body.text)
    return Response(status_code=204)


@router.get("/{note_id}", response_model=Note, summary="Read a note")
async def get_note(request: Request, namespace: NamespacePath, note_id: NoteId) -> Response:
    text = await _service(request).get(namespace, note_id)
    if text is None:
        raise NotFound("no such note")
    return JSONResponse({"text": text})


@router.get("", response_model=list[str], summary="List note ids")
async def list_notes(request: Request, namespace: NamespacePath, limit: PageLimit) -> Response:
    return JSONResponse(await _service(request).list(namespace, limit))


@router.post("/search", summary="Note ids whose text contains a string")
@served_by_fastapi("a request body model")
@accepts(Body.JSON, read_only=True)
async def search_notes(request: Request, namespace: NamespacePath, body: NoteSearch, limit: PageLimit) -> list[str]:
    return await _service(request).list(namespace, limit, body.contains)


@router.delete("/{note_id}", status_code=204, summary="Delete a note")
async def delete_note(request: Request, namespace: NamespacePath, note_id: NoteId) -> Response:
    await _service(request).delete(namespace, note_id)
    return Response(status_code=204)


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[NotesService]:
    engine = state.databases.engine(Database.metadata)
    # IMMEDIATE: another gateway on the same SQLite files may be writing (a deferred transaction
    # that read the schema could not then take the write lock: SQLITE_BUSY without waiting)
    async with engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"}).begin() as conn:
        await conn.run_sync(notes.metadata.create_all)
    yield NotesService(engine, state.databases.dialect(Database.metadata))


CAPABILITY = Capability(
    name="notes",
    router=router,
    database=Database.metadata,
    lifecycle=lifecycle,
    tables=(notes,),
    summary="Short text notes by id (a capability that exists only for the tests).",
)
