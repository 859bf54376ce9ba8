"""``storage-gateway promote --to TARGET``: copy every namespace of this deployment into PostgreSQL.

The source (the configured settings, typically the embedded SQLite files) is only ever read. The
target's three databases are migrated with Alembic, then each namespace is streamed across as an
archive, export piped into import in-process (no temporary file; the importer checks every
member's sha256, the manifest's counts and ``checksums.json`` as for an uploaded archive), and
verified afterwards: per capability, part and collection the target holds the source's count, and
an order-free digest of the rows (and of the file bytes' sha256) equals the source's. A namespace
the target already holds exactly is skipped, so an interrupted promote is run again and goes on
(a namespace left half-copied is cleared on the target and copied again). API keys and quotas
are copied by key (missing ones only). At the end it prints the settings to switch to.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import Table, select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import make_url

from app.core.config import Database, DatabaseSettings, Settings, normalize_url
from app.core.names import NAME_PATTERN
from app.core.namespace_data import Blob, delete_namespace, writer
from app.core.state import GatewayState
from app.portability.exporter import BATCH, export_archive, line_of, open_snapshots
from app.portability.importer import holds_data, import_archive

# Fields of an exported line that are not the data's, left out of the digest: this backend's choice
# (a collection from a SQLite archive gets PostgreSQL's default index), and housekeeping each
# gateway's background sweep writes on its own (when it last pruned a thread).
BACKEND_FIELDS = frozenset({"index", "pruned_at"})
JSON_TEXT_FIELDS = frozenset({"payload"})  # JSON as text in a line (a point's payload): compared as values


class PromoteError(ValueError):
    """A target that cannot be promoted into (told to the operator as one line)."""


def target_settings(source: Settings, to: str, files_backend: str | None = None) -> Settings:
    """The source's settings with the target's databases: ``to`` is a base DSN (the three
    databases are ``persistence.postgres_databases``' names on it) or a YAML file with a
    ``persistence:`` and/or ``databases:`` block (and optionally ``files:``)."""
    files = source.files
    files_given = False
    if re.match(r"^postgres(ql)?(\+\w+)?://", to):
        urls = {db: normalize_url(f"{to.rstrip('/')}/{getattr(source.persistence.postgres_databases, db.value)}") for db in Database}
    else:
        path = Path(to)
        if not path.is_file():
            raise PromoteError(f"--to {to!r} is neither a postgresql:// URL nor a settings file")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise PromoteError(f"{to} must hold a mapping at the top level")
        # the file's settings alone (not this process's GATEWAY_* variables, which name the source)
        view = Settings.model_construct(**{**source.__dict__, **_sections(raw)})
        urls = {db: Settings.database_url(view, db) for db in Database}
        if "files" in raw:
            files = type(source.files).model_validate(raw["files"])
            files_given = files.backend is not None
    for db, url in urls.items():
        if not url.startswith("postgresql+asyncpg://"):
            raise PromoteError(f"the target's {db.value} database must be PostgreSQL, not {url.split('://')[0]}")
        if url == source.database_url(db):
            raise PromoteError(f"the target's {db.value} database is the source's")
    if files_backend is not None:
        files = files.model_copy(update={"backend": files_backend})
    elif not files_given:
        files = files.model_copy(update={"backend": "database"})  # what a PostgreSQL deployment uses by default
    databases = source.databases.model_copy(update={
        db.value: source.databases.get(db).model_copy(update={"url": url}) for db, url in urls.items()
    })
    return source.model_copy(update={"databases": databases, "files": files, "auto_migrate": False})


def _sections(raw: dict[str, Any]) -> dict[str, Any]:
    from app.core.config import DatabasesSettings, PersistenceSettings

    out: dict[str, Any] = {
        "persistence": PersistenceSettings.model_validate(raw.get("persistence") or {}),
        "databases": DatabasesSettings.model_validate(raw.get("databases") or {}),
    }
    if out["persistence"].postgres_base_dsn is None and not any(
        DatabaseSettings.model_validate(v).url for v in (raw.get("databases") or {}).values()
    ):
        raise PromoteError("the settings file names no PostgreSQL database (persistence.postgres_base_dsn or databases.*.url)")
    return out


async def namespaces_of(state: GatewayState) -> list[str]:
    """Every namespace with a row in any capability's tables (sorted)."""
    found: set[str] = set()
    for capability in state.capabilities:
        async with state.databases.engine(capability.database).connect() as conn:
            for table in capability.tables:
                found.update((await conn.execute(select(table.c.namespace).distinct())).scalars())
    return sorted(n for n in found if re.fullmatch(NAME_PATTERN, n))


@dataclass
class Fingerprint:
    """Per capability and part: lines, per collection counts, and an order-free digest of the lines."""

    parts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, cap: str, part: str, canonical: bytes, collection: str | None) -> None:
        entry = self.parts.setdefault(f"{cap}/{part}", {"count": 0, "digest": 0, "collections": {}})
        entry["count"] += 1
        entry["digest"] = (entry["digest"] + int.from_bytes(hashlib.sha256(canonical).digest(), "big")) % (1 << 256)
        if collection is not None:
            entry["collections"][collection] = entry["collections"].get(collection, 0) + 1

    def items(self) -> int:
        return sum(e["count"] for k, e in self.parts.items() if not k.endswith("/blobs"))

    def differences(self, other: Fingerprint) -> list[str]:
        out = []
        for key in sorted(set(self.parts) | set(other.parts)):
            mine, theirs = self.parts.get(key), other.parts.get(key)
            if mine is None or theirs is None or mine["count"] != theirs["count"] or mine["collections"] != theirs["collections"]:
                out.append(f"{key}: {mine and mine['count']} items here, {theirs and theirs['count']} there")
            elif mine["digest"] != theirs["digest"]:
                out.append(f"{key}: the same count, other content")
        return out


def _canonical(row: dict[str, Any]) -> bytes:
    """A line with its JSON as values (each backend writes JSON text its own way), keys sorted;
    the stdlib's parser keeps integers past 64 bits exact."""
    value = json.loads(line_of(row))
    kept = {k: json.loads(v) if k in JSON_TEXT_FIELDS and isinstance(v, str) else v
            for k, v in value.items() if k not in BACKEND_FIELDS}
    return json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


async def fingerprint(state: GatewayState, namespace: str) -> Fingerprint:
    """The namespace's fingerprint, read from one snapshot per database."""
    out = Fingerprint()
    async with AsyncExitStack() as stack:
        conns = await open_snapshots(state, stack)
        for capability in state.capabilities:
            service = state.services[capability.name]
            async for item in capability.namespace_data.export(service, conns[capability.database], namespace, BATCH):
                if isinstance(item, Blob):
                    out.add(capability.name, "blobs", f"{item.sha256}:{item.size}".encode(), None)
                    continue
                for row in item.rows:
                    collection = row.get("collection")
                    out.add(capability.name, item.table, _canonical(row), collection if isinstance(collection, str) else None)
    return out


Progress = Callable[..., None]


@dataclass
class NamespaceResult:
    namespace: str
    action: str  # copied | skipped | recopied
    items: int
    bytes: int = 0
    seconds: float = 0.0


async def promote_namespace(
    source: GatewayState, target: GatewayState, namespace: str, *,
    on_manifest: Callable[[dict[str, Any]], None] | None = None, progress: Callable[[str, int, int], None] | None = None,
) -> NamespaceResult:
    started = time.monotonic()
    wanted = await fingerprint(source, namespace)
    action = "copied"
    if await holds_data(target, namespace):
        if not (await fingerprint(target, namespace)).differences(wanted):
            return NamespaceResult(namespace, "skipped", wanted.items(), 0, round(time.monotonic() - started, 3))
        # a namespace left half-copied by an interrupted promote (or changed since): copied again
        await delete_namespace(target, namespace)
        action = "recopied"
    report = await import_archive(
        target, namespace, export_archive(source, namespace, on_manifest=on_manifest, progress=progress)
    )
    got = await fingerprint(target, namespace)
    if differences := got.differences(wanted):
        # the source changed while it was copied (the gateway still serves it), or a bug: run promote again
        raise PromoteError(f"namespace {namespace!r} differs on the target after the copy: {'; '.join(differences[:5])}")
    return NamespaceResult(namespace, action, got.items(), int(report.get("bytes", 0)), round(time.monotonic() - started, 3))


async def copy_table(source: GatewayState, target: GatewayState, db: Database, table: Table, batch: int = 500) -> int:
    """Rows of a small keyed table (API keys, quotas) the target lacks, by primary key; none replaced."""
    key = list(table.primary_key.columns)
    copied = 0
    async with source.databases.engine(db).connect() as src:
        result = await src.stream(select(table).order_by(*key))
        async for rows in result.mappings().partitions(batch):
            values = [dict(r) for r in rows]
            async with writer(target.databases.engine(db)).begin() as conn:
                have = set((await conn.execute(
                    select(*key).where(tuple_(*key).in_([tuple(v[c.name] for c in key) for v in values]))
                )).all())
                new = [v for v in values if tuple(v[c.name] for c in key) not in have]
                if new:
                    await conn.execute(pg_insert(table).on_conflict_do_nothing(), new)
                copied += len(new)
    return copied


async def copy_settings_tables(source: GatewayState, target: GatewayState) -> dict[str, int]:
    from app.auth.models import api_keys
    from app.quotas.tables import TABLES

    out = {"api_keys": await copy_table(source, target, Database.metadata, api_keys)}
    for db, (_usage, quotas) in TABLES.items():
        out[f"{db.value}.namespace_quotas"] = await copy_table(source, target, db, quotas)
    return out


def switch_to(target: Settings, show_secrets: bool = False) -> list[str]:
    """The settings to switch the gateway to, as environment variables."""
    lines = []
    for db in Database:
        url = make_url(target.database_url(db)).set(drivername="postgresql")
        lines.append(f"GATEWAY_DATABASES__{db.value.upper()}__URL={url.render_as_string(hide_password=not show_secrets)}")
    lines.append(f"GATEWAY_FILES__BACKEND={target.files.backend}")
    return lines
