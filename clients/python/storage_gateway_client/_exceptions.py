"""One error root: transport failures (wrapping httpx) and HTTP status errors from problem+json."""

from __future__ import annotations

from typing import Any

import httpx


class GatewayError(Exception):
    """Base of every error this client raises."""


class TransportError(GatewayError):
    """The gateway could not be reached, or the connection failed mid-request."""

    def __init__(self, message: str, *, cause: httpx.TransportError | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class ClientClosed(GatewayError):
    """The client was used after ``close()``."""


class HTTPStatusError(GatewayError):
    """The gateway answered with an error status; the problem+json fields are kept."""

    status_code: int = 0

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        code: str | None = None,
        problem: dict[str, Any] | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.problem = problem or {}
        self.retry_after = retry_after
        self.request_id = request_id

    @property
    def detail(self) -> str | None:
        return self.problem.get("detail")


class InvalidRequest(HTTPStatusError):
    """400, 413, 415, 416 or 422: the request itself is wrong."""


class Unauthorized(HTTPStatusError):
    """401: no API key, or one the gateway does not know."""


class Forbidden(HTTPStatusError):
    """403: the key is not valid for this namespace or action."""


class NotFound(HTTPStatusError):
    """404."""


class Conflict(HTTPStatusError):
    """409: e.g. a vector collection that exists with another size or distance."""


class PreconditionFailed(HTTPStatusError):
    """412: an ``If-Match`` / ``If-None-Match`` condition did not hold."""


class RateLimited(HTTPStatusError):
    """429; ``retry_after`` says when to try again."""


class Unavailable(HTTPStatusError):
    """503: a database is unreachable; ``retry_after`` says when to try again."""


class InsufficientStorage(HTTPStatusError):
    """507: the database's disk is full, or (``QuotaExceeded``) the namespace's quota."""


class QuotaExceeded(InsufficientStorage):
    """507 ``quota_exceeded``: the write would pass the namespace's quota, named by ``quota``
    (``kv.bytes``, ``files.items``, ...); nothing was written."""

    @property
    def quota(self) -> str | None:
        errors = self.problem.get("errors") or [{}]
        quota = errors[0].get("quota") if isinstance(errors[0], dict) else None
        return quota if isinstance(quota, str) else None


_BY_STATUS: dict[int, type[HTTPStatusError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    412: PreconditionFailed,
    413: InvalidRequest,
    415: InvalidRequest,
    416: InvalidRequest,
    422: InvalidRequest,
    429: RateLimited,
    503: Unavailable,
    507: InsufficientStorage,
}


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def error_from_response(response: httpx.Response) -> HTTPStatusError:
    """The exception for an error response, built from its problem+json body when it has one."""
    problem: dict[str, Any] = {}
    try:
        body = response.json()
        if isinstance(body, dict):
            problem = body
    except ValueError:
        pass
    status = response.status_code
    cls = _BY_STATUS.get(status, HTTPStatusError)
    if status == 507 and problem.get("code") == "quota_exceeded":
        cls = QuotaExceeded
    message = problem.get("detail") or problem.get("title") or response.reason_phrase or f"HTTP {status}"
    return cls(
        f"{status} {message}",
        status_code=status,
        code=problem.get("code"),
        problem=problem,
        retry_after=_retry_after(response),
        request_id=response.headers.get("x-request-id") or problem.get("request_id"),
    )
