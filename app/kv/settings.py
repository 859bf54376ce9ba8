"""Settings of the kv capability (``kv:`` in the gateway's settings)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class KvSettings(BaseModel):
    """Key-value entries: expiry and its background sweep."""

    model_config = ConfigDict(extra="forbid")

    sweep_interval_seconds: float = Field(
        default=60.0, gt=0, description="How often expired kv entries are deleted in the background."
    )
    sweep_batch: int = Field(default=1000, ge=1, description="Most expired entries deleted per statement.")
    max_ttl_seconds: int = Field(default=10 * 365 * 24 * 3600, ge=1, description="Largest `ttl_seconds`.")
