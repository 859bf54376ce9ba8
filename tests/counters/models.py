"""The counters table (metadata database), on a MetaData of its own: the gateway's migrations
do not know it, so the lifecycle creates it (``app.core.capability.create_tables``)."""

from sqlalchemy import BigInteger, CheckConstraint, Column, MetaData, Table

from app.core.db.tables import NAMING_CONVENTION, NameColumn

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# SQLite turns an integer sum past 64 bits into a REAL: the CHECK makes that an error instead
# (``ck_counters_value_is_integer``), as PostgreSQL's BIGINT does (SQLSTATE 22003).
counters = Table(
    "counters",
    metadata,
    Column("namespace", NameColumn, primary_key=True),
    Column("name", NameColumn, primary_key=True),
    Column("value", BigInteger, nullable=False),
    CheckConstraint("typeof(value) = 'integer'", name="value_is_integer").ddl_if(dialect="sqlite"),
)
