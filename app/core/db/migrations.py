"""Running and inspecting the Alembic migrations from inside the gateway."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.schema import SchemaItem

import migrations
from app.core.config import Database
from app.core.db.databases import Databases
from app.core.fences.sqlalchemy_ import is_dialect_conditional

# Per-collection tables the vectors capability creates at run time, and the version tables.
RUNTIME_TABLE_PREFIXES = ("vec_", "fts_", "alembic_version")
# Indexes on migrated tables made at run time: the store's HNSW index per embedding size.
RUNTIME_INDEX_PREFIXES = ("store_hnsw_",)

SCRIPT_LOCATION = str(Path(migrations.__file__).parent)


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    return cfg


@lru_cache
def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def version_table(db: Database) -> str:
    return f"alembic_version_{db.value}"


def include_object(
    obj: SchemaItem, name: str | None, type_: str, reflected: bool, compare_to: SchemaItem | None
) -> bool:
    """Tables created at run time (one per vector collection) are not the migrations' business."""
    if type_ == "table" and reflected and compare_to is None:
        return not (name or "").startswith(RUNTIME_TABLE_PREFIXES)
    if type_ == "index" and reflected and compare_to is None and (name or "").startswith(RUNTIME_INDEX_PREFIXES):
        return False
    if type_ == "index" and not reflected and compare_to is None and is_dialect_conditional(obj):
        return False  # a one-dialect index (``Index.ddl_if``) is not missing where it does not apply
    return True


def _current(connection: Connection, db: Database) -> str | None:
    ctx = MigrationContext.configure(connection, opts={"version_table": version_table(db)})
    return ctx.get_current_revision()


async def current_revision(databases: Databases, db: Database) -> str | None:
    async with databases.engine(db).connect() as conn:
        return await conn.run_sync(_current, db)


def _upgrade(connection: Connection, db: Database, target: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    cfg.attributes["db"] = db.value
    command.upgrade(cfg, target)


async def upgrade(databases: Databases, db: Database, target: str = "head") -> None:
    """Bring ``db`` to ``target`` through the gateway's own engine (so SQLite hooks apply)."""
    async with databases.engine(db).connect() as conn:
        await conn.run_sync(_upgrade, db, target)
        await conn.commit()
