"""HTTP routes of the counters capability: plain FastAPI, body and answer models."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request, Response

from app.core.dependencies import MetadataConnection, NamespacePath, PageLimit
from app.core.errors import InvalidInput, NotFound, problem_responses
from app.core.http.limits import Body, accepts
from app.core.http.pagination import MAX_CURSOR_CHARS, Page
from app.core.http.routing import CapabilityRouter
from app.core.names import NAME_MAX_LENGTH, NAME_PATTERN
from app.core.state import service_of
from tests.counters.schemas import Counter, Increment
from tests.counters.service import CountersService

router = CapabilityRouter("counters", tags=["counters"])

Name = Annotated[str, Path(min_length=1, max_length=NAME_MAX_LENGTH, pattern=NAME_PATTERN, description="Counter name.")]


async def counters_service(request: Request) -> CountersService:
    service: CountersService = service_of(request, "counters")
    return service


Service = Annotated[CountersService, Depends(counters_service)]


@router.post("/{name}/increment", summary="Add to a counter", responses=problem_responses(InvalidInput))
@accepts(Body.JSON)
async def increment(namespace: NamespacePath, name: Name, body: Increment, conn: MetadataConnection, service: Service) -> Counter:
    """Add `n` to the counter (a new one starts at 0); its new value. Past 64 bits: 422, nothing changes."""
    return await service.increment(conn, namespace, name, body.n)


@router.get("/{name}", summary="Read a counter", responses=problem_responses(NotFound))
async def get_counter(namespace: NamespacePath, name: Name, conn: MetadataConnection, service: Service) -> Counter:
    return await service.get(conn, namespace, name)


@router.get("", summary="List counters", responses=problem_responses(InvalidInput))
async def list_counters(
    namespace: NamespacePath, conn: MetadataConnection, service: Service, limit: PageLimit,
    cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_CHARS, description="`next_cursor` of the previous page.")] = None,
) -> Page[Counter]:
    """Counters by name, a page at a time."""
    return await service.list(conn, namespace, cursor, limit)


@router.delete("/{name}", summary="Delete a counter", status_code=204)
async def delete_counter(namespace: NamespacePath, name: Name, conn: MetadataConnection, service: Service) -> Response:
    """204 whether or not it existed."""
    await service.delete(conn, namespace, name)
    return Response(status_code=204)
