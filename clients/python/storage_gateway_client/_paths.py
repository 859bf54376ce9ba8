"""Building URL paths: every user-supplied segment is percent-encoded, ``/`` included."""

from __future__ import annotations

from urllib.parse import quote


def segment(value: str) -> str:
    encoded = quote(value, safe="")
    # "." and ".." would be removed as dot-segments by URL normalisation; encode their dots.
    return encoded.replace(".", "%2E") if encoded in (".", "..") else encoded
