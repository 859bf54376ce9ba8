"""Request dependencies of the checkpoints capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.checkpoints.service import CheckpointsService


async def get_checkpoints_service(request: Request) -> CheckpointsService:
    """The service built once by the checkpoints lifespan for the backend in use."""
    service: CheckpointsService = request.app.state.checkpoints_service
    return service


CheckpointsServiceDep = Annotated[CheckpointsService, Depends(get_checkpoints_service)]
