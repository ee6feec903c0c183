"""A publish racing the delete of its topic or channel leaves no orphan row
(migration 0006: on PostgreSQL no foreign key checks these, novaque's own
locks do; MySQL/MariaDB and SQLite keep their foreign keys)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
from novaque.ops import browse, topology
from novaque.schema import channels, deliveries, messages, topics
from novaque.testing import FakeClock
from tests._races import race
from tests.conftest import Backend


def foreign_keys(engine: sa.Engine, table: str) -> set[str]:
    return {fk["constrained_columns"][0] for fk in sa.inspect(engine).get_foreign_keys(table)}


def test_postgres_alone_has_no_foreign_keys_on_the_hot_tables(
    backend: Backend, tmp_path: Path
) -> None:
    url = backend.scratch_url(tmp_path)
    client = novaque.Client(backend.engine(url))
    client.migrate()
    engine = backend.engine(url)
    engine_checked = backend.name != "postgres"
    assert foreign_keys(engine, "novaque_messages") == ({"topic_id"} if engine_checked else set())
    assert foreign_keys(engine, "novaque_deliveries") == (
        {"message_id", "channel_id"} if engine_checked else set()
    )
    client.downgrade("0005")
    engine.dispose()
    assert foreign_keys(engine, "novaque_messages") == {"topic_id"}
    assert foreign_keys(engine, "novaque_deliveries") == {"message_id", "channel_id"}


def orphans(engine: sa.Engine) -> tuple[int, int, int]:
    """Deliveries whose channel is gone, messages whose topic is gone, and
    deliveries whose message is gone."""
    with engine.connect() as conn:
        lost_messages_deliveries = conn.execute(
            sa.select(sa.func.count())
            .select_from(deliveries.outerjoin(messages, messages.c.id == deliveries.c.message_id))
            .where(messages.c.id.is_(None))
        ).scalar_one()
        lost_deliveries = conn.execute(
            sa.select(sa.func.count())
            .select_from(deliveries.outerjoin(channels, channels.c.id == deliveries.c.channel_id))
            .where(channels.c.id.is_(None))
        ).scalar_one()
        lost_messages = conn.execute(
            sa.select(sa.func.count())
            .select_from(messages.outerjoin(topics, topics.c.id == messages.c.topic_id))
            .where(topics.c.id.is_(None))
        ).scalar_one()
    return int(lost_deliveries), int(lost_messages), int(lost_messages_deliveries)


@pytest.mark.parametrize("with_key", [False, True], ids=["plain", "dedup-key"])
def test_a_publish_waiting_for_delete_channel_writes_nothing_to_the_deleted_channel(
    backend: Backend, clock: FakeClock, with_key: bool
) -> None:
    client = backend.client(clock=clock)
    client.ensure_channel("race-c", "gone")
    client.ensure_channel("race-c", "kept")
    client.publish("race-c", b"warm")  # the topic id is cached
    key = "late-1" if with_key else None

    def delete(conn: sa.Connection) -> None:
        client._context.dialect.begin_transaction(conn)
        topology.delete_channel(conn, client._context.dialect, "race-c", "gone")

    [message_id] = race(backend, delete, lambda: client.publish("race-c", b"late", dedup_key=key))
    assert isinstance(message_id, int)
    assert [d.channel for d in client.get_message(message_id).deliveries] == ["kept"]
    assert client.list_channels("race-c") == ["kept"]
    assert orphans(backend.engine()) == (0, 0, 0)
    client.delete_topic("race-c")


def test_a_publish_waiting_for_delete_topic_lands_in_the_topic_created_again(
    backend: Backend, clock: FakeClock
) -> None:
    client = backend.client(clock=clock)
    client.ensure_channel("race-t", "c")
    client.publish("race-t", b"warm")  # the topic id is cached

    def delete(conn: sa.Connection) -> None:
        client._context.dialect.begin_transaction(conn)
        topology.delete_topic(conn, client._context.dialect, "race-t")

    [message_id] = race(backend, delete, lambda: client.publish("race-t", b"late"))
    assert isinstance(message_id, int)
    message = client.get_message(message_id)
    assert (message.topic, message.deliveries) == ("race-t", [])  # no channel any more
    assert orphans(backend.engine()) == (0, 0, 0)
    client.delete_topic("race-t")


@pytest.mark.parametrize("deleted", ["topic", "channel"])
def test_a_delete_waiting_for_a_publish_deletes_what_it_wrote(
    backend: Backend, clock: FakeClock, deleted: str
) -> None:
    client = backend.client(clock=clock)
    client.ensure_channel("race-p", "c")
    client.ensure_channel("race-p", "other")
    written: list[int] = []

    def publish(conn: sa.Connection) -> None:
        written.append(client.publish("race-p", b"first", connection=conn))

    def delete() -> None:
        if deleted == "topic":
            client.delete_topic("race-p")
        else:
            client.delete_channel("race-p", "c")

    assert race(backend, publish, delete) == [None]
    assert orphans(backend.engine()) == (0, 0, 0)
    if deleted == "topic":
        assert "race-p" not in client.list_topics()
        with pytest.raises(novaque.MessageNotFound):
            client.get_message(written[0])
    else:
        assert [d.channel for d in client.get_message(written[0]).deliveries] == ["other"]
        client.delete_topic("race-p")


@pytest.mark.parametrize("first", ["delete", "move"])
def test_dead_letters_moved_to_a_channel_being_deleted_leave_no_orphan(
    backend: Backend, clock: FakeClock, first: str
) -> None:
    client = backend.client(clock=clock)
    client.ensure_channel("race-r", "source")
    client.publish("race-r", b"letter")
    [msg] = client.claim("race-r", "source")
    client.reject(msg, "for the move")
    client.ensure_channel("race-r", "target")  # created after: it holds no delivery of it

    def move() -> int:
        return client.requeue_dead("race-r", "source", to_channel="target")

    if first == "delete":

        def delete(conn: sa.Connection) -> None:
            client._context.dialect.begin_transaction(conn)
            topology.delete_channel(conn, client._context.dialect, "race-r", "target")

        [outcome] = race(backend, delete, move)
        assert isinstance(outcome, novaque.ChannelNotFound)
        assert [d.state for d in client.get_message(msg.id).deliveries] == ["dead"]
    else:

        def held_move(conn: sa.Connection) -> None:
            # The move in a transaction held open: a delete of its target
            # waits for it, then deletes the moved letter with the channel.
            dialect = client._context.dialect
            dialect.begin_transaction(conn)
            source, target = browse.dead_channels(conn, dialect, "race-r", "source", "target")
            work = browse.DeadWork("requeue", "race-r", source, 60_000_000, target_id=target)
            got = browse.dead_batch(conn, dialect, client._context.now(), work, None, 0, 100)
            assert got[1] == 1, got

        assert race(backend, held_move, lambda: client.delete_channel("race-r", "target")) == [None]
        assert client.get_message(msg.id).deliveries == []
    assert orphans(backend.engine()) == (0, 0, 0)
    client.delete_topic("race-r")


@pytest.mark.parametrize("first", ["replay", "prune"])
def test_a_replay_racing_prune_leaves_no_delivery_without_its_message(
    backend: Backend, clock: FakeClock, first: str
) -> None:
    client = backend.client(clock=clock)
    dialect = client._context.dialect
    client.ensure_channel("race-m", "c")
    message_id = client.publish("race-m", b"old")
    client.ack(client.claim("race-m", "c")[0])  # no live delivery: a replay writes one
    clock.advance(60)
    cutoff = clock()

    def held_replay(conn: sa.Connection) -> None:
        dialect.begin_transaction(conn)
        assert (
            browse.replay(conn, dialect, client._context.now(), message_id, None, 60_000_000)[0]
            == 1
        )

    def held_prune(conn: sa.Connection) -> None:
        dialect.begin_transaction(conn)
        topic_id = topology.existing_topic_id(conn, "race-m")
        cutoff_us = client._context.now()
        assert browse.prune_batch(conn, dialect, cutoff_us, topic_id, cutoff_us, 100)[1] == 1

    if first == "replay":  # the prune waits, then deletes the replayed delivery too
        [pruned] = race(backend, held_replay, lambda: client.prune(cutoff))
        assert pruned >= 1
    else:  # the replay waits, then finds its message gone
        [outcome] = race(backend, held_prune, lambda: client.replay(message_id))
        assert isinstance(outcome, novaque.MessageNotFound)
    with pytest.raises(novaque.MessageNotFound):
        client.get_message(message_id)
    assert orphans(backend.engine()) == (0, 0, 0)
    client.delete_topic("race-m")
