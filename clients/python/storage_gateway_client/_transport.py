"""Sending requests: error mapping, and retries with backoff for idempotent calls.

Which transport carries the requests (``transport=``): by default (``None``) a plain ``http://``
gateway is spoken to through ``Http11Transport`` (``_http11.py``: a lean HTTP/1.1 client on
asyncio, a fraction of the CPU of httpx's default transport per request), while ``https://``
gateways, and any gateway when the environment names an HTTP proxy (``HTTP_PROXY``/``ALL_PROXY``,
honoured by httpx only with its default transport), keep httpx's default transport.
``"http11"`` asks for ``Http11Transport`` (``http://`` only), ``"httpx"`` for httpx's default
transport whatever the URL; an ``httpx.AsyncBaseTransport`` instance is used as given.

``verify`` is httpx's: ``True`` (the system's CA certificates), ``False``, an ``ssl.SSLContext``,
or the path of a CA bundle (PEM), turned here into an ``SSLContext`` (httpx 0.28 deprecates a
path). It applies only to the transport this module creates, so it is refused together with a
transport instance or an ``http_client`` of the caller's, where it would be silently ignored.
"""

from __future__ import annotations

import asyncio
import os
import random
import ssl
import urllib.request
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, TypeAlias

import httpx

from ._exceptions import ClientClosed, RateLimited, TransportError, Unavailable, error_from_response
from ._http11 import IDEMPOTENT_METHODS, Http11Transport

URL_CACHE_SIZE = 512  # parsed URLs kept (paths differ per collection, key and point)
TRANSPORTS = ("http11", "httpx")  # the transports ``transport=`` names

TransportChoice: TypeAlias = Literal["http11", "httpx"] | httpx.AsyncBaseTransport | None
Verify: TypeAlias = bool | str | os.PathLike[str] | ssl.SSLContext


def _env_http_proxy() -> bool:
    """Whether httpx would read an HTTP proxy from the environment (it does so only for its
    default transport, so then that transport is kept and the proxy honoured as before)."""
    proxies = urllib.request.getproxies()
    if "*" in (host.strip() for host in proxies.get("no", "").split(",")):
        return False
    return bool(proxies.get("http") or proxies.get("all"))


class RetryPolicy:
    """Exponential backoff with jitter for connection errors, 503s and 429s (after their
    ``Retry-After``, up to ``max_backoff``: a namespace's heavy operations at their limit, a
    rate limit)."""

    def __init__(self, attempts: int = 4, backoff: float = 0.1, max_backoff: float = 2.0) -> None:
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.max_backoff = max_backoff

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        base = min(self.max_backoff, self.backoff * (2.0**attempt))
        if retry_after is not None:
            base = min(self.max_backoff, max(base, retry_after))
        return base * (0.5 + random.random() / 2)


class Transport:
    """Owns the lazily created ``httpx.AsyncClient`` and turns answers into values or errors."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        timeout: float | httpx.Timeout,
        retry: RetryPolicy,
        http_client: httpx.AsyncClient | None = None,
        transport: TransportChoice = None,
        verify: Verify = True,
    ) -> None:
        scheme = httpx.URL(base_url).scheme
        if isinstance(transport, str):
            if transport not in TRANSPORTS:
                raise ValueError(f"transport must be one of {TRANSPORTS} or an httpx transport, not {transport!r}")
            if transport == "http11" and scheme != "http":
                raise ValueError(f"transport='http11' speaks plain http only, not {scheme!r}")
            if http_client is not None:
                raise ValueError("transport= names a transport for the client made here; http_client= brings its own")
        if verify is not True and (http_client is not None or isinstance(transport, httpx.AsyncBaseTransport)):
            raise ValueError("verify= applies to the transport made here, not to a given http_client or transport")
        self._base_url = base_url.rstrip("/")
        self._headers = dict(headers)
        self._timeout = timeout
        self._retry = retry
        self._client = http_client
        self._owns_client = http_client is None
        self._transport = transport
        self._verify: bool | ssl.SSLContext = (
            verify if isinstance(verify, bool | ssl.SSLContext) else ssl.create_default_context(cafile=os.fspath(verify))
        )
        self._closed = False
        self._urls: dict[str, httpx.URL] = {}

    def url(self, path: str) -> httpx.URL:
        """The gateway's absolute URL for ``path``, parsed once. (Given a relative path, httpx
        parses it and merges it with the base URL on every request: a fifth of the client's CPU
        for a small call.)"""
        url = self._urls.get(path)
        if url is None:
            if len(self._urls) >= URL_CACHE_SIZE:
                self._urls.clear()
            url = self._urls[path] = httpx.URL(self._base_url + path)
        return url

    @property
    def client(self) -> httpx.AsyncClient:
        if self._closed:
            raise ClientClosed("this GatewayClient is closed")
        if self._client is None:
            choice = self._transport
            if choice is None and httpx.URL(self._base_url).scheme == "http" and not _env_http_proxy():
                choice = "http11"
            transport: httpx.AsyncBaseTransport | None = None  # None: httpx's default
            if choice == "http11":
                transport = Http11Transport()  # its DEFAULT_LIMITS: 100 open, 20 idle for up to 4 s
            elif isinstance(choice, httpx.AsyncBaseTransport):
                transport = choice
            self._client = httpx.AsyncClient(
                base_url=self._base_url,
                headers=self._headers,
                timeout=self._timeout,
                transport=transport,
                verify=self._verify,
                limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
            )
        return self._client

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._client is not None and self._owns_client:
            await self._client.aclose()
        self._client = None

    async def request(
        self,
        method: str,
        url: str,
        *,
        idempotent: bool | None = None,
        ok: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> httpx.Response:
        """Send, retrying idempotent calls; error statuses other than ``ok`` raise."""
        retryable = method.upper() in IDEMPOTENT_METHODS if idempotent is None else idempotent
        if self._client is not None and not self._owns_client:
            kwargs.setdefault("headers", {})
            kwargs["headers"] = {**self._headers, **kwargs["headers"]}
        attempts = self._retry.attempts if retryable else 1
        for attempt in range(attempts):
            try:
                response = await self.client.request(method, self.url(url), **kwargs)
            except httpx.TransportError as exc:
                if attempt + 1 < attempts:
                    await asyncio.sleep(self._retry.delay(attempt))
                    continue
                raise TransportError(f"{method} {url}: {exc.__class__.__name__}: {exc}", cause=exc) from exc
            if response.status_code < 400 or response.status_code in ok:
                return response
            error = error_from_response(response)
            if isinstance(error, (Unavailable, RateLimited)) and attempt + 1 < attempts:
                await asyncio.sleep(self._retry.delay(attempt, error.retry_after))
                continue
            raise error
        raise AssertionError("unreachable")  # pragma: no cover

    def stream(self, method: str, url: str, **kwargs: Any) -> AbstractAsyncContextManager[httpx.Response]:
        """A streaming response context (``async with``); status errors are the caller's to check."""
        return self.client.stream(method, self.url(url), **kwargs)
