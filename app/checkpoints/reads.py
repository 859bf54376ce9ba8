"""The one statement that reads checkpoints: a page of them with their values and writes.

A page of checkpoint rows (a CTE) and, in the same statement, the stored values of their channel
versions and their pending writes, as one ``UNION ALL`` of rows tagged by ``kind``. One
statement means one round trip, and on PostgreSQL no BEGIN/COMMIT (``app.core.fast.fixed_statements``):
a read answers from one snapshot either way. Statements are built once per shape (which of the
optional conditions a request has) and reused.

Every read is weighed in the same statement (``stored_bytes``): a page ends before the checkpoint
that would make it weigh more than its byte budget, and a first checkpoint heavier than the budget
comes without its values and writes and is refused (``TooHeavy``), so no read loads more than the
budget into the gateway's memory whatever is stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Integer, Text, and_, bindparam, case, cast, func, literal, null, select, tuple_, union_all

from app.checkpoints.backend import CheckpointsBackend
from app.checkpoints.models import checkpoint_blobs as blobs
from app.checkpoints.models import checkpoint_metadata_terms as terms
from app.checkpoints.models import checkpoint_threads as threads
from app.checkpoints.models import checkpoint_writes as writes
from app.checkpoints.models import checkpoints as cp
from app.core.db.pages import budgeted, byte_length
from app.core.fast.fixed_statements import FixedStatement, StatementConnection, StatementShapes
from app.core.errors import Conflict

CHECKPOINT, VALUE, WRITE = 0, 1, 2
_NEWEST_FIRST = (("checkpoint_id", True), ("thread_pk", True), ("checkpoint_ns", True))
# ``idx`` of a checkpoint row: in the page; the page's first, heavier than the budget alone
# (answered without its bytes, values and writes); the one after the page's last (the same)
KEPT, TOO_HEAVY, CUT = 1, -1, 0


@dataclass(frozen=True)
class Shape:
    thread: bool
    checkpoint_ns: bool
    checkpoint_id: bool
    before: bool
    filter_keys: int  # entries of the metadata filter (0: none)
    cursor: bool
    single: bool = False  # a page of one (``limit`` 1: a get)


@dataclass
class PageRow:
    """A checkpoint of the page, with its values (channel, type, bytes) and writes."""

    thread_pk: int
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    type: str
    checkpoint: bytes
    channel_versions: str  # JSON text
    metadata: str  # JSON text
    values: list[tuple[str, str, bytes]]
    writes: list[tuple[str, str, str, bytes, str, int]]  # task_id, channel, type, bytes, task_path, idx


def _text(value: Any = None) -> Any:
    return cast(null(), Text) if value is None else value


def _statement(backend: CheckpointsBackend, shape: Shape) -> Any:
    columns = [cp.c.thread_pk, cp.c.checkpoint_ns, cp.c.checkpoint_id]  # the rest is joined back on the kept keys
    if shape.thread:
        # the thread's pk as a constant of the statement: its checkpoints come in primary-key
        # order (newest first is a backward index scan that stops at the limit)
        thread_pk = select(threads.c.pk).where(
            threads.c.namespace == bindparam("ns"), threads.c.thread_id == bindparam("tid")
        ).scalar_subquery()
        page = select(*columns, cast(bindparam("tid", type_=Text), Text).label("thread_id")).where(cp.c.thread_pk == thread_pk)
        order = [cp.c.checkpoint_id.desc()] if shape.checkpoint_ns else [cp.c.checkpoint_id.desc(), cp.c.checkpoint_ns.desc()]
    else:
        page = (
            select(*columns, cast(threads.c.thread_id, Text).label("thread_id"))
            .select_from(cp.join(threads, threads.c.pk == cp.c.thread_pk))
            .where(threads.c.namespace == bindparam("ns"))
        )
        order = [cp.c.checkpoint_id.desc(), cp.c.thread_pk.desc(), cp.c.checkpoint_ns.desc()]
    if shape.checkpoint_ns:
        page = page.where(cp.c.checkpoint_ns == bindparam("cns", type_=Text))
    if shape.checkpoint_id:
        page = page.where(cp.c.checkpoint_id == bindparam("cid", type_=Text))
    if shape.before:
        page = page.where(cp.c.checkpoint_id < bindparam("before", type_=cp.c.checkpoint_id.type))
    if shape.filter_keys:
        page = page.where(*backend.metadata_filter_shape(cp, shape.filter_keys))
    if shape.cursor:
        # The cursor names its thread by thread_id, looked up here: thread_pk is numbered across
        # every namespace, so a cursor carrying it showed a namespace how many threads the others
        # made between two of its writes. A thread deleted since compares as NULL: only rows of
        # the cursor's very checkpoint_id in other threads can then be passed over.
        after_pk = select(threads.c.pk).where(
            threads.c.namespace == bindparam("ns"), threads.c.thread_id == bindparam("a_tid", type_=Text)
        ).scalar_subquery()
        page = page.where(
            tuple_(cp.c.checkpoint_id, cp.c.thread_pk, cp.c.checkpoint_ns)
            < tuple_(bindparam("a_cid", type_=cp.c.checkpoint_id.type), after_pk,
                     bindparam("a_cns", type_=cp.c.checkpoint_ns.type))
        )
    j = backend.json_text
    budget = bindparam("budget", type_=BigInteger)
    # The page's keys first, then their weights: SQLite computes a select's columns before it
    # sorts, so weighing in the sorted select weighed every checkpoint the sort saw (a thread's
    # history without checkpoint_ns, or a namespace's: 0.6 s a page at 50,000 checkpoints).
    ordered = page.order_by(*order).limit(1 if shape.single else bindparam("lim", type_=Integer)).subquery("ordered")
    o = ordered.c
    weighed = select(ordered, stored_bytes(backend)).select_from(ordered.join(cp, and_(
        cp.c.thread_pk == o.thread_pk, cp.c.checkpoint_ns == o.checkpoint_ns, cp.c.checkpoint_id == o.checkpoint_id,
    )))
    if shape.single:  # one checkpoint: its weight alone decides (no running sum to cut at)
        kept = weighed.cte("page_keys")
    else:
        in_order = weighed.order_by(*(o[name].desc() if desc else o[name] for name, desc in _NEWEST_FIRST))
        kept = budgeted(in_order, _NEWEST_FIRST, budget, first_always=False).cte("page_keys")
    page = select(
        kept, cp.c.parent_checkpoint_id, cp.c.type, cp.c.checkpoint, cp.c.channel_versions, cp.c.metadata,
    ).select_from(kept.join(cp, and_(
        cp.c.thread_pk == kept.c.thread_pk, cp.c.checkpoint_ns == kept.c.checkpoint_ns,
        cp.c.checkpoint_id == kept.c.checkpoint_id,
    ))).cte("page")
    if shape.single:
        within = page.c.weight <= budget
        mark = case((within, KEPT), else_=TOO_HEAVY)
    else:
        within = page.c.within == 1
        mark = case((within, KEPT), (page.c.upto == page.c.weight, TOO_HEAVY), else_=CUT)
    key = (page.c.thread_pk, page.c.checkpoint_ns, page.c.checkpoint_id)
    rows = select(
        literal(CHECKPOINT, Integer).label("kind"), *key, page.c.thread_id.label("a"),
        cast(page.c.parent_checkpoint_id, Text).label("b"), cast(page.c.type, Text).label("c"),
        case((within, page.c.checkpoint), else_=None).label("data"),
        case((within, j(page.c.channel_versions)), else_=None).label("d"),
        case((within, j(page.c.metadata)), else_=None).label("e"), mark.label("idx"),
    )
    found, value = backend.values_of(page)
    values = select(
        literal(VALUE, Integer), *key, cast(value.c.channel, Text), _text(), cast(value.c.type, Text),
        value.c.blob, _text(), _text(), cast(null(), Integer),
    ).select_from(found).where(within)
    pending = select(
        literal(WRITE, Integer), *key, cast(writes.c.task_id, Text), cast(writes.c.channel, Text),
        cast(writes.c.type, Text), writes.c.blob, writes.c.task_path, _text(), writes.c.idx,
    ).select_from(page.join(writes, and_(
        writes.c.thread_pk == page.c.thread_pk, writes.c.checkpoint_ns == page.c.checkpoint_ns,
        writes.c.checkpoint_id == page.c.checkpoint_id,
    ))).where(within)
    return union_all(rows, values, pending)


ROW_BYTES = 256  # what a row costs beyond its lengths (the tuples and objects a read makes of it)


def value_weight(channel: Any, type_: Any, blob: Any) -> Any:
    """What a stored channel value weighs in a read (SQL or Python values alike)."""
    return blob + channel + type_ + ROW_BYTES


def write_weight(task_id: Any, channel: Any, type_: Any, blob: Any, task_path: Any) -> Any:
    """What a stored pending write weighs in a read (SQL or Python values alike)."""
    return blob + task_id + channel + type_ + task_path + ROW_BYTES


def row_bytes(backend: CheckpointsBackend) -> Any:
    """A row of ``checkpoints``'s own stored bytes: its bytes and its JSON as stored."""
    n, j = byte_length, backend.json_text
    return n(cp.c.checkpoint) + n(j(cp.c.metadata)) + n(j(cp.c.channel_versions))


# What a stored row holds whole (what a copy writes again, ``CheckpointsRepository.thread_bytes``):
# a read's weight of it and the keys a read does not count, as it has them already (the
# checkpoint_ns, checkpoint_id and version it looked the row up by).


def checkpoint_row_bytes(backend: CheckpointsBackend) -> Any:
    """A stored row of ``checkpoints``: its ``row_bytes``, its keys, parent and type, and ``ROW_BYTES``."""
    n, c = byte_length, cp.c
    keys = n(c.checkpoint_ns) + n(c.checkpoint_id) + func.coalesce(n(c.parent_checkpoint_id), 0) + n(c.type)
    return row_bytes(backend) + keys + ROW_BYTES


def value_row_bytes() -> Any:
    """A stored row of ``checkpoint_blobs``: its ``value_weight`` and its checkpoint_ns and version."""
    n, b = byte_length, blobs.c
    return value_weight(n(b.channel), n(b.type), n(b.blob)) + n(b.checkpoint_ns) + n(b.version)


def write_row_bytes() -> Any:
    """A stored row of ``checkpoint_writes``: its ``write_weight`` and its checkpoint_ns and checkpoint_id."""
    n, w = byte_length, writes.c
    return write_weight(n(w.task_id), n(w.channel), n(w.type), n(w.blob), n(w.task_path)) + n(w.checkpoint_ns) + n(w.checkpoint_id)


def term_row_bytes() -> Any:
    """A stored row of ``checkpoint_metadata_terms`` (SQLite's filter rows: one per top-level
    scalar of a checkpoint's metadata, each repeating the checkpoint's keys)."""
    n, t = byte_length, terms.c
    return n(t.checkpoint_ns) + n(t.checkpoint_id) + n(t.key) + n(t.value) + ROW_BYTES


def checkpoint_bytes(backend: CheckpointsBackend) -> Any:
    """What a row of ``checkpoints`` weighs without its pending writes: its bytes and JSON as
    stored and the values of its channel versions (their lengths only: no value is read for it)."""
    v = backend.versions_of(cp)
    n = byte_length
    # one primary-key lookup per version, as ``values_of`` reads them: a join let PostgreSQL hash
    # every value the thread ever stored for each checkpoint of the page
    one = select(value_weight(n(blobs.c.channel), n(blobs.c.type), n(blobs.c.blob))).where(
        blobs.c.thread_pk == cp.c.thread_pk, blobs.c.checkpoint_ns == cp.c.checkpoint_ns,
        blobs.c.channel == v.c.key, blobs.c.version == cast(v.c.value, Text),
    ).correlate(cp, v).limit(1).scalar_subquery()
    values = select(func.coalesce(func.sum(one), 0)).select_from(v).scalar_subquery()
    return row_bytes(backend) + ROW_BYTES + values


def pending_bytes(of: Any = cp) -> Any:
    """What the pending writes of a checkpoint weigh: of a row of ``checkpoints``, or of the
    checkpoint ``of`` names (``thread_pk``, ``checkpoint_ns``, ``checkpoint_id``)."""
    n = byte_length
    w = writes.c
    return select(func.coalesce(func.sum(write_weight(n(w.task_id), n(w.channel), n(w.type), n(w.blob), n(w.task_path))), 0)).where(
        w.thread_pk == of.c.thread_pk, w.checkpoint_ns == of.c.checkpoint_ns, w.checkpoint_id == of.c.checkpoint_id,
    ).scalar_subquery()


def stored_bytes(backend: CheckpointsBackend) -> Any:
    """What a read of a row of ``checkpoints`` answers, in stored bytes: the row's
    ``checkpoint_bytes`` and ``pending_bytes``."""
    return (checkpoint_bytes(backend) + pending_bytes()).label("weight")


class TooHeavy(Conflict):
    """A checkpoint weighs more than a read may answer: stored before the limits were lowered,
    referencing versions whose values later puts stored, or by pending writes sent at the same
    time (each is checked against what was stored before it)."""

    def __init__(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, budget: int) -> None:
        super().__init__(
            f"checkpoint {checkpoint_id!r} of thread {thread_id!r} (checkpoint_ns {checkpoint_ns!r}) weighs more than "
            f"a read answers (checkpoints.max_page_bytes: {budget} stored bytes with its channel values and pending "
            "writes); delete it, or raise the setting",
            code="checkpoint_too_large",
        )


class CheckpointReader:
    def __init__(self, backend: CheckpointsBackend, fixed: type[FixedStatement]) -> None:
        self._backend = backend
        self._shapes = StatementShapes(fixed, lambda shape: _statement(backend, shape))

    async def page(
        self, conn: StatementConnection, ns: str, *, thread_id: str | None, checkpoint_ns: str | None,
        checkpoint_id: str | None = None, before: str | None = None, filter: Mapping[str, Any] | None = None,
        after_key: tuple[str, str, str] | None = None, limit: int, budget: int,
    ) -> tuple[list[PageRow], bool]:
        """Checkpoints of namespace ``ns`` newest first (``checkpoint_id``, then thread and
        checkpoint_ns, descending); ``after_key`` (checkpoint_id, thread_id, checkpoint_ns)
        continues after that position. The page ends
        before the checkpoint that would make it weigh more than ``budget`` stored bytes (values
        and pending writes included); True with the rows: it was cut so, and more may follow. A
        first checkpoint heavier than ``budget`` is refused (``TooHeavy``)."""
        params: dict[str, Any] = {"ns": ns, "lim": limit, "tid": thread_id, "cns": checkpoint_ns,
                                  "cid": checkpoint_id, "before": before, "budget": budget}
        if filter:
            params.update(self._backend.metadata_filter_params(filter))
        if after_key is not None:
            params["a_cid"], params["a_tid"], params["a_cns"] = after_key
        shape = Shape(thread_id is not None, checkpoint_ns is not None, checkpoint_id is not None, before is not None,
                      len(filter or {}), after_key is not None, limit == 1)
        pages: dict[tuple[int, str, str], PageRow] = {}
        values, pending = [], []
        cut = False
        for kind, pk, cns, cid, a, b, c, data, d, e, idx in await self._shapes(shape).all(conn, params):
            if kind == CHECKPOINT:
                if idx == TOO_HEAVY:
                    raise TooHeavy(a, cns, cid, budget)
                if idx == CUT:
                    cut = True
                else:
                    pages[(pk, cns, cid)] = PageRow(pk, a, cns, cid, b, c, bytes(data), d, e, [], [])
            elif kind == VALUE:
                values.append(((pk, cns, cid), (a, c, bytes(data))))
            else:
                pending.append(((pk, cns, cid), (a, b, c, bytes(data), d, idx)))
        for key, value in values:
            pages[key].values.append(value)
        for key, write in pending:
            pages[key].writes.append(write)
        out = sorted(pages.values(), key=lambda r: (r.checkpoint_id, r.thread_pk, r.checkpoint_ns), reverse=True)
        for row in out:
            row.writes.sort(key=lambda w: (w[4], w[0], w[5]))  # (task_path, task_id, idx)
        return out, cut


