"""HTTP schemas of the vectors capability.

Vectors travel as JSON arrays of numbers or, more compactly, as base64 of little-endian float32
(``vector_b64``, ``vectors_b64``): a 500 x 384 batch is about 4x smaller that way and needs no
float parsing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from app.core.names import DocumentedKey
from app.core.numbers import MAX_LIST_ITEMS, FiniteFloat, StrictBool, StrictInt
from app.vectors.payload_index import FIELD_PATTERN, MAX_PAYLOAD_INDEXES, PayloadKind
from app.vectors.planner import PlanKind
from app.vectors.text import MAX_QUERY_TERMS, TextLanguage

StrictNumber = Annotated[float, Strict()]  # NaN/infinity: refused with the vector's own message
# Hard ceilings on request lists, so validation stops at the first element past them instead of
# collecting an error per element (the settings' own, lower limits are checked by the service).
MAX_VECTOR_LENGTH = 16000  # pgvector's largest vector
MAX_QUERY_CHARS = 10_000
Vector = Annotated[list[StrictNumber], Field(max_length=MAX_VECTOR_LENGTH, fail_fast=True)]
DistanceName = Literal["cosine", "l2", "ip"]
Filters = Annotated[
    dict[str, Any] | None,
    Field(
        description="AND-ed JSON-typed conditions on top-level payload keys; operators "
        "`$eq $ne $in $nin $gt $gte $lt $lte $exists`, `$and`/`$or`.",
        examples=[{"user_id": "u1", "n": {"$gte": 3}}],
    ),
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class IndexOptions(_Body):
    """How a collection is indexed (PostgreSQL; SQLite always searches exactly)."""

    kind: Literal["hnsw", "exact"] = Field(default="hnsw", description="`exact` skips the ANN index.")
    m: StrictInt | None = Field(default=None, ge=2, le=100, description="HNSW graph degree.")
    ef_construction: StrictInt | None = Field(default=None, ge=4, le=1000, description="HNSW build breadth; at least twice m (pgvector builds no other graph).")


class PayloadIndexCreate(_Body):
    """A payload field to index for filters: equality and ranges on it are served by a B-tree."""

    field: str = Field(pattern=FIELD_PATTERN, description="A top-level payload field.", examples=["user_id"])
    kind: PayloadKind = Field(description="The values indexed: keyword (strings), integer, float or bool.")


class SubgraphsRead(BaseModel):
    """A declared field's payload subgraphs (pgvector, described only)."""

    built: int = Field(description="Values with a ready subgraph (a partial HNSW index of their points).")
    building: int = Field(description="Subgraphs being built in the background.")


class PayloadIndexBuild(BaseModel):
    """A declared payload index's build (pgvector, described only)."""

    seconds: float | None = Field(default=None, description="How long its CREATE INDEX CONCURRENTLY took.")
    points: int | None = Field(default=None, description="The collection's points when it was built.")
    built_at: str | None = Field(default=None, description="When it was built (UTC).")
    phase: str | None = Field(default=None, description="A running build's phase (PostgreSQL's).")
    tuples_done: int | None = None
    tuples_total: int | None = None


class PayloadIndexRead(BaseModel):
    field: str
    kind: PayloadKind
    state: Literal["pending", "building", "ready", "failed"] = Field(
        description="pending (built in the background with the HNSW index once the collection is big and quiet; "
        "filters on the field are correct meanwhile), building, ready, or failed: PostgreSQL refused to build it "
        "from the stored values (`error` says which points to fix); filters on the field stay correct without it, "
        "the HNSW index and the other payload indexes are built regardless, and the build is tried again every "
        "five `index_sweep_seconds`. SQLite: made with the collection."
    )
    error: str | None = Field(default=None, description="Why a `failed` index could not be built; null otherwise.")
    build: PayloadIndexBuild | None = Field(
        default=None,
        description="pgvector: a `ready` index's build by the background builder (`seconds`, `points`, `built_at`), "
        "a `building` one's progress (`phase`, `tuples_done`, `tuples_total`); null otherwise (and on SQLite, "
        "where it is made with the table).",
    )
    subgraphs: SubgraphsRead | None = Field(
        default=None,
        description="Describe of a declared field of an HNSW collection (pgvector): its payload subgraphs, "
        "partial HNSW indexes of the values too common to compare exactly and too rare for the main graph "
        "(`hnsw_subgraph` plans); null elsewhere (SQLite has no graph).",
    )


class CollectionCreate(_Body):
    """Create a collection, or ensure it exists with these settings."""

    vector_size: StrictInt = Field(ge=1, description="Dimension of every vector.", examples=[384])
    distance: DistanceName = Field(default="cosine", description="cosine, l2 or ip (inner product).")
    index: IndexOptions | None = Field(default=None, description="Index options (defaults from settings).")
    text_field: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Payload field indexed for full text (a string, or a list of strings); searches with a `query` "
        "then fuse both rankings. Its text is split into terms as on every backend: NFKC, case folded, runs of letters "
        "and digits, each stemmed by `text_language`'s Snowball stemmer; ranked by BM25 (k1 1.2, b 0.75).",
        examples=["text"],
    )
    text_language: TextLanguage | None = Field(
        default=None,
        description="The Snowball stemmer of the text field's terms and queries (default english; `none`: words as "
        "they are). Needs `text_field`; fixed at creation.",
        examples=["english"],
    )
    payload_indexes: list[PayloadIndexCreate] | None = Field(
        default=None,
        max_length=MAX_PAYLOAD_INDEXES,
        fail_fast=True,
        description="Payload fields to index for filtered search (each field once).",
        examples=[[{"field": "user_id", "kind": "keyword"}]],
    )

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"vector_size": 384, "distance": "cosine", "text_field": "text",
                                         "payload_indexes": [{"field": "user_id", "kind": "keyword"}]}]},
    )


class CalibrationRead(BaseModel):
    """The recall calibration of a collection's HNSW graph: sampled points searched exactly and
    through the graph at growing ``ef_search`` until the mean recall@k reaches the target."""

    ef_search: int = Field(
        description="The smallest measured ef_search that reached the target (else the smallest with the best "
        "recall measured); searches use it when it is above the size rule's."
    )
    recall: float = Field(description="The mean recall@k measured at that ef_search.")
    target_recall: float = Field(description="`vectors.target_recall` when measured.")
    points: int = Field(description="The collection's size when measured (measured again at twice or half of it).")
    queries: int = Field(description="Sampled points searched.")
    k: int = Field(description="Results per search compared.")
    seconds: float = Field(description="How long the measurement took.")


class IndexRead(BaseModel):
    kind: Literal["hnsw", "hnsw_halfvec", "exact"] = Field(
        description="hnsw; hnsw_halfvec (half-precision index above 2000 dims); exact (no ANN index)."
    )
    m: int | None = None
    ef_construction: int | None = None
    ef_search: int | None = Field(
        default=None,
        description="Search breadth of an unfiltered search of 10 at the collection's size (describe; lists: "
        "without the growth): `vectors.ef_search` grown with the collection, or the calibrated one when larger.",
    )
    calibration: CalibrationRead | None = Field(
        default=None,
        description="Describe of a ready HNSW index (pgvector): what the recall calibration of its graph measured; "
        "null before one, and where there is no graph (SQLite, exact collections: searches are exact).",
    )
    backend: str = Field(description="pgvector or sqlite-vec.", examples=["pgvector"])
    state: Literal["pending", "building", "ready", "exact"] = Field(
        description="exact: searched exactly, no ANN index (SQLite, kind exact). HNSW kinds: pending (not "
        "built yet: fewer than vectors.index_min_rows points, or writes not quiet yet; searches are exact), "
        "building (a background build is running), ready (searches use the index).",
        examples=["ready"],
    )
    progress: dict[str, Any] | None = Field(
        default=None,
        description="While an index is building (pgvector): its phase and tuples/blocks done and total.",
    )
    plans: dict[str, int] | None = Field(
        default=None,
        description="Describe only: searches of this collection by plan (exact_scan, filter_first, hnsw, "
        "hnsw_iterative, hnsw_subgraph; `fallback`: graph searches redone exactly), counted by the worker that answered "
        "since it started.",
    )


class CollectionRead(BaseModel):
    """A collection's settings (and, when described, its size)."""

    collection: str = Field(examples=["memories"])
    vector_size: int = Field(examples=[384])
    distance: DistanceName
    text_field: str | None = None
    text_language: str | None = Field(default=None, description="The stemmer of the text field (null without one).")
    index: IndexRead
    payload_indexes: list[PayloadIndexRead] = Field(default_factory=list)
    count: int | None = Field(default=None, description="Number of points (describe only).")
    created_at: datetime


class CollectionPage(BaseModel):
    items: list[CollectionRead]
    next_cursor: str | None = None


class PointWrite(_Body):
    """One point: `vector` or `vector_b64`, an optional id (generated when absent) and payload."""

    id: str | None = Field(default=None, description="Point id (1-1024 bytes); generated when absent.")
    vector: Vector | None = Field(default=None, examples=[[0.1, 0.2, 0.3]])
    vector_b64: str | None = Field(default=None, description="base64 of little-endian float32.")
    payload: dict[str, Any] | None = Field(
        default=None, examples=[{"user_id": "u1", "text": "hello"}],
        description="A JSON object. Integers must fit in 64 bits, as in filters (store a larger one as a string); "
                    "numbers read back as sent, but -0.0 as 0.0.",
    )


class PointsUpsert(_Body):
    """A batch of points, as a list of `points` or as parallel lists (`vectors`/`vectors_b64`,
    `payloads`, `ids`) whose lengths must match."""

    points: list[PointWrite] | None = Field(default=None, max_length=MAX_LIST_ITEMS, fail_fast=True)
    vectors: list[Vector] | None = Field(default=None, max_length=MAX_LIST_ITEMS, fail_fast=True)
    vectors_b64: list[str] | None = Field(
        default=None, max_length=MAX_LIST_ITEMS, fail_fast=True,
        description="The vectors of the batch, each as base64 of little-endian float32.",
    )
    payloads: list[dict[str, Any] | None] | None = Field(default=None, max_length=MAX_LIST_ITEMS, fail_fast=True)
    ids: list[DocumentedKey | None] | None = Field(default=None, max_length=MAX_LIST_ITEMS, fail_fast=True)

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [{"required": [name], "properties": {name: {"type": "array"}}} for name in ("points", "vectors", "vectors_b64")],
            "examples": [{"points": [{"id": "p1", "vector": [0.1, 0.2, 0.3], "payload": {"user_id": "u1"}}]}]
        },
    )


class PointsUpserted(BaseModel):
    ids: list[str] = Field(description="The id of every point, in request order.")


class PointUpdate(_Body):
    """New vector and/or payload; a field left out or null keeps the stored one."""

    vector: Vector | None = None
    vector_b64: str | None = None
    payload: dict[str, Any] | None = None


class PointRead(BaseModel):
    id: str
    payload: dict[str, Any] = Field(default_factory=dict)
    vector: list[float] | None = None
    vector_b64: str | None = None


class PointPage(BaseModel):
    items: list[PointRead]
    next_cursor: str | None = Field(
        default=None,
        description="Pass as `cursor` for the next page (a page may hold fewer than `limit` points and still have one: "
        "it also ends at `limits.max_page_bytes` of payloads and vectors).",
    )


class SearchRequest(_Body):
    """Nearest points to `vector` among those matching `filters`."""

    vector: Vector | None = None
    vector_b64: str | None = Field(default=None, description="The query vector as base64 float32.")
    query: str | None = Field(
        default=None, max_length=MAX_QUERY_CHARS,
        description=f"Text for hybrid search (needs a text_field): its first {MAX_QUERY_TERMS} distinct terms "
        "(split and stemmed as the text field's) are ranked by BM25 and fused with the vector ranking.",
    )
    fusion: Literal["rrf", "weighted"] = Field(
        default="rrf",
        description="How a hybrid search fuses its halves: `rrf`, the sum of 1/(60 + rank) over the halves; `weighted`, "
        "alpha * v + (1 - alpha) * t, v the vector score min-max normalised over the candidates, t the BM25 score "
        "over the best candidate's.",
    )
    alpha: FiniteFloat | None = Field(
        default=None, ge=0, le=1,
        description="The vector half's weight in `weighted` fusion (default 0.5): 1 ranks by the vector alone, 0 by the "
        "text alone (ties to the nearer point).",
    )
    limit: StrictInt = Field(default=10, ge=1, description="Most results (at most limits.max_page_size).")
    filters: Filters = None
    score_threshold: FiniteFloat | None = Field(default=None, description="Drop results whose vector score is lower.")
    ef_search: StrictInt | None = Field(
        default=None, ge=1, le=1000, description="HNSW search breadth (pgvector); default: chosen by the planner."
    )
    explain: StrictBool = Field(
        default=False,
        description="Answer with the `plan` the search ran, and (hybrid) each hit's `debug`: its rank and score on each half.",
    )
    with_vectors: StrictBool = Field(
        default=False,
        description="Answer every hit with its stored vector (e.g. for maximal marginal relevance): `vector`, or "
        "`vector_b64` with `vector_format: b64`. At most `limits.max_page_bytes` of vectors per answer, counted as "
        "`limit` x `vector_size` x 6 bytes (b64) or 24 (json); more is a 422.",
    )
    vector_format: Literal["json", "b64"] = Field(
        default="json", description="How `with_vectors` answers the vectors: JSON numbers or base64 float32."
    )

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"vector": [0.1, 0.2, 0.3], "limit": 5, "filters": {"user_id": "u1"}}]},
    )


class HalfScore(BaseModel):
    rank: int | None = Field(description="The hit's rank in this half's ranking (1 is best); null: not among its candidates.")
    score: float = Field(description="Vector: the score a vector search gives. Text: the BM25 score (0: none of the terms).")
    normalised: float | None = Field(default=None, description="`weighted` fusion: the score as fused (0 to 1).")


class HybridDebug(BaseModel):
    """How a hybrid hit scored on each half (``explain``)."""

    fusion: Literal["rrf", "weighted"]
    vector: HalfScore
    text: HalfScore
    alpha: float | None = Field(default=None, description="`weighted` fusion: the vector half's weight.")


class SearchHit(BaseModel):
    id: str
    score: float = Field(
        description="Higher is better: 1-cosine distance, inner product, or -L2; hybrid: the fused score (rrf or weighted)."
    )
    distance: float = Field(description="The raw distance (-inner product for ip).")
    payload: dict[str, Any] | None = Field(
        default_factory=dict,
        description="null with `payload_omitted` for the hits past `limits.max_page_bytes` of payloads (nearest first).",
    )
    payload_omitted: bool = Field(
        default=False,
        description="The payload was left out: the answer's payloads reached `limits.max_page_bytes`. Read the point "
        "for it (the Python client does).",
    )
    vector: list[float] | None = Field(default=None, description="The stored vector (`with_vectors`, json).")
    vector_b64: str | None = Field(default=None, description="The stored vector (`with_vectors`, b64).")
    debug: HybridDebug | None = Field(default=None, description="A hybrid search with `explain`: how the hit scored on each half.")


class TextPlan(BaseModel):
    """What a hybrid search's text half did (``explain``)."""

    terms: list[str] = Field(description="The query's terms as searched (split, case folded and stemmed).")
    fusion: Literal["rrf", "weighted"]
    matched: int = Field(description="Points the text half ranked (at most its pool of candidates).")
    exact: int = Field(
        description="How many of them are proven BM25's exact top. All but where a PostgreSQL search of common "
        "terms scored only the points holding its rarer ones: then those whose score no other point can reach."
    )


class SearchPlan(BaseModel):
    """How a search ran (``explain``)."""

    kind: PlanKind = Field(
        description="exact_scan, filter_first (an index narrows the filter; exact), hnsw, hnsw_iterative "
        "(pgvector 0.8's iterative scan), hnsw_subgraph (the payload subgraph of a declared field's value)."
    )
    reason: str
    ef_search: int | None = None
    rows: int | None = Field(default=None, description="The collection's estimated size (pgvector).")
    estimated_matches: int | None = Field(default=None, description="The filter's estimated matches (corrected).")
    fallback: bool = Field(default=False, description="The graph search found too few matches and was redone exactly.")
    text: TextPlan | None = Field(default=None, description="A hybrid search: its text half.")
    candidates: int | None = Field(
        default=None, description="Graph candidates the filter was applied to (pgvector `hnsw`, `hnsw_subgraph`)."
    )
    estimate: Literal["statistics", "sample"] | None = Field(
        default=None, description="How the filter's share was estimated: ANALYZE's statistics of declared fields, or a "
        "block sample (pgvector)."
    )
    correction: float | None = Field(
        default=None, description="The factor this collection's earlier searches of the filter's shape taught the "
        "estimate (pgvector; null: none)."
    )
    graph_share: float | None = Field(default=None, description="The share of graph candidates expected to match.")
    max_scan_tuples: int | None = Field(default=None, description="The iterative walk's bound (`hnsw_iterative`).")
    costs: dict[str, float] | None = Field(
        default=None, description="Each plan considered, with its predicted milliseconds by this collection's "
        "measured costs (pgvector); the cheapest ran."
    )
    found_matches: int | None = Field(
        default=None, description="What the plan found: the filter's matches an exact plan compared, or those "
        "among a graph plan's candidates."
    )
    ms: float | None = Field(default=None, description="The plan's statements, as the gateway timed them.")


class SearchResults(BaseModel):
    results: list[SearchHit]
    plan: SearchPlan | None = None


class PointsList(_Body):
    filters: Filters = None
    limit: StrictInt | None = Field(default=None, ge=1)
    cursor: str | None = None
    with_vectors: StrictBool = False
    vector_format: Literal["json", "b64"] = "json"


class PointsDelete(_Body):
    """Delete the points in `ids`, or matching `filters` (both: those in `ids` that match). An empty
    filter (`{}`) matches every point: it empties the collection."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [  # as delete_points checks
        {"required": ["ids"], "properties": {"ids": {"type": "array"}}},
        {"required": ["filters"], "properties": {"filters": {"type": "object"}}},
    ]})

    ids: list[DocumentedKey] | None = Field(default=None, max_length=MAX_LIST_ITEMS, fail_fast=True)
    filters: Filters = None


class Deleted(BaseModel):
    deleted: int
