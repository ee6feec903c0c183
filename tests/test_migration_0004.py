"""Migration 0004: a 0003 database with live messages, leases, dead letters and
ordered groups keeps every row; the new settings start at the client's
defaults; downgrade makes deferred deliveries ready and keeps the rest."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

import novaque
from novaque import _migrate
from tests.conftest import Backend, FakeClock
from tests.test_migration_0003 import _fill_0002, _leased


def _fill_0003(engine: sa.Engine, now_us: int) -> None:
    """0003's own rows: a group_fifo channel with a group's head and a delivery
    parked behind it."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO novaque_channels (id, topic_id, name, created_at, ordering) "
                "VALUES (4, 1, 'fifo', 1, 1)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO novaque_messages (id, topic_id, body, published_at, expires_at, "
                "max_attempts, group_key) VALUES (11, 1, :a1, :now, :later, 5, 'a'), "
                "(12, 1, :a2, :now, :later, 5, 'a')"
            ),
            {"a1": b"a1", "a2": b"a2", "now": now_us, "later": now_us + 10**12},
        )
        conn.execute(
            sa.text(
                "INSERT INTO novaque_deliveries (id, message_id, channel_id, state, visible_at, "
                "attempts, max_attempts, group_key) VALUES (103, 11, 4, 0, :now, 0, 5, 'a'), "
                "(104, 12, 4, 0, :parked, 0, 5, 'a')"
            ),
            {"now": now_us, "parked": now_us + 2**61},
        )
        conn.execute(
            sa.text(
                "INSERT INTO novaque_groups (channel_id, group_key, head_id) VALUES (4, 'a', 103)"
            )
        )


def test_upgrading_a_0003_database_with_live_data_keeps_every_row(
    backend: Backend, tmp_path: Path
) -> None:
    url = backend.scratch_url(tmp_path)
    engine = backend.engine(url)
    clock = FakeClock()
    client = novaque.Client(engine, novaque.Options(clock=clock))
    client.migrate(to="0002")
    now_us = int(clock().timestamp() * 1_000_000)
    _fill_0002(engine, now_us)
    client.migrate(to="0003")
    _fill_0003(engine, now_us)

    client.migrate()
    with engine.connect() as conn:
        assert _migrate.current(conn) == _migrate.head()
    got = client.channel_settings("orders", "audit")
    assert (got.dead_max_count, got.dead_max_bytes, got.dead_letter_expired) == (7, None, None)
    [dead] = client.list_dead("orders", "audit")
    assert (dead.delivery_id, dead.last_error) == (101, "boom")
    assert _leased(engine) == (102, "tok", 1)
    clock.advance(31)
    [again] = client.claim("orders", "ship")
    assert (again.delivery_id, again.attempts) == (102, 2)
    [first] = client.claim("orders", "fifo", max_messages=5)
    assert first.body == b"a1"
    assert client.claim("orders", "fifo") == []  # a2 still waits behind its head
    client.ack(first)
    assert [m.body for m in client.claim("orders", "fifo")] == [b"a2"]
    assert client.publish("orders", b"\x00payload", dedup_key="order-1") == 10


def test_downgrading_0004_makes_deferred_deliveries_ready(backend: Backend, tmp_path: Path) -> None:
    url = backend.scratch_url(tmp_path)
    client = novaque.Client(backend.engine(url))
    client.migrate()
    client.ensure_channel("orders", "billing", dead_max_bytes=10, dead_letter_expired=True)
    message_id = client.publish("orders", b"x")
    with client.engine.begin() as conn:  # as defer() leaves a delivery
        conn.execute(
            sa.text("UPDATE novaque_deliveries SET state = 3, visible_at = :v, attempts = 1"),
            {"v": 2**62 - 1},
        )
    assert client.claim("orders", "billing") == []
    client.downgrade(to="0003")
    client.migrate()
    [msg] = client.claim("orders", "billing")
    assert (msg.id, msg.attempts) == (message_id, 2)
    got = client.channel_settings("orders", "billing")
    assert (got.dead_max_bytes, got.dead_letter_expired) == (None, None)
