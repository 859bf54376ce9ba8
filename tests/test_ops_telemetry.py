"""Operations, inside one process: request ids, JSON access logs, /metrics, the Dockerfile's command."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import time
import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sqlalchemy import text

from app.core.ops import metrics
from app.core.config import Database
from app.core.db.databases import Databases
from tests.conftest import ADMIN_KEY, ROOT, Backend, Server
from tests.test_migrations import settings_for

def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text format (parsed by prometheus-client's own parser) -> {(name, labels): value}."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def access_lines(server: Server, request_id: str, timeout: float = 5.0) -> list[dict]:
    """The JSON access log lines of one request (the line is written right after the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for line in server.log().splitlines():
            if request_id in line and line.startswith("{"):
                entry = json.loads(line)
                if entry.get("logger") == "app.access":
                    found.append(entry)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


async def raw_request(base_url: str, head: str) -> tuple[int, dict[str, str], bytes]:
    host, port = httpx.URL(base_url).host, httpx.URL(base_url).port
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head.encode())
        await writer.drain()
        status_line = await reader.readline()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, val = line.decode().partition(":")
            headers[name.strip().lower()] = val.strip()
        body = await reader.readexactly(int(headers.get("content-length", 0)))
        return int(status_line.split()[1]), headers, body
    finally:
        writer.close()


async def test_request_id_sent_in_comes_back_and_is_logged(http: httpx.AsyncClient, server: Server, namespace: str) -> None:
    rid = f"ops-{uuid.uuid4().hex}"
    r = await http.put(f"/v1/{namespace}/kv/settings/theme", json="dark", headers={"X-Request-ID": rid})
    assert r.status_code in (200, 201, 204), r.text
    assert r.headers["x-request-id"] == rid
    [entry] = access_lines(server, rid)
    assert entry["request_id"] == rid
    assert entry["level"] == "info"
    assert entry["method"] == "PUT"
    assert entry["route"] == "/v1/{namespace}/kv/{collection}/{key}"
    assert entry["namespace"] == namespace
    assert entry["status"] == r.status_code
    assert isinstance(entry["duration_ms"], (int, float)) and entry["duration_ms"] >= 0
    assert entry["time"].endswith("+00:00")
    # The concrete key never reaches the log line's fields (only the template does).
    assert "theme" not in entry["route"] and "theme" not in entry["message"]


async def test_every_answer_carries_a_request_id_even_errors(http: httpx.AsyncClient, server: Server) -> None:
    # A route that does not exist: 404 problem with the id in header and body.
    r = await http.get("/no/such/route")
    assert r.status_code == 404
    rid = r.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid)
    assert r.json()["request_id"] == rid
    # Invalid ids (control characters, too long) are replaced by a generated one.
    for bad in ("x" * 129, "has space", ""):
        r = await http.get("/healthz", headers={"X-Request-ID": bad})
        assert r.status_code == 200
        assert r.headers["x-request-id"] != bad and re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])
    # A body refused before any handler runs (413) still has the id we sent, in header and body.
    # (raw socket: declare a huge body and send none, so the refusal is read cleanly)
    rid = f"big-{uuid.uuid4().hex}"
    status, headers, body = await raw_request(
        server.url, f"PUT /v1/ns/kv/c/k HTTP/1.1\r\nHost: x\r\nX-Request-ID: {rid}\r\n"
        f"Authorization: Bearer {ADMIN_KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 999999999\r\n\r\n",
    )
    assert status == 413
    assert headers["x-request-id"] == rid and json.loads(body)["request_id"] == rid
    # A 422 from validation: the id is in the problem body too.
    rid = f"bad-{uuid.uuid4().hex}"
    r = await http.get("/v1/bad%20ns/kv/c/k", headers={"X-Request-ID": rid})
    assert r.status_code == 422
    assert r.headers["x-request-id"] == rid and r.json()["request_id"] == rid


async def test_metrics_expose_the_families_and_move_with_traffic(http: httpx.AsyncClient, namespace: str) -> None:
    before = parse_metrics((await http.get("/metrics")).text)
    route = "/v1/{namespace}/kv/{collection}/{key}"
    for i in range(3):
        r = await http.put(f"/v1/{namespace}/kv/m/key-{i}", json={"i": i})
        assert r.status_code in (200, 201, 204)
    r = await http.get(f"/v1/{namespace}/kv/m/missing")
    assert r.status_code == 404
    r = await http.get(f"/v1/{namespace}/kv/m/key-0", headers={"If-None-Match": "*"})
    r = await http.get("/no/such/route")
    assert r.status_code == 404
    response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    after = parse_metrics(response.text)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    put = {"method": "PUT", "route": route}
    assert moved("gateway_http_requests_total", **put) == 3
    assert moved("gateway_http_request_duration_seconds_count", **put) == 3
    assert moved("gateway_http_request_duration_seconds_bucket", le="+Inf", **put) == 3
    assert moved("gateway_http_request_duration_seconds_sum", **put) > 0
    assert moved("gateway_http_requests_total", method="GET", route=route, status="404") == 1
    assert moved("gateway_http_requests_total", method="GET", route="unmatched", status="404") == 1
    assert moved("gateway_errors_total", code="not_found") == 2
    # This scrape itself is in flight while it is being rendered.
    assert value(after, "gateway_http_requests_in_flight") >= 1
    assert value(after, "gateway_db_connections_opened_total", database="metadata") >= 1
    for db in ("metadata", "vectors", "checkpoints"):
        assert value(after, "gateway_db_pool_size", database=db) >= 1
        assert value(after, "gateway_db_pool_limit", database=db) >= value(after, "gateway_db_pool_size", database=db)
        assert ("gateway_db_pool_checked_out", frozenset({("database", db)})) in after
    # Cardinality: no label value anywhere names a concrete namespace, key or path.
    for (_, labels) in after:
        for _, label_value in labels:
            assert namespace not in label_value and "key-0" not in label_value


async def test_sixteen_connections_at_a_time_are_reused_not_reopened(backend: Backend) -> None:
    """With the default pool, a steady 16 requests at a time open no new database connections.

    Connections beyond ``pool_size`` are closed after each use; with the old default of 10 that
    meant six new PostgreSQL connections per round of 16, a third of the gateway's throughput at
    that concurrency (docs/benchmarks.md). Counted by ``gateway_db_connections_opened_total``.
    """
    dbs = Databases.open(settings_for(backend))

    def opened() -> float:
        labels = {"database": "metadata"}
        return metrics.REGISTRY.get_sample_value("gateway_db_connections_opened_total", labels) or 0.0

    rounds = 10
    try:
        before = opened()
        for _ in range(rounds):
            all_held = asyncio.Barrier(16)

            async def hold() -> None:
                async with dbs.engine(Database.metadata).connect() as conn:
                    await conn.execute(text("SELECT 1"))
                    await asyncio.wait_for(all_held.wait(), 10)

            await asyncio.gather(*(hold() for _ in range(16)))
        assert opened() - before == 16  # once, in the first round
    finally:
        await dbs.close()


async def test_request_garbage_does_not_keep_the_cycle_collector_busy(http: httpx.AsyncClient, namespace: str) -> None:
    """Objects alive at start-up are frozen and the young generation has room (app/core/ops/gc_tuning.py).

    With CPython's defaults, 400 kv reads at concurrency 16 ran about 55 young-generation
    passes (and full ones every few thousand requests): a fifth of a read's CPU.
    """
    await http.put(f"/v1/{namespace}/kv/gc/k", json={"v": list(range(50))})
    name = "python_gc_collections_total"
    before = parse_metrics((await http.get("/metrics")).text)
    for _ in range(25):
        answers = await asyncio.gather(*(http.get(f"/v1/{namespace}/kv/gc/k") for _ in range(16)))
        assert {r.status_code for r in answers} == {200}
    after = parse_metrics((await http.get("/metrics")).text)
    young = value(after, name, generation="0") - value(before, name, generation="0")
    full = value(after, name, generation="2") - value(before, name, generation="2")
    assert young <= 5 and full == 0, (young, full)


def test_dockerfile_runs_the_same_serve_command_the_tests_start() -> None:
    text = (ROOT / "Dockerfile").read_text()
    instructions: dict[str, list[str]] = {}
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            instructions.setdefault(word.upper(), []).append(rest.strip())
    assert instructions["FROM"][0].startswith("python:3.11-slim")
    entrypoint = json.loads(instructions["ENTRYPOINT"][-1])
    assert entrypoint[:2] == ["storage-gateway", "serve"]  # the console script conftest.start_server runs
    assert entrypoint[entrypoint.index("--host") + 1] == "0.0.0.0"
    # The console script points at the CLI the tests drive.
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'storage-gateway = "app.cli:main"' in pyproject
    from app.cli import build_parser

    build_parser().parse_args(entrypoint[1:])  # every flag it passes exists
    run = " ".join(instructions["RUN"])
    assert "-r requirements.lock" in run and "--no-deps" in run
    assert instructions["USER"] and instructions["USER"][-1] not in ("root", "0")
    assert any("GATEWAY_DATA_DIR=/data" in env for env in instructions["ENV"])
    assert "/data" in instructions["VOLUME"][0] and instructions["EXPOSE"] == ["8000"]
    healthcheck = instructions["HEALTHCHECK"][0]
    assert "/healthz" in healthcheck and "urllib" in healthcheck and "curl" not in healthcheck
    assert (ROOT / ".dockerignore").exists()
    # Every COPY source exists (the README glob may match nothing while it is being written).
    for copy in instructions["COPY"]:
        *sources, _dest = shlex.split(copy)
        for src in sources:
            assert src.endswith("*") or (ROOT / src).exists(), src


def test_log_format_is_json_for_machines_and_text_on_a_terminal() -> None:
    import io
    import logging

    from app.core.ops.logs import JsonFormatter, RequestIdFilter, TextFormatter, logging_config, wants_json
    from app.core.http.requestid import _current

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert wants_json("auto", io.StringIO()) and not wants_json("auto", Tty())
    assert wants_json("json", Tty()) and not wants_json("text", io.StringIO())
    config = logging_config("info", "json")
    assert config["handlers"]["stderr"]["formatter"] == "json"
    assert config["loggers"]["uvicorn.access"]["propagate"] is False  # replaced by app.access
    record = logging.LogRecord("app.access", logging.INFO, __file__, 1, "GET %s", ("/x",), None)
    record.status = 200
    token = _current.set("rid-123")
    try:
        RequestIdFilter().filter(record)
    finally:
        _current.reset(token)
    entry = json.loads(JsonFormatter().format(record))
    assert entry["request_id"] == "rid-123" and entry["message"] == "GET /x" and entry["status"] == 200
    assert entry["level"] == "info" and entry["logger"] == "app.access"
    text = TextFormatter().format(record)
    assert "[rid-123]" in text and "GET /x" in text and not text.startswith("{")
