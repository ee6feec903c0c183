"""Migration 0011: priorities and limits. A 0010 database with live data keeps
every row, each message and delivery at priority 0 (the order it had), no
channel limited, and claims take the lanes from then on; downgrading to 0010
drops the columns (priorities and limits with them) and keeps every row;
``novaque_schema`` follows both ways."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from novaque import _migrate
from tests._migration_rows import ADDED_BY_0011, columns, rows
from tests.conftest import Backend
from tests.test_migration_0005 import _migrated_0004
from tests.test_migration_0009 import TABLES, _recorded

NEW_COLUMNS = ADDED_BY_0011


def _rows_without_new(engine: sa.Engine) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table, in the columns 0010 had."""
    return rows(engine, TABLES)


def test_upgrading_a_0010_database_with_live_data_keeps_every_row(
    backend: Backend, tmp_path: Path
) -> None:
    engine, client, _ = _migrated_0004(backend, tmp_path)
    client.migrate(to="0010")
    before = _rows_without_new(engine)
    assert "priority" not in columns(engine, "novaque_deliveries")

    client.migrate(to="0011")
    assert _recorded(engine) == ["0011"]
    assert _rows_without_new(engine) == before
    with engine.connect() as conn:
        assert _migrate.current(conn) == "0011"
        lanes = conn.execute(sa.text("SELECT DISTINCT priority FROM novaque_deliveries"))
        assert set(lanes.scalars()) <= {0}
        limited = conn.execute(
            sa.text(
                "SELECT COUNT(*) FROM novaque_channels WHERE max_leased IS NOT NULL "
                "OR rate_count IS NOT NULL OR group_max_leased IS NOT NULL"
            )
        )
        assert limited.scalar_one() == 0
    client.migrate()
    client.publish("orders", b"normal")
    client.publish("orders", b"urgent", priority=-1)
    got = [m.body for m in client.claim("orders", "billing", max_messages=10)]
    assert got[0] == b"urgent"
    assert b"normal" in got[1:]


def test_downgrading_0011_drops_priorities_and_limits_and_keeps_the_rest(
    backend: Backend, tmp_path: Path
) -> None:
    engine, client, _ = _migrated_0004(backend, tmp_path)
    client.migrate()
    client.publish("orders", b"normal")
    client.publish("orders", b"urgent", priority=-1)
    client.flush_stats()  # the counters written now, not at some later call
    before = _rows_without_new(engine)

    client.downgrade(to="0010")
    assert _recorded(engine) == ["0010"]
    for table, added in NEW_COLUMNS.items():
        assert not added & set(columns(engine, table)), table
    assert _rows_without_new(engine) == before
    client.migrate(to="0011")
    assert _recorded(engine) == ["0011"]
