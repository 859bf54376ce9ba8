"""HTTP shapes of key management."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: str = Field(
        max_length=129, description="Exact namespace, a prefix ending in `*`, or `*`.", examples=["team-*"]
    )
    scopes: list[str] = Field(
        min_length=1, max_length=32, description="CAP:ACTION; CAP in records, kv, files, vectors, *; "
        "ACTION in read, write, * (write includes read).", examples=[["kv:write", "vectors:read"]],
    )
    description: str = Field(default="", max_length=500, examples=["memory plugin, production"])


class KeyRead(BaseModel):
    key_id: str = Field(examples=["3f9a1c2b4d5e6f70"])
    namespace: str
    scopes: list[str]
    description: str
    created_at: datetime
    revoked_at: datetime | None = None


class KeyCreated(KeyRead):
    key: str = Field(description="The secret: shown once, never again.", examples=["sgw_3f9a1c2b4d5e6f70_..."])
