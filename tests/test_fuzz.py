"""Schema fuzzing with schemathesis against a real server on both backends (bounded examples).

Every operation in /openapi.json gets generated valid and invalid requests, sent with the admin
key. No answer may be a 5xx, and every answer must match what the document says: its status,
content type, headers and body schema. (schemathesis's pytest plugin does not load under
pytest 9, so its CLI runs here, with a fixed seed so a failure can be replayed.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import ADMIN_KEY, Server

CHECKS = ",".join([
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
])
MAX_EXAMPLES = 15


def test_every_operation_answers_as_documented(server: Server, tmp_path: Path) -> None:
    # the fuzzer must get past auth, or every answer would be a (conforming) 401
    assert httpx.get(f"{server.url}/v1/admin/keys", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200
    cli = Path(sys.executable).parent / "schemathesis"
    result = subprocess.run(
        [
            str(cli), "run", f"{server.url}/openapi.json",
            "--header", f"Authorization: Bearer {ADMIN_KEY}",
            "--checks", CHECKS,
            "--max-examples", str(MAX_EXAMPLES),
            "--phases", "examples,coverage,fuzzing",
            "--seed", "20261129",
            "--request-timeout", "30",
            "--continue-on-failure",
            "--no-color",
        ],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    report = result.stdout[-20000:] + result.stderr[-5000:]
    assert result.returncode == 0, report
    assert "passed" in result.stdout, report
