"""Counters: exact after a scripted sequence, per UTC day, safe under concurrent flushes."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from typing import Any

import pytest

import novaque
from novaque import Counters
from novaque.testing import FakeClock
from tests import _preloaded, _procs
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")


def test_scripted_sequence_yields_exact_counters(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("t", "a")
    client.ensure_channel("t", "b")
    m0, m1, m2, m3 = client.publish_many("t", [b"0", b"1", b"2", b"3"])
    m4 = client.publish("t", b"4", max_attempts=1)
    assert client.channel_counters("t", "a") == Counters()  # reads flushed buckets only

    first = client.claim("t", "a", max_messages=5)
    assert [m.id for m in first] == [m0, m1, m2, m3, m4]
    client.ack(first[0])
    client.requeue(first[1], delay=0)
    client.reject(first[2], "bad input")
    client.requeue(first[3], delay=60)
    clock.advance(31)  # m4's lease expires; it had its only attempt
    assert client.reap_leases() == 1
    again = client.claim("t", "a", max_messages=5)
    assert [m.id for m in again] == [m1]
    client.ack(again[0])
    assert client.requeue_dead("t", "a") == 2  # m2 and m4
    third = client.claim("t", "a", max_messages=5)
    assert [m.id for m in third] == [m2, m4]
    for msg in third:
        client.reject(msg)
    dead = client.list_dead("t", "a")
    assert client.delete_dead("t", "a", [dead[0].delivery_id]) == 1
    assert client.replay(m0) == 1  # a acked m0; b still holds it
    clock.advance(days=8)
    client.run_maintenance()  # TTL purge, then the flush

    a = Counters(published=6, claimed=8, acked=2, requeued=4, dead=4, purged=4)
    b = Counters(published=5, purged=5)
    assert client.channel_counters("t", "a") == a
    assert client.channel_counters("t", "b") == b
    assert client.topic_counters("t") == a + b
    # Every delivery is accounted for: published = acked + purged once nothing is live.
    assert a.published == a.acked + a.purged
    assert client.channel_backlog("t", "a") == novaque.Backlog()


def test_prune_and_retention_count_as_purged(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("t", "a", dead_max_count=1)
    client.publish_many("t", [b"1", b"2", b"3"])
    for msg in client.claim("t", "a", max_messages=2):
        client.reject(msg)
    assert client.enforce_dead_retention() == 1
    clock.advance(1)
    assert client.prune(clock()) == 3
    client.flush_stats()
    assert client.channel_counters("t", "a") == Counters(published=3, claimed=2, dead=2, purged=3)


def test_counters_fall_on_utc_days(client: novaque.Client, clock: FakeClock) -> None:
    clock.set(datetime(2030, 1, 1, 23, 59, 59, tzinfo=timezone.utc))
    client.ensure_channel("t", "a")
    client.publish_many("t", [b"1", b"2"])
    clock.advance(2)  # 2030-01-02 00:00:01
    client.ack(client.claim("t", "a")[0])
    clock.advance(days=3)  # nothing happens on the 3rd and 4th
    client.publish("t", b"3")
    client.flush_stats()  # one flush carries three days

    d1, d2, d5 = date(2030, 1, 1), date(2030, 1, 2), date(2030, 1, 5)
    assert client.daily_counters("t", "a") == [
        (d1, Counters(published=2)),
        (d2, Counters(claimed=1, acked=1)),
        (d5, Counters(published=1)),
    ]
    assert client.daily_counters("t", "a", since=d2, until=d2) == [
        (d2, Counters(claimed=1, acked=1))
    ]
    assert client.channel_counters("t", "a", until=d1) == Counters(published=2)
    assert client.channel_counters("t", "a", since=d2) == Counters(published=1, claimed=1, acked=1)
    assert client.channel_counters("t", "a", since=d1, until=d5) == Counters(
        published=3, claimed=1, acked=1
    )
    assert client.topic_counters("t", since=date(2030, 1, 3), until=date(2030, 1, 4)) == (
        Counters()
    )
    assert client.daily_counters("t", "a", since=date(2030, 1, 6)) == []


@pytest.mark.sync_only
def test_two_processes_flushing_one_bucket_lose_no_increment(backend: Backend) -> None:
    setup = backend.client()
    setup.ensure_channel("race", "c")
    at = datetime(2030, 6, 1, 12, tzinfo=timezone.utc).isoformat()
    ctx = _preloaded.context
    barrier, out = ctx.Barrier(2), ctx.Queue()
    plan = [(40, 15), (30, 25)]  # (published, acked) per process
    procs = [
        _preloaded.process(_procs.publish_and_flush, (backend.url, at, n, k, barrier, out))
        for n, k in plan
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert [status for status, _ in results] == ["ok", "ok"], results
    assert setup.daily_counters("race", "c") == [
        (date(2030, 6, 1), Counters(published=70, claimed=40, acked=40))
    ]


def test_stats_reads_of_missing_names_raise_and_create_nothing(client: novaque.Client) -> None:
    reads: list[Any] = [
        lambda t, c: client.channel_counters(t, c),
        lambda t, c: client.daily_counters(t, c),
        lambda t, c: client.channel_backlog(t, c),
        lambda t, c: client.list_dead(t, c),
        lambda t, c: client.requeue_dead(t, c),
        lambda t, c: client.delete_dead(t, c, [1]),
    ]
    for read in reads:
        with pytest.raises(novaque.TopicNotFound, match="'nope'"):
            read("nope", "c")
    for read in (client.topic_counters, client.topic_backlog, client.list_messages):
        with pytest.raises(novaque.TopicNotFound):
            read("nope")
    now = datetime.now(timezone.utc)
    with pytest.raises(novaque.TopicNotFound):
        client.replay_range("nope", now - timedelta(hours=1), now)
    assert client.list_topics() == []

    client.ensure_topic("t")
    for read in reads:
        with pytest.raises(novaque.ChannelNotFound, match="'typo' of topic 't'"):
            read("t", "typo")
    assert client.list_channels("t") == []
    assert client.list_topics() == ["t"]


def test_counter_windows_are_checked(client: novaque.Client) -> None:
    client.ensure_channel("t", "a")
    with pytest.raises(novaque.InvalidOption, match=r"since must be a datetime\.date"):
        client.channel_counters("t", "a", since=datetime.now(timezone.utc))  # type: ignore[arg-type]
    with pytest.raises(novaque.InvalidOption, match="until must be"):
        client.topic_counters("t", until="2030-01-01")  # type: ignore[arg-type]
    with pytest.raises(novaque.InvalidOption, match=r"since \(2030-01-02\) must not be after"):
        client.daily_counters("t", "a", since=date(2030, 1, 2), until=date(2030, 1, 1))
    with pytest.raises(novaque.InvalidName):
        client.channel_counters("t", "bad name")
