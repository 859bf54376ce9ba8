"""The plain path answers exactly as the fast paths do (``app.core.fast``), on both backends.

One script of kv, records, checkpoints, vectors and store requests (successes, conditions, pages,
404s, 412s, 422s) runs against the test server (every fast path on) and against a second server
on the same databases with ``fast_paths`` all off, each in a namespace of its own; every answer
(status, headers that say something, body) must be the same but for what names its namespace.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_KEY, Server, start_server, stop_server

PLAIN = {f"GATEWAY_FAST_PATHS__{piece}": "false" for piece in ("PLANS", "ONE_STATEMENT", "INLINE_SQLITE")}
VOLATILE = {"request_id", "instance", "created_at", "updated_at"}
KEPT_HEADERS = ("content-type", "etag", "location")


@pytest.fixture(scope="module")
def plain_server(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second gateway on the test server's (migrated) databases, every fast path off."""
    srv = start_server(server.backend, tmp_path_factory.mktemp("logs") / f"plain-{server.backend.name}.log", **PLAIN)
    yield srv
    stop_server(srv)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _checkpoint(n: int, step: int) -> dict[str, Any]:
    return {
        "thread_id": "t1", "checkpoint_id": f"1ef{n:05d}", "parent_checkpoint_id": f"1ef{n - 1:05d}" if n else None,
        "checkpoint": {"type": "msgpack", "data": _b64(bytes([n]) * 20)},
        "channel_versions": {"messages": f"{n:04d}"}, "metadata": {"source": "loop", "step": step},
        "blobs": [{"channel": "messages", "version": f"{n:04d}", "type": "msgpack", "data": _b64(b"m" * (n + 1))}],
    }


# (method, path under /v1/{namespace}/, JSON body or raw bytes, extra headers)
SCRIPT: list[tuple[str, str, Any, dict[str, str]]] = [
    # kv
    ("PUT", "kv/c/a", {"x": 1}, {}),
    ("GET", "kv/c/a", None, {}),
    ("PUT", "kv/c/a", {"x": 2}, {"If-Match": '"9"'}),
    ("PUT", "kv/c/a", {"x": 2}, {"If-Match": '"1"'}),
    ("PUT", "kv/c/b", [1, "two", None], {"If-None-Match": "*"}),
    ("PUT", "kv/c/b", {"again": True}, {"If-None-Match": "*"}),
    ("PUT", "kv/c/bad", b'{"unterminated', {}),
    ("GET", "kv/c?limit=1", None, {}),
    ("GET", "kv/c?prefix=a&keys_only=true", None, {}),
    ("GET", "kv/c/missing", None, {}),
    ("DELETE", "kv/c/a", None, {}),
    ("GET", "kv/c/a", None, {}),
    # records
    ("PUT", "records/r/k1", {"v": 1}, {}),
    ("POST", "records/r", {"records": [{"key": "k2", "value": {"v": 2}}, {"key": "k3", "value": [3]}]}, {}),
    ("POST", "records/r", {"records": [{"key": "", "value": 1}]}, {}),
    ("GET", "records/r/k1", None, {}),
    ("GET", "records/r?order=desc&limit=2", None, {}),
    ("GET", "records/r?after=k1&before=k3", None, {}),
    ("POST", "records/r/trim", {"keep_last": 2}, {}),
    ("POST", "records/r/trim", {"keep_last": "many"}, {}),
    ("GET", "records/r", None, {}),
    ("GET", "records/r/k1", None, {}),
    ("DELETE", "records/r/k2", None, {}),
    # checkpoints
    ("POST", "checkpoints/put", _checkpoint(0, 0), {}),
    ("POST", "checkpoints/put", _checkpoint(1, 1), {}),
    ("POST", "checkpoints/writes", {"thread_id": "t1", "checkpoint_id": "1ef00001", "task_id": "task",
                                    "writes": [{"idx": 0, "channel": "messages", "type": "msgpack", "data": _b64(b"w")}]}, {}),
    ("POST", "checkpoints/put", {"thread_id": "t1"}, {}),
    ("GET", "checkpoints/tuple?thread_id=t1", None, {}),
    ("GET", "checkpoints/tuple?thread_id=t1&checkpoint_id=1ef00000", None, {}),
    ("GET", "checkpoints/tuple?thread_id=nobody", None, {}),
    ("POST", "checkpoints/search", {"thread_id": "t1", "filter": {"step": 1}}, {}),
    ("POST", "checkpoints/search", {"limit": 1}, {}),
    ("POST", "checkpoints/search", {"limit": 0}, {}),
    # vectors
    ("PUT", "vectors/v", {"vector_size": 3, "distance": "cosine"}, {}),
    ("POST", "vectors/v/points", {"points": [{"id": f"p{i}", "vector": [1, i, 2], "payload": {"tag": i % 3}} for i in range(12)]}, {}),
    ("POST", "vectors/v/search", {"vector": [1, 2, 2], "limit": 4}, {}),
    ("POST", "vectors/v/search", {"vector": [1, 2, 2], "limit": 3, "filters": {"tag": 1}}, {}),
    ("POST", "vectors/v/search", {"vector": [1, 2], "limit": 3}, {}),
    ("POST", "vectors/v/search", b"not json", {}),
    ("POST", "vectors/missing/search", {"vector": [1, 2, 2]}, {}),
    # store (LangGraph's batch of operations)
    ("POST", "store/batch", {"ops": [{"op": "put", "namespace": ["m"], "key": f"k{i}", "value": {"i": i},
                                      "vectors": [{"field": "t", "vector": [1, i, 2]}]} for i in range(4)]}, {}),
    ("POST", "store/read", {"ops": [{"op": "get", "namespace": ["m"], "key": "k1"}, {"op": "get", "namespace": ["m"], "key": "no"},
                                    {"op": "search", "namespace_prefix": ["m"], "query_vector": [1, 2, 2], "limit": 2}]}, {}),
    ("POST", "store/get", {"ops": [{"op": "get", "namespace": ["m"], "key": "k2"}, {"op": "get", "namespace": ["m"], "key": "no"},
                                   {"op": "get", "namespace": ["m"], "key": "k0"}], "omit_expired": True}, {}),
    ("POST", "store/get", {"ops": [{"op": "get", "namespace": ["m"], "key": "k3"}]}, {}),
    ("POST", "store/get", {"ops": [{"op": "search", "namespace_prefix": ["m"]}]}, {}),
    ("POST", "store/read", {"ops": [{"op": "put", "namespace": ["m"], "key": "k"}]}, {}),
    ("POST", "store/batch", {"ops": [{"op": "search", "namespace_prefix": ["m"], "filter": {"i": {"$gt": 1}}}]}, {}),
]


def _normal(value: Any, namespace: str, etags: dict[str, str]) -> Any:
    """``value`` without what differs between two runs in two namespaces: the namespace, times,
    request ids, and ETags (random versions), named in the order they appear."""
    if isinstance(value, dict):
        return {k: _etag(v, etags) if k == "etag" else _normal(v, namespace, etags) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_normal(v, namespace, etags) for v in value]
    if isinstance(value, str):
        return value.replace(namespace, "NS")
    return value


def _etag(tag: str, etags: dict[str, str]) -> str:
    return etags.setdefault(tag, f"etag-{len(etags)}")


def _answers(url: str) -> list[tuple[Any, ...]]:
    namespace = f"fp{uuid.uuid4().hex[:10]}"
    answers = []
    etags: dict[str, str] = {}
    with httpx.Client(base_url=f"{url}/v1/{namespace}/", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30) as client:
        for method, path, body, headers in SCRIPT:
            raw = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
            sent = {"Content-Type": "application/json", **headers} if raw is not None else headers
            r = client.request(method, path, content=raw, headers=sent)
            content = _normal(r.json(), namespace, etags) if r.content and "json" in r.headers.get("content-type", "") else r.content
            kept = {h: _etag(r.headers[h], etags) if h == "etag" else _normal(r.headers[h], namespace, etags)
                    for h in KEPT_HEADERS if h in r.headers}
            answers.append((method, path, r.status_code, kept, content))
    return answers


def test_the_plain_path_answers_as_the_fast_paths_do(server: Server, plain_server: Server) -> None:
    fast, plain = _answers(server.url), _answers(plain_server.url)
    statuses = {a[2] for a in fast}
    assert {200, 201, 204, 404, 412, 422} <= statuses, statuses  # the script reaches every kind of answer
    for f, p in zip(fast, plain, strict=True):
        assert f == p


def test_a_write_on_the_plain_path_is_committed_before_its_answer(server: Server, plain_server: Server) -> None:
    """With ``one_statement`` off, a kv write is an ordinary transaction: what it wrote is
    visible to the fast server at once (committed before the answer)."""
    namespace = f"fp{uuid.uuid4().hex[:10]}"
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for i in range(5):
        assert httpx.put(f"{plain_server.url}/v1/{namespace}/kv/c/k", json={"i": i}, headers=headers).status_code == 204
        assert httpx.get(f"{server.url}/v1/{namespace}/kv/c/k", headers=headers).json() == {"i": i}
