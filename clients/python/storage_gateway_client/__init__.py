"""Async client for storage-gateway."""

from ._client import GatewayClient
from ._exceptions import (
    ClientClosed,
    Conflict,
    Forbidden,
    GatewayError,
    HTTPStatusError,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
    RateLimited,
    TransportError,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "ClientClosed",
    "Conflict",
    "Forbidden",
    "GatewayClient",
    "GatewayError",
    "HTTPStatusError",
    "InvalidRequest",
    "NotFound",
    "PreconditionFailed",
    "RateLimited",
    "TransportError",
    "Unauthorized",
    "Unavailable",
]
