"""Request dependencies of the vectors capability: the backend chosen at start-up, the service."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.core.dependencies import NamespacePath, VectorsConnection, VectorsReadConnection
from app.vectors.backend import VectorIndex
from app.vectors.service import VectorService


async def get_vector_index(request: Request) -> VectorIndex:
    return request.app.state.vector_index


VectorIndexDep = Annotated[VectorIndex, Depends(get_vector_index)]


# async: a plain ``def`` dependency would be run in the thread pool on every request.
async def _service(
    request: Request, namespace: NamespacePath, session: VectorsConnection, index: VectorIndexDep
) -> VectorService:
    return VectorService(session, index, request.app.state.settings, namespace, request.app.state.vector_registry)


async def _read_service(
    request: Request, namespace: NamespacePath, session: VectorsReadConnection, index: VectorIndexDep
) -> VectorService:
    return VectorService(session, index, request.app.state.settings, namespace, request.app.state.vector_registry)


VectorServiceDep = Annotated[VectorService, Depends(_service)]
"""A service on a write session (SQLite: BEGIN IMMEDIATE)."""
VectorReadServiceDep = Annotated[VectorService, Depends(_read_service)]
"""A service on a read session (searches and lists sent as POST)."""
