"""The rows of novaque's tables as the migration tests compare them: every
row, in the columns an older revision had (columns added by later revisions
left out, so that a test written for one revision holds at the head)."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

#: Columns added to existing tables by revision 0011 (priorities and limits).
ADDED_BY_0011 = {
    "novaque_messages": frozenset({"priority"}),
    "novaque_deliveries": frozenset({"priority"}),
    "novaque_schedules": frozenset({"priority"}),
    "novaque_channels": frozenset(
        {"max_leased", "rate_count", "rate_period", "group_max_leased", "rate_window", "rate_used"}
    ),
}
#: Columns added to existing tables by revision 0013 (a channel's lanes).
ADDED_BY_0013 = {"novaque_channels": frozenset({"low_lane", "high_lane"})}
#: Columns added to existing tables by revisions since 0010.
ADDED_LATER = {
    table: ADDED_BY_0011.get(table, frozenset()) | ADDED_BY_0013.get(table, frozenset())
    for table in {*ADDED_BY_0011, *ADDED_BY_0013}
}


def columns(engine: sa.Engine, table: str) -> list[str]:
    with engine.connect() as conn:
        return [c["name"] for c in sa.inspect(conn).get_columns(table)]


def rows(engine: sa.Engine, tables: Iterable[str]) -> dict[str, list[tuple[object, ...]]]:
    """Every row of ``tables``, sorted, without the columns of :data:`ADDED_LATER`."""
    found = {}
    with engine.connect() as conn:
        for table in tables:
            later = ADDED_LATER.get(table, frozenset())
            names = [c for c in columns(engine, table) if c not in later]
            result = conn.execute(sa.text(f"SELECT {', '.join(names)} FROM {table}"))
            found[table] = sorted((tuple(row) for row in result), key=repr)
    return found
