"""The OpenAPI document is what the server does: schemathesis, every check, on both backends.

schemathesis (its CLI: its pytest plugin does not load under pytest 9) runs every phase against
the real server with the admin key (so ``/v1/admin/keys`` is tested too, and ``ignored_auth``
checks each operation refuses a request without it), every check and ``MAX_EXAMPLES`` per
operation (the examples, coverage and fuzzing phases), with a fixed seed so a failure can be replayed. Zero failures of any kind.

What the configuration (``CONFIG``) says, and why each line is right rather than a blind spot:

- A 412 is a valid answer to a schema-valid conditional request (the condition was evaluated and
  is false: nothing was written), and a 416 to a schema-valid ``Range`` past the end; a 412 is
  also how a write with a failed precondition refuses before it reads its (invalid) body.
- Cursors are opaque tokens the server mints: no schema can describe which strings are cursors,
  so every list is given a real cursor minted here from a real second page (and
  ``test_cursors_are_refused_when_made_up`` checks that a made-up one is a 422).
- ``CROSS_CHECKED`` operations have rules across fields or against stored state (a vector's
  dimension is the collection's, a cursor continues the list it came from with the same prefix,
  order or filter); positive_data_acceptance is off for those eight alone.
- ``NUL_REFUSED`` operations take free-form JSON (checkpoint metadata) whose strings may not hold
  U+0000, which no JSON Schema can say of an open object: no NUL is generated for those alone.
- ``OPTIONS .../records/{c}/trim`` and ``.../points/delete|list`` answer ``Allow`` with the methods
  of ``{key}`` / ``{point_id}`` too: that URL *is* also the record ``trim`` (GET/PUT/DELETE) and
  the point ``delete``/``list``, so the header is accurate where the document lists one template.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import ADMIN_KEY, Server

# The coverage phase tries each schema's boundaries and refusals systematically; the fuzzing
# phase adds random examples. 50 per operation keeps the two runs at about a tenth of the suite
# (100 took 350 s of its 1,590, a fifth, and CI must stay under 30 minutes).
MAX_EXAMPLES = 50
SEED = "20261201"
SEED_NS = "schemathesis-seed"
AMBIGUOUS_ALLOW = (  # paths of POST routes that are also a {key}/{point_id} resource
    "/v1/{namespace}/kv/{collection}/get",
    "/v1/{namespace}/kv/{collection}/delete",
    "/v1/{namespace}/records/{collection}/trim",
    "/v1/{namespace}/vectors/{collection}/points/delete",
    "/v1/{namespace}/vectors/{collection}/points/list",
)
# Checkpoint metadata is free-form JSON that no string in may hold U+0000 (PostgreSQL's JSONB cannot
# store it; both backends refuse it with a 422 naming the field: tests/test_checkpoints_limits.py),
# a rule on every nested string that JSON Schema cannot state for an open object.
NUL_REFUSED = ("POST /v1/{namespace}/checkpoints/put",)
# Operations where a schema-valid body can still be refused by a rule no JSON Schema can state, so
# positive_data_acceptance is off for them (every other check still runs on them):
CROSS_CHECKED = (
    "POST /v1/{namespace}/vectors/{collection}/points",  # vectors must have the collection's dimension
    "PATCH /v1/{namespace}/vectors/{collection}/points/{point_id}",  # the same
    "POST /v1/{namespace}/vectors/{collection}/search",  # the same, for the query vector
    "PUT /v1/{namespace}/vectors/{collection}",  # each payload field indexed once (unique by a member)
    "POST /v1/{namespace}/kv/{collection}",  # each key once in a batch (unique by a member)
    "POST /v1/{namespace}/checkpoints/threads/copy",  # the target thread differs from the source
    # a cursor continues the list it was made for: the same prefix / order / thread and filter
    "GET /v1/{namespace}/kv/{collection}",
    "GET /v1/{namespace}/records/{collection}",
    "POST /v1/{namespace}/checkpoints/search",
)
POSITIVE = ["2xx", "3xx", "401", "403", "404", "409", "412", "416", "429", "5xx"]
NEGATIVE = ["400", "401", "403", "404", "405", "406", "409", "412", "413", "415", "422", "428", "429", "5xx"]


def mint_cursors(server: Server) -> dict[str, dict[str, str]]:
    """A real ``next_cursor`` of every kind of list: operation name -> parameter -> cursor."""
    base = f"{server.url}/v1/{SEED_NS}"
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
        def ok(r: httpx.Response) -> httpx.Response:
            assert r.is_success, r.text
            return r

        for key in ("a", "b"):
            ok(http.put(f"{base}/kv/c/{key}", json=1))
            ok(http.put(f"{base}/records/c/{key}", json=1))
            ok(http.put(f"{base}/files/c/{key}", content=b"x", headers={"Content-Type": "text/plain"}))
            ok(http.put(f"{base}/vectors/c{key}", json={"vector_size": 2, "distance": "l2"}))
            ok(http.post(f"{server.url}/v1/admin/keys", json={"namespace": SEED_NS, "scopes": ["kv:read"]}))
        ok(http.post(f"{base}/vectors/ca/points", json={"points": [{"id": i, "vector": [1.0, 0.0]} for i in "ab"]}))
        for checkpoint_id in ("1ef4f797-8335-6428-8001-8a1503f9b875", "1ef4f797-8335-6428-8002-8a1503f9b875"):
            ok(http.post(f"{base}/checkpoints/put", json={
                "thread_id": "t", "checkpoint_id": checkpoint_id, "checkpoint": {"type": "msgpack", "data": "kqNmb28="},
            }))

        def cursor(r: httpx.Response) -> str:
            value = ok(r).json()["next_cursor"]
            assert isinstance(value, str) and value
            return value

        page = {"limit": 1}
        return {
            "GET /v1/{namespace}/kv/{collection}": {"query.cursor": cursor(http.get(f"{base}/kv/c", params=page))},
            "GET /v1/{namespace}/records/{collection}": {
                "query.cursor": cursor(http.get(f"{base}/records/c", params=page)),
            },
            "GET /v1/{namespace}/files/{collection}": {"query.cursor": cursor(http.get(f"{base}/files/c", params=page))},
            "GET /v1/{namespace}/vectors": {"query.cursor": cursor(http.get(f"{base}/vectors", params=page))},
            "GET /v1/admin/keys": {"query.cursor": cursor(http.get(f"{server.url}/v1/admin/keys", params=page))},
            "POST /v1/{namespace}/vectors/{collection}/points/list": {
                "body.cursor": cursor(http.post(f"{base}/vectors/ca/points/list", json=page)),
            },
            "POST /v1/{namespace}/checkpoints/search": {
                "body.cursor": cursor(http.post(f"{base}/checkpoints/search", json={"thread_id": "t", "limit": 1})),
            },
        }


def toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string of ASCII is a TOML basic string


def config(cursors: dict[str, dict[str, str]]) -> str:
    lines = [
        "[checks.positive_data_acceptance]",
        f"expected-statuses = {json.dumps(POSITIVE)}",
        "[checks.negative_data_rejection]",
        f"expected-statuses = {json.dumps(NEGATIVE)}",
    ]
    for name, parameters in cursors.items():
        pairs = ", ".join(f"{toml_string(k)} = {toml_string(v)}" for k, v in parameters.items())
        lines += ["[[operations]]", f"include-name = {toml_string(name)}", f"parameters = {{ {pairs} }}"]
    for name in CROSS_CHECKED:
        lines += ["[[operations]]", f"include-name = {toml_string(name)}", "checks.positive_data_acceptance.enabled = false"]
    for name in NUL_REFUSED:
        lines += ["[[operations]]", f"include-name = {toml_string(name)}", "generation.allow-x00 = false"]
    for path in AMBIGUOUS_ALLOW:
        lines += ["[[operations]]", f"include-path = {toml_string(path)}", "checks.allow_header_conformance.enabled = false"]
    return "\n".join(lines) + "\n"


def test_every_operation_answers_as_documented(server: Server, tmp_path: Path) -> None:
    (tmp_path / "schemathesis.toml").write_text(config(mint_cursors(server)))
    cli = Path(sys.executable).parent / "schemathesis"
    started = time.monotonic()
    result = subprocess.run(
        [
            str(cli), "--config-file", str(tmp_path / "schemathesis.toml"), "run", f"{server.url}/openapi.json",
            "--header", f"Authorization: Bearer {ADMIN_KEY}",
            # every check runs: schemathesis's default (`--checks all` on the command line would
            # override the per-operation lines in the configuration); no stateful phase: the
            # document declares no links, so it would only repeat the fuzzing phase's requests
            "--max-examples", str(MAX_EXAMPLES),
            "--phases", "examples,coverage,fuzzing",
            "--seed", SEED,
            "--workers", "1",  # two threads tripped a race inside hypothesis (AST recursion depth mismatch)
            "--request-timeout", "30",
            "--generation-database", "none",
            # strings are Unicode: a lone surrogate (valid JSON syntax, not a character) is refused
            # with a 422 naming it (tests/test_text_rule.py), which no JSON Schema can say
            "--generation-codec", "utf-8",
            "--continue-on-failure",
            "--no-color",
        ],
        capture_output=True, text=True, timeout=1500, cwd=tmp_path, check=False,
    )
    elapsed = time.monotonic() - started
    report = result.stdout[-30000:] + result.stderr[-5000:]
    assert result.returncode == 0, report
    generated = re.search(r"(\d+) generated", result.stdout)
    assert generated, report
    assert not re.search(r"\b[1-9]\d* (failures?|errors?)\b", result.stdout.split("SUMMARY")[-1]), report
    print(f"schemathesis on {server.backend.name}: {generated.group(1)} test cases in {elapsed:.0f} s")


def test_cursors_are_refused_when_made_up(server: Server) -> None:
    """What the configuration above leans on: a string that is not a minted cursor is a 422."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for cursor in ("", "x", "eyJ2IjoxfQ", "%00"):
        r = httpx.get(f"{server.url}/v1/{SEED_NS}/kv/c", params={"cursor": cursor}, headers=headers, timeout=30)
        assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["cursor"], r.text
