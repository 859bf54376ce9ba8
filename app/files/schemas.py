"""The HTTP shapes of the files capability."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from app.files.repository import FileRow


class FileRead(BaseModel):
    """A stored file's metadata (its bytes are at ``GET /files/{collection}/{id}``)."""

    id: str = Field(examples=["u1.png"])
    size: int = Field(description="Bytes.", examples=[48213])
    content_type: str = Field(examples=["image/png"])
    sha256: str = Field(description="Hex digest of the content; also the ETag.", examples=["9f86d081884c7d65..."])
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: FileRow) -> FileRead:
        return cls(
            id=row.file_id,
            size=row.size,
            content_type=row.content_type,
            sha256=row.sha256,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class FilePage(BaseModel):
    """A page of file metadata sorted by id (byte order)."""

    items: list[FileRead]
    next_cursor: str | None = Field(default=None, description="Pass as `cursor` for the next page.")


class FilesUsage(BaseModel):
    """How much the namespace stores in files."""

    namespace: str = Field(examples=["my_plugin"])
    total_bytes: int = Field(description="Sum of the sizes of all its files.", examples=[1048576])
    file_count: int = Field(examples=[12])
