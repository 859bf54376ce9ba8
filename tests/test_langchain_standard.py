"""LangChain's own standard suites against the client's adapters, on a live gateway, both backends:
``VectorStoreIntegrationTests`` (sync and async) for ``GatewayVectorStore`` and the
``BaseStore`` suites for ``GatewayByteStore``. Only the fixtures they ask for are given; no test
of theirs is overridden or skipped (their own ``test_no_overrides_DO_NOT_OVERRIDE`` checks it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from langchain_tests.integration_tests import (
    BaseStoreAsyncTests,
    BaseStoreSyncTests,
    VectorStoreIntegrationTests,
)

from storage_gateway_client import GatewayByteStore, GatewayClient, GatewayVectorStore
from tests.conftest import ADMIN_KEY, Server

# Bytes no text encoding round-trips, nothing at all, and UTF-8.
THREE_VALUES = (b"\x00\xfe\xff\x80 binary", b"", "🎉 buzz".encode())


class TestGatewayVectorStore(VectorStoreIntegrationTests):
    @pytest.fixture
    async def vectorstore(self, server: Server, namespace: str) -> AsyncIterator[GatewayVectorStore]:
        """An empty store: a fresh namespace; the collection is made by its first write."""
        async with GatewayClient(server.url, namespace, ADMIN_KEY) as client:
            store = GatewayVectorStore(client, "standard", self.get_embeddings())
            yield store
            await store.aclose()


class TestGatewayByteStoreSync(BaseStoreSyncTests[bytes]):
    @pytest.fixture
    def kv_store(self, server: Server, namespace: str) -> Iterator[GatewayByteStore]:
        store = GatewayByteStore(GatewayClient(server.url, namespace, ADMIN_KEY), "bytes")
        yield store
        store.close()  # the sync methods' connections (the client given was never used)

    @pytest.fixture
    def three_values(self) -> tuple[bytes, bytes, bytes]:
        return THREE_VALUES


class TestGatewayByteStoreAsync(BaseStoreAsyncTests[bytes]):
    @pytest.fixture
    async def kv_store(self, server: Server, namespace: str) -> AsyncIterator[GatewayByteStore]:
        async with GatewayClient(server.url, namespace, ADMIN_KEY) as client:
            yield GatewayByteStore(client, "bytes")

    @pytest.fixture
    def three_values(self) -> tuple[bytes, bytes, bytes]:
        return THREE_VALUES
