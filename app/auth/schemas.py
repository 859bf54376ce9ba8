"""HTTP shapes of key management."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.core.names import KEY_PATTERN, NAME_PATTERN, key_problem

# What app.auth.service.validate_pattern and validate_scopes accept, for the OpenAPI document.
# The capability names are the registry's: app.core.http.openapi writes them into this pattern.
SCOPE_PATTERN = r"^((CAPABILITY|\*):(read|write|\*)|namespace:admin)$"
NAMESPACE_GRANT_PATTERN = rf"^(\*|{NAME_PATTERN[1:-1]}|[A-Za-z0-9][A-Za-z0-9_.-]{{0,126}}\*)$"


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: str = Field(
        max_length=129, json_schema_extra={"pattern": NAMESPACE_GRANT_PATTERN}, description="Exact namespace, a prefix ending in `*`, or `*`.", examples=["team-*"]
    )
    scopes: list[Annotated[str, Field(json_schema_extra={"pattern": SCOPE_PATTERN})]] = Field(
        min_length=1, max_length=32, fail_fast=True, description="CAP:ACTION; CAP a capability this gateway serves or *; "
        "ACTION in read, write, * (write includes read); or namespace:admin (export and import the whole namespace).", examples=[["kv:write", "vectors:read"]],
    )
    description: str = Field(
        default="", max_length=500, json_schema_extra={"pattern": KEY_PATTERN}, examples=["memory plugin, production"]
    )

    @field_validator("description")
    @classmethod
    def _plain_text(cls, value: str) -> str:
        # No control characters or lone surrogates: PostgreSQL's text refuses a NUL (a 500
        # there, stored on SQLite), and a key's description is shown to operators as a line.
        if value and key_problem(value, max_bytes=4 * 500):
            raise ValueError("must be UTF-8 text without control characters")
        return value


class KeyRead(BaseModel):
    key_id: str = Field(examples=["3f9a1c2b4d5e6f70"])
    namespace: str
    scopes: list[str]
    description: str
    created_at: datetime
    revoked_at: datetime | None = None


class KeyCreated(KeyRead):
    key: str = Field(description="The secret: shown once, never again.", examples=["sgw_3f9a1c2b4d5e6f70_..."])
