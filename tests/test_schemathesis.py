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
  so every list is given a real cursor minted from a real second page by its capability's
  samples (``Samples.cursors``; a list without one fails here saying so), and
  ``test_cursors_are_refused_when_made_up`` checks that a made-up one is a 422.
- A capability's ``Samples.cross_checked`` operations have rules across fields or against stored
  state (a vector's dimension is the collection's, a cursor continues the list it came from with
  the same prefix, order or filter); positive_data_acceptance is off for those alone.
- ``POST /v1/{namespace}/import`` takes a namespace archive: any bytes fit its schema, but only
  an archive whose digests and counts hold is accepted (tests/test_portability.py refuses the
  rest), so positive_data_acceptance is off for it too.
- ``Samples.nul_refused`` operations take free-form JSON (checkpoint metadata) whose strings may
  not hold U+0000, which no JSON Schema can say of an open object: no NUL is generated for those.
- ``Samples.ambiguous_allow`` paths (``.../records/{c}/trim``, ``.../points/delete|list``) answer
  ``Allow`` with the methods of ``{key}`` / ``{point_id}`` too: that URL *is* also the record
  ``trim`` and the point ``delete``/``list``, so the header is accurate where the document lists
  one template.

It runs on the capabilities under test (``tests/conftest.py``): the whole document (admin routes
included) for the built-in ones, only their own operations (by tag) for a module's extra ones.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from dataclasses import dataclass, field
from typing import Any

import httpx

from app.capabilities import BUILTIN
from app.core.capability import Capability
from tests.conftest import ADMIN_KEY, Server

# The coverage phase tries each schema's boundaries and refusals systematically; the fuzzing
# phase adds random examples. 50 per operation keeps the two runs at about a tenth of the suite
# (100 took 350 s of its 1,590, a fifth, and CI must stay under 30 minutes).
MAX_EXAMPLES = 50
SEED = "20261201"
SEED_NS = "schemathesis-seed"
POSITIVE = ["2xx", "3xx", "401", "403", "404", "409", "412", "416", "429", "5xx"]
NEGATIVE = ["400", "401", "403", "404", "405", "406", "409", "412", "413", "415", "422", "428", "429", "5xx"]


@dataclass
class Plan:
    """What schemathesis is told, gathered from the samples of the capabilities under test."""

    cursors: dict[str, dict[str, str]] = field(default_factory=dict)
    cross_checked: list[str] = field(default_factory=list)
    nul_refused: list[str] = field(default_factory=list)
    ambiguous_allow: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)  # empty: the whole document


def cursor_operations(spec: dict[str, Any], capability: str) -> list[str]:
    """Names ("GET /v1/...") of the operations of ``capability`` that take a ``cursor``."""
    def has_cursor(op: dict[str, Any]) -> bool:
        if any(p["name"] == "cursor" for p in op.get("parameters", [])):
            return True
        schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
        if "$ref" in schema:
            schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        return "cursor" in schema.get("properties", {})

    return [
        f"{method.upper()} {path}" for path, item in spec["paths"].items()
        if path.split("/")[2:4] == ["{namespace}", capability]
        for method, op in item.items() if isinstance(op, dict) and has_cursor(op)
    ]


async def plan(server: Server, capabilities: tuple[Capability[Any], ...], everything: bool) -> Plan:
    out = Plan(tags=[] if everything else [c.name for c in capabilities])
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
        spec = (await http.get("/openapi.json")).json()
        for capability in capabilities:
            samples = capability.samples_for("cursors")
            minted = await samples.cursors(http, SEED_NS)
            missing = [name for name in cursor_operations(spec, capability.name) if name not in minted]
            assert not missing, (
                f"the samples of {capability.name!r} mint no cursor for {missing}: return one from its Samples.cursors"
            )
            for name, parameters in minted.items():
                assert all(isinstance(v, str) and v for v in parameters.values()), (name, parameters)
            out.cursors.update(minted)
            out.cross_checked += samples.cross_checked
            out.nul_refused += samples.nul_refused
            out.ambiguous_allow += samples.ambiguous_allow
        if everything:
            # an archive's validity (digests, counts, order) is no schema's: tests/test_portability.py checks it
            out.cross_checked.append("POST /v1/{namespace}/import")
            # the gateway's own list: API keys
            for _ in range(2):
                r = await http.post("/v1/admin/keys", json={"namespace": SEED_NS, "scopes": ["kv:read"]})
                assert r.status_code == 201, r.text
            page = (await http.get("/v1/admin/keys", params={"limit": 1})).json()
            out.cursors["GET /v1/admin/keys"] = {"query.cursor": page["next_cursor"]}
    return out


def toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string of ASCII is a TOML basic string


def config(plan: Plan) -> str:
    lines = [
        "[checks.positive_data_acceptance]",
        f"expected-statuses = {json.dumps(POSITIVE)}",
        "[checks.negative_data_rejection]",
        f"expected-statuses = {json.dumps(NEGATIVE)}",
    ]
    for name, parameters in plan.cursors.items():
        pairs = ", ".join(f"{toml_string(k)} = {toml_string(v)}" for k, v in parameters.items())
        lines += ["[[operations]]", f"include-name = {toml_string(name)}", f"parameters = {{ {pairs} }}"]
    for name in plan.cross_checked:
        lines += ["[[operations]]", f"include-name = {toml_string(name)}", "checks.positive_data_acceptance.enabled = false"]
    for name in plan.nul_refused:
        lines += ["[[operations]]", f"include-name = {toml_string(name)}", "generation.allow-x00 = false"]
    for path in plan.ambiguous_allow:
        lines += ["[[operations]]", f"include-path = {toml_string(path)}", "checks.allow_header_conformance.enabled = false"]
    return "\n".join(lines) + "\n"


async def test_every_operation_answers_as_documented(
    server: Server, tmp_path: Path, capabilities_under_test: tuple[Capability[Any], ...]
) -> None:
    everything = {c.name for c in capabilities_under_test} == {c.name for c in BUILTIN}
    todo = await plan(server, capabilities_under_test, everything)
    (tmp_path / "schemathesis.toml").write_text(config(todo))
    cli = Path(sys.executable).parent / "schemathesis"
    started = time.monotonic()
    only = [arg for tag in todo.tags for arg in ("--include-tag", tag)]
    result = subprocess.run(
        [
            str(cli), "--config-file", str(tmp_path / "schemathesis.toml"), "run", f"{server.url}/openapi.json", *only,
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
    print(f"schemathesis on {server.backend.name} ({todo.tags or 'everything'}): {generated.group(1)} test cases in {elapsed:.0f} s")


def test_cursors_are_refused_when_made_up(server: Server) -> None:
    """What the configuration above leans on: a string that is not a minted cursor is a 422."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for cursor in ("", "x", "eyJ2IjoxfQ", "%00"):
        r = httpx.get(f"{server.url}/v1/{SEED_NS}/kv/c", params={"cursor": cursor}, headers=headers, timeout=30)
        assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["cursor"], r.text
