"""The path a Starlette router matches a request on, and a parsed JSON body handed to a request.

Starlette's routes match ``get_route_path(scope)`` (``starlette._utils``, private): the ASGI
``path`` with the app's ``root_path`` taken off when it starts with it. There is no public
accessor, so the same rule is written here from the ASGI fields themselves (``path``,
``root_path``: the ASGI spec's, public), and ``tests/test_fences.py`` checks it agrees with
Starlette's (the private function, and ``Route.matches`` itself) on every case it handles.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import Scope


def route_path(scope: Scope) -> str:
    """``scope``'s path as the router sees it: below ``root_path`` when it is mounted there."""
    path: str = scope["path"]
    root_path: str = scope.get("root_path", "")
    if not root_path or not path.startswith(root_path):
        return path
    if path == root_path:
        return ""
    if path[len(root_path)] == "/":
        return path[len(root_path):]
    return path


def set_parsed_json(request: Request, value: Any) -> None:
    """Make ``await request.json()`` return ``value`` without parsing the body again.

    Starlette's ``Request.json`` keeps what it parsed in ``_json`` and parses only when that is
    unset (``tests/test_fences.py`` checks it still does). FastAPI's handler of a route with a body
    model reads the body through ``request.json()``, so a body parsed (and validated) beforehand
    by ``app.core.http.bodies`` is handed over this way."""
    request._json = value
