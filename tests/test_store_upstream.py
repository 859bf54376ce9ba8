"""LangGraph's own store tests against ``GatewayStore`` on a live gateway, on both backends.

The test files come from the sdists of the installed ``langgraph-checkpoint-sqlite``
(``tests/test_store.py``, ``test_async_store.py``, ``test_ttl.py``), ``langgraph-checkpoint``
(``tests/test_store.py``: InMemoryStore's and the ``AsyncBatchedBaseStore`` batching tests) and
``langgraph-sdk`` (``tests/integration/test_store.py``, against the LangGraph Platform API),
fetched with ``pip download --no-deps --no-binary :all:`` into the pytest cache (never into the
repository) and run unedited, each suite in a pytest of its own, all at once, against the
session's gateway: ``tests/langgraph_store_conftest.py`` rebinds their stores and fixtures to it.

Left out (``LEFT_OUT``), each with its reason: the tests of SqliteStore's own SQL and helpers;
and the conftest runs the SQLite suite's tests parametrized ``memory`` / ``file`` (SqliteStore's
two kinds of database) once, since on the gateway both are the same store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.conftest import ROOT, Server

SUITES: dict[str, list[str]] = {
    "langgraph-checkpoint-sqlite": ["tests/test_store.py", "tests/test_async_store.py", "tests/test_ttl.py"],
    "langgraph-checkpoint": ["tests/test_store.py"],
    "langgraph-sdk": ["tests/integration/test_store.py"],
}
SUPPORT = {"langgraph-checkpoint": ["tests/embed_test_utils.py"]}
SQLITE_INTERNALS = "tests SqliteStore's own SQL or helpers, not what a store does"
LEFT_OUT: dict[str, dict[str, str]] = {
    "langgraph-checkpoint-sqlite": {
        "tests/test_store.py::test_vector_store_initialization": "reads SqliteStore's sqlite3 connection (`store.conn`) for its vector tables",
        "tests/test_store.py::test_nonnull_migrations": SQLITE_INTERNALS,
        "tests/test_store.py::test_escape_glob_literal": SQLITE_INTERNALS,
        "tests/test_store.py::test_namespace_match_pattern": SQLITE_INTERNALS,
        "tests/test_store.py::test_list_namespaces_prefix_uses_indexable_condition": SQLITE_INTERNALS,
    },
}
# Each suite's passing tests, at least (the installed versions' sdists, as counted on 2026-12-07).
MIN_PASSED = {"langgraph-checkpoint-sqlite": 89, "langgraph-checkpoint": 117, "langgraph-sdk": 4}
# The SQLite suite's TTL tests mostly sleep (41 s in a row): its tests run on this many workers.
WORKERS = {"langgraph-checkpoint-sqlite": 6}
PYTEST_INI = "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"


def sdist(name: str, cache: Path) -> Path:
    """The installed version's sdist of ``name``, extracted (downloaded once into ``cache``)."""
    wanted = version(name)
    stem = f"{name.replace('-', '_')}-{wanted}"
    archive = cache / f"{stem}.tar.gz"
    if not archive.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"{name}=={wanted}", "-d", str(cache)],
            check=True, capture_output=True, timeout=300,
        )
    extracted = cache / stem
    if not extracted.exists():
        with tarfile.open(archive) as tar:
            tar.extractall(cache, filter="data")
    return extracted


def lay_out(name: str, source: Path, where: Path) -> list[str]:
    """The suite's files under ``where/tests`` as in the sdist, with the rebinding conftest."""
    for relative in [*SUITES[name], *SUPPORT.get(name, [])]:
        target = where / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / relative, target)
        init = source / Path(relative).parent / "__init__.py"
        if init.exists():
            shutil.copy(init, target.parent / "__init__.py")
    shutil.copy(ROOT / "tests" / "langgraph_store_conftest.py", where / "tests" / "conftest.py")
    (where / "pytest.ini").write_text(PYTEST_INI)
    return SUITES[name]


def counts(report: Path) -> dict[str, int]:
    suite = ET.parse(report).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    assert suite is not None
    total = int(suite.get("tests", 0))
    failed, errors, skipped = (int(suite.get(k, 0)) for k in ("failures", "errors", "skipped"))
    return {"passed": total - failed - errors - skipped, "failed": failed + errors, "skipped": skipped}


@pytest.mark.slow
def test_langgraph_store_suites_pass_against_the_gateway(
    server: Server, api_key: str | None, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    cache = Path(request.config.cache.mkdir("langgraph-sdists"))
    env = {
        **os.environ, "GATEWAY_STORE_TEST_URL": server.url, "GATEWAY_STORE_TEST_KEY": api_key or "",
        "GATEWAY_STORE_TEST_NAMESPACE": f"upstream-{server.backend.name}",
        # only the plugins the suites use: loading every installed one took 2-3 s per process
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    runs = {}
    for name in SUITES:
        where = tmp_path / name
        files = lay_out(name, sdist(name, cache), where)
        deselect = [arg for test in LEFT_OUT.get(name, {}) for arg in ("--deselect", test)]
        runs[name] = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "asyncio", "-p", "pytest_mock",
             f"--junitxml={where / 'report.xml'}", "--durations=5",
             *(["-p", "xdist.plugin", "-n", str(WORKERS[name])] if name in WORKERS else []), *deselect, *files],
            cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
    outputs = {name: run.communicate(timeout=600)[0] for name, run in runs.items()}
    found = {name: counts(tmp_path / name / "report.xml") for name in SUITES}
    for name, result in found.items():
        assert result["failed"] == 0 and result["skipped"] == 0, f"{name}: {result}\n{outputs[name][-8000:]}"
        assert result["passed"] >= MIN_PASSED[name], f"{name}: {result}\n{outputs[name][-3000:]}"
