"""Key management over HTTP, for the admin key only: ``/v1/admin/keys``."""

from __future__ import annotations

from typing import Annotated

from sqlalchemy.ext.asyncio import AsyncEngine
from fastapi import APIRouter, Path, Query, Request, Response, status

from app.auth import service
from app.auth.dependencies import Admin
from app.auth.schemas import KeyCreate, KeyCreated, KeyRead
from app.core.config import Database
from app.core.dependencies import PageLimit
from app.core.errors import Forbidden, InvalidInput, Unauthorized, problem_responses
from app.core.http.limits import Body, accepts
from app.core.http.pagination import Page, decode_cursor, encode_cursor
from app.core.state import gateway_state

router = APIRouter(prefix="/v1/admin/keys", tags=["admin"], responses=problem_responses(Unauthorized, Forbidden))


def _engine(request: Request) -> AsyncEngine:
    return gateway_state(request.app).databases.engine(Database.metadata)


@router.post(
    "", status_code=status.HTTP_201_CREATED, response_model=KeyCreated,
    summary="Create an API key", responses=problem_responses(InvalidInput),
)
@accepts(Body.JSON)
async def create_key(body: KeyCreate, request: Request, _: Admin) -> KeyCreated:
    """Issue a key for a namespace pattern and scopes; the secret is in this answer only."""
    state = gateway_state(request.app)
    async with state.databases.engine(Database.metadata).begin() as conn:
        issued = await service.create_key(conn, body.namespace, body.scopes, body.description, state.capability_names)
    return KeyCreated(
        key_id=issued.key_id, key=issued.secret, namespace=issued.namespace_pattern,
        scopes=issued.scopes, description=issued.description, created_at=issued.created_at,
    )


@router.get("", response_model=Page[KeyRead], summary="List API keys")
async def list_keys(
    request: Request, _: Admin, limit: PageLimit,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> Page[KeyRead]:
    """Every key with its pattern, scopes and revocation time (never the secret)."""
    after = decode_cursor(cursor, "after")["after"] if cursor else None
    async with _engine(request).connect() as conn:
        rows = await service.list_keys(conn, after, limit + 1)
    items = [KeyRead(**r) for r in rows[:limit]]
    next_cursor = encode_cursor({"after": items[-1].key_id}) if len(rows) > limit else None
    return Page[KeyRead](items=items, next_cursor=next_cursor)


@router.delete("/{key_id}", status_code=status.HTTP_204_NO_CONTENT, summary="Revoke an API key")
async def revoke_key(
    request: Request, _: Admin,
    key_id: Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="The key's public id.")],
) -> Response:
    """Refused from the next request on this process, and on every other worker and replica
    within twice `auth.revocation_check_seconds`; revoking twice is fine."""
    async with _engine(request).begin() as conn:
        await service.revoke_key(conn, key_id)
    gateway_state(request.app).key_cache.forget_all()  # other processes see it within 2 x auth.revocation_check_seconds
    return Response(status_code=status.HTTP_204_NO_CONTENT)
