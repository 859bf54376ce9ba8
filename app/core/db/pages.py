"""A page of rows cut at a byte budget, in its one statement.

A list answers up to ``limit`` items, and an item may be large (a kv value or record of up to
``limits.max_value_bytes``, a checkpoint with its values): a page of a thousand such items would be
fetched whole by the driver and built whole in the gateway's memory. ``budgeted`` takes the page's
keys with what each item weighs (a length the database knows without reading the value out,
``byte_length``), keeps the rows that with the rows before them weigh at most a budget, and the
next row marked as cut (``within`` 0, its heavy columns NULL), which says that more follow. One
window over the page does it. Values ride through the window (SQLite reads them as it did before
the budget; PostgreSQL carries TOAST pointers): looking each kept one up by key afterwards cost
the embedded default's 50-record list a third of its throughput (docs/benchmarks.md), and a
checkpoint page, whose rows are wider, joins its table back instead (``app.checkpoints.reads``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import case, func, or_, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import BigInteger

from app.core.db.sqlite import SQLITE

# octet_length() came in SQLite 3.43: before it, the bytes of a text are its length as a blob
# (a Debian bookworm Python has SQLite 3.40, and its sqlite3 module loads extensions).
SQLITE_OCTET_LENGTH = SQLITE.sqlite_version_info >= (3, 43, 0)


class byte_length(FunctionElement[int]):
    """The length in bytes of a text or binary value."""

    type = BigInteger()
    inherit_cache = True
    name = "byte_length"


@compiles(byte_length)
def _byte_length(element: byte_length, compiler: SQLCompiler, **kw: Any) -> str:
    return f"octet_length({compiler.process(element.clauses, **kw)})"


@compiles(byte_length, "sqlite")
def _byte_length_sqlite(element: byte_length, compiler: SQLCompiler, **kw: Any) -> str:
    return byte_length_sql(compiler.process(element.clauses, **kw), "sqlite")


def byte_length_sql(expr: str, dialect: str) -> str:
    """``byte_length`` of the SQL expression ``expr``, as text SQL of ``dialect``."""
    if dialect == "sqlite" and not SQLITE_OCTET_LENGTH:
        return f"length(CAST({expr} AS BLOB))"
    return f"octet_length({expr})"


def budgeted(
    ordered: Any, order: Sequence[tuple[str, bool]], budget: ColumnElement[Any], *, first_always: bool,
    heavy: Sequence[str] = (),
) -> Any:
    """The rows of ``ordered`` (a SELECT with a ``weight`` column, no row weighing nothing, and
    its ORDER BY and LIMIT) up to the first whose running sum of ``weight`` in ``order`` (column
    name, descending) passes ``budget``, with ``within`` 1 for the others (and for the first row
    whatever it weighs if ``first_always``) and 0 for that one, whose ``heavy`` columns are NULL;
    ``upto`` is the running sum. In ``order``: a window's output order is no promise of SQL's."""
    first = ordered.cte("page_all")
    keys = [first.c[name].desc() if desc else first.c[name] for name, desc in order]
    weighed = select(
        first, func.sum(first.c.weight).over(order_by=keys, rows=(None, 0)).label("upto"),
        func.row_number().over(order_by=keys).label("nth"),
    ).cte("page_weighed")
    w = weighed.c
    within = w.upto <= budget
    kept = or_(w.nth == 1, w.upto - w.weight <= budget)  # the row before it was within...
    if first_always:
        within = or_(within, w.nth == 1)
        kept = or_(kept, w.nth == 2)  # ...or was the first
    columns = [case((within, c), else_=None).label(c.name) if c.name in heavy else c for c in w if c.name != "nth"]
    in_order = [w[name].desc() if desc else w[name] for name, desc in order]
    return select(*columns, case((within, 1), else_=0).label("within")).where(kept).order_by(*in_order)
