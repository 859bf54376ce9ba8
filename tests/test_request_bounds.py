"""A request body's lists and dicts stop validating at their first invalid item.

Pydantic collects an error for every invalid item of a container (one per branch of a union:
four for a checkpoint filter's scalar), and FastAPI copies each. A 5 MB body of 100,000 invalid
pending writes was 400,000 errors: 0.8 s of validation and 3.6 s of copying them, on the event
loop, and about 1 GB; a search filter of a million invalid entries, about 30 s and 5 GB. Every
container a body can hold is therefore ``fail_fast`` (its first invalid item is the 422), unless
nothing in it can fail (``dict[str, Any]``: JSON keys are text).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter

from app.core.http.bodies import body_models
from app.core.http.routing import api_routes
from app.main import create_app

CONTAINERS = ("list", "dict", "set", "frozenset", "tuple")


def _request_models() -> dict[str, Any]:
    """Every request body type of the app's routes, by route."""
    app = create_app()
    found: dict[str, Any] = {f"json_body {name}": model for name, model in body_models.items()}
    for route in api_routes(app.router.routes):
        contexts = [route] if isinstance(route, APIRoute) else list(getattr(route, "effective_route_contexts", list)())
        for context in contexts:
            for param in context.dependant.body_params:
                found[f"{sorted(context.methods)} {context.path_format} {param.name}"] = param.field_info.annotation
    return found


def _containers(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if node.get("type") in CONTAINERS:
            yield path, node
        for key, value in node.items():
            yield from _containers(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _containers(value, f"{path}[{i}]")


def _cannot_fail(container: dict[str, Any]) -> bool:
    items = container.get("items_schema") or container.get("values_schema") or {"type": "any"}
    keys = container.get("keys_schema") or {"type": "str"}
    return items.get("type") == "any" and keys == {"type": "str"} or keys.get("type") == "any"


def test_every_request_container_stops_at_its_first_invalid_item() -> None:
    models = _request_models()
    assert len(models) >= 10 and any("checkpoints/search" in where for where in models)
    slow = []
    for where, model in models.items():
        if model is None or (isinstance(model, type) and not issubclass(model, BaseModel)):
            continue
        for path, container in _containers(TypeAdapter(model).core_schema):
            if container.get("fail_fast") is not True and not _cannot_fail(container):
                slow.append(f"{where}: {path}")
    assert slow == []


def test_the_container_check_sees_a_container_that_does_not_stop() -> None:
    class Body(BaseModel):
        names: list[int]
        free: dict[str, Any]

    found = [p for p, c in _containers(TypeAdapter(Body).core_schema) if c.get("fail_fast") is not True and not _cannot_fail(c)]
    assert found == ["/schema/fields/names/schema"]


def _errors(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 422, r.text[:500]
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert "more)" not in problem["detail"], problem["detail"][:300]  # every error is listed: a few
    return problem["errors"]  # type: ignore[no-any-return]


N = 50_000  # within the body's shape limits (limits.max_json_containers: 100,000)


@pytest.mark.parametrize(("method", "path", "body", "offender"), [
    ("POST", "checkpoints/writes",
     {"thread_id": "t", "checkpoint_id": "c", "task_id": "x", "writes": [{"idx": "x", "channel": 1, "type": 1, "data": 1}] * N},
     "writes.0"),
    ("POST", "checkpoints/search", {"filter": {f"k{i}": [] for i in range(N)}}, "filter.k0"),
    ("POST", "checkpoints/prune", {"thread_ids": [[]] * N}, "thread_ids.0"),
    ("POST", "records/c", {"records": [{"key": 1, "value": 1}] * N}, "records.0"),
    ("POST", "vectors/c/points", {"points": [{"id": True, "vector": "x"}] * N}, "points.0"),
    ("POST", "vectors/c/points", {"vectors": [["x"] * 10] * (N // 2)}, "vectors.0.0"),
    ("POST", "vectors/c/search", {"vector": ["x"] * 16_000, "limit": 1}, "vector.0"),
])
async def test_a_body_of_many_invalid_items_is_one_item_of_errors(
    http: httpx.AsyncClient, namespace: str, method: str, path: str, body: dict[str, Any], offender: str
) -> None:
    r = await http.request(method, f"/v1/{namespace}/{path}", content=json.dumps(body).encode(),
                           headers={"content-type": "application/json"})
    errors = _errors(r)
    assert 1 <= len(errors) <= 4, errors  # the first invalid item's (a union's branches at most)
    assert all(".".join(e["loc"][1:]).startswith(offender) for e in errors), errors
