"""Migration 0005: a 0004 database with live messages, leases, dead and deferred
letters, ordered groups and daily counters keeps every row; the minute counters
and the consumers start empty; downgrade drops them and keeps the rest."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

import novaque
from novaque import Counters, _migrate
from tests import _migration_rows
from tests.conftest import Backend, FakeClock
from tests.test_migration_0003 import _fill_0002, _leased
from tests.test_migration_0004 import _fill_0003

OLD_TABLES = (
    "novaque_topics",
    "novaque_channels",
    "novaque_messages",
    "novaque_deliveries",
    "novaque_groups",
    "novaque_stats",
)


def _fill_0004(engine: sa.Engine, now_us: int) -> None:
    """0004's own rows: a deferred delivery, a lease held under an attempt id, a
    channel with the §9 settings, and a day of counters."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO novaque_channels (id, topic_id, name, created_at, dead_max_bytes, "
                "dead_letter_expired) VALUES (5, 1, 'later', 1, 1000, :yes)"
            ),
            {"yes": True},
        )
        conn.execute(
            sa.text(
                "INSERT INTO novaque_deliveries (id, message_id, channel_id, state, visible_at, "
                "attempts, max_attempts, lease_token, attempt_id) VALUES "
                "(105, 10, 5, 3, :deferred, 1, 5, NULL, NULL)"
            ),
            {"deferred": 2**62 - 1},
        )
        conn.execute(sa.text("UPDATE novaque_deliveries SET attempt_id = 'try-1' WHERE id = 102"))
        conn.execute(
            sa.text(
                "INSERT INTO novaque_stats (channel_id, day, published, claimed, acked, "
                "requeued, dead, purged) VALUES (1, :day, 3, 2, 1, 0, 0, 0)"
            ),
            {"day": "2026-11-30"},
        )


def _rows(engine: sa.Engine) -> dict[str, list[tuple[object, ...]]]:
    return _migration_rows.rows(engine, OLD_TABLES)


def _consumers(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM novaque_consumers")).scalar_one())


def _migrated_0004(backend: Backend, tmp_path: Path) -> tuple[sa.Engine, novaque.Client, int]:
    url = backend.scratch_url(tmp_path)
    engine = backend.engine(url)
    clock = FakeClock()
    client = novaque.Client(engine, novaque.Options(clock=clock))
    client.migrate(to="0002")
    now_us = int(clock().timestamp() * 1_000_000)
    _fill_0002(engine, now_us)
    client.migrate(to="0003")
    _fill_0003(engine, now_us)
    client.migrate(to="0004")
    _fill_0004(engine, now_us)
    return engine, client, now_us


def test_upgrading_a_0004_database_with_live_data_keeps_every_row(
    backend: Backend, tmp_path: Path
) -> None:
    engine, client, _ = _migrated_0004(backend, tmp_path)
    before = _rows(engine)

    client.migrate()
    with engine.connect() as conn:
        assert _migrate.current(conn) == _migrate.head()
    assert _rows(engine) == before
    assert _consumers(engine) == 0
    assert client.minute_counters("orders", "billing") == []
    [day] = client.daily_counters("orders", "billing")
    assert day[1] == Counters(published=3, claimed=2, acked=1)
    assert _leased(engine) == (102, "tok", 1)
    [dead] = client.list_dead("orders", "audit")
    assert (dead.delivery_id, dead.last_error) == (101, "boom")
    [first] = client.claim("orders", "fifo", max_messages=5)
    assert first.body == b"a1"
    client.ack(first)
    client.flush_stats()
    [(_, counters)] = client.minute_counters("orders", "fifo")
    assert counters == Counters(claimed=1, acked=1)


def test_downgrading_0005_drops_the_new_tables_and_keeps_the_rest(
    backend: Backend, tmp_path: Path
) -> None:
    engine, client, _ = _migrated_0004(backend, tmp_path)
    client.migrate()
    client.ensure_channel("orders", "billing")
    consumer = client.subscribe("orders", "live", lambda msg: None)
    consumer.start()
    client.publish("orders", b"x")
    client.flush_stats()
    consumer.shutdown()
    with engine.begin() as conn:  # a consumer that died without removing its row
        conn.execute(
            sa.text(
                "INSERT INTO novaque_consumers (host, pid, topic, channel, max_in_flight, "
                "in_flight, started_at, heartbeat_at) VALUES ('h', 1, 'orders', 'live', 1, 0, 1, 1)"
            )
        )
    before = _rows(engine)

    client.downgrade(to="0004")
    tables = set(sa.inspect(engine).get_table_names())
    assert not {"novaque_minute_stats", "novaque_consumers"} & tables
    assert _rows(engine) == before
    client.migrate()
    assert _consumers(engine) == 0
    assert client.minute_counters("orders", "billing") == []
    assert [c.published for _, c in client.daily_counters("orders", "billing")] == [3, 1]
