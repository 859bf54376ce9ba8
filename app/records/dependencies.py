"""Request dependencies of the records capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.core.state import service_of

from app.records.service import RecordsService


async def get_records_service(request: Request) -> RecordsService:
    """The service built once by the records lifecycle for the backend in use."""
    service: RecordsService = service_of(request, "records")
    return service


RecordsServiceDep = Annotated[RecordsService, Depends(get_records_service)]
