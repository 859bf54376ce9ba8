"""Quotas over HTTP: a namespace's usage (``GET /v1/{namespace}/usage``, any read scope of the
namespace) and its own quotas (``/v1/admin/quotas``, the admin key only). The rules are
``app.quotas.usage``'s."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, FastAPI, Path, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from app.auth.dependencies import Admin
from app.quotas import usage as quotas
from app.core.dependencies import NamespacePath
from app.core.errors import Forbidden, InvalidInput, NotFound, Unauthorized, problem_responses
from app.core.http.limits import Body, accepts
from app.core.http.routing import GatedRoutes, Guard, copy_routes
from app.core.numbers import StrictInt
from app.quotas.usage import observe_usage
from app.core.state import gateway_state


class CapabilityUsage(BaseModel):
    items: int = Field(description="Items stored (entries, records, files, threads).")
    bytes: int = Field(description="Bytes stored (values, file sizes); 0 where a capability counts items only.")
    max_items: int | None = Field(description="The namespace's quota of items (its own, else the default); null: none.")
    max_bytes: int | None = Field(description="The namespace's quota of bytes; null: none.")


class UsageRead(BaseModel):
    namespace: str
    capabilities: dict[str, CapabilityUsage] = Field(description="By capability, for those that keep quotas.")


class QuotaWrite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # at most 2**62: a bound a JSON Schema validator reads exactly (2**63 - 1 is no float)
    max_bytes: StrictInt | None = Field(default=None, ge=0, le=2**62, description="null: the default.")
    max_items: StrictInt | None = Field(default=None, ge=0, le=2**62, description="null: the default.")


async def _usage(request: Request, namespace: str) -> UsageRead:
    state = gateway_state(request.app)
    found = await quotas.usage_of(state, namespace)
    for cap, u in found.items():
        observe_usage(namespace, cap, u.items, u.bytes)
    return UsageRead(namespace=namespace, capabilities={c: CapabilityUsage(**vars(u)) for c, u in found.items()})


usage_router = APIRouter(tags=["usage"], responses=problem_responses(Unauthorized, Forbidden))


@usage_router.get("/v1/{namespace}/usage", response_model=UsageRead, summary="A namespace's usage and quotas")
async def get_usage(request: Request, namespace: NamespacePath) -> UsageRead:
    """Items and bytes the namespace stores in each capability that keeps quotas, with its quotas.
    Any key of the namespace with a read (or write) scope of any capability may read it."""
    return await _usage(request, namespace)


router = APIRouter(prefix="/v1/admin/quotas", tags=["admin"], responses=problem_responses(Unauthorized, Forbidden))

CapabilityPath = Annotated[str, Path(pattern=r"^[a-z][a-z0-9_]{0,31}$", description="A capability that keeps quotas.")]


@router.get("/{namespace}", response_model=UsageRead, summary="A namespace's usage and quotas (admin)")
async def admin_usage(request: Request, _: Admin, namespace: NamespacePath) -> UsageRead:
    """What `GET /v1/{namespace}/usage` answers, for the admin."""
    return await _usage(request, namespace)


@router.post("/{namespace}", response_model=UsageRead, summary="Recount a namespace's usage now")
@accepts(Body.NONE)
async def reconcile(
    request: Request, _: Admin, namespace: NamespacePath,
    batch: Annotated[int, Query(ge=1, le=10_000, description="Rows a page of the recount reads.")] = quotas.RECOUNT_BATCH,
) -> UsageRead:
    """What the background reconciliation does for a few namespaces a round: recount this one's
    items and bytes from what it stores, a page of rows at a time at one snapshot, and correct
    its usage by the difference in one short write transaction per capability."""
    await quotas.reconcile_namespace(gateway_state(request.app), namespace, batch)
    return await _usage(request, namespace)


@router.put(
    "/{namespace}/{capability}", response_model=UsageRead, summary="Set a namespace's own quota",
    responses=problem_responses(InvalidInput, NotFound),
)
@accepts(Body.JSON)
async def put_quota(
    body: QuotaWrite, request: Request, _: Admin, namespace: NamespacePath, capability: CapabilityPath
) -> UsageRead:
    """The namespace's own quota in one capability (a null limit: the default). Usage may exceed a
    lowered quota: then writes that add are refused until enough is deleted."""
    await quotas.set_quota(gateway_state(request.app), namespace, capability, quotas.Limits(body.max_bytes, body.max_items))
    return await _usage(request, namespace)


@router.delete(
    "/{namespace}/{capability}", status_code=status.HTTP_204_NO_CONTENT, summary="Back to the default quota",
    responses=problem_responses(NotFound),
)
async def delete_quota(request: Request, _: Admin, namespace: NamespacePath, capability: CapabilityPath) -> Response:
    """Forget the namespace's own quota in the capability; the default applies again."""
    await quotas.set_quota(gateway_state(request.app), namespace, capability, None)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


class NamespaceRoutes(GatedRoutes):
    """Routes of the gateway's own under ``/v1/{namespace}/<name>`` (``usage``), exactly there."""

    def selects(self, parts: list[str]) -> bool:
        return len(parts) == 4 and parts[3] == self.name


def include_namespace_routes(app: FastAPI, name: str, router: APIRouter, guard: Guard) -> None:
    """Add ``router``'s routes (paths ``/v1/{namespace}/<name>``) behind a gate on ``name``."""
    routes = copy_routes(app, router, "")
    app.router.routes.append(NamespaceRoutes(name, routes, guard, gateway_state(app).settings))
