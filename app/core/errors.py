"""One exception root and one renderer: every error leaves as RFC 9457 problem+json.

Domain code raises a ``ProblemError`` subclass; nothing builds ``HTTPException`` strings. The same
classes document each route's error answers in OpenAPI through ``problem_responses``.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from app.core.ops.metrics import count_problem
from app.core.http.requestid import current_request_id
from app.core.state import disk_space_of

log = logging.getLogger("app.errors")

PROBLEM_JSON = "application/problem+json"
DATABASE_RETRY_AFTER_SECONDS = 2


class Problem(BaseModel):
    """RFC 9457 problem details, with a stable machine-readable ``code``."""

    type: str = Field(default="about:blank", examples=["about:blank"])
    title: str = Field(examples=["Not Found"])
    status: int = Field(examples=[404])
    code: str = Field(description="Stable machine-readable error code.", examples=["not_found"])
    detail: str | None = Field(default=None, examples=["kv entry 'theme' does not exist"])
    instance: str | None = None
    request_id: str | None = None
    errors: list[dict[str, Any]] | None = Field(
        default=None, description="Per-field validation errors, each naming its location."
    )


class ProblemError(Exception):
    """Base of every error the gateway answers on purpose."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    title: ClassVar[str] = "Internal Server Error"

    def __init__(
        self,
        detail: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        errors: list[dict[str, Any]] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(detail or self.title)
        self.detail = detail
        self.headers = headers or {}
        self.errors = errors
        self.instance_code = code or self.code


class BadRequest(ProblemError):
    status, code, title = 400, "bad_request", "Bad Request"


class Unauthorized(ProblemError):
    status, code, title = 401, "unauthorized", "Unauthorized"


class Forbidden(ProblemError):
    status, code, title = 403, "forbidden", "Forbidden"


class NotFound(ProblemError):
    status, code, title = 404, "not_found", "Not Found"


class MethodNotAllowed(ProblemError):
    status, code, title = 405, "method_not_allowed", "Method Not Allowed"


class RequestTimeout(ProblemError):
    status, code, title = 408, "request_timeout", "Request Timeout"


class Conflict(ProblemError):
    status, code, title = 409, "conflict", "Conflict"


class PreconditionFailed(ProblemError):
    status, code, title = 412, "precondition_failed", "Precondition Failed"


class PayloadTooLarge(ProblemError):
    status, code, title = 413, "payload_too_large", "Content Too Large"


class UnsupportedMediaType(ProblemError):
    status, code, title = 415, "unsupported_media_type", "Unsupported Media Type"


class RangeNotSatisfiable(ProblemError):
    status, code, title = 416, "range_not_satisfiable", "Range Not Satisfiable"


class InvalidInput(ProblemError):
    """A request that parsed but names something invalid; ``field`` says which."""

    status, code, title = 422, "invalid_input", "Unprocessable Content"

    def __init__(self, field: str, message: str, **kwargs: Any) -> None:
        loc = field.split(".")
        super().__init__(
            f"{field}: {message}", errors=[{"loc": loc, "msg": message}], **kwargs
        )
        self.field = field


class OutOfRange(ProblemError):
    """A number the database cannot hold (beyond 64-bit integers): the request, not the server."""

    status, code, title = 422, "out_of_range", "Unprocessable Content"


class TooManyRequests(ProblemError):
    status, code, title = 429, "rate_limited", "Too Many Requests"


class ServiceUnavailable(ProblemError):
    status, code, title = 503, "unavailable", "Service Unavailable"


class InsufficientStorage(ProblemError):
    status, code, title = 507, "insufficient_storage", "Insufficient Storage"


def problem_response(
    status: int,
    title: str,
    code: str,
    detail: str | None = None,
    *,
    request: Request | None = None,
    headers: dict[str, str] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status, "code": code}
    if detail:
        body["detail"] = detail
    request_id = current_request_id()
    if request is not None:
        body["instance"] = request.url.path
        request_id = getattr(request.state, "request_id", None) or request_id
    if request_id:
        body["request_id"] = request_id
    if errors:
        body["errors"] = errors
    count_problem(code, status)
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


def render(error: ProblemError, request: Request | None = None) -> JSONResponse:
    return problem_response(
        error.status,
        error.title,
        error.instance_code,
        error.detail,
        request=request,
        headers=error.headers,
        errors=error.errors,
    )


MAX_LISTED_ERRORS = 100


def _jsonable_errors(errors: Any) -> list[dict[str, Any]]:
    out = []
    for err in errors[:MAX_LISTED_ERRORS]:
        item = {"loc": [str(x) for x in err.get("loc", ())], "msg": str(err.get("msg", "")), "type": err.get("type")}
        out.append(item)
    return out


def _describe_validation(errors: list[dict[str, Any]], total: int) -> str:
    parts = []
    for err in errors[:5]:
        loc = [x for x in err["loc"] if x not in ("body", "query", "path", "header")] or err["loc"]
        parts.append(f"{'.'.join(loc)}: {err['msg']}")
    more = f" (and {total - 5} more)" if total > 5 else ""
    return "; ".join(parts) + more


_STATUS_CODES: dict[int, type[ProblemError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    408: RequestTimeout,
    409: Conflict,
    412: PreconditionFailed,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    416: RangeNotSatisfiable,
    422: InvalidInput,
    429: TooManyRequests,
    503: ServiceUnavailable,
    507: InsufficientStorage,
}

SQLITE_FULL = 13  # "database or disk is full"
POSTGRES_DISK_FULL = "53100"


def disk_full_kind(exc: BaseException) -> str | None:
    """``"sqlite"`` / ``"postgresql"`` / ``"os"`` when ``exc`` says the disk is full, else None."""
    if isinstance(exc, sa_exc.DBAPIError):
        orig = exc.orig
        if getattr(orig, "sqlstate", None) == POSTGRES_DISK_FULL:
            return "postgresql"
        if getattr(orig, "sqlite_errorcode", None) == SQLITE_FULL or "database or disk is full" in str(orig):
            return "sqlite"
        return None
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "os"
    return None


def is_database_unavailable(exc: BaseException) -> bool:
    """Connection-level failures (refused, timed out, pool exhausted, locked): retryable 503s."""
    if isinstance(exc, (sa_exc.TimeoutError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        # PostgreSQL says why by SQLSTATE: 08xxx connection exceptions, 57P0x the server is
        # shutting down / starting up / crashed, 53300 too many connections, 57014 a statement
        # cancelled by statement_timeout (an overloaded or stuck server), 40P01 a deadlock and
        # 40001 a serialization failure (the transaction was rolled back: retrying it is the
        # remedy PostgreSQL documents): all retryable.
        sqlstate = getattr(exc.orig, "sqlstate", None) or ""
        if sqlstate.startswith(("08", "57P")) or sqlstate in ("53300", "57014", "40P01", "40001"):
            return True
        if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError)):
            return True
        text = str(exc.orig).lower() if exc.orig is not None else ""
        return any(s in text for s in ("connection", "database is locked", "cannot connect"))
    if isinstance(exc, OSError):
        return True
    return False


async def app_error_response(scope: Scope, exc: Exception) -> Response | None:
    """The app's own answer to ``exc`` (its most specific exception handler), or None without one.

    For middlewares that catch an error outside FastAPI's exception middleware and must still
    answer it the way the app would.
    """
    handlers = getattr(scope.get("app"), "exception_handlers", {})
    for cls in type(exc).__mro__:
        if cls in handlers:
            response: Response = await handlers[cls](Request(scope), exc)
            return response
    return None


@dataclass(frozen=True)
class DatabaseErrorRule:
    """A database error a capability's own statements can cause, answered as ``problem()``
    instead of a 500 (``Capability.errors``). It matches an error by the name of a constraint
    (a PostgreSQL error's ``constraint_name``, or the name in SQLite's message), by PostgreSQL's
    SQLSTATE, or by a fragment of SQLite's message; each one given must match."""

    problem: Callable[[], ProblemError]
    constraint: str | None = None
    sqlstate: str | None = None
    sqlite_message: str | None = None

    def matches(self, exc: BaseException) -> bool:
        if self.constraint is None and self.sqlstate is None and self.sqlite_message is None:
            return False
        errors = list(_driver_errors(exc))
        if self.sqlstate is not None and not any(getattr(e, "sqlstate", None) == self.sqlstate for e in errors):
            return False
        if self.sqlite_message is not None and not any(self.sqlite_message in _sqlite_text(e) for e in errors):
            return False
        if self.constraint is not None and not any(
            getattr(e, "constraint_name", None) == self.constraint or f"failed: {self.constraint}" in _sqlite_text(e)
            for e in errors
        ):
            return False
        return True


def _driver_errors(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the driver's error SQLAlchemy wraps, and what that one wraps (asyncpg's own)."""
    yield exc
    orig = exc.orig if isinstance(exc, sa_exc.DBAPIError) else None
    if orig is not None:
        yield orig
        if orig.__cause__ is not None:
            yield orig.__cause__


def _sqlite_text(exc: BaseException) -> str:
    return str(exc) if getattr(exc, "sqlite_errorcode", None) is not None else ""


INTEGER_OUT_OF_RANGE = DatabaseErrorRule(
    lambda: OutOfRange("a number is out of range: integers are stored in 64 bits"), sqlstate="22003"
)
"""PostgreSQL's numeric_value_out_of_range, whichever capability's statement met it."""


def database_problem(exc: BaseException, rules: tuple[DatabaseErrorRule, ...] = ()) -> ProblemError | None:
    """What ``exc`` means to the client, if it is a database error ``rules`` (a capability's own,
    tried first) or the gateway's own rules name: an integer beyond 64 bits (PostgreSQL's 22003,
    or Python's ``OverflowError`` binding one to SQLite) is a 422 on both backends."""
    from app.quotas.usage import quota_problem  # a write the quota triggers refused: 507 naming it

    if (quota := quota_problem(exc)) is not None:
        return quota
    for rule in (*rules, INTEGER_OUT_OF_RANGE):
        if rule.matches(exc):
            return rule.problem()
    if any(isinstance(e, OverflowError) for e in _driver_errors(exc)):
        return OutOfRange("a number is out of range: integers are stored in 64 bits")
    return None


def _rules_of(request: Request) -> tuple[DatabaseErrorRule, ...]:
    """The error rules of the capability whose route ``request`` matched (``/v1/{namespace}/<name>/...``)."""
    template = getattr(request.scope.get("route"), "path_format", "") or ""
    parts = template.split("/")
    state = getattr(request.app.state, "gateway", None)
    if len(parts) < 4 or parts[1] != "v1" or state is None:
        return ()
    for capability in state.capabilities:
        if capability.name == parts[3]:
            rules: tuple[DatabaseErrorRule, ...] = capability.errors
            return rules
    return ()


def install_error_handlers(app: FastAPI) -> None:
    """Render every error, including FastAPI's own, as problem+json."""

    async def on_problem(request: Request, exc: ProblemError) -> JSONResponse:
        return render(exc, request)

    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        every = exc.errors()
        errors = _jsonable_errors(every)  # the first MAX_LISTED_ERRORS of them
        return problem_response(
            422, "Unprocessable Content", "invalid_input", _describe_validation(errors, len(every)),
            request=request, errors=errors,
        )

    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        cls = _STATUS_CODES.get(exc.status_code)
        title = cls.title if cls else "Error"
        code = cls.code if cls else f"http_{exc.status_code}"
        raw: object = exc.detail  # typed str, but FastAPI's HTTPException carries any JSON
        detail = raw if isinstance(raw, str) else None
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route matches {request.method} {request.url.path}"
        if exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}"
        return problem_response(
            exc.status_code, title, code, detail, request=request, headers=getattr(exc, "headers", None)
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        problem = database_problem(exc, _rules_of(request))
        if problem is not None:
            return render(problem, request)
        kind = disk_full_kind(exc)
        if kind is not None:  # before "unavailable": a full disk is not worth a retry in 2 s
            space = disk_space_of(request)
            if space is not None:
                space.on_disk_full(sqlite=kind != "postgresql")
            return render(InsufficientStorage("the database's disk is full; delete data or free disk space"), request)
        if is_database_unavailable(exc):
            # One line per refused request, not a traceback each: an outage would drown the log.
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            log.warning(
                "database unavailable: %s: %s", exc.__class__.__name__, reason[0] if reason else "",
                extra={"code": "database_unavailable"},
            )
            return problem_response(
                503, "Service Unavailable", "database_unavailable",
                "a database needed for this request is unreachable; retry later",
                request=request, headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
            )
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return problem_response(500, "Internal Server Error", "internal_error", None, request=request)

    app.add_exception_handler(ProblemError, on_problem)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http)  # type: ignore[arg-type]
    # Database and OS errors are handled in the inner middleware so they are answered, not re-raised.
    app.add_exception_handler(sa_exc.SQLAlchemyError, on_unexpected)
    app.add_exception_handler(OSError, on_unexpected)
    app.add_exception_handler(Exception, on_unexpected)


def problem_responses(*errors: type[ProblemError]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` for the problem classes a route may answer with."""
    out: dict[int | str, dict[str, Any]] = {}
    for err in errors:
        out[err.status] = {
            "model": Problem,
            "description": err.title,
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
    return out
