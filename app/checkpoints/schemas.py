"""HTTP shapes of the checkpoints capability.

Checkpoints, channel values and pending writes travel as typed bytes: ``{"type": ..., "data":
<base64>}`` exactly as LangGraph's serializer produced them (``serde.dumps_typed``); the gateway
stores and returns them without reading them. ``channel_versions`` and ``metadata`` are JSON: the
first says which stored channel values a checkpoint uses, the second is what lists filter on.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, StrictStr, StringConstraints, WithJsonSchema

from app.checkpoints.backend import TERM_KEY_MAX_BYTES
from app.core.http.pagination import MAX_CURSOR_CHARS
from app.core.names import KeyText
from app.core.numbers import MAX_LIST_ITEMS, FiniteFloat, StrictBool, StrictInt, at_most_items

Scalar = StrictStr | StrictInt | FiniteFloat | StrictBool | None
# A filter's key is found the same on both backends up to TERM_KEY_MAX_BYTES of UTF-8 (SQLite
# keeps the metadata terms it filters on for keys up to that); a character is at most 4 bytes.
FILTER_KEY_CHARS = TERM_KEY_MAX_BYTES // 4
FilterKey = Annotated[str, StringConstraints(max_length=FILTER_KEY_CHARS)]


def _text(max_bytes: int, *, allow_empty: bool = False) -> KeyText:
    """Identifier text: at most ``max_bytes`` of UTF-8, no control characters (and documented so)."""
    return KeyText(max_bytes, allow_empty)


def _base64(value: Any) -> Any:
    """Standard padded base64, strictly: pydantic's Base64Bytes drops what is not base64
    (``"!!!!"`` became empty bytes), which would store garbage as a checkpoint."""
    if not isinstance(value, str):
        return value
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("must be standard base64 (A-Z a-z 0-9 + /, padded with =)") from None


B64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
Base64Data = Annotated[
    bytes,
    BeforeValidator(_base64),
    WithJsonSchema({"type": "string", "contentEncoding": "base64", "pattern": B64_PATTERN}),
]
ThreadId = Annotated[str, Field(description="LangGraph `thread_id`.", examples=["thread-1"]), _text(1024)]
CheckpointNs = Annotated[
    str, Field(description="LangGraph `checkpoint_ns` (`\"\"` for the root graph).", examples=[""]),
    _text(1024, allow_empty=True),
]
CheckpointId = Annotated[str, Field(description="LangGraph checkpoint id.", examples=["1ef4f797-8335-6428-8001-8a1503f9b875"]), _text(128)]
Channel = Annotated[str, Field(examples=["messages"]), _text(1024)]
Version = Annotated[str, Field(examples=["00000000000000000000000000000002.0.5394839437013563"]), _text(128)]
TypeName = Annotated[str, Field(description="The serializer's type tag.", examples=["msgpack"]), _text(64)]
TaskId = Annotated[str, _text(1024)]


class TypedBytes(BaseModel):
    """Bytes as the serializer made them, with its type tag."""

    type: TypeName
    data: Base64Data = Field(description="The bytes, base64.", examples=["kqNmb28="])


class BlobCreate(TypedBytes):
    """One channel value at one version (stored once per thread, namespace, channel and version)."""

    channel: Channel
    version: Version


class CheckpointCreate(BaseModel):
    """A checkpoint with the channel values new in it (`aput`)."""

    thread_id: ThreadId
    checkpoint_ns: CheckpointNs = ""
    checkpoint_id: CheckpointId
    parent_checkpoint_id: CheckpointId | None = None
    checkpoint: TypedBytes = Field(description="The checkpoint without its channel values and versions.")
    channel_versions: Annotated[dict[str, StrictStr | StrictInt | FiniteFloat], at_most_items(MAX_LIST_ITEMS)] = Field(
        default_factory=dict, max_length=MAX_LIST_ITEMS, fail_fast=True,
        description="Channel name to version: which stored values this checkpoint uses.",
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="JSON metadata; lists filter on it.")
    blobs: list[BlobCreate] = Field(
        default_factory=list, max_length=MAX_LIST_ITEMS, fail_fast=True,
        description="Channel values at their new versions.",
    )


class CheckpointConfig(BaseModel):
    """What identifies a stored checkpoint."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str


class WriteCreate(TypedBytes):
    idx: StrictInt = Field(ge=-(2**31), lt=2**31, description="Index of the write in its task (negative: special channels).")
    channel: Channel


class WritesCreate(BaseModel):
    """Pending writes of one task against a checkpoint (`aput_writes`). Writes that all have a
    negative `idx` (special channels) replace what the task stored; otherwise existing ones stay."""

    thread_id: ThreadId
    checkpoint_ns: CheckpointNs = ""
    checkpoint_id: CheckpointId
    task_id: TaskId
    task_path: Annotated[str, _text(4096, allow_empty=True)] = ""
    writes: list[WriteCreate] = Field(max_length=MAX_LIST_ITEMS, fail_fast=True)


class WriteRead(BaseModel):
    task_id: str
    channel: str
    type: str
    data: str = Field(description="base64")
    task_path: str
    idx: int


class TypedBytesRead(BaseModel):
    type: str
    data: str = Field(description="base64")


class CheckpointTupleRead(BaseModel):
    """A checkpoint with the values of its channel versions and its pending writes, ordered by
    (`task_path`, `task_id`, `idx`)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: TypedBytesRead
    channel_versions: dict[str, Any]
    metadata: dict[str, Any]
    values: dict[str, TypedBytesRead]
    pending_writes: list[WriteRead]


class CheckpointPage(BaseModel):
    """Checkpoints newest first (descending `checkpoint_id`)."""

    items: list[CheckpointTupleRead]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; null at the end (a page may be short of "
        "`limit` and still have one: `checkpoints.max_page_bytes`).",
    )


class CheckpointSearch(BaseModel):
    """What `alist` asks for: every field optional."""

    thread_id: ThreadId | None = None
    checkpoint_ns: CheckpointNs | None = Field(default=None, description="Omit: every namespace of the thread.")
    checkpoint_id: CheckpointId | None = Field(default=None, description="Only this checkpoint.")
    filter: Annotated[dict[FilterKey, Scalar], Field(fail_fast=True), at_most_items(MAX_LIST_ITEMS)] | None = Field(
        default=None, description="Metadata entries that must all be equal (top-level keys of at most "
        f"{FILTER_KEY_CHARS} characters, scalar values).",
        examples=[{"source": "loop", "step": 1}],
    )
    before: CheckpointId | None = Field(default=None, description="Only checkpoints with a smaller id.")
    limit: StrictInt | None = Field(default=None, ge=1, description="Most items in this page.")
    cursor: str | None = Field(default=None, max_length=MAX_CURSOR_CHARS, description="`next_cursor` of the previous page.")


class RunsDelete(BaseModel):
    run_ids: list[Annotated[str, _text(1024)]] = Field(max_length=MAX_LIST_ITEMS, fail_fast=True, description="Delete every checkpoint whose metadata `run_id` is one of these.")


class ThreadCopy(BaseModel):
    source_thread_id: ThreadId
    target_thread_id: ThreadId


class ThreadsPrune(BaseModel):
    thread_ids: list[ThreadId] = Field(max_length=MAX_LIST_ITEMS, fail_fast=True)
    strategy: Literal["keep_latest", "delete"] = Field(
        default="keep_latest",
        description="`keep_latest`: the newest checkpoint per namespace (and the ancestors a delta channel needs); `delete`: all.",
    )


class Deleted(BaseModel):
    deleted: int = Field(description="How many checkpoints went.")


class Copied(BaseModel):
    copied: int = Field(description="How many checkpoints were copied.")


class RetentionUpdate(BaseModel):
    """Retention of a namespace (no `thread_id`) or of one thread, which overrides its namespace's.
    `null` leaves a setting to the namespace (or off); `0` turns it off."""

    thread_id: ThreadId | None = None
    keep_latest: StrictInt | None = Field(
        default=None, ge=0, le=2**31 - 1, description="Checkpoints kept per thread and `checkpoint_ns`."
    )
    idle_ttl_seconds: FiniteFloat | None = Field(
        default=None, ge=0, le=1e10, description="A thread not written for this long is deleted."
    )


class RetentionRead(BaseModel):
    thread_id: str | None = None
    keep_latest: int | None = None
    idle_ttl_seconds: float | None = None
