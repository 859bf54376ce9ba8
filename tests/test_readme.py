"""The README is a contract with newcomers: its snippets run as printed, in order, against a
gateway started as `make run` starts it (SQLite, no keys on loopback): the curl examples first,
then each Python snippet as a script; and its configuration table lists every setting the code
has."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.settings_doc import rows
from tests.conftest import ROOT, Backend, start_server, stop_server

README = (ROOT / "README.md").read_text()


# What each Python snippet prints, in the README's order.
EXPECTED_OUTPUTS = [
    "dark 2 ['m1']\n",
    "{'answer': 'yes'}\n3 checkpoints\n",
    "m1 I love green tea 2 []\n",
    "tea is green {'topic': 'tea', 'year': 2024} [b'\\x00\\x01', b'bytes', None] ['hi', 'hello!']\n",
]


def shell_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", README, flags=re.S)


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def curl_lines() -> list[str]:
    lines = []
    for block in shell_blocks():
        lines += [line.strip() for line in block.splitlines() if line.strip().startswith("curl ")]
    return lines


def test_every_setting_is_in_the_configuration_table() -> None:
    for yaml_key, env, _default, _meaning in rows():
        assert f"| `{yaml_key}` | `{env}` |" in README, f"README misses {env}"


def test_snippets_run_as_printed_in_order(tmp_path: Path) -> None:
    commands = curl_lines()
    assert len(commands) >= 12
    scripts = python_blocks()
    assert len(scripts) == len(EXPECTED_OUTPUTS)
    backend = Backend("sqlite", {"GATEWAY_DATA_DIR": str(tmp_path)})
    server = start_server(backend, tmp_path / "log", GATEWAY_AUTH__MODE="disabled")
    port = server.url.rsplit(":", 1)[1]
    try:
        for command in commands:
            runnable = command.replace("localhost:8000", f"127.0.0.1:{port}").replace(
                "curl -s ", "curl -sS --fail-with-body ", 1
            )
            result = subprocess.run(["bash", "-c", runnable], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, (command, result.stdout, result.stderr)
        # what the examples wrote is really there
        out = subprocess.run(
            ["curl", "-s", f"127.0.0.1:{port}/v1/my_plugin/files/docs/readme.md"], capture_output=True, timeout=30
        ).stdout
        assert out == (ROOT / "README.md").read_bytes()
        outputs = []
        for n, script in enumerate(scripts):
            path = tmp_path / f"snippet{n}.py"
            path.write_text(script.replace("localhost:8000", f"127.0.0.1:{port}"))
            result = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, (script, result.stdout, result.stderr)
            outputs.append(result.stdout)
        assert outputs == EXPECTED_OUTPUTS, outputs
    finally:
        stop_server(server)
