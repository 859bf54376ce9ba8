"""A page of rows cut at a byte budget, in its one statement.

A list answers up to ``limit`` items, and an item may be large (a kv value or record of up to
``limits.max_value_bytes``, a checkpoint with its values): a page of a thousand such items would be
fetched whole by the driver and built whole in the gateway's memory. ``budgeted`` keeps, of an
ordered and limited page, the rows that with the rows before them weigh at most a budget, and the
next row with its heavy columns NULL, which says that the page was cut there. The weights are
lengths the database knows without reading the values out, and one window (a running sum) over
the page's rows, already in its order, does the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import case, func, or_, select
from sqlalchemy.sql import ColumnElement


def budgeted(
    ordered: Any, order: Sequence[tuple[str, bool]], budget: ColumnElement[Any], *,
    heavy: Sequence[str] = (), first_always: bool,
) -> Any:
    """The rows of ``ordered`` (a SELECT with its ORDER BY and LIMIT and a ``weight`` column, no
    row weighing nothing) up to the first whose running sum of ``weight`` in ``order`` (column
    name, descending) passes ``budget``: ``within`` is 1 for the others (and for the first
    row whatever it weighs if ``first_always``), and that row comes with its ``heavy`` columns
    NULL. ``upto`` is the running sum."""
    first = ordered.cte("page_all")
    keys = [first.c[name].desc() if desc else first.c[name] for name, desc in order]
    upto = func.sum(first.c.weight).over(order_by=keys, rows=(None, 0))
    weighed = select(first, upto.label("upto")).cte("page_weighed")
    within: ColumnElement[bool] = weighed.c.upto <= budget
    if first_always:
        within = or_(within, weighed.c.upto == weighed.c.weight)  # nothing before it
    columns = [case((within, c), else_=None).label(c.name) if c.name in heavy else c for c in weighed.c]
    kept = [weighed.c[name].desc() if desc else weighed.c[name] for name, desc in order]
    return (
        select(*columns, case((within, 1), else_=0).label("within"))  # an integer: a driver value on SQLite too
        .where(weighed.c.upto - weighed.c.weight <= budget)  # the rows before it are within
        .order_by(*kept)
    )
