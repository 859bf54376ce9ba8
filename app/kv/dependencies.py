"""Request dependencies of the kv capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.kv.service import KvService


async def get_kv_service(request: Request) -> KvService:
    """The service built once by the kv lifespan for the backend in use."""
    service: KvService = request.app.state.kv_service
    return service


KvServiceDep = Annotated[KvService, Depends(get_kv_service)]
