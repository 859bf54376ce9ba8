"""Request dependencies of the vectors capability: the backend chosen at start-up, the service."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.dependencies import NamespacePath, VectorsConnection, VectorsReadConnection
from app.vectors.backend import VectorIndex
from app.vectors.service import VectorService


def _build(request: Request, namespace: str, session: AsyncConnection) -> VectorService:
    # The index backend and the registry are the app's, chosen at start-up: read from the app
    # state here rather than as dependencies of their own (each costs FastAPI a resolution).
    state = request.app.state
    index: VectorIndex = state.vector_index
    return VectorService(session, index, state.settings, namespace, state.vector_registry)


# async: a plain ``def`` dependency would be run in the thread pool on every request.
async def _service(request: Request, namespace: NamespacePath, session: VectorsConnection) -> VectorService:
    return _build(request, namespace, session)


async def _read_service(request: Request, namespace: NamespacePath, session: VectorsReadConnection) -> VectorService:
    return _build(request, namespace, session)


VectorServiceDep = Annotated[VectorService, Depends(_service)]
"""A service on a write session (SQLite: BEGIN IMMEDIATE)."""
VectorReadServiceDep = Annotated[VectorService, Depends(_read_service)]
"""A service on a read session (searches and lists sent as POST)."""
