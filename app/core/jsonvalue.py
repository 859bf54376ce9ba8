"""JSON text, one rule everywhere: parsed once on the way in, returned verbatim on the way out.

The rule (CONTRACT: text): the gateway accepts every JSON string that is valid Unicode, U+0000
included; a lone surrogate (``"\\ud800"``: valid JSON syntax, not Unicode) cannot be stored as
UTF-8 and is refused with a 422 naming where it is (``records.3.value``,
``points.7.payload.name``). ``NaN``/``Infinity`` are not JSON and are refused the same way.
Every JSON request body is parsed by ``app.core.http.bodies``, whose parser refuses both; a
refused body of up to ``bodies.NAMED_BYTES`` then passes ``check_json_text`` (a byte scan, and
a parse that names the field), so no capability sees them. (The scan is not run on every body
at the gate any more: its regular expression took 120 ms on 15 MB of ``\\u00e9`` escapes.)

Values stored as JSON text (kv, records) keep their numbers exactly as written: the stdlib
parser hands each number over as its literal (``1e-400`` stays ``1e-400``, a 400-digit integer
stays itself), and orjson writes the compact text with the literals embedded. A value over
``limits.max_value_bytes`` is a 413.

Values that PostgreSQL keeps as jsonb (vector payloads, checkpoint metadata) are stored by both
backends as ``jsonb_text`` writes them: jsonb keeps a number as the decimal written, so a float
written with a positive exponent would read back there as another number, and ``-0.0`` as ``0.0``.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from app.core.errors import InvalidInput, PayloadTooLarge

LONE_SURROGATE = "must be valid Unicode: a lone surrogate (\\ud800-\\udfff) cannot be stored"
NOT_A_NUMBER = "must be a finite JSON number (NaN and Infinity are not JSON)"
MAX_DEPTH = 255  # orjson's: a value sent as text and nested deeper is refused (422)

json_string = json.JSONEncoder(ensure_ascii=False).encode
"""A ``str`` as a JSON string literal, non-ASCII kept: ``json.dumps(s, ensure_ascii=False)``
without building an encoder on every call (0.09 against 0.73 us; a page of 50 keys calls it 50
times)."""


class _Constant:
    """``NaN``/``Infinity`` where the stdlib parser found one, so the check can name its place."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _int(literal: str) -> Any:
    # An int writes itself back as sent, except -0 and those beyond 64 bits (orjson's range).
    return orjson.Fragment(literal) if len(literal) > 18 or literal == "-0" else int(literal)


_value_decoder = json.JSONDecoder(parse_constant=_Constant, parse_float=orjson.Fragment, parse_int=_int)
_check_decoder = json.JSONDecoder(parse_constant=_Constant)
_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)

# What a lone surrogate or a NaN/Infinity can look like in a JSON body: a \uD800-\uDFFF escape,
# the CESU bytes of one (json.loads decodes bytes with surrogatepass), or the constants' names.
# Matches inside strings (an escaped backslash before "ud800", the word "NaN") are false alarms
# that cost one parse; a body without any is passed after a few substring scans (about 1 ms per
# MB; a regular expression with these alternatives takes 30).
_SUSPECT = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]|NaN|Infinity")
_HINTS = (b"\xed", b"\\u", b"NaN", b"Infinity")


def _suspect(body: bytes) -> bool:
    return any(hint in body for hint in _HINTS) and _SUSPECT.search(body) is not None


def is_unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode (no lone surrogate), so it can be stored as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def find_invalid(value: Any, where: str) -> tuple[str, str] | None:
    """``(field, message)`` of the first string that is not valid Unicode or NaN/Infinity in a
    parsed JSON ``value`` (keys included), or None."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, here = stack.pop()
        if isinstance(item, str):
            if not is_unicode(item):
                return here, LONE_SURROGATE
        elif isinstance(item, _Constant):
            return here, NOT_A_NUMBER
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                return here, NOT_A_NUMBER
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                path = f"{here}.{key}" if here else str(key)
                if isinstance(key, str) and not is_unicode(key):
                    # A bad key is named by its escaped text, which can be shown.
                    return (f"{here}.{key!a}" if here else ascii(key)), LONE_SURROGATE + " (in a key)"
                children.append((child, path))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend(reversed([(c, f"{here}.{i}" if here else str(i)) for i, c in enumerate(item)]))
    return None


def check_json_encoding(body: bytes) -> None:
    """422 for a JSON body that is not UTF-8 from its first bytes (see ``check_json_text``): a
    few bytes looked at, so the gate checks every JSON body with it."""
    if body.startswith((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")) or b"\x00" in body[:4]:
        raise InvalidInput("body", "must be JSON encoded as UTF-8, without a byte order mark")


def check_json_text(body: bytes) -> None:
    """422 naming the place of a lone surrogate or NaN/Infinity in a JSON request body, and 422
    for a body that is not UTF-8 from its first bytes: a byte order mark, or UTF-16/32 (a NUL
    byte in the first four, which JSON in UTF-8 never has). RFC 8259 section 8.1: JSON between
    systems is UTF-8 without a BOM. Python's parser reads all of them, but a value kept as
    written (``literal_members``) is read from UTF-8 only, and a records batch fell back to the
    parsed floats (``1e400`` stored as null).

    Malformed JSON is left to the route's parser (which answers it as it always has)."""
    check_json_encoding(body)
    if not _suspect(body):
        return
    try:
        value = _check_decoder.decode(body.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):
        return
    found = find_invalid(value, "")
    if found is not None:
        raise InvalidInput(found[0] or "body", found[1])


def _too_large(field: str, message: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"{field}: {message}", errors=[{"loc": field.split("."), "msg": message}])


def _float_literal(value: Any) -> Any:
    # orjson's hook for what it cannot write itself (float subclasses, numbers beyond 64 bits).
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return orjson.Fragment(json.dumps(value, allow_nan=False))
    raise TypeError


def encode_value(field: str, value: Any, max_bytes: int) -> str:
    """Compact JSON text of an already parsed value, or 422/413 naming ``field``."""
    try:
        data = orjson.dumps(value, default=_float_literal)
    except (orjson.JSONEncodeError, ValueError, TypeError):
        found = find_invalid(value, field)
        if found is not None:
            raise InvalidInput(*found) from None
        try:  # integers beyond 64 bits and deep nesting, which orjson does not write
            data = _encoder.encode(value).encode("utf-8")
        except (ValueError, TypeError, RecursionError):
            raise InvalidInput(field, f"must be JSON nested at most {MAX_DEPTH} levels deep") from None
    if len(data) > max_bytes:
        raise _too_large(field, f"{len(data)} bytes of JSON exceed the limit of {max_bytes} bytes")
    return data.decode("utf-8")


_BLANK = re.compile(r"[ \t\n\r]*")
LITERAL_YIELD_CHARS = 64 * 1024  # a records batch's second parse gives the event loop a turn this often


def _blank(text: str, i: int) -> int:
    """Past the JSON whitespace at ``i``."""
    found = _BLANK.match(text, i)
    return found.end() if found is not None else i


async def literal_members(raw: bytes, field: str, max_item_chars: int) -> list[Any] | None:
    """The array ``field`` of a JSON object body, each item parsed with its numbers kept as
    written (None when the body is not such an object); 413 naming the member or item
    (``field.3``) when one is longer than ``max_item_chars`` characters of JSON text.

    A route that takes a parsed model but stores some of its values as JSON text (a batch of
    records) takes those values from here, so ``1e-400``, ``1.10`` and ``-0`` are stored as sent.
    It costs a second parse of the body, a value at a time (the stdlib's ``raw_decode``), each in
    calls of at most ``max_item_chars`` characters, the event loop served in between and every
    ``LITERAL_YIELD_CHARS``. Parsed in one call, 11.6 MiB of records with 1.2 million numbers
    held the loop 175-240 ms; a single 7 MiB item, 184-220 ms."""
    try:
        text = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    decode, blank, n = _value_decoder.raw_decode, _blank, len(text)
    since = 0

    async def value_at(i: int, where: str) -> tuple[Any, int]:
        """The value at ``i`` and the place after it. Parsed from a slice of the text, grown
        from ``LITERAL_YIELD_CHARS`` up to ``max_item_chars``: a value is complete when it ends
        before the slice does (a number cut short at the slice's end would parse too)."""
        nonlocal since
        size = min(LITERAL_YIELD_CHARS, max_item_chars)
        while True:
            end = min(n, i + size)
            value: Any = None
            try:
                value, j = decode(text[i:end])
            except ValueError:
                if end == n:
                    raise
                j = end - i  # cut short, or longer than the slice
            if j < end - i or end == n:
                since += j
                if since >= LITERAL_YIELD_CHARS:
                    since = 0
                    await asyncio.sleep(0)
                return value, i + j
            if size >= max_item_chars:
                raise _too_large(where, f"must be at most {max_item_chars} characters of JSON text")
            size = min(max_item_chars, size * 4)
            await asyncio.sleep(0)

    found: list[Any] | None = None
    try:
        i = blank(text, 0)
        if text[i:i + 1] != "{":
            return None
        i = blank(text, i + 1)
        closing = False
        while not closing:
            key, i = await value_at(i, field)
            i = blank(text, i)
            if not isinstance(key, str) or text[i:i + 1] != ":":
                return None
            i = blank(text, i + 1)
            if key == field and text[i:i + 1] == "[":
                items: list[Any] = []
                i = blank(text, i + 1)
                more = text[i:i + 1] != "]"
                if not more:
                    i += 1
                while more:
                    item, i = await value_at(i, f"{field}.{len(items)}")
                    items.append(item)
                    i = blank(text, i)
                    if text[i:i + 1] not in (",", "]"):
                        return None
                    more = text[i] == ","
                    i = blank(text, i + 1)
                found = items  # a repeated member: the last, as json.loads keeps it
            else:
                _, i = await value_at(i, field)
            i = blank(text, i)
            if text[i:i + 1] not in (",", "}"):
                return None
            closing = text[i] == "}"
            i = blank(text, i + 1)
    except (ValueError, RecursionError):
        return None
    return found if i == n else None


def parse_value(field: str, raw: bytes, max_bytes: int) -> str:
    """Compact JSON text of a raw request body (numbers as written), or 422/413 naming ``field``."""
    if len(raw) > max_bytes and len(raw.strip()) > max_bytes:
        raise _too_large(field, f"{len(raw)} bytes exceed the limit of {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(field, "must be UTF-8 encoded JSON") from None
    if not text.strip():
        raise InvalidInput(field, "must be a JSON value (the body is empty)")
    try:
        value, end = _value_decoder.raw_decode(text, len(text) - len(text.lstrip()))
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(field, f"is not valid JSON: {exc}") from None
    if text[end:].strip():
        raise InvalidInput(field, f"is not valid JSON: extra data at character {end}")
    return encode_value(field, value, max_bytes)


# Where compact JSON text may hold a number that needs ``jsonb_text``'s walk: an exponent, a
# negative zero, or 19 digits in a row (an integer that may not fit 64 bits). A string that only
# looks like one costs the walk, nothing else.
_JSONB_LOOK = re.compile(r"[0-9][eE][-+]?[0-9]|-0\.0(?![0-9])|[0-9]{19}")


def is_wide(value: Any) -> bool:
    """Whether ``value`` is an integer (not a bool) beyond 64 bits: orjson writes none, and SQLite
    compares one as the nearest float where PostgreSQL's jsonb compares the decimal it is."""
    return isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63


def jsonb_float(x: float) -> str:
    """A finite float as JSON text that PostgreSQL's jsonb answers back as the same float.

    jsonb keeps a number as the decimal of the digits written: ``2.0**70``, written
    ``1.1805916207174113e+21``, answered as the integer ``1180591620717411300000`` (no longer a
    float, and a different number: 2**70 is 1180591620717411303424), and ``-0.0`` as ``0.0``.
    Every float from 1e16 up is an integer (2**53 is 9.0e15), so it is written as that integer
    exactly, with ``.0``; a negative zero as ``0.0``; any other float as Python writes it."""
    if abs(x) >= 1e16:
        return f"{int(x)}.0"
    return "0.0" if x == 0.0 else repr(x)


def _written_out_growth(written: str) -> int:
    """The characters a float written with a negative exponent (Python writes one below 1e-4)
    gains in jsonb, which answers it in full: ``1e-300`` is 302 characters there."""
    mantissa, _, exponent = written.lstrip("-").partition("e")
    digits = len(mantissa.replace(".", ""))
    return max(0, 2 + (-int(exponent) - 1) + digits - len(written.lstrip("-")))


@dataclass(frozen=True, slots=True)
class JsonbText:
    """A JSON value as both backends store it where PostgreSQL keeps jsonb (``jsonb_text``)."""

    text: str
    growth: int  # bytes PostgreSQL's jsonb adds to ``text`` when it answers it (numbers in full)
    wide: bool  # the value holds an integer beyond 64 bits


def jsonb_text(text: str, value: Any) -> JsonbText:
    """``value`` (compact JSON ``text``) as vector payloads and checkpoint metadata are stored.

    jsonb keeps a number as the decimal written, so a float written with a positive exponent
    reads back from PostgreSQL as another number, and ``-0.0`` as ``0.0``: both backends store
    the text with every float as ``jsonb_float`` writes it, so a value reads back the same from
    either (SQLite keeps the text), and equal numbers compare equal on both. jsonb also answers a
    float written with a negative exponent in full (``growth``), which a size limit must count.
    One walk of ``value``, and only when the text may need it (``_JSONB_LOOK``)."""
    if _JSONB_LOOK.search(text) is None:
        return JsonbText(text, 0, False)
    growth = 0
    wide = False

    def swap(item: Any) -> Any:
        nonlocal growth, wide
        if isinstance(item, float):
            if 1e-4 <= abs(item) < 1e16:
                return item  # orjson writes these as Python does (measured on 400,000 random floats)
            written = jsonb_float(item)
            if "e-" in written:
                growth += _written_out_growth(written)
            return orjson.Fragment(written)
        if is_wide(item):
            wide = True
            return orjson.Fragment(str(item))  # orjson writes no integer beyond 64 bits
        if isinstance(item, dict):
            return {k: swap(v) for k, v in item.items()}
        if isinstance(item, list):
            return [swap(v) for v in item]
        return item

    swapped = swap(value)
    return JsonbText(orjson.dumps(swapped).decode(), growth, wide)
