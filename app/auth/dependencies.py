"""Who may call what: the one check in front of every ``/v1`` route.

The capability comes from the route template (``/v1/{namespace}/<capability>/...``) and the
action from the method, except the POSTs that only read (vector search and point listing).
The check runs before any handler touches data, so a refusal says nothing about what exists.
"""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import Depends, Request

from app.auth.ratelimit import RateLimiter
from app.auth.service import ADMIN, ANONYMOUS, Principal, same_secret, verify
from app.core.config import Database
from app.core.errors import Forbidden, TooManyRequests, Unauthorized
from app.core.observability import route_template

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
READ_ONLY_POSTS = frozenset({
    "/v1/{namespace}/vectors/{collection}/search",
    "/v1/{namespace}/vectors/{collection}/points/list",
    "/v1/{namespace}/checkpoints/search",
})
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="storage-gateway"'}


def required_permission(request: Request) -> tuple[str, str]:
    """(capability, action) of the matched route."""
    template = route_template(request.scope)
    parts = template.split("/")
    capability = parts[3] if len(parts) > 3 else ""
    read = request.method in READ_METHODS or (request.method == "POST" and template in READ_ONLY_POSTS)
    return capability, "read" if read else "write"


async def authenticate(request: Request) -> Principal:
    """The caller's principal, or 401. With auth disabled everyone is anonymous and allowed."""
    settings = request.app.state.settings
    if settings.auth.mode == "disabled":
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
        async with request.app.state.databases.engine(Database.metadata).connect() as conn:
            principal = await verify(conn, token)
        if principal is None:
            raise Unauthorized(
                "the API key is not valid (unknown, malformed or revoked)",
                headers={"WWW-Authenticate": 'Bearer realm="storage-gateway", error="invalid_token"'},
            )
    limiter: RateLimiter = request.app.state.rate_limiter
    if limiter.enabled and not principal.is_admin:
        wait = limiter.acquire(principal.key_id)
        if wait > 0:
            raise TooManyRequests(
                "rate limit exceeded for this key", headers={"Retry-After": str(max(1, math.ceil(wait)))}
            )
    request.state.principal = principal
    return principal


async def authorize(request: Request, principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    """403 unless the key covers this namespace and the route's capability and action."""
    namespace = request.path_params.get("namespace", "")
    capability, action = required_permission(request)
    if not principal.allows_namespace(namespace) or not principal.allows(capability, action):
        raise Forbidden(f"this API key may not {action} {capability} in this namespace")
    return principal


async def require_admin(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    if not principal.is_admin:
        raise Forbidden("only the admin key may manage API keys")
    return principal


Authorized = Annotated[Principal, Depends(authorize)]
Admin = Annotated[Principal, Depends(require_admin)]
