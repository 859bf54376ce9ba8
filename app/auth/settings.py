"""Settings of API keys and rate limits (``auth:`` in the gateway's settings)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator


class AuthSettings(BaseModel):
    """API keys: required by default; off only on loopback unless explicitly forced."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["required", "disabled"] = Field(
        default="required", description="`disabled` serves without keys (loopback only unless forced)."
    )
    admin_key: SecretStr | None = Field(
        default=None, description="A key allowed everything, including key management under /v1/admin/keys."
    )
    force_disabled_on_public_address: bool = Field(
        default=False, description="Allow mode=disabled on a non-loopback address (dangerous)."
    )
    rate_limit_per_second: float = Field(default=0.0, ge=0, description="Requests per second per key; 0 = off.")
    rate_limit_burst: int = Field(default=50, ge=1, description="Token bucket size for the rate limit.")
    namespace_rate_limit_per_second: float = Field(
        default=0.0, ge=0,
        description="Requests per second per namespace, whatever the key (the admin key aside), per process; 0 = off. "
        "A proxy in front enforces it across processes and replicas (docs/operations.md).",
    )
    namespace_rate_limit_burst: int = Field(default=100, ge=1, description="Token bucket size for the namespace rate limit.")
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="With mode=disabled, origins (`scheme://host[:port]`) besides the gateway's own whose browser "
        "pages may write; writes with any other `Origin` are 403.",
    )
    revocation_check_seconds: float = Field(
        default=1.0, gt=0, le=60,
        description="How often each process checks for revoked keys; a revoked key is refused everywhere within twice this.",
    )

    @field_validator("allowed_origins")
    @classmethod
    def _origins_normalized(cls, value: list[str]) -> list[str]:
        return [origin.strip().rstrip("/").lower() for origin in value]

    @field_validator("admin_key")
    @classmethod
    def _admin_key_strong(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters")
        return value
