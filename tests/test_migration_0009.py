"""Migration 0009: novaque's revision recorded by its migrations in
``novaque_schema``. A 0008 database with live data keeps every row; every
migration from 0009 on writes its revision there on upgrade and the one it
revises on downgrade; downgrading 0009 drops the table and the revision is
read from the version table again."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
from novaque import _migrate, schema
from tests import _migration_rows
from tests.conftest import Backend
from tests.test_migration_0005 import OLD_TABLES, _migrated_0004

TABLES = (*OLD_TABLES, "novaque_minute_stats", "novaque_consumers")


def _rows(engine: sa.Engine) -> dict[str, list[tuple[object, ...]]]:
    return _migration_rows.rows(engine, TABLES)


def _recorded(engine: sa.Engine) -> list[str] | None:
    """The rows of novaque_schema, or None without the table."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(schema.REVISION_TABLE):
            return None
        return list(
            conn.execute(sa.text(f"SELECT revision FROM {schema.REVISION_TABLE}")).scalars()
        )


def _order() -> list[str]:
    """novaque's revisions, oldest first."""
    history = _migrate.history()
    order: list[str] = []
    while len(order) < len(history):
        order += [r for r, downs in history.items() if r not in order and set(downs) <= set(order)]
    return order


def test_the_revision_table_starts_at_a_known_revision() -> None:
    assert _migrate.REVISION_TABLE_SINCE in _migrate.known_revisions()


def test_upgrading_a_0008_database_with_live_data_keeps_every_row(
    backend: Backend, tmp_path: Path
) -> None:
    engine, client, _ = _migrated_0004(backend, tmp_path)
    client.migrate(to="0008")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO novaque_minute_stats (channel_id, minute, published, claimed, "
                "acked, requeued, dead, purged) VALUES (1, 60000000, 1, 0, 0, 0, 0, 0)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO novaque_consumers (host, pid, topic, channel, max_in_flight, "
                "in_flight, started_at, heartbeat_at) VALUES ('h', 1, 'orders', 'live', 1, 0, 1, 1)"
            )
        )
    before = _rows(engine)
    assert _recorded(engine) is None

    client.migrate(to="0009")
    assert _recorded(engine) == ["0009"]
    assert _rows(engine) == before
    with engine.connect() as conn:
        assert _migrate.current(conn) == "0009"


def test_downgrading_0009_drops_the_table_and_keeps_the_rest(
    backend: Backend, tmp_path: Path
) -> None:
    engine, client, _ = _migrated_0004(backend, tmp_path)
    client.migrate()
    client.publish("orders", b"x")
    client.flush_stats()  # the counters written now, not at some later call
    before = _rows(engine)

    client.downgrade(to="0008")
    assert _recorded(engine) is None
    assert _rows(engine) == before
    with engine.connect() as conn:
        assert _migrate.current(conn) == "0008"  # from novaque_alembic_version
    with pytest.raises(
        novaque.SchemaOutOfDate,
        match=rf"at revision '0008' \(recorded in {schema.VERSION_TABLE}\), this version of "
        rf"novaque needs '{_migrate.head()}': run `novaque migrate`",
    ):
        novaque.Client(engine).list_topics()
    client.migrate()
    assert _recorded(engine) == [_migrate.head()]
    assert _rows(engine) == before


def test_every_migration_from_0009_on_records_its_revision(
    backend: Backend, tmp_path: Path
) -> None:
    """Up one revision at a time to the head, then down to 0008: after each
    step novaque_schema holds exactly the revision the database is at."""
    client = novaque.Client(backend.engine(backend.scratch_url(tmp_path)))
    order = _order()
    since = order.index(_migrate.REVISION_TABLE_SINCE)
    client.migrate(to=order[since - 1])
    for revision in order[since:]:
        client.migrate(to=revision)
        assert _recorded(client.engine) == [revision], revision
    for revision in reversed(order[since - 1 : -1]):
        client.downgrade(to=revision)
        expected = None if revision == order[since - 1] else [revision]
        assert _recorded(client.engine) == expected, revision
