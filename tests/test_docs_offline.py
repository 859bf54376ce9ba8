"""``/docs`` renders in a real browser with no route to the internet, directly and behind nginx.

Headless Chromium (the Debian package, installed here when missing as the nginx test installs
nginx) resolves every host name but 127.0.0.1 to nothing and sends everything else to a proxy on
a closed port, so a page that needs a CDN renders blank (as FastAPI's default ``/docs`` did).
The gateway's page must render every operation of every capability, and trip no violation of
its own ``Content-Security-Policy`` (which allows the gateway's origin only and no inline code).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from app.core.http.docs import CSP
from tests.conftest import Server
from tests.test_ops_proxy import ROOT_PATH, Proxied, proxied  # noqa: F401  (the nginx fixture)

CAPABILITIES = ("records", "kv", "files", "vectors", "checkpoints")
OFFLINE = [
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--proxy-server=http://127.0.0.1:9",  # anything not loopback goes to a closed port
]


def chromium_binary() -> str:
    """Chromium from the Debian package; installed here when missing (fresh CI machines)."""
    found = shutil.which("chromium")
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for attempt in range(3):
        update = subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True, timeout=300, check=False)
        install = subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
            env=env, capture_output=True, text=True, timeout=900, check=False,
        )
        if install.returncode == 0:
            break
        time.sleep(2 + attempt * 3)  # another apt may hold the lock
    else:
        raise RuntimeError(f"cannot install chromium:\n{update.stderr[-2000:]}\n{install.stderr[-2000:]}")
    found = shutil.which("chromium")
    assert found, "chromium installed but not found"
    return found


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_binary()


def render(chromium: str, url: str, profile: Path) -> tuple[str, str]:
    """The DOM after the page's scripts ran (15 s of virtual time), and the browser's console."""
    result = subprocess.run(
        [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
            *OFFLINE, "--virtual-time-budget=15000", "--dump-dom", url,
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    console = "\n".join(line for line in result.stderr.splitlines() if ":CONSOLE" in line)
    return result.stdout, console


def operations(spec: dict) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if method in {"get", "put", "post", "patch", "delete", "head", "options"}
    }


def rendered(dom: str) -> set[tuple[str, str]]:
    """(method, path) of each operation block Swagger UI drew."""
    found = set()
    for block in re.finditer(r'id="operations-[^"]*"(.*?)data-path="([^"]+)"', dom, re.DOTALL):
        method = re.search(r'opblock-summary-method">([A-Z]+)<', block.group(1))
        if method:
            found.add((method.group(1), block.group(2)))
    return found


def check_docs(chromium: str, base: str, root: str, profile: Path) -> None:
    page = httpx.get(f"{base}/docs", timeout=30)
    assert page.status_code == 200
    assert page.headers["content-security-policy"] == CSP
    assert "'unsafe-inline'" not in CSP and "http" not in CSP
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page.text, re.DOTALL)
    assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts), "inline script"
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert assets and all(a.startswith(f"{root}/docs/assets/") for a in assets), assets
    assert f'data-openapi-url="{root}/openapi.json"' in page.text
    for asset in assets:
        answer = httpx.get(base.removesuffix(root) + asset, timeout=30)
        assert answer.status_code == 200, asset
        assert answer.headers["content-security-policy"] == CSP
        assert answer.headers["x-content-type-options"] == "nosniff"

    spec = httpx.get(f"{base}/openapi.json", timeout=30).json()
    dom, console = render(chromium, f"{base}/docs", profile)
    assert "Content Security Policy" not in console, console
    drawn = rendered(dom)
    assert drawn == operations(spec), sorted(operations(spec) ^ drawn)
    for capability in CAPABILITIES:
        assert any(path.startswith(f"/v1/{{namespace}}/{capability}") for _, path in drawn), capability
    assert 'class="swagger-ui' in dom and "storage-gateway" in dom


def test_docs_render_offline(chromium: str, server: Server, tmp_path: Path) -> None:
    check_docs(chromium, server.url, "", tmp_path / "profile")


def test_docs_render_offline_behind_the_proxy_sub_path(
    chromium: str, proxied: Proxied, tmp_path: Path  # noqa: F811
) -> None:
    check_docs(chromium, proxied.url, ROOT_PATH, tmp_path / "profile")
    # the UI's requests went through nginx under the sub-path, none elsewhere
    log = proxied.nginx_access_log()
    assert f'"GET {ROOT_PATH}/openapi.json' in log
    assert f'"GET {ROOT_PATH}/docs/assets/swagger-ui-bundle.js' in log


def test_unknown_doc_assets_are_problems(server: Server) -> None:
    for name in ("nope.js", "..%2Fcore.py", "swagger-ui.js"):
        answer = httpx.get(f"{server.url}/docs/assets/{name}", timeout=30)
        assert answer.status_code == 404, name
        assert answer.headers["content-type"] == "application/problem+json"
