"""Migration 0010: the schedules table. A 0009 database with live data keeps
every row and gets an empty ``novaque_schedules`` that schedules work in;
downgrading to 0009 drops it (and the schedules) and keeps every other row;
``novaque_schema`` follows both ways."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from novaque import _migrate
from tests.conftest import Backend
from tests.test_migration_0005 import _migrated_0004
from tests.test_migration_0009 import TABLES, _recorded, _rows

SCHEDULES = "novaque_schedules"


def _has_schedules(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return sa.inspect(conn).has_table(SCHEDULES)


def test_upgrading_a_0009_database_with_live_data_keeps_every_row(
    backend: Backend, tmp_path: Path
) -> None:
    engine, client, _ = _migrated_0004(backend, tmp_path)
    client.migrate(to="0009")
    before = _rows(engine)
    assert not _has_schedules(engine)

    client.migrate(to="0010")
    assert _recorded(engine) == ["0010"]
    assert _rows(engine) == before
    with engine.connect() as conn:
        assert _migrate.current(conn) == "0010"
        assert conn.execute(sa.text(f"SELECT COUNT(*) FROM {SCHEDULES}")).scalar_one() == 0
    client.migrate()
    info = client.schedule("nightly", "orders", b"x", every=3600)
    assert client.list_schedules() == [info]


def test_downgrading_0010_drops_the_schedules_and_keeps_the_rest(
    backend: Backend, tmp_path: Path
) -> None:
    engine, client, _ = _migrated_0004(backend, tmp_path)
    client.migrate()
    client.publish("orders", b"x")
    client.schedule("nightly", "orders", b"x", every=3600)
    client.flush_stats()  # the counters written now, not at some later call
    before = _rows(engine)

    client.downgrade(to="0009")
    assert not _has_schedules(engine)
    assert _recorded(engine) == ["0009"]
    assert _rows(engine) == before
    assert set(TABLES) <= set(sa.inspect(engine).get_table_names())

    client.migrate()
    assert _recorded(engine) == [_migrate.head()]
    assert client.list_schedules() == []
    assert _rows(engine) == before
