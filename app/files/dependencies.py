"""Request dependencies of the files capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.files.service import FilesService

STATE_KEY = "files_service"


def get_files_service(request: Request) -> FilesService:
    service: FilesService = getattr(request.app.state, STATE_KEY)
    return service


Files = Annotated[FilesService, Depends(get_files_service)]
