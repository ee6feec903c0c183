"""Dead letters on expiry (DESIGN §9): on a channel with ``dead_letter_expired``,
a delivery still live when its message's TTL passes becomes a dead letter with
reason "expired" instead of being purged, and its message is kept for it."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

import novaque
from novaque import Backlog
from novaque.ops import maintain
from novaque.schema import DEFERRED_VISIBLE_AT, STATE_DEFERRED, deliveries, messages
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")

DAY = 86_400
WEEK = 7 * DAY  # Options.default_ttl


def set_aside(backend: Backend, delivery_id: int) -> None:
    """Make a leased delivery deferred, as ``defer()`` leaves it."""
    with backend.engine().begin() as conn:
        conn.execute(
            sa.update(deliveries)
            .where(deliveries.c.id == delivery_id)
            .values(state=STATE_DEFERRED, visible_at=DEFERRED_VISIBLE_AT, lease_token=None)
        )


def postpone(backend: Backend, delivery_id: int, seconds: int) -> None:
    """Make a ready delivery pending (due ``seconds`` from its current due time)."""
    with backend.engine().begin() as conn:
        conn.execute(
            sa.update(deliveries)
            .where(deliveries.c.id == delivery_id)
            .values(visible_at=deliveries.c.visible_at + seconds * 1_000_000)
        )


def message_count(backend: Backend) -> int:
    with backend.engine().connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(messages)).scalar_one())


def test_live_deliveries_become_expired_letters_and_keep_their_message(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "keep", dead_letter_expired=True)
    client.ensure_channel("t", "drop")  # Options.dead_letter_expired: False
    ready, pending, leased, deferred, dead = client.publish_many(
        "t", [b"ready", b"pending", b"leased", b"deferred", b"dead"], ttl=60
    )
    claimed = {m.id: m for m in client.claim("t", "keep", max_messages=5, lease=3600)}
    client.reject(claimed[dead], "bad")  # dead before its TTL: purged with it, as before
    set_aside(backend, claimed[deferred].delivery_id)
    client.requeue(claimed[ready], delay=0)
    client.requeue(claimed[pending], delay=0)
    postpone(backend, claimed[pending].delivery_id, 10**6)
    assert client.channel_backlog("t", "keep") == Backlog(
        pending=1, ready=1, in_flight=1, dead=1, deferred=1
    )
    clock.advance(61)
    died_at = clock()

    assert client.purge_expired() == 1  # only the message whose letter was dead already
    assert message_count(backend) == 4
    letters = client.list_dead("t", "keep")
    assert [x.message_id for x in letters] == [ready, pending, leased, deferred]
    assert {x.reason for x in letters} == {"expired"}
    assert {x.died_at for x in letters} == {died_at}
    assert [x.attempts for x in letters] == [1, 1, 1, 1]  # as each was
    assert client.channel_backlog("t", "keep") == Backlog(dead=4)
    assert client.channel_backlog("t", "drop") == Backlog()
    with pytest.raises(novaque.LeaseLost):  # the lease ended with its message's TTL
        client.ack(claimed[leased])
    info = client.get_message(ready)
    assert [(d.channel, d.state) for d in info.deliveries] == [("keep", "dead")]
    assert info.expires_at == died_at + timedelta(seconds=WEEK)  # one default_ttl more
    with pytest.raises(novaque.MessageNotFound):
        client.get_message(dead)
    client.flush_stats()
    keep = client.channel_counters("t", "keep")
    assert (keep.dead, keep.purged) == (5, 1)  # the rejection and four expired; one purged
    drop = client.channel_counters("t", "drop")
    assert (drop.dead, drop.purged) == (0, 5)

    assert client.purge_expired() == 0  # nothing else is due
    clock.advance(WEEK - 1)
    assert client.purge_expired() == 0
    clock.advance(1)  # one default_ttl after they died: the messages go with their letters
    assert client.purge_expired() == 4
    assert message_count(backend) == 0
    assert client.list_dead("t", "keep") == []
    client.flush_stats()
    assert client.channel_counters("t", "keep").purged == 5


def test_the_options_default_and_the_channel_setting(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, dead_letter_expired=True)
    client.ensure_channel("t", "default")  # None: the client's True
    client.ensure_channel("t", "off", dead_letter_expired=False)
    client.ensure_channel("t", "on", dead_letter_expired=True)
    assert client.channel_settings("t", "default").dead_letter_expired is None
    message_id = client.publish("t", b"x", ttl=10)
    clock.advance(10)
    assert client.purge_expired() == 0
    info = client.get_message(message_id)
    assert [(d.channel, d.state) for d in info.deliveries] == [
        ("default", "dead"),
        ("on", "dead"),
    ]
    # The other way round: a client whose default is False leaves "default" alone.
    other = backend.client(clock=clock)
    second = other.publish("t", b"y", ttl=10)
    clock.advance(10)
    assert other.purge_expired() == 0  # "on" keeps it
    info = other.get_message(second)
    assert [(d.channel, d.state) for d in info.deliveries] == [("on", "dead")]
    # Reset to the default: a message whose channels all purge goes at once.
    other.ensure_channel("t", "on", reset=("dead_letter_expired",))
    third = other.publish("t", b"z", ttl=10)
    clock.advance(10)
    assert other.purge_expired() == 1
    with pytest.raises(novaque.MessageNotFound):
        other.get_message(third)


def test_ordered_heads_that_die_on_expiry_move_their_groups_on(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo", dead_letter_expired=True)
    g1 = client.publish("t", b"g1", group="g", ttl=60)  # the head, leased
    g2 = client.publish("t", b"g2", group="g", ttl=60)  # parked behind it
    client.publish("t", b"g3", group="g")  # parked, lives on
    client.publish("t", b"h1", group="h")  # a head that lives on
    h2 = client.publish("t", b"h2", group="h", ttl=60)  # parked behind it, expires
    claimed = client.claim("t", "c", max_messages=10, lease=3600)
    assert sorted(m.body for m in claimed) == [b"g1", b"h1"]
    clock.advance(61)
    client.purge_expired()
    assert [x.message_id for x in client.list_dead("t", "c")] == [g1, g2, h2]
    # g3 heads its group now; h1 is still in flight, so h waits for it.
    assert [m.body for m in client.claim("t", "c", max_messages=10)] == [b"g3"]
    assert client.channel_backlog("t", "c") == Backlog(in_flight=2, dead=3)


def test_requeue_dead_of_an_expired_letter_gives_it_a_fresh_ttl(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", dead_letter_expired=True)
    message_id = client.publish("t", b"x", ttl=60)
    clock.advance(61)
    client.purge_expired()
    clock.advance(DAY)
    assert client.requeue_dead("t", "c") == 1
    requeued_at = clock()
    assert client.get_message(message_id).expires_at == requeued_at + timedelta(seconds=WEEK)
    clock.advance(WEEK - 1)
    assert client.purge_expired() == 0
    [msg] = client.claim("t", "c")
    assert (msg.id, msg.attempts) == (message_id, 1)
    client.ack(msg)


def test_expired_letters_go_by_the_channels_dead_letter_bounds(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", dead_letter_expired=True, dead_max_count=1)
    client.publish_many("t", [b"1", b"2", b"3"], ttl=60)
    clock.advance(61)
    assert client.purge_expired() == 0
    assert client.enforce_dead_retention() == 2
    assert len(client.list_dead("t", "c")) == 1
    clock.advance(WEEK)
    client.run_maintenance()  # the messages whose letters went, and the last one
    assert client.list_messages("t") == []


def test_a_purge_batch_of_many_expired_messages(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintain, "BURY_CHUNK", 2)  # letters made in several statements
    client = backend.client(clock=clock, maintenance_batch=3)
    client.ensure_channel("t", "keep", dead_letter_expired=True)
    client.ensure_channel("t", "drop")
    client.ensure_channel("u", "plain")  # another topic: no channel of it keeps
    client.publish_many("t", [b"t"] * 7, ttl=60)
    client.publish_many("u", [b"u"] * 5, ttl=60)
    clock.advance(61)
    assert client.purge_expired() == 5  # u's messages; t's are kept for their letters
    assert client.channel_backlog("t", "keep") == Backlog(dead=7)
    assert client.channel_backlog("t", "drop") == Backlog()
    assert message_count(backend) == 7


@pytest.mark.sync_only
def test_acks_racing_the_purge_either_ack_or_die(backend: Backend, clock: FakeClock) -> None:
    """Each leased delivery of an expired message is either acked or becomes a
    dead letter (its ack then loses the lease), never both, counted once."""
    client = backend.client(clock=clock, maintenance_batch=10)  # many purge transactions
    acker = backend.client(clock=clock)
    client.ensure_channel("t", "c", dead_letter_expired=True)
    acker.list_topics()  # connected and checked before the race
    client.publish_many("t", [b"x"] * 300, ttl=60)
    held = client.claim("t", "c", max_messages=300, lease=3600)
    assert len(held) == 300
    clock.advance(61)
    lost: list[novaque.Message] = []
    barrier = threading.Barrier(2)

    def ack() -> None:
        barrier.wait(timeout=30)
        newest_first = held[::-1]  # the purge takes the oldest first: they meet
        for i in range(0, 300, 10):
            lost.extend(acker.ack_many(newest_first[i : i + 10]))

    def purge() -> None:
        barrier.wait(timeout=30)
        client.purge_expired()

    threads = [threading.Thread(target=ack), threading.Thread(target=purge)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    client.purge_expired()  # whatever the race left for it
    dead = {x.delivery_id for x in client.list_dead("t", "c", limit=1000)}
    assert dead == {m.delivery_id for m in lost}
    assert message_count(backend) == len(lost)  # kept for their letters, the others gone
    assert client.channel_backlog("t", "c") == Backlog(dead=len(lost))
    client.flush_stats()
    acker.flush_stats()
    counters = client.channel_counters("t", "c")
    assert (counters.acked, counters.dead) == (300 - len(lost), len(lost))
