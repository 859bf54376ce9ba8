"""Request dependencies of the files capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.core.state import service_of

from app.files.service import FilesService



async def get_files_service(request: Request) -> FilesService:
    """The service built once by the files lifecycle for the backend in use."""
    service: FilesService = service_of(request, "files")
    return service


Files = Annotated[FilesService, Depends(get_files_service)]
