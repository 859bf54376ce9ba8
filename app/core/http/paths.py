"""Percent-escapes in a request's path that do not decode to UTF-8 are a 422, never a U+FFFD.

The server decodes the path with replacement (``x%FFy`` and ``x%FEy`` both become ``x\ufffdy``),
so distinct URLs would name the same key or file. ``scope["raw_path"]`` still has the bytes sent:
when the decoded path holds a U+FFFD (rare, so the check costs a substring scan), the raw path is
decoded strictly, and a path whose escapes are not UTF-8 is refused, naming the path parameter.
A U+FFFD sent as ``%EF%BF%BD`` is valid UTF-8 and passes.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from starlette.types import Scope

from app.core.errors import InvalidInput

REPLACEMENT = "\ufffd"


def check_path_utf8(scope: Scope) -> None:
    """``InvalidInput`` (422) when the raw path's percent-escapes are not valid UTF-8."""
    if REPLACEMENT not in scope.get("path", ""):
        return
    raw = scope.get("raw_path")
    if raw is None:
        return
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        params = scope.get("path_params", {})
        field = next((name for name, value in params.items() if REPLACEMENT in str(value)), "path")
        raise InvalidInput(field, "must be valid UTF-8 once percent-decoded") from None
