"""Request dependencies of the store capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.core.state import service_of
from app.store.service import StoreService


async def get_store_service(request: Request) -> StoreService:
    """The service built once by the store lifecycle for the vectors database's backend."""
    service: StoreService = service_of(request, "store")
    return service


StoreServiceDep = Annotated[StoreService, Depends(get_store_service)]
