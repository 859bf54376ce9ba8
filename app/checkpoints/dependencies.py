"""Request dependencies of the checkpoints capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.core.state import service_of

from app.checkpoints.service import CheckpointsService


async def get_checkpoints_service(request: Request) -> CheckpointsService:
    """The service built once by the checkpoints lifecycle for the backend in use."""
    service: CheckpointsService = service_of(request, "checkpoints")
    return service


CheckpointsServiceDep = Annotated[CheckpointsService, Depends(get_checkpoints_service)]
