"""``GatewayCheckpointSaver``: LangGraph's ``BaseCheckpointSaver`` (langgraph-checkpoint 4.x) on
the gateway's checkpoints capability. Needs the ``langgraph`` extra.

Values are serialized by the saver's ``serde`` (``dumps_typed``) and travel as typed bytes the
gateway stores without reading. Of a config only ``thread_id``, ``checkpoint_ns`` and
``checkpoint_id`` travel (configs also carry live objects). Channel values are stored once per
(thread, checkpoint_ns, channel, version), as LangGraph's PostgreSQL saver stores them; like it,
primitive values (str, int, float, bool, None) ride inside the checkpoint instead.

The async methods are the interface. The sync ones work from a thread other than the event loop
the saver runs on (they submit to that loop, as ``AsyncPostgresSaver`` does) and raise
``asyncio.InvalidStateError`` on the loop's own thread.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

if TYPE_CHECKING:
    from ._client import GatewayClient
    from ._transport import Transport

T = TypeVar("T")
_PRIMITIVE = (str, int, float, bool)
PAGE_SIZE = 100  # checkpoints fetched per request by alist
BATCH = 500  # thread or run ids sent per request

_SYNC_ERROR = (
    "Synchronous calls to GatewayCheckpointSaver are only allowed from a different thread. From the "
    "main thread, use the async interface. For example, use `await checkpointer.aget_tuple(...)` or "
    "`await graph.ainvoke(...)`."
)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _jsonable(value: Any) -> Any:
    """``value`` as JSON can carry it (what JSON cannot is turned into its string)."""
    return json.loads(json.dumps(value, default=str))


class GatewayCheckpointSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpointer storing graph state in a gateway namespace: ``gw.checkpointer()``."""

    def __init__(self, client: GatewayClient, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self._transport: Transport = client._transport
        self._prefix = f"/v1/{quote(client.namespace, safe='')}/checkpoints"
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    # --- plumbing ------------------------------------------------------------------------

    def _bind_loop(self) -> None:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()

    async def _post(self, path: str, body: dict[str, Any], ok: tuple[int, ...] = ()) -> Any:
        self._bind_loop()
        response = await self._transport.request(
            "POST", self._prefix + path, idempotent=True, ok=ok,
            content=json.dumps(body, separators=(",", ":")), headers={"Content-Type": "application/json"},
        )
        return response.json() if response.status_code == 200 else None

    def _typed(self, value: Any) -> dict[str, str]:
        type_, data = self.serde.dumps_typed(value)
        return {"type": type_, "data": _b64(data)}

    def _load(self, typed: dict[str, str]) -> Any:
        return self.serde.loads_typed((typed["type"], base64.b64decode(typed["data"])))

    def _tuple(self, item: dict[str, Any]) -> CheckpointTuple:
        checkpoint = self._load(item["checkpoint"])
        checkpoint["channel_versions"] = item["channel_versions"]
        inline = checkpoint.get("channel_values") or {}
        checkpoint["channel_values"] = {**inline, **{ch: self._load(v) for ch, v in item["values"].items()}}
        thread_id, ns = item["thread_id"], item["checkpoint_ns"]
        parent = item["parent_checkpoint_id"]
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": item["checkpoint_id"]}},
            checkpoint=checkpoint,
            metadata=item["metadata"],
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}} if parent else None
            ),
            pending_writes=[(w["task_id"], w["channel"], self._load(w)) for w in item["pending_writes"]],
        )

    def _sync(self, coroutine: Coroutine[Any, Any, T]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is self.loop:
            coroutine.close()
            raise asyncio.InvalidStateError(_SYNC_ERROR)
        if self.loop is None or not self.loop.is_running():
            coroutine.close()
            raise asyncio.InvalidStateError(
                "GatewayCheckpointSaver's sync methods run on the event loop it was created or first used on, "
                "which is not running; use the async methods"
            )
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    # --- the async interface -----------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._bind_loop()
        configurable = config["configurable"]
        params = {"thread_id": str(configurable["thread_id"]), "checkpoint_ns": configurable.get("checkpoint_ns", "")}
        if checkpoint_id := get_checkpoint_id(config):
            params["checkpoint_id"] = checkpoint_id
        response = await self._transport.request("GET", self._prefix + "/tuple", params=params, ok=(404,))
        if response.status_code == 404:
            return None
        return self._tuple(response.json())

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        body: dict[str, Any] = {}
        if config is not None:
            configurable = config.get("configurable") or {}
            if configurable.get("thread_id") is not None:
                body["thread_id"] = str(configurable["thread_id"])
            if configurable.get("checkpoint_ns") is not None:
                body["checkpoint_ns"] = configurable["checkpoint_ns"]
            if checkpoint_id := get_checkpoint_id(config):
                body["checkpoint_id"] = checkpoint_id
        if filter:
            body["filter"] = filter
        if before is not None and (before_id := get_checkpoint_id(before)):
            body["before"] = before_id
        remaining = limit
        while remaining is None or remaining > 0:
            body["limit"] = PAGE_SIZE if remaining is None else min(PAGE_SIZE, remaining)
            page = await self._post("/search", body)
            for item in page["items"]:
                yield self._tuple(item)
            if remaining is not None:
                remaining -= len(page["items"])
            if not page["next_cursor"]:
                return
            body["cursor"] = page["next_cursor"]

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        rest: dict[str, Any] = dict(checkpoint)
        values = rest.pop("channel_values")
        versions = rest.pop("channel_versions")
        # Primitive values ride inside the checkpoint, as PostgresSaver keeps them in its row;
        # the others are stored once per version.
        rest["channel_values"] = {k: v for k, v in values.items() if v is None or isinstance(v, _PRIMITIVE)}
        blobs = [
            {"channel": channel, "version": str(version), **self._typed(values[channel])}
            for channel, version in new_versions.items()
            if channel in values and channel not in rest["channel_values"]
        ]
        await self._post("/put", {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": configurable.get("checkpoint_id"),
            "checkpoint": self._typed(rest),
            "channel_versions": versions,
            "metadata": _jsonable(get_serializable_checkpoint_metadata(config, metadata)),
            "blobs": blobs,
        })
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint["id"]}}

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        configurable = config["configurable"]
        await self._post("/writes", {
            "thread_id": str(configurable["thread_id"]),
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            "checkpoint_id": configurable["checkpoint_id"],
            "task_id": task_id,
            "task_path": task_path,
            "writes": [
                {"idx": WRITES_IDX_MAP.get(channel, idx), "channel": channel, **self._typed(value)}
                for idx, (channel, value) in enumerate(writes)
            ],
        })

    async def adelete_thread(self, thread_id: str) -> None:
        self._bind_loop()
        await self._transport.request("DELETE", self._prefix + "/threads", params={"thread_id": str(thread_id)})

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        run_ids = [str(r) for r in run_ids]
        for i in range(0, len(run_ids), BATCH):
            await self._post("/runs/delete", {"run_ids": run_ids[i:i + BATCH]})

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._post("/threads/copy", {"source_thread_id": str(source_thread_id), "target_thread_id": str(target_thread_id)})

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"Unknown prune strategy: {strategy!r}")
        ids = [str(t) for t in thread_ids]
        for i in range(0, len(ids), BATCH):
            await self._post("/prune", {"thread_ids": ids[i:i + BATCH], "strategy": strategy})

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """``<32-digit counter>.<random>``, the scheme of LangGraph's own savers."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # --- the sync interface (from other threads) ---------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._sync(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._sync(collect())

    def put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions
    ) -> RunnableConfig:
        return self._sync(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        return self._sync(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        return self._sync(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        return self._sync(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        return self._sync(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        return self._sync(self.aprune(thread_ids, strategy=strategy))
