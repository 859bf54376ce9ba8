"""Async client for storage-gateway."""

from typing import TYPE_CHECKING

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
    InsufficientStorage,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
    QuotaExceeded,
    RateLimited,
    TransportError,
    Unauthorized,
    Unavailable,
)

if TYPE_CHECKING:
    from ._checkpoints import GatewayCheckpointSaver
    from ._langchain import GatewayByteStore, GatewayChatMessageHistory, GatewayVectorStore
    from ._langgraph import make_checkpointer, make_store
    from ._store import GatewayStore

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
    "GatewayStore",
    "GatewayVectorStore",
    "HTTPStatusError",
    "InsufficientStorage",
    "IntegrityError",
    "InvalidRequest",
    "KvEntry",
    "NotFound",
    "PayloadIndex",
    "PreconditionFailed",
    "QuotaExceeded",
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
    "make_checkpointer",
    "make_store",
]


# What is imported on first use, from which module: the LangGraph adapters need the
# ``langgraph`` extra, the LangChain ones the ``langchain`` extra.
_LAZY = {
    "GatewayCheckpointSaver": "._checkpoints",
    "GatewayStore": "._store",
    "make_checkpointer": "._langgraph",
    "make_store": "._langgraph",
    "GatewayVectorStore": "._langchain",
    "GatewayByteStore": "._langchain",
    "GatewayChatMessageHistory": "._langchain",
}


def __getattr__(name: str) -> object:
    """The LangGraph and LangChain adapters are imported on first use (their extras)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
