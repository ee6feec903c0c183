"""Migration 0003: a 0002 database with live messages, leases and dead letters
keeps every row; the new channel settings start at their defaults; downgrade
keeps the rows too."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

import novaque
from novaque import _migrate
from tests.conftest import Backend, FakeClock
from tests.test_migration_0002 import _fill_0001


def _fill_0002(engine: sa.Engine, now_us: int) -> None:
    """Rows as novaque 0.2 wrote them: 0.1's ready and dead deliveries, and a
    leased one in a third channel."""
    _fill_0001(engine, now_us)  # the same columns on 0002
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO novaque_channels (id, topic_id, name, created_at) "
                "VALUES (3, 1, 'ship', 1)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO novaque_deliveries (id, message_id, channel_id, state, visible_at, "
                "attempts, max_attempts, lease_token) VALUES (102, 10, 3, 1, :until, 1, 5, 'tok')"
            ),
            {"until": now_us + 30_000_000},
        )


def _leased(engine: sa.Engine) -> tuple[int, str, int]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT id, lease_token, attempts FROM novaque_deliveries WHERE channel_id = 3")
        ).one()
    return int(row[0]), str(row[1]), int(row[2])


def _settings(engine: sa.Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT id, ordering, filter_expr, paused, lease, max_attempts, dead_max_count "
                "FROM novaque_channels ORDER BY id"
            )
        ).all()
    return [(r[0], r[1], r[2], bool(r[3]), *r[4:]) for r in rows]


def test_upgrading_a_0002_database_with_live_data_keeps_every_row(
    backend: Backend, tmp_path: Path
) -> None:
    url = backend.scratch_url(tmp_path)
    engine = backend.engine(url)
    clock = FakeClock()
    client = novaque.Client(engine, novaque.Options(clock=clock))
    client.migrate(to="0002")
    now_us = int(clock().timestamp() * 1_000_000)
    _fill_0002(engine, now_us)

    client.migrate()
    with engine.connect() as conn:
        assert _migrate.current(conn) == _migrate.head()

    assert sorted(client.list_channels("orders")) == ["audit", "billing", "ship"]
    assert _settings(engine) == [
        (1, 0, None, False, None, None, None),
        (2, 0, None, False, None, None, 7),
        (3, 0, None, False, None, None, None),
    ]
    [dead] = client.list_dead("orders", "audit")
    assert (dead.delivery_id, dead.message_id, dead.last_error) == (101, 10, "boom")
    # The lease taken before the migration still holds, and ends as it would have.
    assert _leased(engine) == (102, "tok", 1)
    assert client.claim("orders", "ship") == []
    clock.advance(31)
    [again] = client.claim("orders", "ship")
    assert (again.delivery_id, again.attempts) == (102, 2)
    [msg] = client.claim("orders", "billing")
    assert (msg.id, msg.delivery_id, msg.body) == (10, 100, b"\x00payload")
    client.ack(msg)
    assert client.publish("orders", b"\x00payload", dedup_key="order-1") == 10


def test_downgrading_0003_keeps_the_rows(backend: Backend, tmp_path: Path) -> None:
    url = backend.scratch_url(tmp_path)
    client = novaque.Client(backend.engine(url))
    client.migrate()
    client.ensure_channel("orders", "billing")
    with client.engine.begin() as conn:
        conn.execute(sa.text("UPDATE novaque_channels SET max_attempts = 3, paused = true"))
    message_id = client.publish("orders", b"x", dedup_key="k")
    client.downgrade(to="0002")
    client.migrate()
    [msg] = client.claim("orders", "billing")
    assert msg.id == message_id
    assert _settings(client.engine) == [(1, 0, None, False, None, None, None)]
    assert client.publish("orders", b"x", dedup_key="k") == message_id


def test_downgrading_0003_lets_waiting_deliveries_go(backend: Backend, tmp_path: Path) -> None:
    """Deliveries parked behind their group's head become due again on 0002."""
    url = backend.scratch_url(tmp_path)
    client = novaque.Client(backend.engine(url))
    client.migrate()
    client.ensure_channel("orders", "billing", ordering="group_fifo")
    client.publish_many("orders", [b"1", b"2", b"3"], groups=["g", "g", "g"])
    assert client.channel_settings("orders", "billing").ordering == "group_fifo"
    client.downgrade(to="0002")
    with client.engine.connect() as conn:
        visible = conn.execute(sa.text("SELECT max(visible_at) FROM novaque_deliveries")).scalar()
    assert visible is not None
    assert visible < 2**61
    client.migrate()
    assert [m.body for m in client.claim("orders", "billing", max_messages=5)] == [
        b"1",
        b"2",
        b"3",
    ]
