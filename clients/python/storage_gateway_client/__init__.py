"""Async client for storage-gateway."""

from ._client import GatewayClient
from ._persist import AsyncPersistStore, RemotePersistStore
from ._vector_store import RemoteVectorStore, VectorRecord, VectorStoreProtocol
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
    "AsyncPersistStore",
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
    "RemotePersistStore",
    "RemoteVectorStore",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "VectorRecord",
    "VectorStoreProtocol",
]
