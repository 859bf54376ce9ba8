"""Conditional requests (RFC 9110 section 13): ETags, ``If-Match`` and ``If-None-Match``.

Shared by kv entries and files: both carry a strong ETag and both honour ``If-Match`` for
compare-and-swap and ``If-None-Match: *`` for create-only writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Header

from app.core.errors import InvalidInput, PreconditionFailed


def quote_etag(tag: str) -> str:
    return f'"{tag}"'


MAX_ETAGS = 64  # entity tags one condition may list: each is a bound value of the write's statement


def parse_etags(header: str | None, name: str, *, weak: bool = True) -> list[str] | None:
    """``None`` when absent, ``["*"]`` for any (the bare ``*`` only), else the listed tags
    without quotes or ``W/``, each once; a weak tag only where ``weak`` comparison is the rule
    (``If-None-Match``; ``If-Match`` compares strongly, so a weak tag matches nothing there, RFC
    9110 13.1.1), and a quoted ``"*"`` is a tag no version has. More than ``MAX_ETAGS`` is a 422
    naming the header ``name``."""
    if header is None:
        return None
    header = header.strip()
    if header == "*":
        return ["*"]
    tags: dict[str, None] = {}
    for part in header.split(","):
        part = part.strip()
        if part.startswith("W/"):
            if not weak:
                continue
            part = part[2:]
        if len(part) >= 2 and part[0] == part[-1] == '"':
            part = part[1:-1]
        if part and part != "*":
            tags[part] = None
    if len(tags) > MAX_ETAGS:
        raise InvalidInput(name, f"at most {MAX_ETAGS} entity tags (got {len(tags)})")
    return list(tags)


@dataclass(frozen=True)
class WriteConditions:
    """What a conditional write requires of the current version (``None`` = nothing)."""

    if_match: list[str] | None = None
    if_none_match: list[str] | None = None

    @property
    def any(self) -> bool:
        return self.if_match is not None or self.if_none_match is not None

    def check(self, current: str | None) -> None:
        """Raise 412 unless the current ETag (``None`` = missing) satisfies the conditions."""
        if self.if_match is not None:
            if current is None or ("*" not in self.if_match and current not in self.if_match):
                raise PreconditionFailed(
                    "If-Match: the current version does not match" if current else "If-Match: it does not exist"
                )
        if self.if_none_match is not None:
            if current is not None and ("*" in self.if_none_match or current in self.if_none_match):
                raise PreconditionFailed("If-None-Match: it already exists in a matching version")


async def _write_conditions(
    if_match: Annotated[str | None, Header(description="Write only if the current ETag is one of these.")] = None,
    if_none_match: Annotated[
        str | None, Header(description="`*`: write only if it does not exist yet.")
    ] = None,
) -> WriteConditions:
    return WriteConditions(parse_etags(if_match, "If-Match", weak=False), parse_etags(if_none_match, "If-None-Match"))


from fastapi import Depends  # noqa: E402

Conditions = Annotated[WriteConditions, Depends(_write_conditions)]
