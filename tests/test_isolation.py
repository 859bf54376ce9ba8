"""The isolation matrix: every /v1 endpoint, with keys for the wrong namespace, read-only keys and none.

For each capability a gateway serves, namespace B is seeded with its sample data
(``Capability.samples``); every operation of the capability that the OpenAPI document lists is
then sent at B with (1) a key for namespace A, (2) a read-only key for B, (3) no key. B's data
must be exactly the same afterwards: as the API answers it (the samples' snapshot), and row for
row in every table the capability declares (``Capability.tables``). Which operations only read
is the document's ``x-required-scope``; which capabilities exist is the registry's
(``app.capabilities``, and what the gateway serves besides).
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from sqlalchemy import select

from app.core.capability import Capability
from app.quotas.tables import RESERVED
from app.core.db.databases import Databases
from app.portability.router import ROUTES as NAMESPACE_ROUTES
from tests.conftest import Backend, Server
from tests.test_migrations import settings_for


def operations(spec: dict[str, Any], capability: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path template, operation) of every namespaced operation (of ``capability``)."""
    prefix = "/v1/{namespace}/" + (f"{capability}" if capability else "")
    ops = []
    for path, item in spec["paths"].items():
        if not path.startswith(prefix) or (capability and path[len(prefix):][:1] not in ("", "/")):
            continue
        for method, op in item.items():
            if method in ("get", "put", "post", "patch", "delete", "head"):
                ops.append((method.upper(), path, op))
    return ops


def is_read(op: dict[str, Any]) -> bool:
    scope = op["x-required-scope"]
    assert scope.endswith((":read", ":write")), scope
    return scope.endswith(":read")


def request_for(
    method: str, template: str, op: dict[str, Any], namespace: str, params: dict[str, str]
) -> dict[str, Any]:
    path = template.replace("{namespace}", namespace)
    for name, value in params.items():
        path = path.replace("{" + name + "}", value)
    path = re.sub(r"\{[a-z_]+\}", "x1", path)  # parameters the samples do not name
    kwargs: dict[str, Any] = {"method": method, "url": path}
    content = op.get("requestBody", {}).get("content", {})
    if "multipart/form-data" in content:
        kwargs["files"] = {"file": ("x.bin", b"evil", "application/octet-stream")}
    elif "application/json" in content:
        kwargs["json"] = {}
    elif method in ("PUT", "POST", "PATCH"):
        kwargs["content"] = b"evil"
    return kwargs


async def make_key(http: httpx.AsyncClient, namespace: str, *scopes: str) -> str:
    r = await http.post("/v1/admin/keys", json={"namespace": namespace, "scopes": list(scopes)})
    assert r.status_code == 201, r.text
    return r.json()["key"]


async def stored_rows(backend: Backend, capabilities: tuple[Capability[Any], ...], ns: str) -> dict[str, list[Any]]:
    """Every row of ``ns`` in every table the capabilities declare, as stored."""
    databases = Databases.open(settings_for(backend))
    out: dict[str, list[Any]] = {}
    try:
        for capability in capabilities:
            async with databases.engine(capability.database).connect() as conn:
                for table in capability.tables:
                    query = select(table).where(table.c.namespace == ns).order_by(*table.primary_key.columns)
                    out[table.name] = [tuple(row) for row in await conn.execute(query)]
    finally:
        await databases.close()
    return out


async def test_isolation_matrix(
    server: Server, http: httpx.AsyncClient, namespace: str, backend: Backend, capability: Capability[Any]
) -> None:
    """Refusals of every operation of ``capability`` at namespace B change nothing of B's."""
    samples = capability.samples_for("seed", "snapshot")
    ns_a, ns_b = f"{namespace}a", f"{namespace}b"
    for ns in (ns_a, ns_b):
        await samples.seed(http, ns)
    before = await samples.snapshot(http, ns_b)
    rows_before = await stored_rows(backend, (capability,), ns_b)
    empty = [table for table, rows in rows_before.items() if not rows]
    assert not empty, f"the samples' seed of {capability.name!r} writes no row in {empty}: make it touch every table"
    spec = (await http.get("/openapi.json")).json()
    served = {template.split("/")[3] for _, template, _ in operations(spec)}
    # no route outside a registered capability, but the gateway's own: /v1/{namespace}/usage
    # (tests/test_quotas.py) and the namespace's export and import (app.portability)
    assert served == {c.name for c in server.capabilities} | RESERVED | set(NAMESPACE_ROUTES), served
    ops = operations(spec, capability.name)
    assert ops, f"{capability.name!r} has no operation under /v1/{{namespace}}/{capability.name}"

    key_a = await make_key(http, ns_a, "*:*")
    reader_b = await make_key(http, ns_b, "*:read")
    async with (
        httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {key_a}"}) as as_a,
        httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {reader_b}"}) as as_reader,
        httpx.AsyncClient(base_url=server.url) as anonymous,
    ):
        for method, template, op in ops:
            req = request_for(method, template, op, ns_b, dict(samples.path_params))
            r = await as_a.request(**req)
            assert r.status_code == 403, (method, template, r.status_code, r.text)
            assert ns_b not in r.text.replace(req["url"], ""), "a refusal must not describe B's data"

            r = await anonymous.request(**req)
            assert r.status_code == 401, (method, template, r.status_code)

            r = await as_reader.request(**req)
            if is_read(op):
                assert r.status_code != 403, (method, template, r.text)
                assert r.status_code < 500
            else:
                assert r.status_code == 403, (method, template, r.status_code, r.text)
    assert await samples.snapshot(http, ns_b) == before
    assert await stored_rows(backend, (capability,), ns_b) == rows_before


async def test_same_names_in_two_namespaces_never_meet(
    http: httpx.AsyncClient, namespace: str, capability: Capability[Any]
) -> None:
    """Admin writes the same names in two namespaces; each reads back only its own."""
    samples = capability.samples_for("seed", "same_names")
    a, b = f"{namespace}a", f"{namespace}b"
    await samples.seed(http, a)
    await samples.seed(http, b)
    await samples.same_names(http, a, b)
