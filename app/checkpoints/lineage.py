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

from collections.abc import Sequence

from app.checkpoints.repository import Lineage


def kept_ids(rows: Sequence[Lineage], keep: int, stored: set[tuple[str, str, str]]) -> set[str]:
    """Ids to keep among ``rows`` (one checkpoint_ns, newest first); ``stored`` holds the
    (checkpoint_ns, channel, version) of every stored value of the thread's delta channels."""
    by_id = {r.checkpoint_id: r for r in rows}

    def has_value(r: Lineage, channel: str) -> bool:
        version = r.channel_versions.get(channel)
        return version is not None and (r.checkpoint_ns, channel, str(version)) in stored

    kept: set[str] = set()
    # (checkpoint, channel) pairs already walked through: a walk that reaches one stops for that
    # channel, as everything past it was kept by the walk before. So the walks of all heads
    # together visit each checkpoint once per channel (a channel with no stored value made each
    # head walk the whole chain: keep x N, 160 s of the event loop for 30,000 checkpoints).
    walked: set[tuple[str, str]] = set()
    for head in rows[:keep]:
        kept.add(head.checkpoint_id)
        needed = {ch for ch in head.delta_channels if not has_value(head, ch)}
        cur = by_id.get(head.parent_checkpoint_id or "")
        while cur is not None:
            needed = {ch for ch in needed if (cur.checkpoint_id, ch) not in walked}
            if not needed:
                break
            walked.update((cur.checkpoint_id, ch) for ch in needed)
            kept.add(cur.checkpoint_id)  # its pending writes are deltas to replay
            needed = {ch for ch in needed if not has_value(cur, ch)}
            cur = by_id.get(cur.parent_checkpoint_id or "")
    return kept
