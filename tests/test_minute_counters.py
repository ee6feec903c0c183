"""Live throughput (DESIGN §10): counters per UTC minute for the last 24 hours."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

import novaque
from novaque import Counters
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")

NOON = datetime(2026, 6, 1, 12, 0, 10, tzinfo=timezone.utc)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOON)


def minute(hh: int, mm: int) -> datetime:
    return datetime(2026, 6, 1, hh, mm, tzinfo=timezone.utc)


def test_each_event_counts_in_its_minute_by_the_clock(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "a")
    client.publish_many("t", [b"1", b"2", b"3"])  # 12:00
    clock.advance(60)  # 12:01
    [first, second] = client.claim("t", "a", max_messages=2)
    client.ack(first)
    clock.advance(120)  # 12:03 (12:02 has no activity)
    client.requeue(second, delay=0)
    client.flush_stats()

    assert client.minute_counters("t", "a") == [
        (minute(12, 0), Counters(published=3)),
        (minute(12, 1), Counters(claimed=2, acked=1)),
        (minute(12, 3), Counters(requeued=1)),
    ]
    # The daily buckets hold the same events.
    assert client.daily_counters("t", "a") == [
        (date(2026, 6, 1), Counters(published=3, claimed=2, acked=1, requeued=1))
    ]
    # since: aware, inclusive of the minute it falls in.
    since = minute(12, 1) + timedelta(seconds=59)
    assert [m for m, _ in client.minute_counters("t", "a", since=since)] == [
        minute(12, 1),
        minute(12, 3),
    ]
    assert client.minute_counters("t", "a", since=minute(12, 4)) == []
    tokyo = timezone(timedelta(hours=9))
    assert len(client.minute_counters("t", "a", since=minute(12, 3).astimezone(tokyo))) == 1


def test_minutes_are_aware_utc_and_several_flushes_add_up(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "a")
    client.publish("t", b"x")
    client.flush_stats()
    client.publish("t", b"y")
    client.flush_stats()
    [(at, counters)] = client.minute_counters("t", "a")
    assert at.tzinfo is not None
    assert at.utcoffset() == timedelta(0)
    assert (at.second, at.microsecond) == (0, 0)
    assert counters == Counters(published=2)


def test_minutes_older_than_a_day_are_not_read_and_are_pruned(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "a")
    client.publish("t", b"old")  # 12:00 on June 1st
    client.flush_stats()
    clock.advance(hours=23, minutes=59)  # 11:59 on June 2nd: still within the day
    client.publish("t", b"new")
    client.flush_stats()
    assert len(client.minute_counters("t", "a")) == 2
    clock.advance(minutes=2)  # 12:01: the first minute is more than 24 h old
    assert [c.published for _, c in client.minute_counters("t", "a")] == [1]
    # Still stored until maintenance prunes it (asked for explicitly here).
    assert len(client.minute_counters("t", "a", since=minute(0, 0))) == 2
    client.run_maintenance()
    assert len(client.minute_counters("t", "a", since=minute(0, 0))) == 1
    # The daily buckets are kept by their own retention.
    assert [c.published for _, c in client.daily_counters("t", "a")] == [1, 1]


def test_counts_of_a_deleted_channel_are_dropped_with_it(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "a")
    client.ensure_channel("t", "b")
    client.publish("t", b"x")
    client.delete_channel("t", "a")
    client.flush_stats()
    assert [c for _, c in client.minute_counters("t", "b")] == [Counters(published=1)]
    with pytest.raises(novaque.ChannelNotFound):
        client.minute_counters("t", "a")


def test_reads_create_nothing_and_refuse_bad_input(client: novaque.Client) -> None:
    with pytest.raises(novaque.TopicNotFound):
        client.minute_counters("nope", "a")
    client.ensure_topic("t")
    with pytest.raises(novaque.ChannelNotFound):
        client.minute_counters("t", "a")
    client.ensure_channel("t", "a")
    assert client.minute_counters("t", "a") == []
    with pytest.raises(novaque.InvalidOption, match="naive"):
        client.minute_counters("t", "a", since=datetime(2026, 1, 1))
    with pytest.raises(novaque.InvalidOption, match="since must be a timezone-aware datetime"):
        client.minute_counters("t", "a", since=date(2026, 1, 1))  # type: ignore[arg-type]
    with pytest.raises(novaque.InvalidName):
        client.minute_counters("t", "bad name")
    assert client.list_topics() == ["t"]


@pytest.mark.sync_only
def test_a_publish_in_a_transaction_on_another_database_counts_its_minute_there(
    backend: Backend, client: novaque.Client, clock: FakeClock, tmp_path: Path
) -> None:
    elsewhere_engine = backend.engine(backend.scratch_url(tmp_path))
    elsewhere = novaque.Client(elsewhere_engine, novaque.Options(clock=clock))
    elsewhere.migrate()
    elsewhere.ensure_channel("t", "c")
    with Session(elsewhere_engine) as session, session.begin():
        client.publish("t", b"there", session=session)
    # Written in the publishing transaction, in the minute of the client's clock.
    assert elsewhere.minute_counters("t", "c") == [(minute(12, 0), Counters(published=1))]
