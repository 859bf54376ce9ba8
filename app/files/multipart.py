"""Streaming ``multipart/form-data`` for ``POST /files/{collection}`` (python-multipart's push parser).

``await request.form()`` would spool whole files; here the parser is fed the body piece by piece
and the ``file`` part's bytes go straight to a ``BlobWriter``. Fields: ``file`` (required, once)
and ``file_id`` (optional, before or after the file). Anything else is a 422 naming it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from app.core.errors import InvalidInput, UnsupportedMediaType

FILE_FIELD = "file"
FILE_ID_FIELD = "file_id"
MAX_TEXT_FIELD_BYTES = 4096
MAX_PART_HEADER_BYTES = 16 * 1024


class ChunkSink(Protocol):
    async def write(self, data: bytes) -> None: ...


@dataclass
class FormUpload:
    """What the form said besides the file's bytes."""

    file_id: str | None = None
    content_type: str | None = None
    filename: str | None = None


@dataclass
class _Part:
    headers: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    text: bytearray = field(default_factory=bytearray)


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` content type, or 415/422."""
    ctype, options = parse_options_header(content_type or "")
    if ctype != b"multipart/form-data":
        raise UnsupportedMediaType("POST uploads must be multipart/form-data (or use PUT with the raw body)")
    boundary = options.get(b"boundary")
    if not boundary:
        raise InvalidInput("Content-Type", "multipart/form-data needs a boundary parameter")
    return boundary


async def read_form(body: AsyncIterator[bytes], content_type: str | None, sink: ChunkSink) -> FormUpload:
    """Feed ``body`` through the parser; the ``file`` part's bytes go to ``sink`` as they arrive."""
    boundary = boundary_of(content_type)
    form = FormUpload()
    events: list[tuple[str, bytes]] = []
    header_size = 0
    current: _Part | None = None
    header_name = bytearray()
    header_value = bytearray()
    seen_file = False
    file_done = False

    def on(event: str) -> Callable[[bytes, int, int], None]:
        def data_callback(data: bytes, start: int, end: int) -> None:
            events.append((event, data[start:end]))

        return data_callback

    callbacks = {
        "on_part_begin": lambda: events.append(("part_begin", b"")),
        "on_part_data": on("data"),
        "on_part_end": lambda: events.append(("part_end", b"")),
        "on_header_field": on("header_field"),
        "on_header_value": on("header_value"),
        "on_header_end": lambda: events.append(("header_end", b"")),
        "on_headers_finished": lambda: events.append(("headers_done", b"")),
    }
    try:
        parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    except FormParserError as exc:
        raise InvalidInput("Content-Type", str(exc)) from None

    async def drain() -> None:
        nonlocal current, header_size, seen_file, file_done
        for event, data in events:
            if event == "part_begin":
                current = _Part()
                header_name.clear()
                header_value.clear()
            elif current is None:
                continue
            elif event in ("header_field", "header_value"):
                header_size += len(data)
                if header_size > MAX_PART_HEADER_BYTES:
                    raise InvalidInput("body", "multipart part headers are too large")
                (header_name if event == "header_field" else header_value).extend(data)
            elif event == "header_end":
                current.headers[header_name.decode("latin-1").strip().lower()] = header_value.decode("latin-1").strip()
                header_name.clear()
                header_value.clear()
            elif event == "headers_done":
                current.name = _part_name(current.headers)
                if current.name == FILE_FIELD:
                    if seen_file:
                        raise InvalidInput(FILE_FIELD, "must be given once")
                    seen_file = True
                    form.content_type = current.headers.get("content-type") or None
                    _, options = parse_options_header(current.headers.get("content-disposition", ""))
                    filename = options.get(b"filename")
                    form.filename = filename.decode("utf-8", "replace") if filename else None
                elif current.name != FILE_ID_FIELD:
                    raise InvalidInput(current.name or "body", "unknown form field (expected `file` and optionally `file_id`)")
            elif event == "data":
                if current.name == FILE_FIELD:
                    await sink.write(data)
                else:
                    current.text.extend(data)
                    if len(current.text) > MAX_TEXT_FIELD_BYTES:
                        raise InvalidInput(current.name or "body", "form field is too long")
            elif event == "part_end":
                if current.name == FILE_FIELD:
                    file_done = True
                elif current.name == FILE_ID_FIELD:
                    try:
                        form.file_id = current.text.decode("utf-8")
                    except UnicodeDecodeError:
                        raise InvalidInput(FILE_ID_FIELD, "must be valid UTF-8") from None
                current = None
        events.clear()

    try:
        async for piece in body:
            parser.write(piece)
            await drain()
        parser.finalize()
    except FormParserError as exc:
        raise InvalidInput("body", f"malformed multipart/form-data: {exc}") from None
    await drain()
    if not file_done:
        raise InvalidInput(FILE_FIELD, "a complete `file` part is required")
    return form


def _part_name(headers: dict[str, str]) -> str | None:
    disposition, options = parse_options_header(headers.get("content-disposition", ""))
    if disposition != b"form-data":
        raise InvalidInput("body", "every part needs Content-Disposition: form-data")
    name = options.get(b"name")
    return name.decode("utf-8", "replace") if name is not None else None
