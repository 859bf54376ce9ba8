"""Which checkpoints of a thread retention keeps: the newest N per ``checkpoint_ns``, and every
ancestor a ``DeltaChannel`` needs to rebuild its value.

A ``DeltaChannel`` stores a full value (a ``_DeltaSnapshot``) only every ``snapshot_frequency``
updates; in between, a checkpoint lists the channel in ``channel_versions`` with no stored value,
counts it in ``metadata.counters_since_delta_snapshot``, and LangGraph rebuilds it by walking the
parent chain back to the nearest checkpoint that does store a value, replaying the pending writes
met on the way (``BaseCheckpointSaver.get_delta_channel_history``). So for each kept checkpoint
the parents up to and including that nearest stored value are kept too (or the whole chain, when
none stores one). The gateway decides this from JSON it already reads (versions, metadata) and
which values are stored, never from the bytes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from app.checkpoints.repository import CheckpointKey, CheckpointsRepository, Lineage


def kept_ids(rows: Sequence[Lineage], keep: int, stored: set[tuple[str, str, str]]) -> set[str]:
    """Ids to keep among ``rows`` (one checkpoint_ns, newest first); ``stored`` holds the
    (checkpoint_ns, channel, version) of every stored value of the thread's delta channels."""
    by_id = {r.checkpoint_id: r for r in rows}

    def has_value(r: Lineage, channel: str) -> bool:
        version = r.channel_versions.get(channel)
        return version is not None and (r.checkpoint_ns, channel, str(version)) in stored

    kept: set[str] = set()
    # The channels already walked through each checkpoint: a walk that reaches one goes on only
    # for the channels no walk took through it before, as everything past it for those was kept
    # by the walk before. So the walks of all heads together visit each checkpoint once per
    # channel (a channel with no stored value made each head walk the whole chain: keep x N,
    # 160 s of the event loop for 30,000 checkpoints). A set of channels is shared by the
    # checkpoints a walk passes without a stored value of any: one (checkpoint, channel) tuple
    # each made a chain of 7,000 checkpoints with 64 delta channels 448,000 tuples (40 MiB, and
    # collections of the garbage collector that held the GIL for 100 ms).
    walked: dict[str, frozenset[str]] = {}
    for head in rows[:keep]:
        kept.add(head.checkpoint_id)
        needed = frozenset(ch for ch in head.delta_channels if not has_value(head, ch))
        cur = by_id.get(head.parent_checkpoint_id or "")
        while cur is not None:
            before = walked.get(cur.checkpoint_id)
            if before is not None:
                needed = needed - before
            if not needed:
                break
            walked[cur.checkpoint_id] = needed if before is None else before | needed
            kept.add(cur.checkpoint_id)  # its pending writes are deltas to replay
            if cur.channel_versions:  # else it has a stored value of no channel
                valued = {ch for ch in needed if has_value(cur, ch)}
                if valued:
                    needed = needed - valued
            cur = by_id.get(cur.parent_checkpoint_id or "")
    return kept


def doomed(pk: int, lineage: Sequence[Lineage], keep: int, stored: set[tuple[str, str, str]]) -> list[CheckpointKey]:
    """The checkpoints of ``lineage`` (thread ``pk``'s) that keep-latest ``keep`` deletes."""
    by_ns: dict[str, list[Lineage]] = defaultdict(list)
    for row in lineage:
        by_ns[row.checkpoint_ns].append(row)
    out: list[CheckpointKey] = []
    for ns, rows in by_ns.items():
        if len(rows) <= keep:
            continue
        kept = kept_ids(rows, keep, stored)
        out += [(pk, ns, r.checkpoint_id) for r in rows if r.checkpoint_id not in kept]
    return out


async def doomed_checkpoints(repo: CheckpointsRepository, conn: AsyncConnection, pk: int, keep: int) -> list[CheckpointKey]:
    """What keep-latest ``keep`` deletes of thread ``pk``, read out: all but the newest ``keep``
    of each checkpoint_ns, or (with delta channels) those ``kept_ids`` does not keep."""
    if not await repo.has_delta_channels(conn, pk):
        return await repo.all_but_newest(conn, pk, keep)
    channels = await repo.delta_channel_names(conn, pk)
    stored = await repo.blob_keys(conn, pk, channels) if channels else set()
    lineage = await repo.lineage(conn, pk, channels, stored)
    # The walks are pure Python, checkpoints x delta channels (a thread of 7,000 checkpoints
    # with 64 of them: 0.9 s): in a worker thread, so the event loop keeps its turns (the GIL
    # passes between them every few milliseconds).
    return await anyio.to_thread.run_sync(doomed, pk, lineage, keep, stored)
