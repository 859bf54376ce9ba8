"""Quotas per namespace: usage kept by the databases themselves, in the writing transaction.

A capability declares what it stores (``Capability.usage``: ``Counted(table, ...)``, a table
with a ``namespace`` column, each row one item, its bytes the length of a column or a size
column). For each such table the gateway installs triggers (``install``, at start-up) that add
every insert, update and delete to ``namespace_usage`` (namespace, capability, shard) in the
same transaction as the write, and refuse a write that brings a namespace past its quota
(``namespace_quotas``: the row of the namespace, else the defaults row ``''`` written from the
``quotas`` settings): SQLite ``RAISE(ABORT)``, PostgreSQL an exception with SQLSTATE
``QT507``; the request's transaction rolls back, so nothing changes, and the client gets a 507
naming the quota (``quota_problem``). Deletes and shrinking updates are never refused. Rows
no trigger can count (a vector collection's table has no namespace column) are ``Kept``: their
capability adds each write's difference itself in the write's transaction (``keep``, same rules).

Rules: usage is never counted per request; it is exact because it commits or rolls back with
the write (a crash loses both or neither). ``reconcile`` recounts a few namespaces a round in
the background (drift can only come from writes made while accounting was off). On PostgreSQL a
namespace's usage is ``SHARDS`` rows (by backend pid) so that concurrent writers of one
namespace do not queue on one row; usage is their sum, and a write that brings it within 1/``NEAR``
of a limit takes the namespace's lock and sums again (racing writers never end above it).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge
from sqlalchemy import Table, func, inspect, literal_column, select, text, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.config import Database
from app.core.db.upsert import insert_builder
from app.core.errors import InsufficientStorage
from app.core.namespace_data import writer
from app.core.ops.metrics import REGISTRY
from app.quotas.settings import QuotasSettings
from app.quotas.tables import TABLES, Counted, Kept, Part

if TYPE_CHECKING:
    from app.core.capability import Capability, Periodic
    from app.core.state import GatewayState

log = logging.getLogger("app.quotas")

QUOTA_REFUSED = Counter(
    "gateway_quota_refused",
    "Writes refused 507 because they would pass a namespace's quota (quota: capability.bytes or .items).",
    ("quota",),
    registry=REGISTRY,
)
USAGE_ITEMS = Gauge(
    "gateway_namespace_usage_items",
    "Items a namespace stores in a capability, as last recounted (app.quotas.usage.reconcile_round) or read.",
    ("namespace", "capability"),
    registry=REGISTRY,
)
USAGE_BYTES = Gauge(
    "gateway_namespace_usage_bytes",
    "Bytes a namespace stores in a capability, as last recounted or read.",
    ("namespace", "capability"),
    registry=REGISTRY,
)


def observe_usage(namespace: str, capability: str, items: int, size: int) -> None:
    USAGE_ITEMS.labels(namespace=namespace, capability=capability).set(items)
    USAGE_BYTES.labels(namespace=namespace, capability=capability).set(size)


SHARDS = 64
"""PostgreSQL: usage rows per namespace and capability (a writer adds to the one of its backend)."""
DEFAULTS = ""
"""The namespace of the defaults row in ``namespace_quotas`` (no namespace is empty)."""
INTERNAL = "~"
"""The first character of the gateway's own namespaces, which no request can name (a checkpoint
copy's staging ``~copy``, deleted threads' ``~trash``): counted, never refused."""
SQLSTATE = "QT507"
INSTALL_RETRY_SECONDS = 2.0
RECOUNT_BATCH = 1000
"""Rows a page of a recount reads."""
VERSION = 8
"""Of the triggers' SQL: a gateway finding another version's triggers replaces them (and recounts)."""
MESSAGE = "quota exceeded: "
NEAR = 8
"""PostgreSQL: a write that brings a namespace within 1/``NEAR`` of a limit takes the namespace's
lock for that capability until it commits and reads the usage again (``near_lock``), so writers
racing at the limit are judged one after another, each on what the one before committed; further
from it no lock is taken (concurrent writers there could pass the limit only by more than 1/``NEAR``
of it together)."""


def near_lock(ns: str, cap: str) -> str:
    """PostgreSQL: the transaction-scoped advisory lock of ``ns``'s usage of ``cap``, as SQL."""
    return f"pg_advisory_xact_lock(hashtextextended('quota:' || {cap} || ':' || {ns}, 0))"


@dataclass(frozen=True)
class Limits:
    max_bytes: int | None
    max_items: int | None


def default_limits(settings: QuotasSettings, capability: str) -> Limits:
    own = settings.capabilities.get(capability)
    return Limits(
        own.max_bytes if own is not None and own.max_bytes is not None else settings.default.max_bytes,
        own.max_items if own is not None and own.max_items is not None else settings.default.max_items,
    )


# --- trigger DDL ------------------------------------------------------------------------------

def _sqlite_check(cap: str, ns: str, *, items: bool, grows: str, when: str = "1") -> str:
    """One statement: refuse the write when ``ns`` is past a quota of ``cap`` (its items' only
    when ``items``, its bytes' only when ``grows``: a write is refused only for what it adds); the
    limits are read first, the usage only where there is one."""
    over_items = "u.items > q.mi" if items else "0"
    return (
        f"SELECT CASE WHEN {over_items} THEN RAISE(ABORT, '{MESSAGE}{cap}.items') "
        f"ELSE RAISE(ABORT, '{MESSAGE}{cap}.bytes') END "
        "FROM (SELECT coalesce(o.max_items, d.max_items) AS mi, coalesce(o.max_bytes, d.max_bytes) AS mb "
        f"FROM (SELECT 1) LEFT JOIN namespace_quotas o ON o.namespace = {ns} AND o.capability = '{cap}' "
        f"LEFT JOIN namespace_quotas d ON d.namespace = '' AND d.capability = '{cap}') q, "
        f"(SELECT sum(items) AS items, sum(bytes) AS bytes FROM namespace_usage WHERE namespace = {ns} "
        f"AND capability = '{cap}') u "
        f"WHERE {when} AND substr({ns}, 1, 1) <> '{INTERNAL}' AND (q.mi IS NOT NULL OR q.mb IS NOT NULL) "
        f"AND ({over_items} OR ({grows} AND u.bytes > q.mb));"
    )


def _sqlite_add(cap: str, ns: str, items: str, size: str, owner: str = "") -> str:
    """Add to ``ns``'s usage (``owner``: ``FROM ... WHERE`` finding a part's row; none, nothing)."""
    values = f"SELECT {ns}, '{cap}', 0, {items}, {size} {owner}" if owner else f"VALUES ({ns}, '{cap}', 0, {items}, {size})"
    return (
        "INSERT INTO namespace_usage (namespace, capability, shard, items, bytes) "
        f"{values} ON CONFLICT (namespace, capability, shard) "
        "DO UPDATE SET items = items + excluded.items, bytes = bytes + excluded.bytes;"
    )


def _sqlite_part_triggers(cap: str, counted: Counted, part: Part) -> list[str]:
    """A part's bytes added to its row's namespace as it is written (checked when it adds some)."""
    t, owner = part.table.name, f"{counted.table.name} w"
    new, old = part.bytes_sql("NEW", "sqlite"), part.bytes_sql("OLD", "sqlite")
    ns = f"(SELECT w.namespace FROM {owner} WHERE w.{counted.pk} = NEW.{part.key})"
    return [
        f"CREATE TRIGGER {_name(t, 'insert')} AFTER INSERT ON {t} BEGIN "
        + _sqlite_add(cap, "w.namespace", "0", new, f"FROM {owner} WHERE w.{counted.pk} = NEW.{part.key}")
        + _sqlite_check(cap, ns, items=False, grows=f"({new}) > 0") + " END",
        f"CREATE TRIGGER {_name(t, 'delete')} AFTER DELETE ON {t} BEGIN "
        + _sqlite_add(cap, "w.namespace", "0", f"-({old})", f"FROM {owner} WHERE w.{counted.pk} = OLD.{part.key}")
        + " END",
        f"CREATE TRIGGER {_name(t, 'update')} AFTER UPDATE ON {t} WHEN ({new}) <> ({old}) BEGIN "
        + _sqlite_add(cap, "w.namespace", "0", f"({new}) - ({old})", f"FROM {owner} WHERE w.{counted.pk} = NEW.{part.key}")
        + _sqlite_check(cap, ns, items=False, grows="1", when=f"({new}) > ({old})") + " END",
    ]


def sqlite_triggers(cap: str, counted: Counted) -> list[str]:
    t = counted.table.name
    new, old = counted.bytes_sql("NEW", "sqlite"), counted.bytes_sql("OLD", "sqlite")
    # deleted or moved: with its parts' bytes (inserted: it has none yet; its parts are counted as
    # they are written, with it there; updated in place: its own bytes only)
    new_all, old_all = counted.bytes_sql("NEW", "sqlite", parts=True), counted.bytes_sql("OLD", "sqlite", parts=True)
    checks = _sqlite_check(cap, "NEW.namespace", items=True, grows=f"({new_all}) > 0")
    return [
        f"CREATE TRIGGER {_name(t, 'insert')} AFTER INSERT ON {t} BEGIN " + _sqlite_add(cap, "NEW.namespace", "1", new)
        + _sqlite_check(cap, "NEW.namespace", items=True, grows=f"({new}) > 0") + " END",
        f"CREATE TRIGGER {_name(t, 'delete')} AFTER DELETE ON {t} BEGIN "
        + _sqlite_add(cap, "OLD.namespace", "-1", f"-({old_all})") + " END",
        # an update in place: its bytes' difference, checked only when it grows
        f"CREATE TRIGGER {_name(t, 'update')} AFTER UPDATE ON {t} "
        f"WHEN NEW.namespace = OLD.namespace AND ({new}) <> ({old}) BEGIN "
        + _sqlite_add(cap, "NEW.namespace", "0", f"({new}) - ({old})")
        + _sqlite_check(cap, "NEW.namespace", items=False, grows="1", when=f"({new}) > ({old})")
        + " END",
        # a row moved to another namespace (a checkpoint copy's staged thread taking its name)
        f"CREATE TRIGGER {_name(t, 'move')} AFTER UPDATE ON {t} WHEN NEW.namespace <> OLD.namespace BEGIN "
        + _sqlite_add(cap, "OLD.namespace", "-1", f"-({old_all})") + _sqlite_add(cap, "NEW.namespace", "1", new_all)
        + checks + " END",
    ] + [ddl for part in counted.parts for ddl in _sqlite_part_triggers(cap, counted, part)]


def _pg_add() -> str:
    """PostgreSQL: the one function every usage trigger calls: add a namespace's change to its
    usage (its backend's row), then, when the change adds, check the namespace's quota (its
    limits first; a namespace without one reads no usage)."""
    return f"""CREATE OR REPLACE FUNCTION {_name("usage", "add")}(ns text, cap text, d_items bigint, d_bytes bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE max_items bigint; max_bytes bigint; used_items bigint; used_bytes bigint;
BEGIN
  IF d_items = 0 AND d_bytes = 0 THEN RETURN; END IF;
  INSERT INTO namespace_usage AS u (namespace, capability, shard, items, bytes)
    VALUES (ns, cap, pg_backend_pid() % {SHARDS}, d_items, d_bytes)
    ON CONFLICT (namespace, capability, shard)
    DO UPDATE SET items = u.items + excluded.items, bytes = u.bytes + excluded.bytes;
  IF (d_items <= 0 AND d_bytes <= 0) OR left(ns, 1) = '{INTERNAL}' THEN RETURN; END IF;
  SELECT coalesce(o.max_items, d.max_items), coalesce(o.max_bytes, d.max_bytes) INTO max_items, max_bytes
    FROM (SELECT 1) one
    LEFT JOIN namespace_quotas o ON o.namespace = ns AND o.capability = cap
    LEFT JOIN namespace_quotas d ON d.namespace = '' AND d.capability = cap;
  IF max_items IS NULL AND max_bytes IS NULL THEN RETURN; END IF;
  SELECT sum(u.items), sum(u.bytes) INTO used_items, used_bytes
    FROM namespace_usage u WHERE u.namespace = ns AND u.capability = cap;
  IF (d_items > 0 AND used_items > max_items - max_items / {NEAR})
      OR (d_bytes > 0 AND used_bytes > max_bytes - max_bytes / {NEAR}) THEN
    -- near the quota: one writer at a time from here to its commit, reading what others committed
    PERFORM {near_lock("ns", "cap")};
    SELECT sum(u.items), sum(u.bytes) INTO used_items, used_bytes
      FROM namespace_usage u WHERE u.namespace = ns AND u.capability = cap;
  END IF;
  IF d_items > 0 AND used_items > max_items THEN
    RAISE EXCEPTION '{MESSAGE}%.items (namespace %: % items, at most %)', cap, ns, used_items, max_items
      USING ERRCODE = '{SQLSTATE}';
  END IF;
  IF d_bytes > 0 AND used_bytes > max_bytes THEN
    RAISE EXCEPTION '{MESSAGE}%.bytes (namespace %: % bytes, at most %)', cap, ns, used_bytes, max_bytes
      USING ERRCODE = '{SQLSTATE}';
  END IF;
END $$"""


def postgres_triggers(cap: str, counted: Counted) -> list[str]:
    """Inserts and deletes: a statement-level trigger each, which adds up its transition table by
    namespace (a batch is one call per namespace). Updates: a row-level trigger whose ``WHEN``
    (evaluated without a call) passes only a row that changes size or namespace. A part's rows
    are added up by the namespace of the row they belong to."""
    t, add, owner = counted.table.name, _name("usage", "add"), f"{counted.table.name} w"
    out = [_pg_add()]
    # a row inserted: its own bytes (its parts are counted as they are written, with it there,
    # in the same statement too); deleted: with its parts left
    own, with_parts = counted.bytes_sql("r", "postgresql"), counted.bytes_sql("r", "postgresql", parts=True)
    statement_level = [(t, "r.namespace", "count(*)", (own, with_parts), "")] + [
        (p.table.name, "w.namespace", "0", (p.bytes_sql("r", "postgresql"),) * 2, f"JOIN {owner} ON w.{counted.pk} = r.{p.key}")
        for p in counted.parts
    ]
    for table, ns, items, sizes, join in statement_level:
        for op, rows, sign, size in (("insert", "new_rows", "", sizes[0]), ("delete", "old_rows", "-", sizes[1])):
            out.append(f"""CREATE OR REPLACE FUNCTION {_name(table, op)}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM {add}(namespace, '{cap}', items, bytes) FROM (
    SELECT {ns} AS namespace, {sign}{items} AS items, {sign}coalesce(sum({size}), 0)::bigint AS bytes
    FROM {rows} r {join} GROUP BY {ns}) d;
  RETURN NULL;
END $$""")
            refs = "NEW TABLE AS new_rows" if op == "insert" else "OLD TABLE AS old_rows"
            out.append(
                f"CREATE OR REPLACE TRIGGER {_name(table, op)} AFTER {op.upper()} ON {table} "
                f"REFERENCING {refs} FOR EACH STATEMENT EXECUTE FUNCTION {_name(table, op)}()"
            )
    new, old = counted.bytes_sql("NEW", "postgresql"), counted.bytes_sql("OLD", "postgresql")
    new_all, old_all = counted.bytes_sql("NEW", "postgresql", parts=True), counted.bytes_sql("OLD", "postgresql", parts=True)
    out.append(f"""CREATE OR REPLACE FUNCTION {_name(t, "update")}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.namespace = OLD.namespace THEN
    PERFORM {add}(NEW.namespace, '{cap}', 0, ({new}) - ({old}));
  ELSE
    PERFORM {add}(OLD.namespace, '{cap}', -1, -({old_all}));
    PERFORM {add}(NEW.namespace, '{cap}', 1, {new_all});
  END IF;
  RETURN NULL;
END $$""")
    out.append(
        f"CREATE OR REPLACE TRIGGER {_name(t, 'update')} AFTER UPDATE ON {t} FOR EACH ROW "
        f"WHEN (OLD.namespace IS DISTINCT FROM NEW.namespace OR ({old}) IS DISTINCT FROM ({new})) "
        f"EXECUTE FUNCTION {_name(t, 'update')}()"
    )
    for p in counted.parts:  # a part updated in place (a checkpoint put again): its bytes' difference
        pt, new, old = p.table.name, p.bytes_sql("NEW", "postgresql"), p.bytes_sql("OLD", "postgresql")
        out.append(f"""CREATE OR REPLACE FUNCTION {_name(pt, "update")}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM {add}(w.namespace, '{cap}', 0, ({new}) - ({old})) FROM {owner} WHERE w.{counted.pk} = NEW.{p.key};
  RETURN NULL;
END $$""")
        out.append(
            f"CREATE OR REPLACE TRIGGER {_name(pt, 'update')} AFTER UPDATE ON {pt} FOR EACH ROW "
            f"WHEN (({old}) IS DISTINCT FROM ({new})) EXECUTE FUNCTION {_name(pt, 'update')}()"
        )
    return out


def _trigger_names(counted: Counted, dialect: str) -> list[str]:
    ops = ("insert", "delete", "update", "move") if dialect == "sqlite" else ("insert", "update", "delete")
    return [_name(counted.table.name, op) for op in ops] + [
        _name(p.table.name, op) for p in counted.parts for op in ("insert", "update", "delete")
    ]


def _name(table: str, op: str) -> str:
    """A trigger's (and its PostgreSQL function's) name; a new ``VERSION`` replaces the old ones."""
    return f"quota{VERSION}_{table}_{op}"


# --- install, recount ---------------------------------------------------------------------------

def counted_by_database(capabilities: Iterable[Capability[Any]]) -> dict[Database, list[tuple[str, Counted | Kept]]]:
    out: dict[Database, list[tuple[str, Counted | Kept]]] = {}
    for capability in capabilities:
        for counted in capability.usage:
            out.setdefault(capability.database, []).append((capability.name, counted))
    return out


async def _existing_triggers(conn: AsyncConnection, dialect: str) -> dict[str, str]:
    """The usage triggers there are (of any version), by name: their tables."""
    if dialect == "sqlite":
        rows = await conn.execute(text(
            "SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'quota%'"
        ))
    else:
        rows = await conn.execute(text(
            "SELECT tgname, tgrelid::regclass::text FROM pg_trigger WHERE tgname LIKE 'quota%' AND NOT tgisinternal"
        ))
    return {r[0]: r[1] for r in rows}


async def _triggers_as_wanted(conn: AsyncConnection, tables: Sequence[Counted], accounting: bool) -> bool:
    """Whether ``tables`` have exactly this version's triggers (accounting on) or none (off)."""
    existing = await _existing_triggers(conn, conn.dialect.name)
    names = {t.name for c in tables for t in c.tables}
    there = {name for name, on in existing.items() if on in names}
    if not accounting:
        return not there
    return there == {name for c in tables for name in _trigger_names(c, conn.dialect.name)}


async def _drop_trigger(conn: AsyncConnection, name: str, table: str) -> None:
    if conn.dialect.name == "sqlite":
        await conn.execute(text(f"DROP TRIGGER IF EXISTS {name}"))
    else:
        await conn.execute(text(f"DROP TRIGGER IF EXISTS {name} ON {table}"))
        await conn.execute(text(f"DROP FUNCTION IF EXISTS {name}()"))


def _count(counted: Counted, dialect: str, namespace: str | None) -> Any:
    t = counted.table
    rows = select(t.c.namespace, literal_column(counted.bytes_sql(t.name, dialect, parts=True)).label("size"))
    if namespace is not None:
        rows = rows.where(t.c.namespace == namespace)
    r = rows.subquery()
    return select(r.c.namespace, func.count(), func.coalesce(func.sum(r.c.size), 0)).group_by(r.c.namespace)


async def _recount(
    conn: AsyncConnection, db: Database, capability: str, tables: Sequence[Counted], namespace: str | None
) -> dict[str, tuple[int, int]]:
    """Set the usage of ``capability`` (of ``namespace``, or of every namespace) to what its
    tables hold, in ``conn``'s transaction; the counts by namespace."""
    usage, _ = TABLES[db]
    dialect = conn.dialect.name
    totals: dict[str, list[int]] = {}
    for counted in tables:
        for ns, items, size in (await conn.execute(_count(counted, dialect, namespace))).all():
            total = totals.setdefault(ns, [0, 0])
            total[0] += int(items)
            total[1] += int(size)
    scope = (usage.c.capability == capability) if namespace is None else (
        (usage.c.capability == capability) & (usage.c.namespace == namespace)
    )
    await conn.execute(usage.delete().where(scope))
    if totals:
        await conn.execute(usage.insert(), [
            {"namespace": ns, "capability": capability, "shard": 0, "items": i, "bytes": b}
            for ns, (i, b) in totals.items()
        ])
    return {ns: (i, b) for ns, (i, b) in totals.items()}


async def install(state: GatewayState, only: Iterable[Database] | None = None) -> set[Database]:
    """Write the settings' default quotas, and install (accounting on) or drop (off) every
    capability's usage triggers. A table that gets its triggers now has its usage recounted in
    the same transaction (its writes wait meanwhile), so usage starts exact. The databases left
    to do: those not migrated yet (PostgreSQL waits for its operator: ``installer`` tries again)."""
    settings = state.settings.quotas
    pending: set[Database] = set()
    for db, entries in counted_by_database(state.capabilities).items():
        if only is not None and db not in only:
            continue
        engine = state.databases.engine(db)
        dialect = state.databases.dialect(db)
        async with engine.connect() as probe:
            migrated = await probe.run_sync(lambda c: inspect(c).has_table("namespace_quotas"))
        if not migrated:
            log.warning("quotas wait for the %s database's migration (revision 0011)", db.value)
            pending.add(db)
            continue
        async with writer(engine).begin() as conn:
            for cap in sorted({cap for cap, _ in entries}):
                await _put_limits(conn, db, DEFAULTS, cap, default_limits(settings, cap))
            for cap in sorted({cap for cap, _ in entries}):
                tables = [c for name, c in entries if name == cap and isinstance(c, Counted)]
                if not tables or await _triggers_as_wanted(conn, tables, settings.accounting):
                    continue
                if dialect == "postgresql":  # the capability's writes wait until its recount is committed
                    for table in (t for counted in tables for t in counted.tables):
                        await conn.execute(text(f"LOCK TABLE {table.name} IN SHARE ROW EXCLUSIVE MODE"))
                    if await _triggers_as_wanted(conn, tables, settings.accounting):
                        continue  # another gateway's, installed meanwhile
                names = {t.name for c in tables for t in c.tables}
                for name, on in (await _existing_triggers(conn, dialect)).items():
                    if on in names:  # another version's, or all of them with accounting off
                        await _drop_trigger(conn, name, on)
                if settings.accounting:
                    for counted in tables:
                        ddl = postgres_triggers(cap, counted) if dialect == "postgresql" else sqlite_triggers(cap, counted)
                        for statement in ddl:
                            await conn.execute(text(statement))
                    await _recount(conn, db, cap, tables, None)
    return pending


def installer(state: GatewayState, pending: set[Database]) -> Periodic:
    """A background job that installs the quotas of the databases ``install`` left (migrated
    meanwhile), every few seconds until none is left."""
    from app.core.capability import Periodic

    async def run() -> None:
        if pending:
            left = await install(state, only=set(pending))
            pending.intersection_update(left)

    return Periodic("quota-install", INSTALL_RETRY_SECONDS, run)


async def reconcile_namespace(
    state: GatewayState, namespace: str, batch: int = RECOUNT_BATCH
) -> dict[str, tuple[int, int]]:
    """Recount ``namespace``'s usage in every capability; the counts by capability.

    Each capability's tables are read ``batch`` rows at a time (keyset pages), all at one
    snapshot, with the usage as it was at that snapshot (PostgreSQL ``REPEATABLE READ``;
    SQLite a read transaction, which WAL lets writers go on beside): the difference is what the
    usage misses, and one short write transaction adds it. Writes committed after the snapshot
    are in the usage already (their triggers), so nothing waits for the recount and it stays exact.
    """
    out: dict[str, tuple[int, int]] = {}
    for db, entries in counted_by_database(state.capabilities).items():
        engine = state.databases.engine(db)
        for cap in sorted({c for c, _ in entries}):
            tables = [c for name, c in entries if name == cap]
            snapshot = engine
            if engine.dialect.name == "postgresql":
                snapshot = engine.execution_options(isolation_level="REPEATABLE READ")
            async with snapshot.connect() as conn, conn.begin():
                before = await _usage_of(conn, db, namespace, cap)  # the first read: the snapshot's
                items = size = 0
                for counted in tables:
                    if isinstance(counted, Kept):
                        n, b = await counted.recount(conn, namespace)
                        items, size = items + n, size + b
                        continue
                    async for n, b in _pages(conn, counted, namespace, batch):
                        items, size = items + n, size + b
            if (items, size) != before:
                log.warning("quota usage of %s in %s was %s, recounted %s", namespace, cap, before, (items, size))
                async with writer(engine).begin() as conn:
                    await _add(conn, db, namespace, cap, items - before[0], size - before[1])
            out[cap] = (items, size)
    return out


def _namespace_key(table: Table) -> list[Any]:
    """The columns of ``table``'s primary key or a unique constraint that starts with ``namespace``
    (an index range per namespace, in an order that pages by keyset)."""
    from sqlalchemy import UniqueConstraint

    keys = [list(table.primary_key.columns)]
    keys += [list(c.columns) for c in table.constraints if isinstance(c, UniqueConstraint)]
    for columns in keys:
        if columns and columns[0].name == "namespace":
            return columns[1:]
    raise ValueError(f"counted table {table.name} has no key that starts with its namespace")


async def _pages(conn: AsyncConnection, counted: Counted, namespace: str, batch: int) -> AsyncIterator[tuple[int, int]]:
    """(items, bytes) of ``namespace``'s rows of the counted table, ``batch`` rows a page."""
    t = counted.table
    key = _namespace_key(t)
    size = text(counted.bytes_sql(t.name, conn.dialect.name, parts=True))
    after: tuple[Any, ...] | None = None
    while True:
        query = select(*key, size).where(t.c.namespace == namespace).order_by(*key).limit(batch)
        if after is not None:
            query = query.where(tuple_(*key) > tuple_(*after))
        rows = (await conn.execute(query)).all()
        if not rows:
            return
        yield len(rows), sum(int(r[-1]) for r in rows)
        if len(rows) < batch:
            return
        after = tuple(rows[-1][:-1])


async def _add(
    conn: AsyncConnection, db: Database, namespace: str, capability: str, items: int, size: int, shard: Any = 0
) -> None:
    usage, _ = TABLES[db]
    ins = insert_builder(conn.dialect.name)(usage).values(
        namespace=namespace, capability=capability, shard=shard, items=items, bytes=size
    )
    await conn.execute(ins.on_conflict_do_update(
        index_elements=[usage.c.namespace, usage.c.capability, usage.c.shard],
        set_={"items": usage.c["items"] + ins.excluded["items"], "bytes": usage.c.bytes + ins.excluded.bytes},
    ))


async def keep(
    conn: AsyncConnection, settings: QuotasSettings, db: Database, namespace: str, capability: str, items: int, size: int
) -> None:
    """Add a write's difference to ``namespace``'s usage of ``capability`` in ``conn``'s transaction
    (a ``Kept`` capability's, which no trigger counts), then, when it adds, refuse it past the
    quota as the triggers do: ``QuotaExceeded`` (507 naming the quota) before the caller commits,
    whose transaction then rolls back, so nothing changes."""
    if not settings.accounting or (items == 0 and size == 0):
        return
    postgres = conn.dialect.name == "postgresql"
    await _add(conn, db, namespace, capability, items, size, text(f"pg_backend_pid() % {SHARDS}") if postgres else 0)
    if (items <= 0 and size <= 0) or namespace.startswith(INTERNAL):
        return
    _, quotas = TABLES[db]
    rows = {r.namespace: r for r in await conn.execute(
        select(quotas).where(quotas.c.namespace.in_([namespace, DEFAULTS]), quotas.c.capability == capability)
    )}
    ordered = [r for r in (rows.get(namespace), rows.get(DEFAULTS)) if r is not None]
    max_items, max_bytes = _first(r.max_items for r in ordered), _first(r.max_bytes for r in ordered)
    if max_items is None and max_bytes is None:
        return
    used_items, used_bytes = await _usage_of(conn, db, namespace, capability)
    if postgres and (
        (items > 0 and max_items is not None and used_items > max_items - max_items // NEAR)
        or (size > 0 and max_bytes is not None and used_bytes > max_bytes - max_bytes // NEAR)
    ):  # near the quota: as the triggers do (NEAR)
        await conn.execute(text(f"SELECT {near_lock(':ns', ':cap')}"), {"ns": namespace, "cap": capability})
        used_items, used_bytes = await _usage_of(conn, db, namespace, capability)
    if items > 0 and max_items is not None and used_items > max_items:
        raise _refused(f"{capability}.items", f"{capability}.items (namespace {namespace}: {used_items} items, at most {max_items})")
    if size > 0 and max_bytes is not None and used_bytes > max_bytes:
        raise _refused(f"{capability}.bytes", f"{capability}.bytes (namespace {namespace}: {used_bytes} bytes, at most {max_bytes})")


async def _usage_of(conn: AsyncConnection, db: Database, namespace: str, capability: str) -> tuple[int, int]:
    usage, _ = TABLES[db]
    row = (await conn.execute(
        select(func.coalesce(func.sum(usage.c["items"]), 0), func.coalesce(func.sum(usage.c.bytes), 0))
        .where(usage.c.namespace == namespace, usage.c.capability == capability)
    )).one()
    return int(row[0]), int(row[1])


async def reconcile_round(state: GatewayState, after: str | None, batch: int) -> str | None:
    """Recount up to ``batch`` namespaces that have usage, in name order after ``after``; where
    the next round starts (None: from the start again)."""
    names: set[str] = set()
    for db in counted_by_database(state.capabilities):
        usage, _ = TABLES[db]
        query = select(usage.c.namespace).distinct().order_by(usage.c.namespace).limit(batch)
        if after is not None:
            query = query.where(usage.c.namespace > after)
        async with state.databases.engine(db).connect() as conn:
            names.update(r[0] for r in await conn.execute(query))
    chosen = sorted(names)[:batch]
    for namespace in chosen:
        counts = await reconcile_namespace(state, namespace)
        for cap, (items, size) in counts.items():
            observe_usage(namespace, cap, items, size)
    return chosen[-1] if len(chosen) == batch else None


def reconciler(state: GatewayState) -> Periodic:
    """The background job: ``reconcile_round`` every ``quotas.reconcile_interval_seconds``."""
    from app.core.capability import Periodic

    settings = state.settings.quotas
    cursor: list[str | None] = [None]

    async def run() -> None:
        cursor[0] = await reconcile_round(state, cursor[0], settings.reconcile_namespaces)

    return Periodic("quota-reconcile", settings.reconcile_interval_seconds, run)


# --- reading and setting -------------------------------------------------------------------------

@dataclass(frozen=True)
class Usage:
    items: int
    bytes: int
    max_items: int | None
    max_bytes: int | None


async def usage_of(state: GatewayState, namespace: str, only: str | None = None) -> dict[str, Usage]:
    """Every counted capability's (or ``only``'s) usage and quota for ``namespace`` (quota: its
    own, else the default)."""
    out: dict[str, Usage] = {}
    for db, entries in counted_by_database(state.capabilities).items():
        if only is not None:
            entries = [(c, t) for c, t in entries if c == only]
            if not entries:
                continue
        _, quotas = TABLES[db]
        async with state.databases.engine(db).connect() as conn:
            limits = {
                (r.namespace, r.capability): r for r in await conn.execute(
                    select(quotas).where(quotas.c.namespace.in_([namespace, DEFAULTS]))
                )
            }
            for cap in sorted({c for c, _ in entries}):
                items, size = await _usage_of(conn, db, namespace, cap)
                rows = [r for r in (limits.get((namespace, cap)), limits.get((DEFAULTS, cap))) if r is not None]
                out[cap] = Usage(items, size, _first(r.max_items for r in rows), _first(r.max_bytes for r in rows))
    return dict(sorted(out.items(), key=lambda kv: [c.name for c in state.capabilities].index(kv[0])))


def _first(values: Iterable[int | None]) -> int | None:
    return next((v for v in values if v is not None), None)


def _database_of(state: GatewayState, capability: str) -> Database:
    for c in state.capabilities:
        if c.name == capability and c.usage:
            return c.database
    from app.core.errors import NotFound

    raise NotFound(f"capability {capability!r} keeps no quota (counted: {', '.join(counted_names(state))})")


def counted_names(state: GatewayState) -> list[str]:
    return [c.name for c in state.capabilities if c.usage]


async def set_quota(state: GatewayState, namespace: str, capability: str, limits: Limits | None) -> None:
    """Set ``namespace``'s own quota of ``capability`` (None: back to the default)."""
    db = _database_of(state, capability)
    _, quotas = TABLES[db]
    async with writer(state.databases.engine(db)).begin() as conn:
        if limits is None:
            await conn.execute(quotas.delete().where(quotas.c.namespace == namespace, quotas.c.capability == capability))
        else:
            await _put_limits(conn, db, namespace, capability, limits)


async def _put_limits(conn: AsyncConnection, db: Database, namespace: str, capability: str, limits: Limits) -> None:
    _, quotas = TABLES[db]
    ins = insert_builder(conn.dialect.name)(quotas).values(
        namespace=namespace, capability=capability, max_bytes=limits.max_bytes, max_items=limits.max_items
    )
    await conn.execute(ins.on_conflict_do_update(
        index_elements=[quotas.c.namespace, quotas.c.capability],
        set_={"max_bytes": ins.excluded.max_bytes, "max_items": ins.excluded.max_items},
    ))


async def refuse_over_quota(request: Any, namespace: str, capability: str, declared: str | None) -> None:
    """413 before a body is read when its declared length alone passes ``namespace``'s bytes
    quota of ``capability`` (no replacement could make it fit); the triggers judge the rest."""
    if declared is None or not declared.isdigit() or len(declared) > 19:
        return
    from app.core.errors import PayloadTooLarge
    from app.core.state import gateway_state

    state = gateway_state(request.app)
    if not state.settings.quotas.accounting:
        return
    limit = (await usage_of(state, namespace, only=capability))[capability].max_bytes
    if limit is not None and int(declared) > limit:
        quota = f"{capability}.bytes"
        raise PayloadTooLarge(
            f"the body ({declared} bytes) is larger than the namespace's whole {quota} quota ({limit})",
            errors=[{"loc": ["quota"], "msg": "larger than the quota", "quota": quota}],
        )


# --- errors --------------------------------------------------------------------------------------

class QuotaExceeded(InsufficientStorage):
    code = "quota_exceeded"


def quota_problem(exc: BaseException) -> QuotaExceeded | None:
    """The 507 of a write the usage triggers refused, naming the quota; None for other errors."""
    seen: list[BaseException] = [exc]
    orig = getattr(exc, "orig", None)
    if orig is not None:
        seen += [orig, *([orig.__cause__] if orig.__cause__ is not None else [])]
    for error in seen:
        message = str(error)
        if getattr(error, "sqlstate", None) == SQLSTATE or (
            getattr(error, "sqlite_errorcode", None) is not None and MESSAGE in message
        ):
            at = message.find(MESSAGE)
            what = message[at + len(MESSAGE):].splitlines()[0] if at >= 0 else message
            return _refused(what.split(" ", 1)[0], what)
    return None


def _refused(quota: str, what: str) -> QuotaExceeded:
    QUOTA_REFUSED.labels(quota=quota[:64]).inc()
    return QuotaExceeded(
        f"the namespace's {quota} quota would be exceeded ({what}); nothing was written: "
        "delete data or ask the operator for a larger quota",
        errors=[{"loc": ["quota"], "msg": "quota exceeded", "quota": quota}],
    )
