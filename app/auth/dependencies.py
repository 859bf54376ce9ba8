"""Who may call what: the one check in front of every ``/v1`` route.

The capability is the gate's (``app.core.routing``: ``/v1/{namespace}/<capability>/...``) and the
action the route's: reads are GET/HEAD and the POSTs declared read-only (``@accepts(...,
read_only=True)``). The check runs from the headers alone, before any byte of the body is read
and before any handler touches data, so a refusal says nothing about what exists.
"""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import Depends, Request

from app.auth.cache import KeyCache
from app.auth.ratelimit import RateLimiter
from app.auth.service import ADMIN, ANONYMOUS, Principal, same_secret
from app.core.errors import Forbidden, TooManyRequests, Unauthorized

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="storage-gateway"'}
_PRINCIPAL = "gateway.principal"


async def authenticate(request: Request) -> Principal:
    """The caller's principal, or 401 (once per request). With auth disabled everyone is anonymous."""
    known: Principal | None = request.scope.get(_PRINCIPAL)
    if known is not None:
        return known
    settings = request.app.state.settings
    if settings.auth.mode == "disabled":
        request.scope[_PRINCIPAL] = ANONYMOUS
        return ANONYMOUS
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("an API key is required: send `Authorization: Bearer <key>`", headers=_CHALLENGE)
    admin_key = settings.auth.admin_key
    if admin_key is not None and same_secret(token, admin_key.get_secret_value()):
        principal = ADMIN
    else:
        keys: KeyCache = request.app.state.key_cache
        found = await keys.principal(token)
        if found is None:
            raise Unauthorized(
                "the API key is not valid (unknown, malformed or revoked)",
                headers={"WWW-Authenticate": 'Bearer realm="storage-gateway", error="invalid_token"'},
            )
        principal = found
    limiter: RateLimiter = request.app.state.rate_limiter
    if limiter.enabled and not principal.is_admin:
        wait = limiter.acquire(principal.key_id)
        if wait > 0:
            raise TooManyRequests(
                "rate limit exceeded for this key", headers={"Retry-After": str(max(1, math.ceil(wait)))}
            )
    request.scope[_PRINCIPAL] = principal
    return principal


async def capability_guard(request: Request, capability: str, reads: bool) -> None:
    """The gate of every capability route: 401 without a valid key, 403 unless the key covers
    this namespace and the capability's read (or write) scope. Runs before the body is read."""
    principal = await authenticate(request)
    namespace = request.path_params.get("namespace", "")
    action = "read" if reads else "write"
    if not principal.allows_namespace(namespace) or not principal.allows(capability, action):
        raise Forbidden(f"this API key may not {action} {capability} in this namespace")


async def admin_guard(request: Request, _gate: str, _reads: bool) -> None:
    """The gate of key management: the admin key only. Runs before the body is read."""
    await require_admin(await authenticate(request))


async def require_admin(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    if not principal.is_admin:
        raise Forbidden("only the admin key may manage API keys")
    return principal


Admin = Annotated[Principal, Depends(require_admin)]
