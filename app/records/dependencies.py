"""Request dependencies of the records capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.records.service import RecordsService


async def get_records_service(request: Request) -> RecordsService:
    """The service built once by the records lifespan for the backend in use."""
    service: RecordsService = request.app.state.records_service
    return service


RecordsServiceDep = Annotated[RecordsService, Depends(get_records_service)]
