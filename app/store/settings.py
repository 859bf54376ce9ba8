"""Settings of the store capability (``store:`` in the gateway's settings)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class StoreSettings(BaseModel):
    """LangGraph long-term memory (the store capability): sizes, TTL sweep and vector search."""

    model_config = ConfigDict(extra="forbid")

    max_namespace_depth: int = Field(default=16, ge=1, le=256, description="Most labels in an item's namespace.")
    max_label_bytes: int = Field(default=256, ge=1, description="Largest namespace label (UTF-8 bytes).")
    max_namespace_bytes: int = Field(
        default=1024, ge=1, le=1024, description="Largest namespace, its labels joined by `.` (UTF-8 bytes)."
    )
    max_ops: int = Field(default=1000, ge=1, description="Most operations in one batch request; more is 413.")
    max_vectors_per_item: int = Field(
        default=64, ge=1, description="Most embedded fields (vectors) one item may have; more is 413."
    )
    max_dimensions: int = Field(default=4096, ge=1, le=16000, description="Largest embedding size.")
    max_search_limit: int = Field(default=1000, ge=1, description="Largest `limit` of a search.")
    max_offset: int = Field(default=10_000, ge=0, description="Largest `offset` of a search or namespace listing.")
    max_ttl_minutes: float = Field(default=10 * 365 * 24 * 60, gt=0, description="Largest item TTL (minutes).")
    sweep_interval_seconds: float = Field(
        default=60.0, gt=0, description="How often expired items are deleted in the background."
    )
    sweep_batch: int = Field(default=1000, ge=1, description="Most expired items deleted per statement.")
    delete_batch: int = Field(
        default=10_000, ge=1, description="Most items one namespace-subtree delete or sweep request deletes (`done` says when all went)."
    )
    exact_search_threshold: int = Field(
        default=5000, ge=0,
        description="A query search over at most this many items compares them all exactly; above it the "
        "embedding size's HNSW index is searched, and exactly again when it finds too few (pgvector).",
    )
    index_min_vectors: int = Field(
        default=1000, ge=0,
        description="An embedding size gets its HNSW index (built in the background) once this many vectors have it (pgvector).",
    )
    index_sweep_seconds: float = Field(
        default=30.0, gt=0, description="How often embedding sizes without an HNSW index are looked for (pgvector)."
    )
    ef_search: int = Field(default=100, ge=1, le=1000, description="HNSW search breadth of a query search (pgvector).")
    insert_ef_construction: int = Field(
        default=64, ge=4, le=1000,
        description="HNSW candidates a vector written after its size's graph is built is linked from (pgvector's "
        "`ef_construction` of the index, set once the build with `vectors.hnsw_ef_construction` is done): LangGraph's 64 "
        "keeps a put as cheap as AsyncPostgresStore's; the bulk of the graph keeps the build's recall (pgvector).",
    )
