"""Settings of fair shares of the write path (``fairness:`` in the gateway's settings)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class FairnessSettings(BaseModel):
    """Fair shares of the write path between namespaces (``app.fairness.fairshare``)."""

    model_config = ConfigDict(extra="forbid")

    chunk_bytes: int = Field(
        default=1024 * 1024, ge=4096,
        description="Most bytes of rows one turn (transaction) of a heavy write writes: a thread copy on both backends; "
        "on SQLite also a prune, delete or retention sweep, whose turns let SQLite's write lock go to the single writes "
        "waiting (a row larger than this is a turn of its own; deleted bytes weigh an eighth).",
    )
    chunk_rows: int = Field(default=500, ge=1, description="Most rows one turn of a heavy write writes.")
    yield_seconds: float = Field(
        default=0.5, ge=0,
        description="How long a heavy write's turn gives way to single writes waiting for SQLite's write lock before "
        "it takes its turn anyway (so heavy writes advance under a flood of single writes).",
    )
    heavy_per_namespace: int = Field(
        default=2, ge=1,
        description="Heavy operations (thread copies) one namespace may run at once per process; more are answered "
        "429 with `Retry-After`.",
    )
