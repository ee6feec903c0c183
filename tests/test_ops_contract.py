"""The operations contract: each operation of ``novaque.ops`` called directly,
on a plain connection of each backend, with the time passed in.

What the clients (and, later, the asyncio twin) rely on: an operation returns
its result and its effects as data (counter deltas, topics to wake, topic ids
learned) and leaves the rest to its caller; it reads no clock and touches no
client state.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque import dialects
from novaque._stats import StatsBuffer
from novaque._time import US
from novaque.dialects.params import ClaimParams
from novaque.ops import Effects, consume, maintain, topology
from novaque.ops import publish as publish_op
from novaque.schema import deliveries

LEASE_US = 30 * US


@pytest.fixture
def db(client: novaque.Client) -> tuple[sa.Engine, dialects.Dialect, int]:
    """novaque's engine, the dialect and a fixed time, with the schema checked."""
    client.list_topics()
    return client.own_engine, client._context.dialect, client._context.now()


def counts(effects: Effects) -> dict[tuple[str, int], int]:
    """The counter deltas of ``effects`` as {(counter, channel id): n}."""
    buffer = StatsBuffer()
    effects.tally.apply(buffer)
    names = ("published", "claimed", "acked", "requeued", "dead", "purged")
    return {
        (names[i], channel_id): n
        for (channel_id, _day), values in buffer.take().items()
        for i, n in enumerate(values)
        if n
    }


def publish(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, topic: str, *bodies: bytes, **kw: Any
) -> publish_op.Published:
    params: dict[str, Any] = {
        "topic": topic,
        "topic_id": None,
        "bodies": list(bodies),
        "dedup_keys": [None] * len(bodies),
        "headers": None,
        "ttl_us": 60 * US,
        "delay_us": 0,
        "max_attempts": 2,
    }
    params.update(kw)
    return publish_op.publish(conn, dialect, now, **params)


def channel_id(conn: sa.Connection, topic: str, channel: str) -> int:
    return topology.existing_channel_id(conn, topic, channel)


def leased(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, topic: str, channel: str, n: int = 10
) -> list[novaque.Message]:
    cid = channel_id(conn, topic, channel)
    token = secrets.token_hex(16)
    rows, at, _ = consume.claim(conn, dialect, now, ClaimParams(cid, n, LEASE_US, token))
    return consume.messages_of(rows, topic, channel, cid, token, at)


def test_publish_returns_ids_and_leaves_counting_and_waking_to_its_caller(db: Any) -> None:
    engine, dialect, now = db
    with engine.begin() as conn:
        topology.ensure_channel(conn, dialect, now, "t", "a", {})
        topology.ensure_channel(conn, dialect, now, "t", "b", {})
        done = publish(conn, dialect, now, "t", b"1", b"2")
        a, b = channel_id(conn, "t", "a"), channel_id(conn, "t", "b")
    assert len(done.ids) == 2
    assert done.ids == sorted(done.ids)
    assert dict(done.fanout) == {a: 2, b: 2}
    effects = done.effects("t")
    assert counts(effects) == {("published", a): 2, ("published", b): 2}
    assert effects.wake == ("t",)
    assert effects.topic_ids == (("t", done.learned_topic_id),)
    assert effects.no_channel is None
    with engine.begin() as conn:
        lonely = publish(conn, dialect, now, "lonely", b"x")
    assert lonely.effects("lonely").no_channel == "lonely"
    assert lonely.effects("lonely").wake == ()


def test_claim_ack_and_ack_and_claim(db: Any) -> None:
    engine, dialect, now = db
    with engine.begin() as conn:
        topology.ensure_channel(conn, dialect, now, "t", "c", {})
        publish(conn, dialect, now, "t", b"1", b"2", b"3")
    with engine.begin() as conn:
        cid = channel_id(conn, "t", "c")
        token = secrets.token_hex(16)
        rows, at, effects = consume.claim(conn, dialect, now, ClaimParams(cid, 2, LEASE_US, token))
    assert at == now
    assert {r.until for r in rows} == {now + LEASE_US}
    assert [r.body for r in rows] == [b"1", b"2"]
    assert counts(effects) == {("claimed", cid): 2}
    first = consume.messages_of(rows, "t", "c", cid, token, at)
    with engine.begin() as conn:
        claim = ClaimParams(cid, 10, LEASE_US, secrets.token_hex(16))
        lost, claimed, _, effects = consume.ack_and_claim(conn, dialect, now, first[:1], claim)
    assert lost == []
    assert [r.body for r in claimed] == [b"3"]  # the acked one gone, the leased one skipped
    assert counts(effects) == {("acked", cid): 1, ("claimed", cid): 1}
    with engine.begin() as conn:
        lost, effects = consume.ack(conn, dialect, now, first)
    assert lost == [first[0]]  # acked already: its lease is gone
    assert counts(effects) == {("acked", cid): 1}
    with engine.begin() as conn:
        rows, _, effects = consume.claim(
            conn, dialect, now, ClaimParams(cid, 5, LEASE_US, "t" * 32)
        )
    assert rows == []
    assert counts(effects) == {}


def test_settling_operations_are_fenced_by_the_token(db: Any) -> None:
    engine, dialect, now = db
    with engine.begin() as conn:
        topology.ensure_channel(conn, dialect, now, "t", "c", {})
        publish(conn, dialect, now, "t", b"1", b"2")
        one, two = leased(conn, dialect, now, "t", "c")
    with engine.begin() as conn:
        assert consume.renew(conn, dialect, now + 5, one, LEASE_US) == now + 5 + LEASE_US
        changed, effects = consume.requeue(conn, dialect, now, one, 120 * US, "x", True)
        assert not changed  # due after the message expires (60 s TTL)
        changed, effects = consume.requeue(conn, dialect, now, one, US, "boom", True)
        assert changed
        assert counts(effects) == {("requeued", one.channel_id): 1}
        assert consume.renew(conn, dialect, now, one, LEASE_US) is None  # no longer leased
        assert consume.kill(conn, dialect, now, one, "rejected", None)[0] is False
        changed, effects = consume.kill(conn, dialect, now, two, "rejected", "why")
        assert changed
        assert counts(effects) == {("dead", two.channel_id): 1}


def test_defer_claim_deferred_snooze_and_pop_count_what_they_change(db: Any) -> None:
    engine, dialect, now = db
    with engine.begin() as conn:
        topology.ensure_channel(conn, dialect, now, "t", "c", {})
        publish(conn, dialect, now, "t", b"1", b"2", b"3")
        one, two, three = leased(conn, dialect, now, "t", "c")
        cid = one.channel_id
    with engine.begin() as conn:
        changed, effects = consume.defer(conn, dialect, now, one)
        assert changed
        assert counts(effects) == {}  # still live: nothing to count
        assert consume.defer(conn, dialect, now, one)[0] is False  # fenced
        changed, effects = consume.requeue(conn, dialect, now, two, 0, None, False, True)
        assert changed
        assert counts(effects) == {("requeued", cid): 1}
        token = secrets.token_hex(16)
        rows, at, effects = consume.claim_deferred(
            conn, dialect, now, cid, [one.delivery_id, three.delivery_id], LEASE_US, token
        )
    assert at == now
    assert [(r.delivery_id, r.attempts, r.until) for r in rows] == [
        (one.delivery_id, 2, now + LEASE_US)
    ]
    assert counts(effects) == {("claimed", cid): 1}
    with engine.begin() as conn:
        rows, at, effects = consume.pop(conn, dialect, now, cid, 10)
        left = conn.execute(sa.select(deliveries.c.id).order_by(deliveries.c.id)).scalars().all()
    assert at == now
    assert [(r.delivery_id, r.attempts, r.until) for r in rows] == [(two.delivery_id, 1, now)]
    assert counts(effects) == {("claimed", cid): 1, ("acked", cid): 1}
    assert left == [one.delivery_id, three.delivery_id]


def test_release_gives_unstarted_deliveries_back_without_their_attempt(db: Any) -> None:
    engine, dialect, now = db
    with engine.begin() as conn:
        topology.ensure_channel(conn, dialect, now, "t", "c", {})
        publish(conn, dialect, now, "t", b"1")
        [msg] = leased(conn, dialect, now, "t", "c")
    with engine.begin() as conn:
        assert consume.release(conn, dialect, now, [msg]) == 1
        assert consume.release(conn, dialect, now, [msg]) == 0
        attempts = conn.execute(
            sa.select(deliveries.c.attempts).where(deliveries.c.id == msg.delivery_id)
        ).scalar_one()
    assert attempts == 0


def test_reaper_and_purge_batches_report_and_count(db: Any) -> None:
    engine, dialect, now = db
    with engine.begin() as conn:
        topology.ensure_channel(conn, dialect, now, "t", "c", {})
        publish(conn, dialect, now, "t", b"1", b"2", max_attempts=1)
        one, _ = leased(conn, dialect, now, "t", "c")
    later = now + LEASE_US + 1
    with engine.begin() as conn:
        found, changed, effects = maintain.reap_batch(conn, dialect, later, 100)
    assert (found, changed) == (2, 2)  # out of attempts: both dead
    assert counts(effects) == {("dead", one.channel_id): 2}
    with engine.begin() as conn:
        seen, deleted, effects = maintain.purge_batch(
            conn, dialect, now + 61 * US, 1, dead_letter_expired=False, default_ttl_us=0
        )
    assert (seen, deleted) == (1, 1)  # one batch of one: the caller loops
    assert counts(effects) == {("purged", one.channel_id): 1}


def test_topology_operations(db: Any) -> None:
    engine, dialect, now = db
    with engine.begin() as conn:
        topology.ensure_channel(conn, dialect, now, "t", "a", {"dead_max_count": 7})
        topology.ensure_channel(conn, dialect, now, "t", "a", {})  # keeps the bound
        topology.ensure_topic(conn, dialect, now, "u")
        assert topology.list_topics(conn, dialect) == ["t", "u"]
        assert topology.list_channels(conn, dialect, "t") == ["a"]
        topology.delete_channel(conn, dialect, "t", "a")
        assert topology.list_channels(conn, dialect, "t") == []
        topology.delete_topic(conn, dialect, "u")
        with pytest.raises(novaque.TopicNotFound):
            topology.delete_topic(conn, dialect, "u")
