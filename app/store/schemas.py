"""HTTP shapes of the store capability: LangGraph's operations (``GetOp``, ``PutOp``, ``SearchOp``,
``ListNamespacesOp``) as JSON, and the items they answer.

A LangGraph namespace travels as a list of labels; a label is 1 to ``store.max_label_bytes``
bytes of UTF-8 without ``.`` or NUL. Embeddings are computed by the client (``GatewayStore``) and
travel with the put (``vectors``: one per embedded field path) and the search (``query_vector``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from app.core.names import DocumentedKey
from app.core.numbers import MAX_LIST_ITEMS, StrictBool, StrictInt

MAX_LABELS = 256  # hard ceiling; `store.max_namespace_depth` is the limit checked
LABEL_PATTERN = r"^[^.\u0000]+$"
Label = Annotated[str, Field(min_length=1, max_length=1024, pattern=LABEL_PATTERN)]
Namespace = Annotated[
    list[Label],
    Field(max_length=MAX_LABELS, fail_fast=True, description="LangGraph's namespace: labels without `.`.", examples=[["users", "u1"]]),
]
Vector = Annotated[list[Annotated[float, Strict()]], Field(min_length=1, max_length=16000, fail_fast=True)]
Distance = Literal["cosine", "l2", "inner_product"]
Filter = Annotated[
    dict[str, Any] | None,
    Field(
        description="AND-ed conditions on value fields (dotted keys reach nested ones): a value (JSON equality) "
        "or operators `$eq $ne $gt $gte $lt $lte $in $nin $exists`, and `$and`/`$or`.",
        examples=[{"kind": "note", "score": {"$gte": 3}}],
    ),
]
Minutes = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VectorIn(_Body):
    """The embedding of one field path of the item's value."""

    field: str = Field(min_length=1, max_length=1024, description="The field path it embeds (LangGraph's).", examples=["text"])
    vector: Vector = Field(examples=[[0.1, 0.2, 0.3]])


class GetOp(_Body):
    op: Literal["get"]
    namespace: Namespace
    key: DocumentedKey
    refresh_ttl: StrictBool = Field(default=False, description="Restart the item's TTL (if it has one).")


class PutOp(_Body):
    """Store ``value`` under (namespace, key), replacing the item and its vectors; ``value`` null deletes."""

    op: Literal["put"]
    namespace: Namespace
    key: DocumentedKey
    value: dict[str, Any] | None = Field(description="A JSON object; null deletes the item.", examples=[{"text": "likes tea"}])
    ttl: Minutes | None = Field(default=None, description="Minutes until the item expires (each refresh restarts it).")
    vectors: list[VectorIn] | None = Field(
        default=None, max_length=MAX_LIST_ITEMS, fail_fast=True,
        description="The item's embeddings, one per field path; the item is found by a query search only through these.",
    )


class SearchOp(_Body):
    """Items under ``namespace_prefix``: with ``query_vector`` by similarity of their best field
    (items without a vector of that size after the others, score null), otherwise most recently
    updated first."""

    op: Literal["search"]
    namespace_prefix: Namespace = Field(default_factory=list)
    filter: Filter = None
    limit: StrictInt = Field(default=10, ge=1)
    offset: StrictInt = Field(default=0, ge=0)
    query_vector: Vector | None = Field(default=None, description="The query's embedding (computed by the client).")
    distance: Distance = Field(default="cosine", description="How similarity is measured (score: 1 - cosine distance, -l2, inner product).")
    refresh_ttl: StrictBool = False


class MatchCondition(_Body):
    match_type: Literal["prefix", "suffix"]
    path: Annotated[list[Label], Field(max_length=MAX_LABELS, fail_fast=True, description="Labels; `*` matches any one label.")]


class ListNamespacesOp(_Body):
    op: Literal["list_namespaces"]
    match_conditions: list[MatchCondition] = Field(default_factory=list, max_length=8, fail_fast=True)
    max_depth: StrictInt | None = Field(default=None, ge=1, description="Namespaces longer than this are cut to it (and deduplicated).")
    limit: StrictInt = Field(default=100, ge=1)
    offset: StrictInt = Field(default=0, ge=0)


Op = Annotated[GetOp | PutOp | SearchOp | ListNamespacesOp, Field(discriminator="op")]
ReadOp = Annotated[GetOp | SearchOp | ListNamespacesOp, Field(discriminator="op")]


class BatchRequest(_Body):
    """Operations answered in order, in one transaction."""

    ops: list[Op] = Field(min_length=1, max_length=MAX_LIST_ITEMS, fail_fast=True)
    omit_expired: StrictBool = Field(
        default=False, description="Leave out items whose TTL has passed but which the sweep has not deleted yet."
    )

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"ops": [
            {"op": "put", "namespace": ["users", "u1"], "key": "prefs", "value": {"theme": "dark"}},
            {"op": "get", "namespace": ["users", "u1"], "key": "prefs"},
        ]}]},
    )


class ReadRequest(_Body):
    """Read operations answered in order (a key with `store:read` may send them)."""

    ops: list[ReadOp] = Field(min_length=1, max_length=MAX_LIST_ITEMS, fail_fast=True)
    omit_expired: StrictBool = False


class GetRequest(_Body):
    """Gets alone, answered in order in one statement (a key with `store:read` may send them)."""

    ops: list[GetOp] = Field(min_length=1, max_length=MAX_LIST_ITEMS, fail_fast=True)
    omit_expired: StrictBool = False


class ItemRead(BaseModel):
    namespace: list[str]
    key: str
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    score: float | None = Field(default=None, description="Search with a query only: the best field's similarity.")


class BatchResults(BaseModel):
    """One result per operation, in order: an item or null (get), null (put), a list of items
    (search), a list of namespaces (list_namespaces)."""

    results: list[ItemRead | list[ItemRead] | list[list[str]] | None]


class SubtreeDelete(_Body):
    """Delete every item whose namespace starts with ``prefix`` (all of them: an empty prefix)."""

    prefix: Namespace


class Deleted(BaseModel):
    deleted: int = Field(description="Items deleted by this request.")
    done: bool = Field(description="False when more remain: send the request again.")


