"""Claiming and settling: leases, fencing, retries, dead letters, delay, TTL."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

import novaque
from novaque.schema import deliveries, messages
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = [pytest.mark.usefixtures("twin"), pytest.mark.pooled]


def one(
    client: novaque.Client, topic: str = "t", channel: str = "c", **kw: object
) -> novaque.Message:
    got = client.claim(topic, channel, **kw)  # type: ignore[arg-type]
    assert len(got) == 1, got
    return got[0]


def delivery_rows(backend: Backend) -> list[tuple[int, int, int, str | None]]:
    with backend.engine().connect() as conn:
        return [
            tuple(r)  # type: ignore[misc]
            for r in conn.execute(
                sa.select(
                    deliveries.c.id,
                    deliveries.c.state,
                    deliveries.c.attempts,
                    deliveries.c.lease_token,
                ).order_by(deliveries.c.id)
            )
        ]


def test_claim_returns_message_fields_and_ack_removes_the_delivery(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    published = clock()
    message_id = client.publish("t", b"hello", headers={"k": "v"}, max_attempts=3)
    msg = one(client, lease=10)
    assert (msg.id, msg.topic, msg.channel, msg.body) == (message_id, "t", "c", b"hello")
    assert msg.headers == {"k": "v"}
    assert (msg.attempts, msg.max_attempts) == (1, 3)
    assert msg.published_at == published
    assert msg.lease_expires_at == published + timedelta(seconds=10)
    assert msg.published_at.tzinfo is not None
    assert len(msg.lease_token) == 32
    assert client.claim("t", "c") == []
    client.ack(msg)
    assert delivery_rows(backend) == []
    assert client.claim("t", "c") == []


def test_claim_takes_oldest_first_up_to_max_messages(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    ids = client.publish_many("t", [str(i) for i in range(7)])
    first = client.claim("t", "c", max_messages=5)
    second = client.claim("t", "c", max_messages=5)
    assert [m.id for m in first] == ids[:5]
    assert [m.id for m in second] == ids[5:]


def test_stale_token_raises_lease_lost_and_changes_nothing(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    first = one(client, lease=5)
    clock.advance(6)
    second = one(client, lease=5)  # the expired lease is claimed again
    assert second.attempts == 2
    assert second.lease_token != first.lease_token
    before = delivery_rows(backend)
    for settle in (
        lambda: client.ack(first),
        lambda: client.requeue(first, delay=0),
        lambda: client.renew(first),
        lambda: client.reject(first, "nope"),
    ):
        with pytest.raises(novaque.LeaseLost, match="no longer current"):
            settle()
    assert client.ack_many([first]) == [first]
    assert delivery_rows(backend) == before
    client.ack(second)
    with pytest.raises(novaque.LeaseLost):
        client.ack(second)  # a second ack too


def test_expired_lease_is_redelivered_after_reaping(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    first = one(client, lease=30)
    clock.advance(29)
    assert client.claim("t", "c") == []
    clock.advance(2)
    client.run_maintenance()
    with pytest.raises(novaque.LeaseLost):
        client.ack(first)  # reaped: the old token is dead
    again = one(client)
    assert again.attempts == 2
    assert again.id == first.id


def test_token_still_settles_after_expiry_when_nobody_reclaimed(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    msg = one(client, lease=1)
    clock.advance(60)
    client.ack(msg)
    assert client.claim("t", "c") == []


def test_requeue_until_max_attempts_then_dead_with_last_error(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x", max_attempts=3)
    for attempt in (1, 2, 3):
        msg = one(client)
        assert msg.attempts == attempt
        client.requeue(msg, delay=0, error=ValueError(f"boom {attempt}"))
    assert client.claim("t", "c") == []  # dead at once, not at the next claim
    with backend.engine().connect() as conn:
        row = conn.execute(
            sa.select(
                deliveries.c.state,
                deliveries.c.dead_reason,
                deliveries.c.last_error,
                deliveries.c.lease_token,
                deliveries.c.died_at,
            )
        ).one()
    assert row.state == novaque.schema.STATE_DEAD
    assert row.dead_reason == "max_attempts"
    assert row.last_error == "ValueError: boom 3"
    assert row.lease_token is None
    assert row.died_at is not None


def test_requeue_applies_backoff_and_delay(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, backoff=novaque.Backoff(base=10, jitter=False))
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    client.requeue(one(client), error="first")  # backoff: 10 s after attempt 1
    clock.advance(9.9)
    assert client.claim("t", "c") == []
    clock.advance(0.2)
    msg = one(client)
    assert msg.attempts == 2
    client.requeue(msg)  # 20 s after attempt 2
    clock.advance(19.9)
    assert client.claim("t", "c") == []
    clock.advance(0.2)
    client.requeue(one(client), delay=timedelta(minutes=5))  # explicit delay wins
    clock.advance(299)
    assert client.claim("t", "c") == []
    clock.advance(2)
    assert one(client).attempts == 4


@pytest.mark.sync_only
def test_backoff_policy() -> None:
    policy = novaque.Backoff(base=1.0, cap=10.0, jitter=False)
    assert [policy.delay(a) for a in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 8, 10, 10]
    jittered = novaque.Backoff(base=timedelta(seconds=2), cap=60)
    assert jittered.delay(3, rand=lambda: 0.5) == 4.0
    assert all(0 <= jittered.delay(10) <= 60 for _ in range(100))
    assert novaque.Backoff(base=0).delay(7) == 0


def test_reject_is_dead_at_once_with_the_reason(backend: Backend, client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    client.publish_many("t", [b"a", b"b"], max_attempts=10)
    first, second = client.claim("t", "c", max_messages=2)
    client.reject(first, "malformed order")
    client.reject(second)
    with backend.engine().connect() as conn:
        reasons = conn.execute(
            sa.select(deliveries.c.dead_reason, deliveries.c.attempts).order_by(deliveries.c.id)
        ).all()
    assert [tuple(r) for r in reasons] == [("malformed order", 1), ("rejected", 1)]
    assert client.claim("t", "c") == []


def test_delay_keeps_a_delivery_invisible_until_due(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"later", delay=timedelta(hours=1))
    client.publish("t", b"now")
    due = client.claim("t", "c", max_messages=5)
    assert [m.body for m in due] == [b"now"]
    client.ack_many(due)
    clock.advance(3599)
    assert client.claim("t", "c") == []
    clock.advance(1)
    assert one(client).body == b"later"


def test_renew_extends_the_lease_and_keeps_the_token(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    msg = one(client, lease=10)
    token = msg.lease_token
    clock.advance(8)
    expiry = client.renew(msg, lease=10)
    assert expiry == clock() + timedelta(seconds=10)
    assert msg.lease_expires_at == expiry
    assert msg.lease_token == token
    clock.advance(8)  # past the first lease, within the renewed one
    assert client.claim("t", "c") == []
    client.run_maintenance()
    client.ack(msg)
    default = client.renew  # renew without lease uses Options.default_lease
    client.publish("t", b"y")
    other = one(client, lease=1)
    assert default(other) == clock() + timedelta(seconds=30)


def test_ack_many_returns_the_lost_ones(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("t", "c")
    client.publish_many("t", [b"a", b"b", b"c"])
    batch = client.claim("t", "c", max_messages=2, lease=5)
    clock.advance(6)
    late = client.claim("t", "c", max_messages=5)  # "c", then the two expired leases
    assert [m.body for m in late] == [b"a", b"b", b"c"]
    lost = client.ack_many([*batch, *late])
    assert lost == batch
    assert client.ack_many([]) == []
    assert client.claim("t", "c") == []


def test_ttl_purge_removes_messages_and_all_their_deliveries(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "live")
    client.ensure_channel("t", "doomed")
    short = client.publish("t", b"short", ttl=60, max_attempts=1)
    long = client.publish("t", b"long", ttl=timedelta(days=1))
    dead = one(client, channel="doomed")
    client.reject(dead)  # dead letters are purged by TTL too
    clock.advance(61)
    client.run_maintenance()
    with backend.engine().connect() as conn:
        left = conn.execute(sa.select(messages.c.id)).scalars().all()
        left_deliveries = conn.execute(sa.select(deliveries.c.message_id)).scalars().all()
    assert left == [long]
    assert sorted(left_deliveries) == [long, long]
    assert short not in left


def test_expired_lease_on_the_last_attempt_goes_dead_when_reaped(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x", max_attempts=1)
    msg = one(client, lease=5)
    clock.advance(6)
    assert client.claim("t", "c") == []  # out of attempts: not handed out again
    client.run_maintenance()
    with backend.engine().connect() as conn:
        row = conn.execute(sa.select(deliveries.c.state, deliveries.c.dead_reason)).one()
    assert tuple(row) == (novaque.schema.STATE_DEAD, "max_attempts")
    with pytest.raises(novaque.LeaseLost):
        client.ack(msg)


def test_names_are_case_sensitive(client: novaque.Client) -> None:
    client.ensure_channel("Orders", "Mail")
    client.ensure_channel("orders", "mail")
    client.ensure_channel("orders", "MAIL")
    client.publish("Orders", b"upper")
    client.publish("orders", b"lower")
    assert client.list_topics() == ["Orders", "orders"]
    assert client.list_channels("orders") == ["MAIL", "mail"]
    assert [m.body for m in client.claim("Orders", "Mail", max_messages=5)] == [b"upper"]
    assert [m.body for m in client.claim("orders", "mail", max_messages=5)] == [b"lower"]
    assert [m.body for m in client.claim("orders", "MAIL", max_messages=5)] == [b"lower"]
    with pytest.raises(novaque.ChannelNotFound):
        client.claim("Orders", "mail")


def test_topology_reads_and_deletes(client: novaque.Client) -> None:
    with pytest.raises(novaque.TopicNotFound):
        client.list_channels("missing")
    with pytest.raises(novaque.TopicNotFound):
        client.claim("missing", "c")
    client.ensure_topic("t")
    client.ensure_topic("t")
    with pytest.raises(novaque.ChannelNotFound):
        client.claim("t", "c")
    client.ensure_channel("t", "c")
    client.ensure_channel("t", "d")
    client.publish("t", b"x")
    client.delete_channel("t", "d")
    assert client.list_channels("t") == ["c"]
    with pytest.raises(novaque.ChannelNotFound):
        client.delete_channel("t", "d")
    client.delete_topic("t")
    assert client.list_topics() == []
    with pytest.raises(novaque.TopicNotFound):
        client.delete_topic("t")
    client.publish("t", b"again")  # recreated by publish, with a fresh id
    assert client.list_topics() == ["t"]
