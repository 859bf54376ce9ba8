"""Request dependencies of the kv capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.core.state import service_of

from app.kv.service import KvService


async def get_kv_service(request: Request) -> KvService:
    """The service built once by the kv lifecycle for the backend in use."""
    service: KvService = service_of(request, "kv")
    return service


KvServiceDep = Annotated[KvService, Depends(get_kv_service)]

