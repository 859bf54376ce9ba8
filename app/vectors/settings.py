"""Settings of the vectors capability (``vectors:`` in the gateway's settings)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class VectorsSettings(BaseModel):
    """Defaults of the vectors capability (each collection may override the index options)."""

    model_config = ConfigDict(extra="forbid")

    max_collections_per_namespace: int = Field(
        default=1000, ge=1,
        description="Collections one namespace may hold (each is a table with its indexes); creating one more is 409 "
        "`too_many_collections`.",
    )
    hnsw_m: int = Field(default=16, ge=2, le=100, description="HNSW graph degree (pgvector `m`).")
    hnsw_ef_construction: int = Field(default=128, ge=4, le=1000, description="HNSW build breadth; at least twice hnsw_m.")
    ef_search: int = Field(default=100, ge=1, le=1000, description="HNSW search breadth of an unfiltered query up to 100,000 points; "
        "the planner scales it with the collection (sqrt) and for filters, and raises it to a graph's calibrated one.")
    target_recall: float = Field(
        default=0.98, ge=0, le=1,
        description="Once a collection's HNSW graph is built (and when it has doubled or halved since), the builder "
        "searches `calibration_queries` of its points exactly and through the graph, and its searches then use at "
        "least the smallest ef_search (40 to 1000) whose mean recall@10 reached this; 0: no calibration, and none "
        "kept by an earlier run is used (pgvector).",
    )
    calibration_queries: int = Field(
        default=50, ge=1, le=1000,
        description="Points sampled for a recall calibration; each costs one exact scan of the collection (pgvector).",
    )
    exact_search_threshold: int = Field(
        default=5000,
        ge=0,
        description="A filtered search expected to match at most this many points may compare them exactly "
        "instead of searching a graph, when that costs less by the collection's measured costs (pgvector).",
    )
    index_min_rows: int = Field(
        default=1000,
        ge=0,
        description="A collection gets its HNSW index (built in the background) once it holds this many points; "
        "below that, searches are exact (pgvector).",
    )
    index_quiet_seconds: float = Field(
        default=1.0,
        ge=0,
        description="The background HNSW build starts after a collection had no point writes for this long (pgvector).",
    )
    index_sweep_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How often collections whose HNSW index is missing or invalid are looked for (pgvector).",
    )
    index_build_memory_mb: int = Field(
        default=1024,
        ge=1,
        description="`maintenance_work_mem` of a background HNSW build; the graph should fit in it (pgvector).",
    )
    index_progress_log_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How often a running background index build logs its progress (pgvector).",
    )
    subgraph_max_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="A value of a declared payload field gets a payload subgraph (a partial HNSW index of its "
        "points, built in the background) when it holds more than `exact_search_threshold` points and at most "
        "this share of the collection; above it the main graph finds its matches cheaply (at 500,000 points "
        "and limit 10, from about 9%: twice limit / share candidates within the unfiltered ef_search) (pgvector).",
    )
    subgraph_max_count: int = Field(
        default=64,
        ge=0,
        le=1000,
        description="Most payload subgraphs per collection, the most common values first; 0: none (pgvector).",
    )
    idempotency_ttl_seconds: int = Field(default=86400, ge=60, description="How long Idempotency-Key answers are kept.")

    @model_validator(mode="after")
    def _buildable_graph(self) -> VectorsSettings:
        if self.hnsw_ef_construction < 2 * self.hnsw_m:  # pgvector refuses to build such a graph
            raise ValueError(
                f"vectors.hnsw_ef_construction ({self.hnsw_ef_construction}) must be at least twice vectors.hnsw_m "
                f"({2 * self.hnsw_m})"
            )
        return self
