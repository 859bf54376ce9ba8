"""Request dependencies of the files capability."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from app.core.names import KEY_MAX_BYTES, KEY_PATTERN, validate_key
from app.core.state import service_of
from app.files.service import FilesService


async def get_files_service(request: Request) -> FilesService:
    """The service built once by the files lifecycle for the backend in use."""
    service: FilesService = service_of(request, "files")
    return service


Files = Annotated[FilesService, Depends(get_files_service)]


async def _file_id_path(
    file_id: Annotated[str, Path(min_length=1, max_length=KEY_MAX_BYTES, json_schema_extra={"pattern": KEY_PATTERN}, description="File id (percent-encoded).", examples=["u1.png"])],
) -> str:
    return validate_key("file_id", file_id)


FileId = Annotated[str, Depends(_file_id_path)]
