"""LangGraph Platform's store API, as ``langgraph-sdk`` (0.4.x) calls it, on the store capability.

Base URL per gateway namespace: ``/v1/{namespace}/store/langgraph`` (``get_client(url=...)``; the key
as ``x-api-key``, as the SDK sends it, or ``Authorization: Bearer``), with the scopes
``store:read`` / ``store:write``:

- ``PUT /store/items`` ``{namespace, key, value, index?, ttl?}``; ``GET /store/items?namespace=a.b&key=k``
  (200 with ``null`` when there is no such item, as the SDK expects); ``DELETE /store/items``
  with a JSON body; ``POST /store/items/search``; ``POST /store/namespaces``; ``GET /ok``.
- The gateway does not embed text (the client does: ``GatewayStore``). A put's ``index`` is not
  acted on; an extension field ``vectors`` may carry the item's embeddings. A search with a
  ``query`` needs ``query_vector``, the query's embedding: without one it is a 422 saying so.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import BackgroundTasks, Query, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from app.core.dependencies import NamespacePath, VectorsConnection
from app.core.errors import InvalidInput, PayloadTooLarge, ServiceUnavailable, problem_responses
from app.core.http.limits import Body, accepts
from app.core.names import KEY_PATTERN, DocumentedKey
from app.core.numbers import MAX_LIST_ITEMS, StrictBool, StrictInt
from app.store import schemas
from app.store.dependencies import StoreServiceDep
from app.store.router import router

# on the store's own router (one capability, one router, one gate), imported by app.store.capability
PREFIX = "/langgraph"

_ERRORS = problem_responses(InvalidInput, PayloadTooLarge, ServiceUnavailable)
JSON = "application/json"
DOTTED_LABELS = r"^([^.\u0000]+(\.[^.\u0000]+)*)?$"
NO_QUERY_VECTOR = (
    "a search with a query needs query_vector, the query's embedding: the gateway does not embed text "
    "(GatewayStore in storage_gateway_client embeds it on the client)"
)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _false(value: bool) -> bool:
    if value:
        raise ValueError("must be false or a list of field paths")
    return value


NotIndexed = Annotated[StrictBool, AfterValidator(_false), WithJsonSchema({"const": False})]
"""LangGraph's ``index=False`` (a JSON false, not ``0``)."""


class PlatformPut(_Body):
    namespace: schemas.Namespace
    key: DocumentedKey
    value: dict[str, Any] = Field(examples=[{"title": "My Document"}])
    index: NotIndexed | Annotated[list[str], Field(max_length=256, fail_fast=True)] | None = Field(
        default=None, description="LangGraph's; not acted on (the gateway does not embed text): send `vectors`."
    )
    ttl: schemas.Minutes | None = None
    vectors: list[schemas.VectorIn] | None = Field(
        default=None, max_length=MAX_LIST_ITEMS, fail_fast=True, description="Extension: the item's embeddings."
    )


class PlatformDelete(_Body):
    namespace: schemas.Namespace
    key: DocumentedKey


class PlatformSearch(_Body):
    namespace_prefix: schemas.Namespace = Field(default_factory=list)
    filter: schemas.Filter = None
    limit: StrictInt = Field(default=10, ge=1)
    offset: StrictInt = Field(default=0, ge=0)
    query: str | None = Field(default=None, max_length=10_000, description="Needs `query_vector`.")
    query_vector: schemas.Vector | None = Field(default=None, description="Extension: the query's embedding.")
    distance: schemas.Distance = "cosine"
    refresh_ttl: StrictBool | None = None


class PlatformNamespaces(_Body):
    prefix: Annotated[list[schemas.Label], Field(max_length=schemas.MAX_LABELS, fail_fast=True)] | None = None
    suffix: Annotated[list[schemas.Label], Field(max_length=schemas.MAX_LABELS, fail_fast=True)] | None = None
    max_depth: StrictInt | None = Field(default=None, ge=1)
    limit: StrictInt = Field(default=100, ge=1)
    offset: StrictInt = Field(default=0, ge=0)


class SearchItemsResponse(BaseModel):
    items: list[schemas.ItemRead]


class ListNamespaceResponse(BaseModel):
    namespaces: list[list[str]]


@router.get(f"{PREFIX}/ok", summary="Health (LangGraph Platform)", responses=_ERRORS)
async def ok(namespace: NamespacePath) -> Response:
    """`{"ok": true}`, as LangGraph Platform answers it (to a key allowed to read the namespace)."""
    return Response(b'{"ok":true}', media_type=JSON)


@router.put(f"{PREFIX}/store/items", summary="Put an item (LangGraph Platform)", status_code=204, responses=_ERRORS)
@accepts(Body.JSON)
async def put_item(
    body: PlatformPut, namespace: NamespacePath, conn: VectorsConnection, service: StoreServiceDep,
    background: BackgroundTasks,
) -> Response:
    """Store `value` under (namespace, key), with its `vectors` if sent."""
    # the service checks what the schemas do not (``construct``: the body is validated already)
    op = schemas.PutOp.model_construct(
        op="put", namespace=body.namespace, key=body.key, value=body.value, ttl=body.ttl, vectors=body.vectors
    )
    outcome = await service.run(conn, namespace, service.check([op]), False, writes=True)
    if outcome.new_dims:
        background.add_task(service.dims_committed, outcome.new_dims)
    return Response(status_code=204)


@router.get(f"{PREFIX}/store/items", summary="Get an item (LangGraph Platform)", responses=_ERRORS)
async def get_item(
    namespace: NamespacePath, conn: VectorsConnection, service: StoreServiceDep, background: BackgroundTasks,
    key: Annotated[str, Query(min_length=1, max_length=1024, pattern=KEY_PATTERN, description="The item's key.")],
    item_namespace: Annotated[
        str, Query(alias="namespace", max_length=4096, pattern=DOTTED_LABELS, description="Labels joined by `.`.")
    ] = "",
    refresh_ttl: Annotated[bool, Query()] = False,
) -> Response:
    """The item, or `null` when there is none."""
    labels = item_namespace.split(".") if item_namespace else []
    op = schemas.GetOp.model_construct(op="get", namespace=labels, key=key, refresh_ttl=refresh_ttl)
    outcome = await service.run(conn, namespace, service.check([op]), False, writes=False)
    if outcome.refresh:
        background.add_task(service.refresh_after, namespace, outcome.refresh)
    return Response(orjson.dumps(outcome.results[0]), media_type=JSON)


@router.delete(f"{PREFIX}/store/items", summary="Delete an item (LangGraph Platform)", status_code=204, responses=_ERRORS)
@accepts(Body.JSON)
async def delete_item(body: PlatformDelete, namespace: NamespacePath, conn: VectorsConnection, service: StoreServiceDep) -> Response:
    """Delete the item; 204 whether or not it existed."""
    op = schemas.PutOp.model_construct(op="put", namespace=body.namespace, key=body.key, value=None, ttl=None, vectors=None)
    await service.run(conn, namespace, service.check([op]), False, writes=True)
    return Response(status_code=204)


@router.post(f"{PREFIX}/store/items/search", summary="Search items (LangGraph Platform)", response_model=SearchItemsResponse, responses=_ERRORS)
@accepts(Body.JSON, read_only=True)
async def search_items(
    body: PlatformSearch, namespace: NamespacePath, conn: VectorsConnection, service: StoreServiceDep,
    background: BackgroundTasks,
) -> Response:
    """Items under `namespace_prefix` matching `filter`; with `query` (and `query_vector`) by similarity."""
    if body.query and body.query_vector is None:
        raise InvalidInput("query_vector", NO_QUERY_VECTOR)
    op = schemas.SearchOp.model_construct(
        op="search", namespace_prefix=body.namespace_prefix, filter=body.filter, limit=body.limit, offset=body.offset,
        query_vector=body.query_vector if body.query else None, distance=body.distance, refresh_ttl=bool(body.refresh_ttl),
    )
    outcome = await service.run(conn, namespace, service.check([op]), False, writes=False)
    if outcome.refresh:
        background.add_task(service.refresh_after, namespace, outcome.refresh)
    return Response(orjson.dumps({"items": outcome.results[0]}), media_type=JSON)


@router.post(f"{PREFIX}/store/namespaces", summary="List namespaces (LangGraph Platform)", response_model=ListNamespaceResponse, responses=_ERRORS)
@accepts(Body.JSON, read_only=True)
async def list_namespaces(body: PlatformNamespaces, namespace: NamespacePath, conn: VectorsConnection, service: StoreServiceDep) -> Response:
    """Namespaces matching `prefix` and `suffix` (`*`: any one label), cut to `max_depth`."""
    conditions = []
    if body.prefix:
        conditions.append(schemas.MatchCondition(match_type="prefix", path=body.prefix))
    if body.suffix:
        conditions.append(schemas.MatchCondition(match_type="suffix", path=body.suffix))
    op = schemas.ListNamespacesOp.model_construct(
        op="list_namespaces", match_conditions=conditions, max_depth=body.max_depth, limit=body.limit, offset=body.offset,
    )
    outcome = await service.run(conn, namespace, service.check([op]), False, writes=False)
    return Response(orjson.dumps({"namespaces": outcome.results[0]}), media_type=JSON)
