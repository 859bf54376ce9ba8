"""``/docs`` (Swagger UI) served entirely by the gateway, under a strict CSP.

FastAPI's own pages load their scripts and styles from a public CDN (a blank page on a network
without one) and start Swagger UI with an inline ``<script>``, which rules out a strict
``Content-Security-Policy``. Here the UI's files come from the pinned ``fastapi-offline``
package (it ships Swagger UI's bundle and CSS, kept current with Swagger UI's releases), the
start-up code is a static script of its own, and the address of the OpenAPI document reaches it
as a ``data-`` attribute, ``root_path`` included. Every answer here carries a CSP that allows the
gateway's own origin only (and ``data:`` images, the icons Swagger UI's CSS embeds).

There is no ``/redoc``: ReDoc's bundle injects ``<style>`` elements at run time and renders
nothing under ``style-src 'self'`` (checked in headless Chromium), and one strict CSP was the
point; Swagger UI already shows every operation and schema.
"""

from __future__ import annotations

import html
from importlib import metadata, resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, Response

from app.core.errors import NotFound

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
ASSETS_PREFIX = "/docs/assets"
_ASSET_TYPES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}
_ASSET_VERSION = metadata.version("fastapi-offline")
_CACHE = "public, max-age=86400"

SWAGGER_INIT_JS = """\
"use strict";
(function () {
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.getAttribute("data-openapi-url"),
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
})();
"""

_PAGE = """\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" type="image/png" href="{assets}/favicon.png?v={version}">
<link rel="stylesheet" href="{assets}/swagger-ui.css?v={version}">
</head>
<body>
<div id="swagger-ui" data-openapi-url="{openapi_url}"></div>
<script src="{assets}/swagger-ui-bundle.js?v={version}"></script>
<script src="{assets}/swagger-init.js?v={version}"></script>
</body>
</html>
"""


def _static_dir() -> Path:
    return Path(str(resources.files("fastapi_offline") / "static"))


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` and its assets (the app is made with ``docs_url=None, redoc_url=None``)."""
    static = _static_dir()
    for name in _ASSET_TYPES:
        if not (static / name).is_file():
            raise RuntimeError(f"fastapi-offline does not ship {name}: check its pinned version")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        page = _PAGE.format(
            title=html.escape(f"{app.title} - Swagger UI"), version=_ASSET_VERSION,
            assets=html.escape(root + ASSETS_PREFIX, quote=True),
            openapi_url=html.escape(root + (app.openapi_url or "/openapi.json"), quote=True),
        )
        return HTMLResponse(page, headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"})

    scripts = {"swagger-init.js": SWAGGER_INIT_JS}

    @app.api_route(ASSETS_PREFIX + "/{name}", methods=["GET", "HEAD"], include_in_schema=False)
    async def asset(name: str) -> Response:
        headers = {**SECURITY_HEADERS, "Cache-Control": _CACHE}
        if name in scripts:
            return Response(scripts[name], media_type="text/javascript; charset=utf-8", headers=headers)
        if name not in _ASSET_TYPES:
            raise NotFound(f"no documentation asset {name!r}")
        return FileResponse(static / name, media_type=_ASSET_TYPES[name], headers=headers)
