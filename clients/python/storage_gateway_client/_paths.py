"""Building URL paths: every user-supplied segment is percent-encoded, ``/`` included."""

from __future__ import annotations

from urllib.parse import quote


def segment(value: str) -> str:
    return quote(value, safe="")
