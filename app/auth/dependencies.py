"""Who may call what: the one check in front of every ``/v1`` route.

The capability is the gate's (``app.core.http.routing``: ``/v1/{namespace}/<capability>/...``) and the
action the route's: reads are GET/HEAD and the POSTs declared read-only (``@accepts(...,
read_only=True)``). The check runs from the headers alone, before any byte of the body is read
and before any handler touches data, so a refusal says nothing about what exists. Rate limits
(optional, per process): per key when the key is known, per namespace once the key may use it
(a namespace's keys share its bucket; the admin key has none).
"""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import Depends, Request

from app.auth.service import ADMIN, ANONYMOUS, Principal, same_secret
from app.core.config import Settings
from app.core.errors import Forbidden, TooManyRequests, Unauthorized
from app.core.state import disk_space_of, gateway_state

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="storage-gateway"'}
_PRINCIPAL = "gateway.principal"


async def authenticate(request: Request) -> Principal:
    """The caller's principal, or 401 (once per request). With auth disabled everyone is anonymous."""
    known: Principal | None = request.scope.get(_PRINCIPAL)
    if known is not None:
        return known
    state = gateway_state(request.app)
    settings = state.settings
    if settings.auth.mode == "disabled":
        request.scope[_PRINCIPAL] = ANONYMOUS
        return ANONYMOUS
    token = _bearer_token(request)
    if not token:
        raise Unauthorized("an API key is required: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)", headers=_CHALLENGE)
    if _is_admin_key(settings, token):
        principal = ADMIN
    else:
        found = await state.key_cache.principal(token)
        if found is None:
            raise Unauthorized(
                "the API key is not valid (unknown, malformed or revoked)",
                headers={"WWW-Authenticate": 'Bearer realm="storage-gateway", error="invalid_token"'},
            )
        principal = found
    limiter = state.rate_limiter
    if limiter.enabled and not principal.is_admin:
        wait = limiter.acquire(principal.key_id)
        if wait > 0:
            raise TooManyRequests(
                "rate limit exceeded for this key", headers={"Retry-After": str(max(1, math.ceil(wait)))}
            )
    request.scope[_PRINCIPAL] = principal
    return principal


def presents_admin_key(request: Request) -> bool:
    """Whether the request carries the admin key, checked as ``authenticate`` checks it, for an
    answer that needs no key but tells the admin more (``/readyz``). Any other key, or none, is
    simply not the admin: no 401, no look-up in the keys table (so it answers with the database
    down) and no rate-limit token spent."""
    token = _bearer_token(request)
    return bool(token) and _is_admin_key(gateway_state(request.app).settings, token)


def _bearer_token(request: Request) -> str:
    """The key of ``Authorization: Bearer <key>``, else of ``x-api-key: <key>`` (how LangGraph's
    SDK sends one), or "" without either."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return token.strip()
    return request.headers.get("x-api-key", "").strip()


def _is_admin_key(settings: Settings, token: str) -> bool:
    admin_key = settings.auth.admin_key
    return admin_key is not None and same_secret(token, admin_key.get_secret_value())


async def capability_guard(request: Request, capability: str, reads: bool) -> None:
    """The gate of every capability route: 401 without a valid key, 403 unless the key covers
    this namespace and the capability's read (or write) scope. Runs before the body is read."""
    principal = await authenticate(request)
    if request.method not in _SAFE_METHODS:
        if principal is ANONYMOUS:
            refuse_foreign_origin(request)
        if not reads and (space := disk_space_of(request)) is not None:
            space.check_write(request)  # 507 while the disk is full, unless it frees space (a POST read never needs any)
    namespace = request.path_params.get("namespace", "")
    action = "read" if reads else "write"
    if not principal.allows_namespace(namespace) or not principal.allows(capability, action):
        raise Forbidden(f"this API key may not {action} {capability} in this namespace")
    limiter = gateway_state(request.app).namespace_limiter
    if limiter is not None and limiter.enabled and not principal.is_admin:
        wait = limiter.acquire(namespace)
        if wait > 0:
            raise TooManyRequests(
                f"rate limit exceeded for namespace {namespace!r} (all its keys together)",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )


async def namespace_read_guard(request: Request, _gate: str, _reads: bool) -> None:
    """The gate of a namespace's own routes (``/v1/{namespace}/usage``): a key of the namespace
    with a read (or write) scope of any capability."""
    principal = await authenticate(request)
    namespace = request.path_params.get("namespace", "")
    names = gateway_state(request.app).capability_names
    if not principal.allows_namespace(namespace) or not any(principal.allows(c, "read") for c in names):
        raise Forbidden("this API key may not read in this namespace")


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}


def _authority(authority: str) -> tuple[str, str]:
    """``host[:port]`` (an IPv6 literal in brackets) as (host, port or "")."""
    authority = authority.lower()
    if authority.startswith("["):
        host, _, rest = authority.partition("]")
        return host + "]", rest[1:] if rest.startswith(":") else ""
    host, _, port = authority.partition(":")
    return host, port


def refuse_foreign_origin(request: Request) -> None:
    """Keyless mode: 403 for a browser write from a page of another origin (CSRF: a form or fetch
    needs no preflight), unless ``auth.allowed_origins`` names it. Clients that send no ``Origin``
    (not a browser) pass. The gateway's own origin is the request's scheme (uvicorn applies
    X-Forwarded-Proto from trusted proxies) and Host; a proxy that drops the port from Host
    (nginx ``$host``) is compared by scheme and host name alone."""
    origin = request.headers.get("origin")
    if origin is None or origin.lower() in gateway_state(request.app).settings.auth.allowed_origins:
        return
    scheme, sep, authority = origin.lower().partition("://")
    ours = request.scope.get("scheme", "http")
    if sep and authority and "/" not in authority and scheme == ours:
        their_host, their_port = _authority(authority)
        host, port = _authority(request.headers.get("host", ""))
        default = _DEFAULT_PORTS.get(scheme, "")
        if their_host == host and (not port or (their_port or default) == port):
            return
    raise Forbidden(
        f"a write from a web page of another origin ({origin[:200]!r}) is refused without an API key; "
        "auth.allowed_origins may allow it"
    )


async def admin_guard(request: Request, _gate: str, _reads: bool) -> None:
    """The gate of key management: the admin key only. Runs before the body is read."""
    await require_admin(await authenticate(request))


async def require_admin(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    if not principal.is_admin:
        raise Forbidden("only the admin key may manage API keys and quotas (/v1/admin)")
    return principal


Admin = Annotated[Principal, Depends(require_admin)]
