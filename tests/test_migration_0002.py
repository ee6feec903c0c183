"""Migration 0002: a 0001 database with live data keeps every row; ids are never
reused afterwards; dedup keys compare exactly."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

import novaque
from novaque import _migrate
from novaque.testing import FakeClock
from tests.conftest import Backend


def _fill_0001(engine: sa.Engine, now_us: int) -> None:
    """Rows as novaque 0.1 wrote them: a live message, a leased and a dead delivery."""
    with engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO novaque_topics (id, name, created_at) VALUES (1, 'orders', 1)")
        )
        conn.execute(
            sa.text(
                "INSERT INTO novaque_channels (id, topic_id, name, created_at, dead_max_count) "
                "VALUES (1, 1, 'billing', 1, NULL), (2, 1, 'audit', 1, 7)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO novaque_messages (id, topic_id, body, published_at, expires_at, "
                "max_attempts, dedup_key) VALUES (10, 1, :body, :now, :later, 5, 'order-1')"
            ),
            {"body": b"\x00payload", "now": now_us, "later": now_us + 10**12},
        )
        conn.execute(
            sa.text(
                "INSERT INTO novaque_deliveries (id, message_id, channel_id, state, visible_at, "
                "attempts, max_attempts, lease_token, last_error, dead_reason, died_at) VALUES "
                "(100, 10, 1, 0, :now, 0, 5, NULL, NULL, NULL, NULL), "
                "(101, 10, 2, 2, :dead, 5, 5, NULL, 'boom', 'max_attempts', :now)"
            ),
            {"now": now_us, "dead": 2**62},
        )


def test_upgrading_a_0001_database_with_live_data_keeps_every_row(
    backend: Backend, tmp_path: Path
) -> None:
    url = backend.scratch_url(tmp_path)
    engine = backend.engine(url)
    clock = FakeClock()
    client = novaque.Client(engine, novaque.Options(clock=clock))
    client.migrate(to="0001")
    now_us = int(clock().timestamp() * 1_000_000)
    _fill_0001(engine, now_us)

    client.migrate()
    with engine.connect() as conn:
        assert _migrate.current(conn) == _migrate.head()

    assert client.list_topics() == ["orders"]
    assert sorted(client.list_channels("orders")) == ["audit", "billing"]
    [dead] = client.list_dead("orders", "audit")
    assert (dead.delivery_id, dead.message_id, dead.last_error) == (101, 10, "boom")
    [msg] = client.claim("orders", "billing")
    assert (msg.id, msg.delivery_id, msg.body) == (10, 100, b"\x00payload")
    client.ack(msg)
    # The dedup key written before the migration still holds its message.
    assert client.publish("orders", b"\x00payload", dedup_key="order-1") == 10


def _only_ids(engine: sa.Engine) -> tuple[int, int]:
    """The (topic id, channel id) of the database's one channel."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT t.id, c.id FROM novaque_topics t JOIN novaque_channels c "
                "ON c.topic_id = t.id"
            )
        ).one()
    return int(row[0]), int(row[1])


def test_topic_and_channel_ids_are_never_reused(backend: Backend, tmp_path: Path) -> None:
    client = novaque.Client(backend.engine(backend.scratch_url(tmp_path)))
    client.migrate()
    client.ensure_channel("orders", "billing")
    first = _only_ids(client.engine)
    client.delete_topic("orders")
    client.ensure_channel("payroll", "salaries")
    second = _only_ids(client.engine)
    assert second[0] > first[0]
    assert second[1] > first[1]


def test_downgrading_0002_keeps_the_rows(backend: Backend, tmp_path: Path) -> None:
    url = backend.scratch_url(tmp_path)
    client = novaque.Client(backend.engine(url))
    client.migrate()
    client.ensure_channel("orders", "billing")
    message_id = client.publish("orders", b"x", dedup_key="k")
    client.downgrade(to="0001")
    client.migrate()
    [msg] = client.claim("orders", "billing")
    assert msg.id == message_id
    assert client.publish("orders", b"x", dedup_key="k") == message_id
