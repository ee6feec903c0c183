"""Schedules: recurring publishes defined by name, fired by maintenance
exactly once across clients; cron (with its time zone's daylight-saving
changes) and fixed-grid periods, catch-up rules, pause/resume, replacement,
validation; on both twins (the concurrency test on threads of sync clients)."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import novaque
from novaque import _fires
from novaque.ops import schedules as schedules_op
from tests.conftest import Backend, FakeClock

pytestmark = pytest.mark.usefixtures("twin")

UTC = timezone.utc
START = datetime(2030, 1, 1, 8, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


def fired(client: novaque.Client, topic: str = "reports", channel: str = "mailer") -> list[Any]:
    """The messages published to ``topic`` since the last call, acked, by fire time."""
    msgs = client.claim(topic, channel, max_messages=1000)
    client.ack_many(msgs)
    return sorted(msgs, key=lambda m: m.headers["novaque-fire-at"])


def fire_times(msgs: list[Any]) -> list[str]:
    return [m.headers["novaque-fire-at"] for m in msgs]


def test_every_fires_on_a_fixed_grid_from_the_call_with_its_headers(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("reports", "mailer")
    info = client.schedule(
        "tick", "reports", b"go", every=60, headers={"kind": "report", "novaque-schedule": "x"}
    )
    assert info == novaque.ScheduleInfo(
        name="tick",
        topic="reports",
        cron=None,
        every=timedelta(seconds=60),
        timezone="UTC",
        next_fire_at=START + timedelta(seconds=60),
        last_fire_at=None,
        paused=False,
        catch_up="latest",
    )
    client.run_maintenance()
    assert fired(client) == []  # not due yet
    clock.advance(61.5)
    client.run_maintenance()
    (msg,) = fired(client)
    assert msg.body == b"go"
    assert msg.headers == {
        "kind": "report",
        "novaque-schedule": "tick",
        "novaque-fire-at": "2030-01-01T08:01:00+00:00",
    }
    assert msg.published_at == START + timedelta(seconds=61.5)
    client.run_maintenance()
    assert fired(client) == []  # once
    clock.advance(58.5)  # 08:02:00 exactly: due (time <= clock), on the grid
    client.run_maintenance()
    assert fire_times(fired(client)) == ["2030-01-01T08:02:00+00:00"]
    got = client.get_schedule("tick")
    assert got.last_fire_at == START + timedelta(minutes=2)
    assert got.next_fire_at == START + timedelta(minutes=3)


def test_a_schedules_fires_carry_its_priority(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("reports", "mailer")
    info = client.schedule("urgent", "reports", b"now!", every=60, priority=-20)
    assert info.priority == -20
    assert client.list_schedules() == [info]
    client.publish("reports", b"earlier, plain")
    clock.advance(61)
    client.run_maintenance()
    got = client.claim("reports", "mailer", max_messages=10)
    assert [(m.body, m.priority) for m in got] == [(b"now!", -20), (b"earlier, plain", 0)]
    # replacing the definition takes its priority (omitted: back to 0)
    assert client.schedule("urgent", "reports", b"now!", every=60).priority == 0


@pytest.mark.parametrize(("value", "error"), [(None, TypeError), (101, novaque.InvalidOption)])
def test_a_bad_schedule_priority_stores_nothing(
    client: novaque.Client, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="priority must be"):
        client.schedule("s", "reports", every=60, priority=value)  # type: ignore[arg-type]
    assert client.list_schedules() == []


def test_cron_fires_in_its_time_zone(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("reports", "mailer")
    info = client.schedule("morning", "reports", cron="0 9 * * 1-5", timezone="Europe/Paris")
    # 2030-01-01 is a Tuesday: its 09:00 in Paris (08:00 UTC) is the clock, not after it.
    assert info.next_fire_at == datetime(2030, 1, 2, 8, 0, tzinfo=UTC)
    assert info.timezone == "Europe/Paris"
    assert info.cron == "0 9 * * 1-5"
    assert info.every is None
    clock.advance(days=1)  # 2030-01-02 08:00 UTC: due
    client.run_maintenance()
    assert fire_times(fired(client)) == ["2030-01-02T08:00:00+00:00"]
    assert client.get_schedule("morning").next_fire_at == datetime(2030, 1, 3, 8, tzinfo=UTC)
    clock.advance(days=4)  # Sunday 2030-01-06 08:00: missed Thu, Fri; latest is Friday's
    client.run_maintenance()
    assert fire_times(fired(client)) == ["2030-01-04T08:00:00+00:00"]
    assert client.get_schedule("morning").next_fire_at == datetime(2030, 1, 7, 8, tzinfo=UTC)


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("latest", ["08:10:00"]),
        ("none", ["08:09:20", "08:09:40", "08:10:00"]),
        ("all", [*[f"08:{m:02d}:{s:02d}" for m in range(10) for s in (0, 20, 40)][1:], "08:10:00"]),
    ],
)
def test_missed_fires_follow_catch_up(
    client: novaque.Client, clock: FakeClock, how: str, expected: list[str]
) -> None:
    client.ensure_channel("reports", "mailer")
    client.schedule("tick", "reports", every=20, catch_up=how)
    clock.advance(minutes=10, seconds=10)  # 08:10:10; fires 08:00:20 .. 08:10:00 missed
    client.run_maintenance()
    assert fire_times(fired(client)) == [f"2030-01-01T{t}+00:00" for t in expected]
    info = client.get_schedule("tick")
    assert info.catch_up == how
    assert info.next_fire_at == datetime(2030, 1, 1, 8, 10, 20, tzinfo=UTC)
    assert info.last_fire_at == datetime(2030, 1, 1, 8, 10, tzinfo=UTC)


def test_none_skips_a_fire_more_than_a_minute_late(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("reports", "mailer")
    client.schedule("hourly", "reports", cron="0 * * * *", catch_up="none")
    clock.advance(hours=1, seconds=61)  # 09:01:01: the 09:00 fire is 61 s late
    client.run_maintenance()
    assert fired(client) == []
    info = client.get_schedule("hourly")
    assert info.last_fire_at is None
    assert info.next_fire_at == datetime(2030, 1, 1, 10, tzinfo=UTC)
    clock.advance(minutes=59)  # 10:00:01
    client.run_maintenance()
    assert fire_times(fired(client)) == ["2030-01-01T10:00:00+00:00"]


def test_all_publishes_at_most_a_thousand_fires_a_pass(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("reports", "mailer")
    client.schedule("fast", "reports", every=1, catch_up="all")
    clock.advance(1200)
    client.run_maintenance()
    first = fired(client)
    assert len(first) == _fires.MAX_FIRES_PER_PASS
    assert client.get_schedule("fast").next_fire_at == START + timedelta(seconds=1001)
    client.run_maintenance()
    rest = fired(client)
    assert len(rest) == 200
    times = fire_times(first + rest)
    assert times == [(START + timedelta(seconds=k)).isoformat() for k in range(1, 1201)]
    assert client.get_schedule("fast").next_fire_at == START + timedelta(seconds=1201)


def test_the_spring_gap_fires_at_the_next_minute_that_exists(backend: Backend, twin: str) -> None:
    # Paris, 2027-03-28: 02:00 local jumps to 03:00 (00:59:59 UTC -> 01:00 UTC).
    clock = FakeClock(datetime(2027, 3, 27, 12, tzinfo=UTC))
    client = backend.client(clock=clock)
    client.ensure_channel("reports", "mailer")
    info = client.schedule(
        "night", "reports", cron="30 2 * * *", timezone="Europe/Paris", catch_up="all"
    )
    assert info.next_fire_at == datetime(2027, 3, 28, 1, 0, tzinfo=UTC)  # 03:00 CEST
    clock.advance(days=2)  # 2027-03-29 12:00 UTC
    client.run_maintenance()
    assert fire_times(fired(client)) == [
        "2027-03-28T01:00:00+00:00",  # 02:30 does not exist: 03:00 local
        "2027-03-29T00:30:00+00:00",  # 02:30 CEST
    ]


def test_the_autumn_repeat_fires_once_the_first_time(backend: Backend, twin: str) -> None:
    # Paris, 2027-10-31: 03:00 CEST goes back to 02:00 CET (01:00 UTC).
    clock = FakeClock(datetime(2027, 10, 30, 12, tzinfo=UTC))
    client = backend.client(clock=clock)
    client.ensure_channel("reports", "mailer")
    client.schedule(
        "night", "reports", cron="*/30 2 * * *", timezone="Europe/Paris", catch_up="all"
    )
    clock.advance(days=2)  # 2027-11-01 12:00 UTC
    client.run_maintenance()
    assert fire_times(fired(client)) == [
        "2027-10-31T00:00:00+00:00",  # 02:00 CEST
        "2027-10-31T00:30:00+00:00",  # 02:30 CEST (not again at 02:00, 02:30 CET)
        "2027-11-01T01:00:00+00:00",  # 02:00 CET
        "2027-11-01T01:30:00+00:00",
    ]


def test_replacing_keeps_paused_and_last_fire_and_resets_the_rest(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("reports", "mailer")
    client.ensure_channel("other", "mailer")
    client.schedule("job", "reports", b"one", every=60, catch_up="all", headers={"a": "1"})
    clock.advance(60)
    client.run_maintenance()
    assert len(fired(client)) == 1
    client.pause_schedule("job")
    clock.advance(30)
    info = client.schedule("job", "other", b"two", cron="*/5 * * * *")
    assert info == novaque.ScheduleInfo(
        name="job",
        topic="other",
        cron="*/5 * * * *",
        every=None,
        timezone="UTC",
        next_fire_at=datetime(2030, 1, 1, 8, 5, tzinfo=UTC),
        last_fire_at=START + timedelta(seconds=60),
        paused=True,
        catch_up="latest",
    )
    clock.advance(minutes=10)
    client.run_maintenance()
    assert fired(client, "other") == []  # paused
    client.resume_schedule("job")
    client.run_maintenance()
    (msg,) = fired(client, "other")
    assert msg.body == b"two"
    assert msg.headers == {
        "novaque-schedule": "job",
        "novaque-fire-at": "2030-01-01T08:10:00+00:00",
    }
    assert fired(client) == []


def test_pause_resume_list_and_unschedule(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("reports", "mailer")
    client.schedule("b", "reports", every=10)
    client.schedule("a", "reports", every=10, catch_up="none")
    assert [s.name for s in client.list_schedules()] == ["a", "b"]
    assert client.pause_schedule("a").paused is True
    assert client.pause_schedule("a").paused is True
    clock.advance(35)
    client.run_maintenance()
    assert [m.headers["novaque-schedule"] for m in fired(client)] == ["b"]
    assert client.resume_schedule("a").paused is False
    client.run_maintenance()
    # catch_up="none": the fires at most 60 s late (08:00:10 .. 08:00:30).
    assert [m.headers["novaque-schedule"] for m in fired(client)] == ["a", "a", "a"]
    assert client.unschedule("a") is True
    assert client.unschedule("a") is False
    assert [s.name for s in client.list_schedules()] == ["b"]
    for call in (client.get_schedule, client.pause_schedule, client.resume_schedule):
        with pytest.raises(novaque.ScheduleNotFound, match="no schedule named 'a'") as err:
            call("a")
        assert err.value.name == "a"
        assert isinstance(err.value, LookupError)


def test_a_fire_creates_its_topic_and_takes_ttl_and_max_attempts(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.schedule("job", "fresh", every=5, ttl=300, max_attempts=2)
    assert "fresh" in client.list_topics()
    client.ensure_channel("fresh", "w")
    clock.advance(5)
    client.run_maintenance()
    (msg,) = client.claim("fresh", "w")
    info = client.get_message(msg.id)
    assert info.expires_at == START + timedelta(seconds=305)
    assert msg.max_attempts == 2


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({}, novaque.InvalidOption, "exactly one of cron= .* and every="),
    ({"cron": "* * * * *", "every": 5}, novaque.InvalidOption, "exactly one of"),
    ({"every": 0.5}, novaque.InvalidOption, "every must be from 1 s"),
    ({"every": "5"}, TypeError, "every must be a duration"),
    ({"every": True}, TypeError, "every must be a duration"),
    ({"every": -1}, novaque.InvalidOption, "every"),
    ({"cron": "@daily"}, novaque.InvalidOption, "exactly 5 fields .*no @daily"),
    ({"cron": "* * * *"}, novaque.InvalidOption, "exactly 5 fields"),
    ({"cron": "0 * * * * *"}, novaque.InvalidOption, "exactly 5 fields"),
    ({"cron": "61 * * * *"}, novaque.InvalidOption, "not a valid cron expression"),
    ({"cron": "0 0 31 2 *"}, novaque.InvalidOption, "not a valid cron expression"),
    ({"cron": 5}, TypeError, "cron must be a str"),
    ({"every": 5, "timezone": "Mars/Olympus"}, novaque.InvalidOption, "not an IANA time zone"),
    ({"every": 5, "timezone": "../etc/passwd"}, novaque.InvalidOption, "not an IANA"),
    ({"every": 5, "timezone": None}, TypeError, "timezone must be a str"),
    ({"every": 5, "catch_up": "some"}, novaque.InvalidOption, "'latest', 'none' or 'all'"),
    ({"every": 5, "catch_up": None}, novaque.InvalidOption, "'latest', 'none' or 'all'"),
    ({"every": 5, "ttl": 0}, novaque.InvalidOption, "ttl"),
    ({"every": 5, "ttl": "1"}, TypeError, "ttl must be a duration"),
    ({"every": 5, "max_attempts": 0}, novaque.InvalidOption, "max_attempts"),
    ({"every": 5, "max_attempts": 1.5}, TypeError, "max_attempts must be an int"),
    ({"every": 5, "headers": {"a": 1}}, TypeError, "headers must map str to str"),
    ({"every": 5, "body": 5}, TypeError, "body must be bytes or str"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD)
def test_bad_input_raises_and_stores_nothing(
    client: novaque.Client, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    client.schedule("keep", "reports", every=10)
    before = client.list_schedules()
    kwargs = dict(kwargs)  # (shared by the parametrized runs)
    body = kwargs.pop("body", b"")
    with pytest.raises(error, match=match):
        client.schedule("keep", "reports", body, **kwargs)
    with pytest.raises(error, match=match):
        client.schedule("new", "reports", body, **kwargs)
    assert client.list_schedules() == before


def test_bad_names_raise(client: novaque.Client) -> None:
    with pytest.raises(novaque.InvalidName, match="schedule name"):
        client.schedule("no spaces", "reports", every=5)
    with pytest.raises(novaque.InvalidName, match="topic name"):
        client.schedule("ok", "no spaces", every=5)
    with pytest.raises(novaque.InvalidName):
        client.get_schedule("")
    assert client.list_schedules() == []


def test_cron_without_cronsim_names_the_extra(
    client: novaque.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)
    with pytest.raises(ImportError, match=r"novaque\[schedules\]"):
        client.schedule("c", "reports", cron="0 9 * * *")
    client.schedule("e", "reports", every=5)  # every= needs nothing
    assert [s.name for s in client.list_schedules()] == ["e"]


@pytest.mark.sync_only
def test_clients_firing_at_once_publish_every_fire_exactly_once(
    backend: Backend, clock: FakeClock
) -> None:
    """Four clients (own engines and connections) run the schedules step at
    once from threads, several rounds: no fire is published twice or lost."""
    clients = [backend.client(clock=clock) for _ in range(4)]
    clients[0].ensure_channel("reports", "mailer")
    names = [f"s{i}" for i in range(8)]
    for name in names:
        clients[0].schedule(name, "reports", every=1, catch_up="all")
    rounds = 3
    for _ in range(rounds):
        clock.advance(10)
        barrier = threading.Barrier(len(clients))
        errors: list[BaseException] = []

        def run(
            client: novaque.Client,
            barrier: threading.Barrier = barrier,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                barrier.wait(30)
                client.fire_schedules()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(c,)) for c in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
    msgs = []
    while batch := fired(clients[0]):
        msgs += batch
    seen = Counter((m.headers["novaque-schedule"], m.headers["novaque-fire-at"]) for m in msgs)
    assert max(seen.values()) == 1
    assert sorted(seen) == sorted(
        (name, (START + timedelta(seconds=k)).isoformat())
        for name in names
        for k in range(1, 10 * rounds + 1)
    )


@pytest.mark.sync_only
def test_a_started_client_fires_from_its_maintenance_loop(
    backend: Backend, clock: FakeClock
) -> None:
    client = backend.client(clock=clock)
    client.ensure_channel("reports", "mailer")
    client.schedule("tick", "reports", every=5)
    clock.advance(5)
    client.start()
    try:
        msgs = client.claim("reports", "mailer", wait=20)
    finally:
        client.shutdown(timeout=10)
    assert fire_times(msgs) == ["2030-01-01T08:00:05+00:00"]


def test_the_loop_reads_the_schedules_at_their_earliest_fire_or_every_ten_seconds(
    client: novaque.Client,
    backend: Backend,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle client's loop does not read the schedules each second: it waits
    for the earliest fire it read, or 10 s for what other processes define, or
    for this client to define or resume one."""
    client.ensure_channel("reports", "mailer")
    client.schedule("hourly", "reports", every=3600)
    jobs = client._maintenance
    reads: list[int] = []
    due_names = schedules_op.due_names

    def counted(*args: Any) -> list[str]:
        reads.append(1)
        return due_names(*args)

    monkeypatch.setattr(schedules_op, "due_names", counted)
    assert jobs.fire_due_schedules() == 0  # defined here: looked at once
    assert len(reads) == 1
    clock.advance(9)
    assert jobs.fire_due_schedules() == 0
    assert len(reads) == 1  # no fire before 09:00, nothing read
    # Another process defines one that fires sooner (at +14 s): seen at the
    # next read, 10 s after the last.
    other = backend.client(clock=clock)
    other.schedule("often", "reports", every=5)
    clock.advance(1)
    assert jobs.fire_due_schedules() == 0
    assert len(reads) == 2
    clock.advance(3)
    assert jobs.fire_due_schedules() == 0  # +13 s: before its fire, nothing read
    assert len(reads) == 2
    clock.advance(1)
    assert jobs.fire_due_schedules() == 1  # +14 s: its fire, read and published
    assert fire_times(fired(client)) == ["2030-01-01T08:00:14+00:00"]
    client.pause_schedule("often")
    client.resume_schedule("often")  # resumed here: looked at the next tick
    reads.clear()
    jobs.fire_due_schedules()
    assert reads == [1]
