"""The S3 bucket of ``files.backend: s3``: every call the gateway makes to it, through aiobotocore.

This is the only module that imports aiobotocore/botocore (imported lazily, so a gateway on the
database backend never pays for them). Downloads' GETs go out on presigned URLs through an aiohttp
session of their own (``S3Objects.get``); everything else through the aiobotocore client. Failures are translated here into two exceptions the rest
of the package understands: ``ObjectMissing`` (the key is gone) and ``ObjectStoreUnavailable``
(a 503 with ``Retry-After``: the bucket cannot be reached or refused us).

Object keys are derived only from values the gateway controls:
``{prefix}{sha256(namespace)[:16]}/{blob_id}`` where ``blob_id`` is a fresh uuid per version.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal, TypedDict
from urllib.parse import SplitResult, urlsplit

from app.files.settings import S3Settings
from app.core.errors import ServiceUnavailable

if TYPE_CHECKING:  # types-aiobotocore[s3], a test extra; nothing is imported at run time
    import aiohttp
    from types_aiobotocore_s3.client import S3Client
    from types_aiobotocore_s3.type_defs import CompletedPartTypeDef

    from aiobotocore.response import StreamingBody

log = logging.getLogger("app.files")

RETRY_AFTER_SECONDS = 2
_BLOB_ID = re.compile(r"^[0-9a-f]{16}/([0-9a-f]{32})$")
_MISSING_CODES = {"NoSuchKey", "404", "NoSuchUpload"}


class ObjectStoreUnavailable(ServiceUnavailable):
    """The bucket is unreachable, slow or refused the gateway's credentials: retry later."""

    code = "object_store_unavailable"

    def __init__(self, detail: str, *, reason: str = "the object store is unavailable") -> None:
        """``reason``: the same in a few words that name no bucket, key or endpoint (what ``/readyz``
        tells a caller without the admin key)."""
        super().__init__(detail, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        self.reason = reason


class _Encryption(TypedDict, total=False):
    """The server-side-encryption arguments every write carries (empty without them)."""

    ServerSideEncryption: Literal["AES256", "aws:kms"]
    SSEKMSKeyId: str


class ObjectMissing(Exception):
    """The object (or multipart upload) does not exist."""


def namespace_segment(namespace: str) -> str:
    return hashlib.sha256(namespace.encode()).hexdigest()[:16]


@contextmanager
def translated(action: str, *, level: int = logging.WARNING) -> Iterator[None]:
    """botocore/aiohttp errors of ``action`` as ``ObjectMissing`` / ``ObjectStoreUnavailable``,
    each logged at ``level``."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        if code in _MISSING_CODES:
            raise ObjectMissing(code) from None
        log.log(level, "object store refused %s: %s %s", action, code, err.get("Message", ""))
        raise ObjectStoreUnavailable(
            f"the object store refused to {action} ({code})", reason="the object store refused the request"
        ) from None
    except (TimeoutError, BotoCoreError, OSError) as exc:
        log.log(level, "object store unreachable during %s: %s", action, exc.__class__.__name__)
        raise ObjectStoreUnavailable(
            f"the object store is unreachable ({action}); retry later", reason="the object store is unreachable"
        ) from None
    except Exception as exc:
        import aiohttp

        if isinstance(exc, aiohttp.ClientError):
            log.log(level, "object store connection failed during %s: %s", action, exc.__class__.__name__)
            raise ObjectStoreUnavailable(
                f"the object store connection failed ({action}); retry later",
                reason="the object store is unreachable",
            ) from None
        raise


@dataclass(frozen=True)
class ListedObject:
    key: str
    blob_id: str
    modified: datetime


@dataclass(frozen=True)
class ListedUpload:
    key: str
    blob_id: str
    upload_id: str
    initiated: datetime


READ_BUFFER_BYTES = 512 * 1024  # a GET's body is read ahead up to twice this (app.core.fences.aiohttp_)

# A download's GET goes out on a presigned URL (see ``S3Objects.get``), signed for this long and
# reused for the same object for at most the second number of seconds (objects never change).
GET_URL_SECONDS = 900
GET_URL_REUSE_SECONDS = 600
GET_URLS_KEPT = 4096


class ObjectBody:
    """A streamed GET: iterate ``chunks()``, and always ``close()``.

    The pieces are the ones aiohttp received (one per socket read, at most the event loop's read
    size, 256 KiB), neither re-cut nor joined: ``StreamingBody.iter_chunks(n)`` would copy each
    into pieces of ``n``. aiohttp keeps reading the S3 socket while they are sent, up to
    ``2 * READ_BUFFER_BYTES`` unread, then pauses it until the response catches up.
    """

    def __init__(self, body: StreamingBody | aiohttp.ClientResponse) -> None:
        import aiohttp

        from app.core.fences.aiohttp_ import widen_read_buffer

        self._body = body
        if isinstance(body, aiohttp.ClientResponse):  # our own session: read_bufsize is set already
            self._content: aiohttp.StreamReader | None = body.content
            return
        raw = getattr(body, "raw_stream", None)  # the aiohttp.ClientResponse (aiobotocore's public property)
        self._content = raw.content if isinstance(raw, aiohttp.ClientResponse) else None
        if self._content is not None:
            widen_read_buffer(self._content, READ_BUFFER_BYTES)

    async def chunks(self) -> AsyncIterator[bytes]:
        with translated("read an object"):
            if self._content is None:  # another HTTP backend than aiohttp: its own read-ahead
                async for piece in self._body.iter_chunks(256 * 1024):  # type: ignore[union-attr]
                    yield piece
                return
            async for piece, _ in self._content.iter_chunks():
                yield piece

    def close(self) -> None:
        self._body.close()


MAX_HEAD_BYTES = 64 * 1024  # an S3 answer's head read by ``get_socket``


class SocketBody:
    """A GET's body left on its socket (``S3Objects.get_socket``): ``buffered``, the bytes read
    with the head, then ``remaining`` more on ``sock``; always ``close()``."""

    def __init__(self, sock: socket.socket, buffered: bytes, length: int, read_timeout: float) -> None:
        self.sock = sock
        self.read_timeout = read_timeout  # the longest the socket may stay silent (files.s3.read_timeout)
        self.buffered = buffered[:length]
        self.remaining = length - len(self.buffered)

    def close(self) -> None:
        self.sock.close()


def _signed_host(parts: SplitResult) -> str:
    """The ``Host`` a presigned URL was signed for, as botocore computes it (``auth._host_from_url``):
    the lower-case host name, bracketed for IPv6, with the port only when it is not the default."""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None and parts.port != {"http": 80, "https": 443}.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


def _parse_head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    """The status and headers (lower-case names) of an HTTP/1.1 answer's head (httptools)."""
    import httptools

    headers: dict[bytes, bytes] = {}

    class Callbacks:
        def on_header(self, name: bytes, value: bytes) -> None:
            headers[name.lower()] = value

    parser = httptools.HttpResponseParser(Callbacks())
    try:
        parser.feed_data(head)
    except httptools.HttpParserError as exc:
        raise ValueError(f"a malformed answer head: {exc}") from None
    return parser.get_status_code(), headers


class S3Objects:
    """One aiobotocore client (one connection pool) for the process, owned by the files lifespan."""

    def __init__(
        self, settings: S3Settings, client: S3Client, stack: AsyncExitStack, http: aiohttp.ClientSession | None = None
    ) -> None:
        self.settings = settings
        self.bucket: str = settings.bucket or ""
        self.prefix = settings.prefix
        self._client = client
        self._stack = stack
        self._http = http  # downloads' GETs on presigned URLs (None: every GET through the client)
        self._get_urls: OrderedDict[str, tuple[float, str]] = OrderedDict()  # key -> (reuse until, URL)
        self._proxies: dict[str, str | None] = {}  # scheme://host -> its proxy from the environment
        self._fallback_logged = False
        self._extra: _Encryption = {}
        if settings.server_side_encryption:
            self._extra["ServerSideEncryption"] = settings.server_side_encryption
            if settings.kms_key_id:
                self._extra["SSEKMSKeyId"] = settings.kms_key_id

    @classmethod
    async def open(cls, settings: S3Settings) -> S3Objects:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        config = AioConfig(
            region_name=settings.region,
            signature_version="s3v4",  # presigned URLs too (botocore would presign with SigV2)
            max_pool_connections=settings.max_connections,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            retries={"max_attempts": 3, "mode": "standard"},
            s3={"addressing_style": "path" if settings.path_style() else "virtual"},
            # Only sign what is needed: SeaweedFS, MinIO and older servers reject the newer
            # default of CRC32 checksums on every request.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        session = get_session()
        stack = AsyncExitStack()
        try:
            client = await stack.enter_async_context(
                session.create_client("s3", endpoint_url=settings.endpoint_url, config=config)
            )
            http = await stack.enter_async_context(_download_session(settings, session.get_config_variable("ca_bundle")))
        except BaseException:
            await stack.aclose()
            raise
        return cls(settings, client, stack, http)

    async def close(self) -> None:
        await self._stack.aclose()

    # --- keys ----------------------------------------------------------------------------

    def key_for(self, namespace: str, blob_id: str) -> str:
        return f"{self.prefix}{namespace_segment(namespace)}/{blob_id}"

    def blob_of(self, key: str) -> str | None:
        """The blob id of a key this gateway wrote, or None for anything else in the bucket."""
        if not key.startswith(self.prefix):
            return None
        match = _BLOB_ID.match(key[len(self.prefix):])
        return match.group(1) if match else None

    # --- writes --------------------------------------------------------------------------

    async def put(self, key: str, data: bytes) -> None:
        with translated("store an object"):
            await self._client.put_object(Bucket=self.bucket, Key=key, Body=data, **self._extra)

    async def create_upload(self, key: str) -> str:
        with translated("start a multipart upload"):
            answer = await self._client.create_multipart_upload(Bucket=self.bucket, Key=key, **self._extra)
        return answer["UploadId"]

    async def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> str:
        with translated("upload a part"):
            answer = await self._client.upload_part(
                Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
            )
        return answer["ETag"]

    async def complete_upload(self, key: str, upload_id: str, etags: list[str]) -> None:
        parts: list[CompletedPartTypeDef] = [{"ETag": etag, "PartNumber": i + 1} for i, etag in enumerate(etags)]
        with translated("complete a multipart upload"):
            await self._client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )

    async def abort_upload(self, key: str, upload_id: str) -> None:
        try:
            with translated("abort a multipart upload"):
                await self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ObjectMissing:
            pass

    async def delete(self, key: str) -> None:
        try:
            with translated("delete an object"):
                await self._client.delete_object(Bucket=self.bucket, Key=key)
        except ObjectMissing:
            pass

    # --- reads ---------------------------------------------------------------------------

    async def get(self, key: str, start: int, end: int) -> ObjectBody:
        """Bytes ``start..end`` (inclusive) of ``key``, streamed.

        Sent as a plain aiohttp GET of a presigned URL, kept per key (an object never changes):
        a ``get_object`` call costs ~3x the CPU of the GET itself in botocore (parameters, event
        hooks, endpoint rules, User-Agent, signing, parsing the answer's headers), which for a
        1 MiB file was half of the gateway's work (docs/benchmarks.md). Anything but a 200/206
        (an expired URL, a missing key, an error, no connection) goes through ``get_object``
        instead, whose retries and answer the caller sees as before.
        """
        byte_range = f"bytes={start}-{end}"
        if self._http is not None:
            response = await self._get_presigned(key, byte_range)
            if response is not None:
                return ObjectBody(response)
        with translated("read an object"):
            answer = await self._client.get_object(Bucket=self.bucket, Key=key, Range=byte_range)
        return ObjectBody(answer["Body"])

    async def _get_url(self, key: str) -> str:
        """``key``'s presigned GET URL, kept for ``GET_URL_REUSE_SECONDS`` (an object never changes)."""
        now = time.monotonic()
        kept = self._get_urls.get(key)
        if kept is not None and kept[0] > now:
            self._get_urls.move_to_end(key)
            return kept[1]
        url = await self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=GET_URL_SECONDS
        )
        self._get_urls[key] = (now + GET_URL_REUSE_SECONDS, url)
        if len(self._get_urls) > GET_URLS_KEPT:
            self._get_urls.popitem(last=False)
        return url

    async def _get_presigned(self, key: str, byte_range: str) -> aiohttp.ClientResponse | None:
        """The GET of ``key``'s presigned URL if it answers 200/206, else None (URL forgotten)."""
        assert self._http is not None
        try:
            url = await self._get_url(key)
            response = await self._http.get(
                url, headers={"Range": byte_range}, allow_redirects=False, proxy=self._proxy_for(url)
            )
        except Exception as exc:  # noqa: BLE001 - get_object retries and reports it
            self._get_urls.pop(key, None)
            self._note_fallback(exc.__class__.__name__)
            return None
        if response.status in (200, 206):
            return response
        response.close()
        self._get_urls.pop(key, None)
        if response.status not in (403, 404):  # (403: an expired URL, e.g. temporary credentials)
            self._note_fallback(f"HTTP {response.status}")
        return None

    async def get_socket(self, key: str, start: int, end: int) -> SocketBody | None:
        """Bytes ``start..end`` of ``key`` on a connection of their own, for ``splice`` to move.

        The presigned GET of ``get``, sent on a plain socket (``Connection: close``) and its
        answer's head read with httptools; the body is left on the socket. Only over plain HTTP
        with no proxy (TLS bytes cannot be spliced), and only for a 200/206 whose
        ``Content-Length`` is the range's: anything else (an error, a refused connection, an
        expired URL) is None, and the caller takes ``get``, which reports it.
        """
        try:
            url = await self._get_url(key)
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname or self._proxy_for(url) is not None:
                return None
        except Exception:  # noqa: BLE001 - no URL (credentials, ...): ``get`` retries and reports it
            return None
        length = end - start + 1
        loop = asyncio.get_running_loop()
        sock: socket.socket | None = None
        try:
            async with asyncio.timeout(self.settings.connect_timeout):
                infos = await loop.getaddrinfo(parts.hostname, parts.port or 80, type=socket.SOCK_STREAM)
                family, kind, proto, _, address = infos[0]
                sock = socket.socket(family, kind, proto)
                sock.setblocking(False)
                await loop.sock_connect(sock, address)
            target = parts.path + ("?" + parts.query if parts.query else "")
            await loop.sock_sendall(sock, (
                f"GET {target} HTTP/1.1\r\nHost: {_signed_host(parts)}\r\nRange: bytes={start}-{end}\r\n"
                "Connection: close\r\nAccept-Encoding: identity\r\n\r\n"
            ).encode("ascii"))
            head = bytearray()
            async with asyncio.timeout(self.settings.read_timeout):
                while (ends := head.find(b"\r\n\r\n")) < 0 and len(head) <= MAX_HEAD_BYTES:
                    received = await loop.sock_recv(sock, 64 * 1024)
                    if not received:
                        break
                    head += received
            if ends < 0:
                raise ConnectionError("no complete answer head")
            status, headers = _parse_head(bytes(head[: ends + 4]))
            if (status not in (200, 206) or headers.get(b"content-length") != str(length).encode()
                    or b"transfer-encoding" in headers or headers.get(b"content-encoding", b"identity") != b"identity"):
                if status in (403, 404):
                    self._get_urls.pop(key, None)
                raise ConnectionError(f"answered {status}")
            body = SocketBody(sock, bytes(head[ends + 4:]), length, self.settings.read_timeout)
            sock = None
            return body
        except (OSError, TimeoutError, ValueError) as exc:
            log.debug("a spliced GET of %s fell back to a copied one: %s", key, exc)
            return None
        finally:
            if sock is not None:
                sock.close()

    def _proxy_for(self, url: str) -> str | None:
        """The proxy botocore would take for ``url`` (``HTTPS_PROXY``, ``NO_PROXY``, ...), looked
        up once per host (aiohttp's ``trust_env`` would look it up, and ``.netrc``, in a thread
        on every request)."""
        scheme, _, rest = url.partition("://")
        origin = f"{scheme}://{rest.partition('/')[0]}"
        if origin not in self._proxies:
            from botocore.utils import get_environ_proxies

            self._proxies[origin] = get_environ_proxies(origin).get(scheme)
        return self._proxies[origin]

    def _note_fallback(self, why: str) -> None:
        if not self._fallback_logged:
            self._fallback_logged = True
            log.warning("a presigned GET failed (%s); read through get_object instead (logged once)", why)

    async def presign(self, key: str, seconds: int, content_type: str) -> str:
        """A GET URL valid for ``seconds`` that serves the object with ``content_type``."""
        with translated("presign a download"):
            return await self._client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": key, "ResponseContentType": content_type},
                ExpiresIn=seconds,
            )

    async def check(self) -> None:
        """Raise unless the bucket answers to these credentials. Logged by the caller, not here
        (``/readyz`` logs a change, not every probe's check)."""
        try:
            with translated("reach the bucket", level=logging.DEBUG):
                await self._client.head_bucket(Bucket=self.bucket)
        except ObjectMissing:
            raise ObjectStoreUnavailable(
                f"bucket {self.bucket!r} does not exist", reason="the bucket does not exist"
            ) from None

    # --- listings (for the sweep) --------------------------------------------------------

    async def objects(self) -> AsyncIterator[list[ListedObject]]:
        """The gateway's objects under the prefix, a page (up to 1000) at a time."""
        paginator = self._client.get_paginator("list_objects_v2")
        with translated("list objects"):
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                listed = []
                for item in page.get("Contents", []):
                    blob_id = self.blob_of(item["Key"])
                    if blob_id is not None:
                        listed.append(ListedObject(item["Key"], blob_id, item["LastModified"]))
                yield listed

    async def uploads(self) -> AsyncIterator[list[ListedUpload]]:
        """Multipart uploads in progress under the prefix, a page at a time."""
        paginator = self._client.get_paginator("list_multipart_uploads")
        with translated("list multipart uploads"):
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                listed = []
                for item in page.get("Uploads", []):
                    blob_id = self.blob_of(item["Key"])
                    if blob_id is not None:
                        listed.append(ListedUpload(item["Key"], blob_id, item["UploadId"], item["Initiated"]))
                yield listed


def _download_session(settings: S3Settings, ca_bundle: str | None) -> aiohttp.ClientSession:
    """The HTTP session of downloads' GETs, set up as aiobotocore sets up its own: the same
    timeouts, botocore's CA bundle, bodies left encoded (and proxies: ``S3Objects._proxy_for``)."""
    import ssl

    import aiohttp
    from botocore.httpsession import get_cert_path

    context = ssl.create_default_context(cafile=ca_bundle or get_cert_path(True))
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=settings.max_connections, ssl=context, keepalive_timeout=12),  # (aiobotocore's)
        timeout=aiohttp.ClientTimeout(sock_connect=settings.connect_timeout, sock_read=settings.read_timeout),
        read_bufsize=READ_BUFFER_BYTES,
        auto_decompress=False,
    )
