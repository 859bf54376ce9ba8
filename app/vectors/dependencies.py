"""Request dependencies of the vectors capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.core.dependencies import NamespacePath
from app.core.state import service_of
from app.vectors.service import VectorService


async def get_vector_service(request: Request) -> VectorService:
    """The service built once by the vectors lifecycle for the backend in use; routes take the
    request's connection (``VectorsConnection``) separately."""
    service: VectorService = service_of(request, "vectors")
    return service


VectorServiceDep = Annotated[VectorService, Depends(get_vector_service)]


async def _namespace(namespace: NamespacePath) -> str:
    return namespace


PointNamespace = Annotated[str, Depends(_namespace)]
"""The path's namespace, reached through a dependency: on the point routes OpenAPI lists the
path parameters a route declares itself before those of its dependencies, and ``point_id`` is
a dependency (``PointId``), so a plain ``NamespacePath`` there would move ``namespace`` ahead of
``point_id`` in the document."""
