"""Publishing: fan-out, late channels, bodies, transactional publish."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import novaque
from tests.conftest import Backend

pytestmark = [pytest.mark.usefixtures("twin"), pytest.mark.pooled]


def drain(client: novaque.Client, topic: str, channel: str) -> list[novaque.Message]:
    got: list[novaque.Message] = []
    while batch := client.claim(topic, channel, max_messages=100):
        got.extend(batch)
        client.ack_many(batch)
    return got


def test_fan_out_gives_every_channel_its_own_copy(client: novaque.Client) -> None:
    for channel in ("a", "b", "c"):
        client.ensure_channel("events", channel)
    ids = [client.publish("events", f"m{i}") for i in range(5)]
    for channel in ("a", "b", "c"):
        got = drain(client, "events", channel)
        assert [m.id for m in got] == ids
        assert [m.body for m in got] == [f"m{i}".encode() for i in range(5)]
        assert {m.channel for m in got} == {channel}


def test_late_channel_does_not_see_earlier_messages(client: novaque.Client) -> None:
    client.ensure_channel("events", "early")
    first = client.publish("events", b"before")
    client.ensure_channel("events", "late")
    second = client.publish("events", b"after")
    assert [m.id for m in drain(client, "events", "early")] == [first, second]
    assert [m.id for m in drain(client, "events", "late")] == [second]


def test_publish_to_a_topic_without_channels_keeps_the_message(client: novaque.Client) -> None:
    message_id = client.publish("lonely", b"x")
    assert client.list_topics() == ["lonely"]
    assert client.list_channels("lonely") == []
    assert message_id > 0


def test_bodies_are_byte_exact(client: novaque.Client) -> None:
    client.ensure_channel("bin", "c")
    limit = client.options.max_body_bytes
    bodies = [b"", os.urandom(1000), bytes(range(256)) * 4, os.urandom(limit), "héllo ✓"]
    ids = [client.publish("bin", body) for body in bodies]
    # One batch too (MariaDB sends its bodies and group keys as hex literals).
    groups = ["ünï ✓", None, "a'\\", "b"]
    ids += client.publish_many("bin", [*bodies[:-2], bodies[-1]], groups=groups)
    got = drain(client, "bin", "c")
    assert [m.id for m in got] == ids
    exact = [b if isinstance(b, bytes) else b.encode() for b in bodies]
    assert [m.body for m in got] == [*exact, *exact[:-2], exact[-1]]
    assert [m.group for m in got[len(bodies) :]] == groups


def test_publish_many_returns_ids_in_order_and_fans_out(client: novaque.Client) -> None:
    client.ensure_channel("bulk", "x")
    client.ensure_channel("bulk", "y")
    bodies = [f"b{i}".encode() for i in range(250)]
    ids = client.publish_many("bulk", bodies, headers={"kind": "test"})
    assert len(ids) == 250
    assert ids == sorted(ids)
    assert len(set(ids)) == 250
    for channel in ("x", "y"):
        got = drain(client, "bulk", channel)
        assert [(m.id, m.body) for m in got] == list(zip(ids, bodies, strict=True))
        assert all(m.headers == {"kind": "test"} for m in got)
    assert client.publish_many("bulk", []) == []


def test_headers_round_trip_and_default_to_empty(client: novaque.Client) -> None:
    client.ensure_channel("h", "c")
    client.publish("h", b"1", headers={"trace": "abc", "ünï": "✓"})
    client.publish("h", b"2")
    first, second = drain(client, "h", "c")
    assert first.headers == {"trace": "abc", "ünï": "✓"}
    assert second.headers == {}


@pytest.mark.sync_only
def test_transactional_publish_with_connection(backend: Backend, client: novaque.Client) -> None:
    client.ensure_channel("orders", "mailer")
    engine = backend.engine()
    with engine.connect() as conn:
        with conn.begin():
            client.publish("orders", b"rolled back", connection=conn)
            conn.rollback()
        with conn.begin():
            kept = client.publish("orders", b"committed", connection=conn)
    got = drain(client, "orders", "mailer")
    assert [(m.id, m.body) for m in got] == [(kept, b"committed")]


@pytest.mark.sync_only
def test_transactional_publish_with_orm_session(backend: Backend, client: novaque.Client) -> None:
    client.ensure_channel("orders", "mailer")
    engine = backend.engine()
    with Session(engine) as session:
        client.publish("orders", b"nope", session=session)
        session.rollback()
        kept = client.publish("orders", b"yes", session=session)
        client.publish_many("orders", [b"yes too"], session=session)
        session.commit()
    got = drain(client, "orders", "mailer")
    assert [m.body for m in got] == [b"yes", b"yes too"]
    assert got[0].id == kept


@pytest.mark.sync_only
def test_transactional_publish_commits_with_the_applications_own_rows(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("orders", "mailer")
    engine = backend.engine()
    app = sa.MetaData()
    orders = sa.Table("app_orders", app, sa.Column("id", sa.Integer, primary_key=True))
    app.create_all(engine)
    try:
        with engine.begin() as conn:
            conn.execute(orders.insert().values(id=1))
            client.publish("orders", b"order 1 saved", connection=conn)

        def failing_order() -> None:
            with engine.begin() as conn:
                conn.execute(orders.insert().values(id=2))
                client.publish("orders", b"order 2 saved", connection=conn)
                raise RuntimeError("the application fails after publishing")

        with pytest.raises(RuntimeError):
            failing_order()
        with engine.connect() as conn:
            assert conn.execute(sa.select(orders.c.id)).scalars().all() == [1]
        assert [m.body for m in drain(client, "orders", "mailer")] == [b"order 1 saved"]
    finally:
        app.drop_all(engine)


@pytest.mark.sync_only
def test_publish_rejects_connection_and_session_together(
    backend: Backend, client: novaque.Client
) -> None:
    engine = backend.engine()
    with (
        engine.connect() as conn,
        Session(engine) as session,
        pytest.raises(novaque.InvalidOption, match="either connection or session"),
    ):
        client.publish("t", b"x", connection=conn, session=session)


def test_publish_many_sends_large_batches_in_bounded_statements(client: novaque.Client) -> None:
    client.ensure_channel("big", "c")
    bodies = [bytes([i]) * client.options.max_body_bytes for i in range(20)]  # 20 MiB
    ids = client.publish_many("big", bodies)
    got = drain(client, "big", "c")
    assert [m.id for m in got] == ids
    assert [m.body for m in got] == bodies


def test_cursor_events_of_novaques_engine_see_every_publish(backend: Backend) -> None:
    # The one-message publish runs on the driver's connection, without
    # SQLAlchemy's statement machinery, unless something watches the engine's
    # statements (here a before_cursor_execute listener, as SQLAlchemy
    # instrumentations add): then it takes SQLAlchemy's path, and is seen.
    client = novaque.Client(backend.engine())
    client.ensure_channel("watched", "c")
    client.publish("watched", b"first")  # the topic id is cached
    seen: list[str] = []

    def watch(conn: object, cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    sa.event.listen(client.own_engine, "before_cursor_execute", watch)
    try:
        client.publish("watched", b"second")
    finally:
        sa.event.remove(client.own_engine, "before_cursor_execute", watch)
    assert any("INSERT INTO novaque_messages" in s for s in seen), seen
    client.publish("watched", b"third")  # unwatched again
    assert client.channel_backlog("watched", "c").ready == 3
    client.shutdown()


@pytest.mark.sync_only
def test_the_driver_path_gives_its_connection_back_without_another_rollback(
    backend: Backend,
) -> None:
    # A one-message publish commits (or rolls back) its own transaction on
    # the driver's connection: the pool is told so and sends no ROLLBACK of
    # its own on return (on PyMySQL a round trip per publish).
    client = novaque.Client(backend.engine())
    client.ensure_channel("pooled", "c")
    client.publish("pooled", b"first")  # the topic id is cached
    resets: list[bool] = []

    def reset(dbapi: object, record: object, state: sa.engine.PoolResetState) -> None:
        resets.append(state.transaction_was_reset)

    sa.event.listen(client.own_engine, "reset", reset)
    try:
        client.publish("pooled", b"second")
    finally:
        sa.event.remove(client.own_engine, "reset", reset)
    assert resets == [True]
    assert client.channel_backlog("pooled", "c").ready == 2
    client.shutdown()


@pytest.mark.sync_only
def test_a_publish_counts_every_channel_whatever_the_session_cuts_group_concat_at(
    backend: Backend,
) -> None:
    # MariaDB's one-message publish returns the channels it went to joined in
    # one string: an application's short group_concat_max_len must not cut it
    # (each channel's published counter and wake-up depend on it). Elsewhere
    # the same publish, with its own SQL.
    engine = backend.engine()
    if backend.name == "mysql":
        sa.event.listen(
            engine,
            "connect",
            lambda dbapi, record: dbapi.cursor().execute("SET SESSION group_concat_max_len = 4"),
        )
    client = novaque.Client(engine, novaque.Options(stats_flush_interval=3600))
    names = [f"channel-{i}" for i in range(12)]
    for name in names:
        client.ensure_channel("joined", name)
    client.publish("joined", b"first")  # the topic id is cached: the driver path next
    client.publish("joined", b"second")
    client.flush_stats()
    counters = {name: client.channel_counters("joined", name).published for name in names}
    assert counters == dict.fromkeys(names, 2)
    client.shutdown()


def test_a_topic_seen_before_follows_its_channels_changed_elsewhere(
    backend: Backend, client: novaque.Client
) -> None:
    # The publisher knows the topic from its earlier publishes (its id, and on
    # MariaDB the plan its deliveries are written from); another client adds
    # a channel, changes one's max_attempts, deletes one: each next publish
    # reaches exactly the channels there are, with their settings.
    client.ensure_channel("followed", "a")
    client.publish("followed", b"1")
    client.publish("followed", b"2")
    other = backend.client()
    other.ensure_channel("followed", "b")
    client.publish("followed", b"3")
    assert client.channel_backlog("followed", "a").ready == 3
    assert client.channel_backlog("followed", "b").ready == 1
    other.ensure_channel("followed", "b", max_attempts=2)
    client.publish("followed", b"4")
    client.publish("followed", b"5")
    got = client.claim("followed", "b", max_messages=10)
    assert [(m.body, m.max_attempts) for m in got] == [
        (b"3", client.options.default_max_attempts),
        (b"4", 2),
        (b"5", 2),
    ]
    other.delete_channel("followed", "a")
    client.publish("followed", b"6")
    client.publish("followed", b"7")
    assert client.list_channels("followed") == ["b"]
    assert client.channel_backlog("followed", "b").ready == 2
    other.delete_channel("followed", "b")
    client.publish("followed", b"8")  # no channel left: kept, delivered to nobody
    other.ensure_channel("followed", "c")
    client.publish("followed", b"9")
    assert [m.body for m in client.claim("followed", "c", max_messages=10)] == [b"9"]


def test_a_topic_that_gains_a_filtered_channel_after_its_id_was_cached(
    backend: Backend, client: novaque.Client
) -> None:
    # The publisher saw the topic plain (its id cached, one statement or the
    # driver path); another client adds a filtered and an ordered channel:
    # the next publish finds them, writes nothing on the fast path, and
    # publishes again in a transaction that writes their deliveries.
    client.ensure_channel("gains", "plain")
    client.publish("gains", b"before")
    other = backend.client()
    other.ensure_channel("gains", "gold", filter="headers.tier == 'gold'")
    other.ensure_channel("gains", "fifo", ordering="group_fifo")
    gold = client.publish("gains", b"gold", headers={"tier": "gold"}, group=None)
    silver = client.publish("gains", b"silver", headers={"tier": "silver"})
    assert [d.channel for d in client.get_message(gold).deliveries] == ["fifo", "gold", "plain"]
    assert [d.channel for d in client.get_message(silver).deliveries] == ["fifo", "plain"]
    assert client.channel_backlog("gains", "plain").ready == 3
