"""Migrations for the three databases, each with its own version table.

Every revision has ``upgrade_<db>()``/``downgrade_<db>()`` per database (Alembic's multidb
layout). ``-x db=NAME`` (or ``config.attributes["db"]``) limits a run to one database; the
gateway passes its own connection in ``config.attributes["connection"]`` when it migrates
itself at start-up. ``alembic revision --autogenerate [-x db=NAME] -m msg`` compares each
database with its ``MetaData`` and writes what differs into that database's functions of the new
revision (the ``<db>_upgrades`` / ``<db>_downgrades`` tokens of ``script.py.mako``).
"""

from __future__ import annotations

import asyncio
import logging.config

from alembic import context
from sqlalchemy.engine import Connection

import app  # noqa: F401  (selects a sqlite3 that can load extensions)
import app.models  # noqa: F401  (registers every table)
from app.core.config import Database, Settings
from app.core.db.databases import create_engine
from app.core.db.migrations import include_object, version_table
from app.core.db.tables import METADATA

config = context.config
if config.config_file_name is not None and not config.attributes.get("connection"):
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)


def selected_databases() -> list[Database]:
    chosen = config.attributes.get("db") or context.get_x_argument(as_dictionary=True).get("db")
    if not chosen:
        return list(Database)
    try:
        return [Database(chosen)]
    except ValueError:
        raise SystemExit(f"-x db={chosen}: must be one of {', '.join(d.value for d in Database)}")


def run_on(connection: Connection, db: Database) -> None:
    context.configure(
        connection=connection,
        target_metadata=METADATA[db],
        version_table=version_table(db),
        include_object=include_object,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        upgrade_token=f"{db.value}_upgrades",
        downgrade_token=f"{db.value}_downgrades",
    )
    with context.begin_transaction():
        context.run_migrations(engine_name=db.value)


async def run_all(settings: Settings) -> None:
    for db in selected_databases():
        engine = create_engine(settings, db)
        try:
            async with engine.connect() as conn:
                await conn.run_sync(run_on, db)
                await conn.commit()
        finally:
            await engine.dispose()


def run_offline() -> None:
    raise SystemExit("offline (--sql) migrations are not supported; run against the databases")


if context.is_offline_mode():
    run_offline()
elif (connection := config.attributes.get("connection")) is not None:
    run_on(connection, Database(config.attributes["db"]))
else:
    asyncio.run(run_all(config.attributes.get("settings") or Settings()))
