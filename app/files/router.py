"""HTTP routes of the files capability: streamed uploads and downloads, Range, ETags.

Uploads read ``request.stream()`` themselves (no body parameters: FastAPI would buffer them);
downloads are a ``StreamingResponse`` that owns its reader (a snapshot connection for database
chunks, a ranged GET for an S3 object) until the last byte. Readers of database chunks each take a
download slot (``FilesService.downloads``), capped per process and per namespace, and a client
that stops reading is cut off (``limits.send_idle_timeout_seconds``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated
from urllib.parse import quote

import anyio
from prometheus_client import Counter
from fastapi import Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from app.core.http import splice
from app.quotas.usage import refuse_over_quota
from app.core.http.conditions import Conditions, quote_etag
from app.core.dependencies import CollectionPath, NamespacePath, PageLimit
from app.core.fast import fast
from app.core.errors import (
    BadRequest,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    RangeNotSatisfiable,
    UnsupportedMediaType,
    problem_responses,
)
from app.core.http.limits import Body, accepts
from app.core.ops.metrics import REGISTRY
from app.core.names import KEY_PATTERN, key_json_schema, validate_key
from app.core.http.routing import CapabilityRouter
from app.files.dependencies import FileId, Files
from app.files.multipart import read_form
from app.files.s3 import ObjectStoreUnavailable
from app.files.schemas import FilePage, FileRead, FilesUsage
from app.files.service import (
    DEFAULT_CONTENT_TYPE,
    file_headers,
    new_file_id,
    plan_download,
)
from app.files.s3 import SocketBody
from app.files.storage import BlobReader, VersionGone

log = logging.getLogger("app.files")
FILE_BYTES_SPLICED = Counter(
    "gateway_file_bytes_spliced",
    "Bytes of S3 downloads moved from the S3 connection to the client's in the kernel (files.s3.splice_downloads).",
    registry=REGISTRY,
)

router = CapabilityRouter("files", tags=["files"])

_UPLOAD_ERRORS = problem_responses(
    BadRequest, InvalidInput, PreconditionFailed, PayloadTooLarge, ObjectStoreUnavailable
)
MULTIPART_OVERHEAD_BYTES = 64 * 1024  # part headers, boundaries and the file_id field
DRAIN_BYTES = 1024 * 1024  # read past a 413 at most this much of the body ...
DRAIN_SECONDS = 1.0  # ... for at most this long
_BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}

# Downloads share the gateway's origin (and /docs'), so a stored file must never run as a page of
# it: types a browser only displays are served inline; anything else (HTML, SVG, XHTML, XML,
# JavaScript, PDF, unknown types) as an attachment unless files.inline_types names it. Every
# download also carries a CSP that forbids scripts, plugins and loads (nosniff is on every answer).
INLINE_SAFE_TYPES = frozenset({
    "text/plain", "text/csv", "application/json", "application/octet-stream",
    "image/png", "image/jpeg", "image/gif", "image/webp", "image/avif", "image/bmp",
    "image/x-icon", "image/vnd.microsoft.icon",
})
INLINE_SAFE_PREFIXES = ("audio/", "video/")
DOWNLOAD_CSP = "default-src 'none'; sandbox"


def download_headers(content_type: str, inline_types: frozenset[str]) -> dict[str, str]:
    """Content-Type, CSP and, for types a browser could execute, ``Content-Disposition: attachment``."""
    headers = {"Content-Type": content_type, "Content-Security-Policy": DOWNLOAD_CSP}
    essence = content_type.partition(";")[0].strip().lower()
    safe = essence in INLINE_SAFE_TYPES or essence.startswith(INLINE_SAFE_PREFIXES)
    if not safe and essence not in inline_types:
        headers["Content-Disposition"] = "attachment"
    return headers


# --- helpers ------------------------------------------------------------------------------


async def _body(request: Request) -> AsyncIterator[bytes]:
    """The request body as it arrives; a client that goes away mid-body is a 400 (never sent)."""
    try:
        async for piece in request.stream():
            yield piece
    except ClientDisconnect:
        raise BadRequest("the upload was cut off before its end", code="upload_incomplete") from None


@asynccontextmanager
async def _answer_early(request: Request) -> AsyncIterator[None]:
    """On a 413 mid-body, read (and drop) a little more of the body before answering.

    Closing a socket with unread bytes makes the kernel send a reset, which can reach the client
    before it reads the 413 (it then sees only "connection reset"). A body that ends soon after
    the limit is drained so the answer arrives; a larger one is cut off as before.
    """
    try:
        yield
    except PayloadTooLarge:
        with anyio.move_on_after(DRAIN_SECONDS):
            drained = 0
            while drained <= DRAIN_BYTES:
                message = await request.receive()
                if message["type"] != "http.request":
                    break
                drained += len(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        raise


def _content_type(value: str | None) -> str:
    if value is None or not value.strip():
        return DEFAULT_CONTENT_TYPE
    value = value.strip()
    if len(value) > 255 or not value.isprintable() or "/" not in value:
        raise InvalidInput("Content-Type", "must be a media type of at most 255 printable characters")
    return value


def _location(request: Request, namespace: str, collection: str, file_id: str) -> str:
    """The file's URL path, percent-encoded (header values must be ASCII); the id ``.`` or ``..``
    with its dots encoded too, or the URL would resolve to the collection or above it (a dot
    segment, RFC 3986 section 5.2.4), as the client's paths do."""
    root = request.scope.get("root_path", "")
    segment = quote(file_id, safe="")
    if segment in (".", ".."):
        segment = segment.replace(".", "%2E")
    return f"{root}/v1/{namespace}/files/{collection}/{segment}"


def _stored_response(row_read: FileRead, etag: str, created: bool, location: str) -> Response:
    headers = {"ETag": etag}
    if created:
        headers["Location"] = location
    return Response(
        row_read.model_dump_json(), status_code=201 if created else 200, headers=headers,
        media_type="application/json",
    )


SEND_PIECE_BYTES = 256 * 1024


class ReaderStalled(Exception):
    """The client took no byte of the answer for ``limits.send_idle_timeout_seconds``."""


class SendDeadline:
    """Cuts a response off when one ``send`` has not returned ``timeout`` seconds after it began.

    One timer for the whole response instead of an ``asyncio.timeout`` per piece: a send only
    notes when it began, and the timer, when it fires, either finds that send still waiting
    (cancel the task, which ``send`` turns into ``ReaderStalled``, as ``asyncio.timeout`` turns
    its own cancellation into ``TimeoutError``) or re-arms itself for the send in progress.
    """

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._began: float | None = None  # when the send in progress began (None: none is)
        self._timer: asyncio.TimerHandle | None = None
        self._fired = False

    async def send(self, send: Send, message: Message) -> None:
        if self._task is None:
            self._task = asyncio.current_task()
            assert self._task is not None
            self._cancelling = self._task.cancelling()
        self._began = began = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(began + self._timeout, self._check)
        try:
            await send(message)
        except asyncio.CancelledError:
            if self._fired and self._task.uncancel() <= self._cancelling:
                raise ReaderStalled from None
            raise
        finally:
            self._began = None

    def _check(self) -> None:
        self._timer = None
        began = self._began
        if began is None or self._task is None:
            return  # between sends: the next one arms the timer again
        if self._loop.time() >= began + self._timeout - 0.001:  # (timers may fire a hair early)
            self._fired = True
            self._task.cancel()
        else:
            self._timer = self._loop.call_at(began + self._timeout, self._check)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class BlobResponse(StreamingResponse):
    """Streams a ``BlobReader`` and closes it however the response ends (done, error, disconnect,
    or a client that stopped reading: each piece of at most ``SEND_PIECE_BYTES`` must be taken
    within ``send_timeout``, so a stuck reader gives its connection and download slot back).

    A larger piece (a database chunk) goes out as ``memoryview`` slices of it, not copies."""

    def __init__(
        self, reader: BlobReader, content: AsyncIterator[bytes], status_code: int, headers: dict[str, str],
        send_timeout: float,
    ) -> None:
        super().__init__(content, status_code=status_code, headers=headers)
        self._reader = reader
        self._send_timeout = send_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        deadline = SendDeadline(self._send_timeout)

        async def timed(message: Message) -> None:
            body = message.get("body", b"")
            if len(body) <= SEND_PIECE_BYTES:
                await deadline.send(send, message)
                return
            view, more = memoryview(body), message.get("more_body", False)
            for i in range(0, len(view), SEND_PIECE_BYTES):
                last = i + SEND_PIECE_BYTES >= len(view)
                piece = view[i:i + SEND_PIECE_BYTES]
                await deadline.send(send, {**message, "body": piece, "more_body": more or not last})

        try:
            socket_body = self._reader.socket_body
            if socket_body is not None:
                await self._splice(scope, timed, socket_body)
            elif self._reader.in_memory:
                # Nothing to stop early and nothing held: no task watching for a disconnect
                # (StreamingResponse's task group, whose cancel scope formats the task's repr:
                # about a tenth of a one-chunk download's CPU). A send to a client that left
                # returns at once (uvicorn drops it); OSError is what ASGI 2.4 servers raise.
                try:
                    await self.stream_response(timed)
                except OSError:
                    raise ClientDisconnect() from None
            else:
                await super().__call__(scope, receive, timed)
        except* ClientDisconnect:
            pass  # the client left; nothing to answer
        except* ReaderStalled:
            log.warning("a download's client took nothing for %g s: cut off", self._send_timeout)
        except* VersionGone as gone:
            log.warning("a download outlasted its snapshot and its file was replaced or deleted meanwhile: cut off "
                        "(%s)", gone.exceptions[0])
        finally:
            deadline.close()
            await self._reader.close()

    async def _splice(self, scope: Scope, send: Send, body: SocketBody) -> None:
        """The head and the bytes read with it as usual, then the rest spliced from the S3 socket
        (the connection offered it: ``ObjectReader.start(splice=True)``)."""
        splicer = scope["extensions"][splice.EXTENSION]
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if body.buffered:
            await send({"type": "http.response.body", "body": body.buffered, "more_body": True})
        if body.remaining:
            try:
                await splicer.splice(body.sock.fileno(), body.remaining, read_timeout=body.read_timeout,
                                     write_timeout=self._send_timeout)
            except splice.SinkStalled:
                raise ReaderStalled from None
            except (splice.SourceEnded, splice.SourceTimeout) as exc:  # the client sees a cut-off
                log.warning("an S3 download was cut off: %s", exc)
                return
            except OSError:  # the client left (reset, broken pipe) or its connection is closing
                raise ClientDisconnect() from None
            FILE_BYTES_SPLICED.inc(body.remaining)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


# --- routes -------------------------------------------------------------------------------


@router.get("", summary="Files usage of the namespace", response_model=FilesUsage)
async def files_usage(namespace: NamespacePath, files: Files) -> FilesUsage:
    """Total bytes and number of files stored under this namespace."""
    total, count = await files.usage(namespace)
    return FilesUsage(namespace=namespace, total_bytes=total, file_count=count)


@router.put(
    "/{collection}/{file_id:path}",
    summary="Upload a file (raw body, streamed)",
    response_model=FileRead,
    status_code=200,
    responses={201: {"model": FileRead, "description": "Created"}, **_UPLOAD_ERRORS},
    openapi_extra={"requestBody": {
        "required": True, "content": _BINARY,
        # Not a declared header parameter: OpenAPI ignores a `Content-Type` one (3.1 section 4.8.12.1).
        "description": "The bytes. Their `Content-Type` (any media type; absent: application/octet-stream) "
        "is stored and served back.",
    }},
)
@accepts(Body.STREAM)
async def put_file(
    request: Request,
    namespace: NamespacePath,
    collection: CollectionPath,
    file_id: FileId,
    files: Files,
    conditions: Conditions,
) -> Response:
    """Store the request body as the new version of the file; visible only once complete."""
    content_type = request.headers.get("content-type")
    files.check_declared_size(request.headers.get("content-length"))
    await refuse_over_quota(request, namespace, "files", request.headers.get("content-length"))
    async with _answer_early(request):
        stored = await files.store(
            namespace, collection, file_id, _body(request), _content_type(content_type), conditions
        )
    location = _location(request, namespace, collection, file_id)
    return _stored_response(FileRead.of(stored.row), quote_etag(stored.row.sha256), stored.created, location)


@router.post(
    "/{collection}",
    summary="Upload a file (multipart/form-data, streamed)",
    response_model=FileRead,
    status_code=201,
    responses={200: {"model": FileRead, "description": "Replaced"}, **_UPLOAD_ERRORS,
               **problem_responses(UnsupportedMediaType)},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["file"],
                        "properties": {
                            "file": {"type": "string", "format": "binary"},
                            "file_id": {"type": "string", "description": "Generated when absent.", **key_json_schema()},
                        },
                        "additionalProperties": False,  # any other part is a 422 (app.files.multipart)
                    }
                }
            },
        }
    },
)
@accepts(Body.STREAM, overhead=MULTIPART_OVERHEAD_BYTES)
async def post_file(
    request: Request,
    namespace: NamespacePath,
    collection: CollectionPath,
    files: Files,
    conditions: Conditions,
) -> Response:
    """Store the form's `file` part under `file_id` (or a generated id, returned)."""
    files.check_declared_size(request.headers.get("content-length"), overhead=MULTIPART_OVERHEAD_BYTES)
    async with _answer_early(request), files.new_blob(namespace) as writer:
        form = await read_form(_body(request), request.headers.get("content-type"), writer)
        file_id = validate_key("file_id", form.file_id) if form.file_id is not None else new_file_id()
        stored = await writer.commit(
            namespace, collection, file_id, _content_type(form.content_type), conditions
        )
    location = _location(request, namespace, collection, file_id)
    return _stored_response(FileRead.of(stored.row), quote_etag(stored.row.sha256), stored.created, location)


@router.get(
    "/{collection}",
    summary="List files",
    response_model=FilePage,
    responses=problem_responses(InvalidInput),
)
async def list_files(
    namespace: NamespacePath,
    collection: CollectionPath,
    files: Files,
    limit: PageLimit,
    prefix: Annotated[str | None, Query(max_length=1024, json_schema_extra={"pattern": KEY_PATTERN}, description="Only ids starting with this.")] = None,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> FilePage:
    """Metadata of the collection's files in id order (UTF-8 byte order), a page at a time."""
    page = await files.list(namespace, collection, prefix=prefix, cursor=cursor, limit=limit)
    return FilePage(items=[FileRead.of(r) for r in page.rows], next_cursor=page.next_cursor)


@router.get(
    "/{collection}/{file_id:path}",
    summary="Download a file (streamed; Range supported)",
    response_class=StreamingResponse,
    responses={
        200: {"content": _BINARY, "description": "The whole file."},
        206: {"content": _BINARY, "description": "The requested single byte range."},
        304: {"description": "Not modified (If-None-Match)."},
        307: {"description": "Presigned redirect to the object (files.s3.presign_downloads)."},
        **problem_responses(NotFound, RangeNotSatisfiable, ObjectStoreUnavailable),
    },
)
@fast()
async def get_file(
    request: Request,
    namespace: NamespacePath,
    collection: CollectionPath,
    file_id: FileId,
    files: Files,
    range: Annotated[str | None, Header(description="One range `bytes=a-b`, `a-` or `-n`.")] = None,
    if_none_match: Annotated[str | None, Header()] = None,
    if_range: Annotated[str | None, Header()] = None,
) -> Response:
    """The file's bytes; a single Range gives 206, several ranges the whole file (200)."""
    reader, plan = await files.open_range(
        namespace, collection, file_id, lambda row: plan_download(row, range, if_none_match, if_range),
        splice=splice.EXTENSION in request.scope.get("extensions", ()),
    )
    try:
        row = reader.row
        headers = file_headers(row)
        if plan.status == 304:
            await reader.close()
            return Response(status_code=304, headers=headers)
        presigned = await files.presigned_url(row)
        if presigned is not None:
            await reader.close()
            return Response(status_code=307, headers={**headers, "Location": presigned})
        headers.update(download_headers(row.content_type, files.inline_types(namespace)))
        headers["Content-Length"] = str(max(plan.byte_range.length, 0))
        if plan.status == 206:
            r = plan.byte_range
            headers["Content-Range"] = f"bytes {r.start}-{r.end}/{row.size}"
        return BlobResponse(
            reader, reader.iter_bytes(plan.byte_range), plan.status, headers, files.send_timeout
        )
    except BaseException:
        await reader.close()
        raise


@router.head(
    "/{collection}/{file_id:path}",
    summary="A file's headers",
    response_class=Response,
    responses={
        200: {"content": _BINARY, "description": "The headers a GET would send, no body."},
        304: {"description": "Not modified (If-None-Match)."},
        **problem_responses(NotFound),
    },
)
async def head_file(
    namespace: NamespacePath,
    collection: CollectionPath,
    file_id: FileId,
    files: Files,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The headers a GET would send (Content-Length, ETag, ...), without the bytes."""
    row = await files.get(namespace, collection, file_id)
    if row is None:
        raise NotFound(f"file {file_id!r} does not exist in collection {collection!r}")
    plan = plan_download(row, None, if_none_match, None)
    headers = file_headers(row)
    if plan.status == 304:
        return Response(status_code=304, headers=headers)
    headers.update(download_headers(row.content_type, files.inline_types(namespace)))
    headers["Content-Length"] = str(row.size)
    return Response(status_code=200, headers=headers)


@router.delete(
    "/{collection}/{file_id:path}",
    summary="Delete a file",
    status_code=204,
    responses=problem_responses(PreconditionFailed),
)
async def delete_file(
    namespace: NamespacePath,
    collection: CollectionPath,
    file_id: FileId,
    files: Files,
    conditions: Conditions,
) -> Response:
    """Delete the file and its bytes; 204 whether or not it existed."""
    await files.delete(namespace, collection, file_id, conditions)
    return Response(status_code=204)
