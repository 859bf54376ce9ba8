"""Request dependencies of the vectors capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from app.core.dependencies import NamespacePath
from app.core.names import KEY_MAX_BYTES, KEY_PATTERN, validate_key
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


async def _point_id_path(
    point_id: Annotated[str, Path(min_length=1, max_length=KEY_MAX_BYTES, json_schema_extra={"pattern": KEY_PATTERN}, description="Point id (percent-encoded).", examples=["p1"])],
) -> str:
    return validate_key("point_id", point_id)


PointId = Annotated[str, Depends(_point_id_path)]


PointNamespace = Annotated[str, Depends(_namespace)]
"""The path's namespace, reached through a dependency: on the point routes OpenAPI lists the
path parameters a route declares itself before those of its dependencies, and ``point_id`` is
a dependency (``PointId``), so a plain ``NamespacePath`` there would move ``namespace`` ahead of
``point_id`` in the document."""
