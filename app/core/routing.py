"""A router per capability that declines other capabilities' requests at once.

FastAPI matches a request by trying every route of every included router in turn, twice; a
route in the last capability paid for regex checks of all the others' routes first (about
0.7 ms per vector search, measured in-process). Paths under ``/v1`` name their capability in
the third segment (``/v1/{namespace}/<capability>/...``; a namespace cannot contain ``/``), so a
router can tell from that one segment whether any of its routes could match.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette._utils import get_route_path
from starlette.routing import Match
from starlette.types import Scope


class CapabilityRouter(APIRouter):
    """``APIRouter(prefix="/<capability>")`` that answers ``Match.NONE`` for other capabilities."""

    def __init__(self, capability: str, **kwargs: Any) -> None:
        super().__init__(prefix=f"/{capability}", **kwargs)
        self.capability = capability

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        parts = get_route_path(scope).split("/", 4)  # "", "v1", namespace, capability, rest
        if len(parts) < 4 or parts[3] != self.capability:
            return Match.NONE, {}
        return super().matches(scope)
