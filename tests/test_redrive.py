"""Redrive (DESIGN §9): requeue_dead / delete_dead with to_channel, limit,
died_before and rate; and cancel, on both twins and every backend."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque import Backlog
from novaque.ops import browse
from novaque.schema import deliveries
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")


def bury(client: novaque.Client, topic: str, channel: str, n: int, clock: FakeClock) -> list[int]:
    """Claim ``n`` deliveries of a channel and reject them one by one, a second
    apart (so they die in delivery-id order); their delivery ids."""
    msgs = client.claim(topic, channel, max_messages=n)
    assert len(msgs) == n
    for msg in msgs:
        client.reject(msg, f"bad {msg.id}")
        clock.advance(1)
    return [m.delivery_id for m in msgs]


def balanced(client: novaque.Client, topic: str, channel: str) -> novaque.Counters:
    """The channel's counters, checked against ``published == acked + purged + live``."""
    client.flush_stats()
    counters = client.channel_counters(topic, channel)
    live = client.channel_backlog(topic, channel).total
    assert counters.published == counters.acked + counters.purged + live, (counters, live)
    return counters


def core(client: novaque.Client) -> Any:
    """The sync client that does the work (the asyncio twin's own, under the twin)."""
    twin = getattr(client, "aio", None)
    return client if twin is None else twin._core


def late_target(client: novaque.Client, n: int, clock: FakeClock) -> tuple[list[int], list[int]]:
    """Topic t: n messages dead in channel "src", and a channel "dst" created
    after they were published (so it holds none of them): (message ids,
    delivery ids of the letters)."""
    client.ensure_channel("t", "src")
    ids = client.publish_many("t", [f"m{i}" for i in range(n)])
    letters = bury(client, "t", "src", n, clock)
    client.ensure_channel("t", "dst")
    return ids, letters


# -- moving to another channel -----------------------------------------------------------


def test_move_to_another_channel(client: novaque.Client, clock: FakeClock) -> None:
    ids, letters = late_target(client, 3, clock)
    client.ensure_channel("t", "other")
    clock.advance(3600)
    assert client.requeue_dead("t", "src", to_channel="dst") == 3
    assert client.channel_backlog("t", "src") == Backlog()
    assert client.channel_backlog("t", "dst") == Backlog(ready=3)
    assert client.channel_backlog("t", "other") == Backlog()
    got = client.claim("t", "dst", max_messages=10)
    assert [m.delivery_id for m in got] == letters  # the same deliveries, moved
    assert [m.id for m in got] == ids
    assert [m.attempts for m in got] == [1, 1, 1]  # attempts reset, then this claim
    assert [m.channel for m in got] == ["dst"] * 3
    info = client.get_message(ids[0])
    assert [(d.channel, d.state) for d in info.deliveries] == [("dst", "in_flight")]
    assert info.expires_at >= clock() + timedelta(days=7)  # a fresh TTL
    client.ack_many(got)
    assert balanced(client, "t", "src") == novaque.Counters(
        published=3, claimed=3, dead=3, purged=3
    )
    assert balanced(client, "t", "dst") == novaque.Counters(
        published=3, claimed=3, acked=3, requeued=3
    )


def test_a_letter_already_live_in_the_target_is_deleted_not_counted(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "src")
    client.ensure_channel("t", "dst")
    ids = client.publish_many("t", ["a", "b", "c"])
    bury(client, "t", "src", 3, clock)
    # dst acked "a", holds "b" still ready and "c" as a dead letter of its own.
    a, b, c = client.claim("t", "dst", max_messages=3)
    client.ack(a)
    client.requeue(b, delay=0)
    client.reject(c)
    assert client.requeue_dead("t", "src", to_channel="dst") == 1  # only "a" moves
    assert client.channel_backlog("t", "src") == Backlog()
    assert client.channel_backlog("t", "dst") == Backlog(ready=2, dead=1)
    assert [d.state for d in client.get_message(ids[1]).deliveries] == ["ready"]
    assert balanced(client, "t", "src").purged == 3  # one moved, two deleted
    assert balanced(client, "t", "dst").published == 4


def test_move_bypasses_the_target_filter_and_takes_its_budget(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "src")
    client.ensure_channel("t", "dst", filter='headers["tier"] == "gold"', max_attempts=7)
    ids = client.publish_many("t", ["x", "y"], headers={"tier": "basic"}, max_attempts=2)
    assert client.channel_backlog("t", "dst") == Backlog()  # the filter said no
    bury(client, "t", "src", 2, clock)
    assert client.requeue_dead("t", "src", to_channel="dst") == 2
    got = client.claim("t", "dst", max_messages=5)
    assert [m.id for m in got] == ids
    assert {m.max_attempts for m in got} == {7}  # the target's setting
    client.requeue_dead("t", "dst")  # nothing dead there: a no-op
    client.ensure_channel("t", "plain")
    client.ensure_channel("t", "src2")
    # Without a budget of its own the target keeps the letter's.
    only = client.publish("t", "z", max_attempts=2)
    for channel in ("src2",):
        bury(client, "t", channel, 1, clock)
    client.ack_many(client.claim("t", "plain", max_messages=5))
    assert client.requeue_dead("t", "src2", to_channel="plain") == 1
    (moved,) = client.claim("t", "plain")
    assert (moved.id, moved.max_attempts) == (only, 2)


def test_move_into_a_group_fifo_channel_joins_its_group(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "src")
    first, second = client.publish_many("t", ["1", "2"], groups=["g", "g"])
    bury(client, "t", "src", 2, clock)
    client.ensure_channel("t", "fifo", ordering="group_fifo")
    third = client.publish("t", "3", group="g")  # fifo's group g has a head now
    client.ack_many(client.claim("t", "src", max_messages=5))
    assert client.requeue_dead("t", "src", to_channel="fifo") == 2
    # Group g: the moved ones keep their delivery ids, lower than its waiting
    # head's (3): they go first, in delivery-id order, one at a time, then 3.
    order = []
    for _ in range(3):
        got = client.claim("t", "fifo", max_messages=5)
        assert len(got) == 1
        order.append(got[0].id)
        client.ack(got[0])
    assert order == [first, second, third]
    assert client.claim("t", "fifo") == []


def test_move_into_strict_fifo_and_out_of_ordered_channels(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "src")
    ids = client.publish_many("t", ["a", "b"], groups=["a", "b"])
    bury(client, "t", "src", 2, clock)
    client.ensure_channel("t", "strict", ordering="strict_fifo")
    assert client.requeue_dead("t", "src", to_channel="strict") == 2
    assert [m.id for m in client.claim("t", "strict", max_messages=5)] == [ids[0]]

    client.ensure_channel("t", "fifo", ordering="group_fifo")
    late = client.publish_many("t", ["c", "d"], groups=["h", "h"])
    client.ack_many(client.claim("t", "src", max_messages=5))
    for msg in client.claim("t", "fifo", max_messages=5):  # the group's head only
        client.reject(msg)
    client.ensure_channel("t", "std")
    assert client.requeue_dead("t", "fifo", to_channel="std") == 1
    assert [m.id for m in client.claim("t", "std", max_messages=5)] == [late[0]]
    # fifo's group moved on when its head died: the second one is claimable.
    assert [m.id for m in client.claim("t", "fifo")] == [late[1]]


def test_move_to_the_same_channel_is_a_plain_requeue(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "src")
    client.publish_many("t", ["a", "b"])
    bury(client, "t", "src", 2, clock)
    assert client.requeue_dead("t", "src", to_channel="src") == 2
    assert client.channel_backlog("t", "src") == Backlog(ready=2)
    assert balanced(client, "t", "src").requeued == 2


def test_missing_channels_raise(client: novaque.Client, clock: FakeClock) -> None:
    late_target(client, 1, clock)
    with pytest.raises(novaque.ChannelNotFound, match="'nope' of topic 't'"):
        client.requeue_dead("t", "src", to_channel="nope")
    with pytest.raises(novaque.ChannelNotFound):
        client.requeue_dead("t", "nope", to_channel="dst")
    with pytest.raises(novaque.TopicNotFound):
        client.delete_dead("nope", "src", limit=1)
    assert client.channel_backlog("t", "src") == Backlog(dead=1)  # nothing moved


# -- limit and died_before ----------------------------------------------------------------


def test_limit_takes_the_oldest_died_first(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("t", "src")
    client.publish_many("t", [str(i) for i in range(6)])
    msgs = client.claim("t", "src", max_messages=6)
    died = []
    for i in (3, 0, 5, 1, 4, 2):  # die in an order unlike delivery ids
        client.reject(msgs[i])
        died.append(msgs[i].delivery_id)
        clock.advance(1)
    assert client.requeue_dead("t", "src", limit=2) == 2
    assert sorted(m.delivery_id for m in client.claim("t", "src", max_messages=9)) == sorted(
        died[:2]
    )
    assert client.delete_dead("t", "src", limit=1) == 1
    left = [x.delivery_id for x in client.list_dead("t", "src")]
    assert sorted(left) == sorted(died[3:])
    # With ids too: the oldest died among them.
    assert client.delete_dead("t", "src", [died[5], died[4]], limit=1) == 1
    assert sorted(x.delivery_id for x in client.list_dead("t", "src")) == sorted([died[3], died[5]])
    assert client.delete_dead("t", "src", limit=2**63 - 1) == 2  # any 64-bit count


def test_died_before_takes_only_older_letters(client: novaque.Client, clock: FakeClock) -> None:
    ids, letters = late_target(client, 4, clock)  # died at t0, t0+1 s, t0+2 s, t0+3 s
    first_death = client.list_dead("t", "src")[0].died_at
    cut = first_death + timedelta(seconds=2)  # the first two died earlier
    assert client.requeue_dead("t", "src", died_before=cut, to_channel="dst") == 2
    assert sorted(m.delivery_id for m in client.claim("t", "dst", max_messages=9)) == letters[:2]
    assert client.delete_dead("t", "src", [letters[3]], died_before=cut) == 0
    assert client.delete_dead("t", "src", died_before=cut + timedelta(seconds=1)) == 1
    assert client.requeue_dead("t", "src", died_before=first_death) == 0
    assert [x.delivery_id for x in client.list_dead("t", "src")] == [letters[3]]
    later = cut + timedelta(days=1)
    assert client.requeue_dead("t", "src", limit=5, died_before=later) == 1
    assert ids


def test_batches_see_every_letter(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, maintenance_batch=3)
    client.ensure_channel("t", "src")
    client.publish_many("t", [str(i) for i in range(8)])
    letters = bury(client, "t", "src", 8, clock)
    client.ensure_channel("t", "dst")
    assert client.requeue_dead("t", "src", to_channel="dst", limit=7) == 7
    assert [x.delivery_id for x in client.list_dead("t", "src")] == [letters[7]]
    assert client.requeue_dead("t", "src", to_channel="dst") == 1
    assert client.channel_backlog("t", "dst") == Backlog(ready=8)


# -- rate ---------------------------------------------------------------------------------


class _Recorded:
    """An event whose wait returns at once, recording how long it was asked to wait."""

    def __init__(self, asked: list[float]) -> None:
        self.asked = asked

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.asked.append(timeout)
        return False


class RecordingWaits:
    """Waits whose events record what a paced call asked for, without waiting."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.asked: list[float] = []

    def event(self) -> _Recorded:
        return _Recorded(self.asked)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_rate_works_in_paced_chunks_of_one_transaction(
    client: novaque.Client, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    late_target(client, 5, clock)
    chunks: list[int] = []
    real_batch = browse.dead_batch

    def counted(conn: sa.Connection, dialect: Any, now: int, work: Any, *rest: Any) -> Any:
        seen, done, last, effects = real_batch(conn, dialect, now, work, *rest)
        chunks.append(done)
        return seen, done, last, effects

    monkeypatch.setattr(browse, "dead_batch", counted)
    waits = RecordingWaits(core(client)._context.waits)
    monkeypatch.setattr(core(client)._context, "waits", waits)
    # 2 letters a second: chunks of 2, and before each later chunk a wait until
    # the letters done so far fit the rate (about 1 s, then about 2 s: the
    # recorded waits return at once).
    assert client.requeue_dead("t", "src", to_channel="dst", rate=2) == 5
    assert chunks == [2, 2, 1]
    assert len(waits.asked) == 2
    assert 0 < waits.asked[0] <= 1.0
    assert 1.0 < waits.asked[1] <= 2.0
    assert client.channel_backlog("t", "dst") == Backlog(ready=5)

    # A high rate: chunks bounded by Options.maintenance_batch (100), no long wait.
    chunks.clear()
    waits.asked.clear()
    for msg in client.claim("t", "dst", max_messages=5):
        client.reject(msg)
    assert client.requeue_dead("t", "dst", rate=10_000, limit=4) == 4
    assert chunks == [4]
    assert waits.asked == []


def test_rate_with_ids_paces_each_chunk(
    client: novaque.Client, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, letters = late_target(client, 3, clock)
    waits = RecordingWaits(core(client)._context.waits)
    monkeypatch.setattr(core(client)._context, "waits", waits)
    assert client.requeue_dead("t", "src", letters, rate=1.5) == 3  # chunks of 1
    assert len(waits.asked) == 2
    assert all(0 < asked <= 2 / 1.5 for asked in waits.asked)


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit": 0}, "limit must be between 1 and"),
        ({"limit": "5"}, "limit must be an integer, got str"),
        ({"limit": True}, "limit must be an integer, got bool"),
        ({"died_before": "2024-01-01"}, "died_before must be a timezone-aware datetime"),
        ({"died_before": datetime(2024, 1, 1)}, "died_before must be timezone-aware"),
        ({"rate": 0}, "rate must be a finite number of letters per second > 0, got 0"),
        ({"rate": -1.5}, "got -1.5"),
        ({"rate": float("inf")}, "got inf"),
        ({"rate": float("nan")}, "got nan"),
        ({"rate": 10**400}, "got a huge int"),
        ({"rate": "fast"}, "rate must be a number of letters per second"),
        ({"rate": True}, "got bool"),
    ],
)
def test_bad_arguments_raise_invalid_option(
    client: novaque.Client, clock: FakeClock, kwargs: dict[str, Any], message: str
) -> None:
    late_target(client, 1, clock)
    with pytest.raises(novaque.InvalidOption, match=message):
        client.requeue_dead("t", "src", to_channel="dst", **kwargs)
    if "rate" not in kwargs:
        with pytest.raises(novaque.InvalidOption, match=message):
            client.delete_dead("t", "src", **kwargs)
    assert client.channel_backlog("t", "src") == Backlog(dead=1)


def test_bad_to_channel_names_raise(client: novaque.Client, clock: FakeClock) -> None:
    late_target(client, 1, clock)
    with pytest.raises(novaque.InvalidName, match="invalid to_channel name"):
        client.requeue_dead("t", "src", to_channel="a b")


# -- cancel -------------------------------------------------------------------------------


def test_cancel_deletes_never_attempted_deliveries(
    client: novaque.Client, clock: FakeClock
) -> None:
    for channel in ("a", "b", "c"):
        client.ensure_channel("t", channel)
    scheduled = client.publish("t", "later", delay=3600)
    assert client.cancel(scheduled) == 3
    info = client.get_message(scheduled)  # still browsable
    assert (info.body, info.deliveries) == (b"later", [])
    assert client.cancel(scheduled) == 0

    now = client.publish("t", "now")
    (leased,) = client.claim("t", "a")  # leased: stays
    (tried,) = client.claim("t", "b")
    client.requeue(tried, delay=60)  # attempted once: stays
    assert client.cancel(now) == 1  # only c's
    states = {d.channel: (d.state, d.attempts) for d in client.get_message(now).deliveries}
    assert states == {"a": ("in_flight", 1), "b": ("pending", 1)}
    client.reject(leased)
    assert client.cancel(now) == 0  # dead letters stay too
    for channel in ("a", "b", "c"):
        counters = balanced(client, "t", channel)
        assert counters.purged == {"a": 1, "b": 1, "c": 2}[channel]


def test_cancel_counts_a_delivery_snoozed_on_its_first_attempt(
    client: novaque.Client, backend: Backend
) -> None:
    client.ensure_channel("t", "a")
    message_id = client.publish("t", "x")
    (msg,) = client.claim("t", "a")
    client.requeue(msg, delay=60)
    # What snooze leaves after a first attempt: ready (pending), attempts 0.
    engine = sa.create_engine(backend.url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.update(deliveries).values(attempts=0))
    finally:
        engine.dispose()
    assert client.cancel(message_id) == 1
    assert client.channel_backlog("t", "a") == Backlog()


def test_cancel_in_an_ordered_channel_moves_the_group_on(client: novaque.Client) -> None:
    client.ensure_channel("t", "fifo", ordering="group_fifo")
    first, second, third = client.publish_many("t", ["1", "2", "3"], groups=["g"] * 3)
    assert client.cancel(third) == 1  # parked behind the head
    assert client.cancel(first) == 1  # the head: the next one heads the group
    (got,) = client.claim("t", "fifo", max_messages=5)
    assert got.id == second
    client.ack(got)
    assert client.claim("t", "fifo") == []
    assert client.channel_backlog("t", "fifo") == Backlog()


def test_cancel_of_a_missing_or_bad_id_raises(client: novaque.Client) -> None:
    with pytest.raises(novaque.MessageNotFound, match="message 123456 does not exist"):
        client.cancel(123456)
    with pytest.raises(novaque.InvalidOption, match="message_id must be between 1 and"):
        client.cancel(0)
    with pytest.raises(novaque.InvalidOption, match="message_id must be an integer, got str"):
        client.cancel("7")  # type: ignore[arg-type]


@pytest.mark.sync_only
def test_concurrent_moves_into_one_channel_leave_one_delivery_per_message(
    backend: Backend, clock: FakeClock
) -> None:
    """Two channels' letters of the same messages moved into one channel at once
    (two clients, two connections): each message ends with one delivery there."""
    import threading

    clients = [backend.client(clock=clock, maintenance_batch=10) for _ in range(2)]
    setup = clients[0]
    setup.ensure_channel("t", "s1")
    setup.ensure_channel("t", "s2")
    count = 300
    setup.publish_many("t", [str(i) for i in range(count)])
    for channel in ("s1", "s2"):
        for msg in setup.claim("t", channel, max_messages=count):
            setup.reject(msg)
    setup.ensure_channel("t", "dst")
    clients[1].list_topics()  # connected, schema checked: both start at once
    start = threading.Barrier(2)
    moved: dict[str, int] = {}

    def move(client: novaque.Client, channel: str) -> None:
        start.wait(timeout=30)
        moved[channel] = client.requeue_dead("t", channel, to_channel="dst")

    threads = [
        threading.Thread(target=move, args=(c, name))
        for c, name in zip(clients, ("s1", "s2"), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sum(moved.values()) == count
    assert setup.channel_backlog("t", "dst") == Backlog(ready=count)
    assert setup.channel_backlog("t", "s1") == setup.channel_backlog("t", "s2") == Backlog()
    for client in clients:
        client.flush_stats()
    purged = [setup.channel_counters("t", c).purged for c in ("s1", "s2")]
    assert purged == [count, count]  # each letter left its channel once: moved or deleted
