"""Request dependencies of the vectors capability: the backend chosen at start-up, the service."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, cast

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.dependencies import NamespacePath, VectorsConnection, VectorsReadConnection
from app.core.state import gateway_state
from app.vectors.service import VectorService

if TYPE_CHECKING:
    from app.vectors.capability import Vectors


def _build(request: Request, namespace: str, session: AsyncConnection) -> VectorService:
    # The index backend and the registry are the process's, chosen at start-up by the lifecycle:
    # read here rather than as dependencies of their own (each costs FastAPI a resolution).
    state = gateway_state(request.app)
    shared = cast("Vectors", state.services["vectors"])
    return VectorService(session, shared.index, state.settings, namespace, shared.registry)


# async: a plain ``def`` dependency would be run in the thread pool on every request.
async def _service(request: Request, namespace: NamespacePath, session: VectorsConnection) -> VectorService:
    return _build(request, namespace, session)


async def _read_service(request: Request, namespace: NamespacePath, session: VectorsReadConnection) -> VectorService:
    return _build(request, namespace, session)


VectorServiceDep = Annotated[VectorService, Depends(_service)]
"""A service on a write session (SQLite: BEGIN IMMEDIATE)."""
VectorReadServiceDep = Annotated[VectorService, Depends(_read_service)]
"""A service on a read session (searches and lists sent as POST)."""
