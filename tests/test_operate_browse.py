"""Browsing and replay: get_message, list_messages, replay, replay_range, prune."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

import novaque
from novaque import DeliveryInfo
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")


def test_get_message_shows_each_live_delivery(client: novaque.Client, clock: FakeClock) -> None:
    for channel in ("a", "b", "c", "d", "e"):
        client.ensure_channel("t", channel)
    published = clock()
    mid = client.publish("t", b"body", headers={"k": "v"}, ttl=3600, max_attempts=2)
    client.ack(client.claim("t", "a")[0])
    msg_b = client.claim("t", "b", lease=10)[0]
    client.requeue(client.claim("t", "c")[0], delay=30, error="try later")
    client.reject(client.claim("t", "d")[0], "no")

    info = client.get_message(mid)
    assert (info.id, info.topic, info.body, info.headers) == (mid, "t", b"body", {"k": "v"})
    assert info.published_at == published
    assert info.expires_at == published + timedelta(seconds=3600)
    assert info.deliveries == [  # "a" acked: no delivery
        DeliveryInfo("b", "in_flight", 1, None, msg_b.lease_expires_at),
        DeliveryInfo("c", "pending", 1, "try later", published + timedelta(seconds=30)),
        DeliveryInfo("d", "dead", 1, None, None),
        DeliveryInfo("e", "ready", 0, None, published),
    ]
    clock.advance(30)
    states = {x.channel: x.state for x in client.get_message(mid).deliveries}
    assert states == {"b": "in_flight", "c": "ready", "d": "dead", "e": "ready"}

    with pytest.raises(novaque.MessageNotFound, match=f"message {mid + 1000} does not exist"):
        client.get_message(mid + 1000)
    with pytest.raises(
        novaque.InvalidOption, match="id must be between 1 and 9223372036854775807, got 0"
    ):
        client.get_message(0)


def test_list_messages_pages_and_filters_by_time(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("t", "a")
    start = clock()
    ids = []
    for i in range(7):
        ids.append(client.publish("t", f"m{i}"))
        clock.advance(10)
    client.publish("other", b"not listed")
    client.ack(client.claim("t", "a")[0])  # acked messages stay browsable

    first = client.list_messages("t", limit=4)
    rest = client.list_messages("t", limit=4, after_id=first[-1].id)
    assert [x.id for x in first + rest] == ids
    assert [x.body for x in first] == [b"m0", b"m1", b"m2", b"m3"]
    assert first[0].deliveries == []
    assert [x.state for x in first[1].deliveries] == ["ready"]
    window = client.list_messages(
        "t", since=start + timedelta(seconds=20), until=start + timedelta(seconds=50)
    )
    assert [x.id for x in window] == ids[2:5]
    assert client.list_messages("t", after_id=ids[-1]) == []
    with pytest.raises(novaque.InvalidOption, match="since must be timezone-aware"):
        client.list_messages("t", since=datetime(2030, 1, 1))
    with pytest.raises(novaque.InvalidOption, match="limit must be between 1 and 1000"):
        client.list_messages("t", limit=5000)


def test_replay_creates_fresh_deliveries_without_duplicates(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "a")
    client.ensure_channel("t", "b")
    mid = client.publish("t", b"x", ttl=60, max_attempts=3)
    first = client.claim("t", "a")[0]
    client.requeue(first, delay=0)
    client.ack(client.claim("t", "a")[0])  # a is done with it after 2 attempts
    client.ensure_channel("t", "late")
    clock.advance(30)

    assert client.replay(mid, channels=["a"]) == 1
    assert client.replay(mid) == 1  # "late" only: a and b hold live deliveries
    assert client.replay(mid) == 0
    got = client.claim("t", "a")[0]
    assert (got.id, got.attempts, got.max_attempts) == (mid, 1, 3)
    assert client.get_message(mid).expires_at >= clock() + timedelta(days=7)
    assert [x.channel for x in client.get_message(mid).deliveries] == ["a", "b", "late"]

    with pytest.raises(novaque.ChannelNotFound, match="'nope' of topic 't'"):
        client.replay(mid, channels=["a", "nope"])
    with pytest.raises(novaque.MessageNotFound):
        client.replay(mid + 99)
    with pytest.raises(novaque.InvalidOption, match="channels must be a list"):
        client.replay(mid, channels="a")


def test_concurrent_replays_of_one_message_create_one_delivery(
    backend: Backend, clock: FakeClock
) -> None:
    clients = [backend.client(clock=clock) for _ in range(4)]
    clients[0].ensure_channel("t", "a")
    mid = clients[0].publish("t", b"x")
    clients[0].ack(clients[0].claim("t", "a")[0])
    start = threading.Barrier(len(clients))
    created: list[int] = []

    def replay(client: novaque.Client) -> None:
        start.wait(timeout=30)
        created.append(client.replay(mid))

    threads = [threading.Thread(target=replay, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(created) == [0, 0, 0, 1]
    assert len(clients[0].get_message(mid).deliveries) == 1


def test_replay_range_replays_a_time_window(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock)
    client.ensure_channel("t", "a")
    client.ensure_channel("t", "b")
    start = clock()
    ids = []
    for i in range(6):
        ids.append(client.publish("t", f"m{i}"))
        clock.advance(10)
    while batch := client.claim("t", "a", max_messages=10):
        client.ack_many(batch)
    window = (start + timedelta(seconds=10), start + timedelta(seconds=40))  # m1, m2, m3
    assert client.replay_range("t", *window, channels=["a"]) == 3
    assert client.replay_range("t", *window) == 0  # a and b hold them all now
    assert [m.id for m in client.claim("t", "a", max_messages=10)] == ids[1:4]
    with pytest.raises(novaque.InvalidOption, match="until must be a timezone-aware datetime"):
        client.replay_range("t", start, None)  # type: ignore[arg-type]


def test_replay_range_handles_more_messages_than_one_chunk(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "a")
    ids = client.publish_many("t", [b"m"] * 1100)  # one published_at: keyset on id
    while batch := client.claim("t", "a", max_messages=1000):
        client.ack_many(batch)
    now = clock()
    assert client.replay_range("t", now, now + timedelta(seconds=1)) == 1100
    client.flush_stats()
    assert client.channel_counters("t", "a").published == 2200
    assert len({m.id for m in client.claim("t", "a", max_messages=1000)}) == 1000
    assert ids[0] == client.list_messages("t", limit=1)[0].id


def test_prune_deletes_old_messages_in_batches(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, maintenance_batch=3)
    client.ensure_channel("t", "a")
    old = client.publish_many("t", [str(i) for i in range(7)])
    client.publish("u", b"old too, another topic")
    client.reject(client.claim("t", "a")[0])  # dead deliveries go with their message
    clock.advance(60)
    cutoff = clock()
    kept = client.publish("t", b"new")

    assert client.prune(cutoff, dry_run=True) == 8
    assert client.get_message(old[0]).id == old[0]  # a dry run changes nothing
    assert client.prune(cutoff) == 8
    assert client.prune(cutoff) == 0
    with pytest.raises(novaque.MessageNotFound):
        client.get_message(old[3])
    assert [m.id for m in client.list_messages("t")] == [kept]
    assert client.channel_backlog("t", "a") == novaque.Backlog(ready=1)
    client.flush_stats()
    assert client.channel_counters("t", "a").purged == 7
    with pytest.raises(novaque.InvalidOption, match="before must be timezone-aware"):
        client.prune(datetime(2030, 1, 1))
    assert client.prune(datetime(1970, 1, 2, tzinfo=timezone.utc)) == 0


def test_oldest_ready_at_is_the_earliest_due_time_of_a_ready_delivery(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "a")
    client.ensure_channel("t", "fifo", ordering="strict_fifo")
    client.ensure_channel("u", "idle")
    assert client.channel_backlog("u", "idle").oldest_ready_at is None
    client.publish("t", b"later", delay=60)  # pending: not ready yet
    assert client.channel_backlog("t", "a").oldest_ready_at is None
    first = clock()
    client.publish_many("t", [b"1", b"2"])
    clock.advance(10)
    client.publish("t", b"3")
    assert client.channel_backlog("t", "a").oldest_ready_at == first
    # On the strict FIFO channel the delayed head holds the others back
    # (parked, counted ready): they have waited since their publish.
    backlog = client.channel_backlog("t", "fifo")
    assert (backlog.pending, backlog.ready, backlog.oldest_ready_at) == (1, 3, first)
    [msg] = client.claim("t", "a", max_messages=1)  # leased: no longer ready
    assert msg.body == b"1"
    assert client.channel_backlog("t", "a").oldest_ready_at == first  # b"2"
    total = client.channel_backlog("u", "idle") + client.channel_backlog("t", "a")
    assert total.oldest_ready_at == first
    assert total == novaque.Backlog(pending=1, ready=2, in_flight=1)
