"""Async client for storage-gateway."""

from typing import TYPE_CHECKING, Any

from ._client import GatewayClient
from ._files import FileDownload, FileHead, FileInfo, FileList, FilesUsage, IntegrityError
from ._models import KvEntry, PayloadIndex, Record, SortOrder
from ._persist import AsyncPersistStore, RemotePersistStore, create_persist_store
from ._vector_store import RemoteVectorStore, VectorRecord, VectorStoreProtocol, create_vector_store
from ._vectors import VectorsAPI
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

if TYPE_CHECKING:
    from ._checkpoints import GatewayCheckpointSaver
    from ._langchain import GatewayByteStore, GatewayChatMessageHistory, GatewayVectorStore

__all__ = [
    "AsyncPersistStore",
    "ClientClosed",
    "Conflict",
    "FileDownload",
    "FileHead",
    "FileInfo",
    "FileList",
    "FilesUsage",
    "Forbidden",
    "GatewayByteStore",
    "GatewayChatMessageHistory",
    "GatewayCheckpointSaver",
    "GatewayClient",
    "GatewayError",
    "GatewayVectorStore",
    "HTTPStatusError",
    "IntegrityError",
    "InvalidRequest",
    "KvEntry",
    "NotFound",
    "PayloadIndex",
    "PreconditionFailed",
    "RateLimited",
    "Record",
    "RemotePersistStore",
    "RemoteVectorStore",
    "SortOrder",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "VectorRecord",
    "VectorStoreProtocol",
    "VectorsAPI",
    "create_persist_store",
    "create_vector_store",
]


_LANGCHAIN = ("GatewayVectorStore", "GatewayByteStore", "GatewayChatMessageHistory")


def __getattr__(name: str) -> type[Any]:
    """The LangGraph saver and the LangChain adapters are imported on first use: they need the
    ``langgraph`` and ``langchain`` extras."""
    if name == "GatewayCheckpointSaver":
        from ._checkpoints import GatewayCheckpointSaver

        return GatewayCheckpointSaver
    if name in _LANGCHAIN:
        from . import _langchain

        adapter: type[Any] = getattr(_langchain, name)
        return adapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
