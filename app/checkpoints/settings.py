"""Settings of the checkpoints capability (``checkpoints:`` in the gateway's settings)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CheckpointsSettings(BaseModel):
    """LangGraph checkpoints: sizes per request and the retention sweep."""

    model_config = ConfigDict(extra="forbid")

    max_blob_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1, description="Largest checkpoint, channel value or pending write (typed bytes)."
    )
    max_metadata_bytes: int = Field(default=64 * 1024, ge=2, description="Largest checkpoint metadata (JSON).")
    max_checkpoint_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1, le=2**60,
        description="Most stored bytes of one checkpoint with its metadata, channel versions and the channel values "
        "it references (a put that would make more is a 413 and stores nothing).",
    )
    max_pending_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1, le=2**60,
        description="Most stored bytes of the pending writes of one checkpoint (a put of writes that would make "
        "more is a 413 and stores nothing).",
    )
    max_copy_bytes: int = Field(
        default=256 * 1024 * 1024, ge=1, le=2**60,
        description="Most stored bytes of a thread one copy writes again: every row it writes whole (checkpoints' bytes "
        "and JSON, values, pending writes and, on SQLite, metadata filter terms, with their keys and identifiers, and 256 "
        "bytes a row); copying a larger thread is a 413 and copies nothing.",
    )
    max_page_bytes: int = Field(
        default=32 * 1024 * 1024, ge=2, le=2**61,
        description="A read answers at most this many stored bytes: a search (list) page ends before the checkpoint "
        "that would make its checkpoints, with their channel values and pending writes, weigh more (`next_cursor` "
        "goes on). At least `max_checkpoint_bytes` + `max_pending_bytes` (which, left unset, are at most half of it each), "
        "so that every checkpoint written can be read.",
    )
    sweep_interval_seconds: float = Field(
        default=60.0, gt=0, description="How often checkpoint retention (keep latest N, idle TTL) is applied."
    )
    sweep_batch: int = Field(default=100, ge=1, description="Most threads one retention statement batch handles.")

    @model_validator(mode="after")
    def _a_checkpoint_fits_a_page(self) -> CheckpointsSettings:
        # write limits left at their defaults fit a smaller page: half of it each
        for name in ("max_checkpoint_bytes", "max_pending_bytes"):
            if name not in self.model_fields_set:
                setattr(self, name, min(getattr(self, name), max(1, self.max_page_bytes // 2)))
        if self.max_checkpoint_bytes + self.max_pending_bytes > self.max_page_bytes:
            raise ValueError(
                "max_page_bytes must be at least max_checkpoint_bytes + max_pending_bytes (a checkpoint written "
                "could not be read)"
            )
        return self
