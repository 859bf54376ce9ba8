"""Quotas: usage and quota rows per namespace and capability (each database)

Revision ID: 0011
Revises: 0010

Each database keeps the usage of the capabilities that live in it, so that the triggers that keep
it (installed at start-up from the capabilities' declarations, ``app.quotas.usage``) write it in
the same transaction as the data.
"""

from alembic import op
import sqlalchemy as sa

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _name(length: int) -> sa.types.TypeEngine:
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def _upgrade() -> None:
    op.create_table(
        "namespace_usage",
        sa.Column("namespace", _name(128), nullable=False),
        sa.Column("capability", sa.String(32), nullable=False),
        sa.Column("shard", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("items", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "capability", "shard", name=op.f("pk_namespace_usage")),
    )
    op.create_table(
        "namespace_quotas",
        sa.Column("namespace", _name(128), nullable=False, comment="'' holds the defaults of the settings."),
        sa.Column("capability", sa.String(32), nullable=False),
        sa.Column("max_bytes", sa.BigInteger(), nullable=True, comment="NULL: the default (none: unlimited)."),
        sa.Column("max_items", sa.BigInteger(), nullable=True, comment="NULL: the default (none: unlimited)."),
        sa.PrimaryKeyConstraint("namespace", "capability", name=op.f("pk_namespace_quotas")),
    )


def _downgrade() -> None:
    bind = op.get_bind()
    # the usage triggers (app.quotas.usage.install) write namespace_usage: drop them first
    if bind.dialect.name == "sqlite":
        names = [r[0] for r in bind.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'quota_%'"
        )]
        for name in names:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    else:
        rows = bind.exec_driver_sql(
            "SELECT tgname, tgrelid::regclass::text FROM pg_trigger WHERE tgname LIKE 'quota_%' AND NOT tgisinternal"
        ).all()
        for name, table in rows:
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        functions = bind.exec_driver_sql(
            "SELECT proname, pg_get_function_identity_arguments(oid) FROM pg_proc WHERE proname LIKE 'quota%'"
        ).all()
        for name, args in functions:
            op.execute(f"DROP FUNCTION IF EXISTS {name}({args})")
    op.drop_table("namespace_quotas")
    op.drop_table("namespace_usage")


def upgrade(engine_name: str) -> None:
    _upgrade()


def downgrade(engine_name: str) -> None:
    _downgrade()
