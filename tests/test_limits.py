"""Channel limits (DESIGN §12): max_leased, rate_limit and group_max_leased,
through claim, pop, claim_deferred, ack-and-claim and consumers, counted
across clients; their settings, their bad values; on both twins."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

import novaque
from novaque.schema import STATE_LEASED, deliveries
from tests.conftest import Backend, FakeClock

pytestmark = pytest.mark.usefixtures("twin")

#: A moment on every window's edge (a whole day since the epoch).
EDGE = datetime(2030, 1, 1, tzinfo=timezone.utc)


def publish(client: novaque.Client, count: int, **kwargs: object) -> list[int]:
    return [client.publish("t", str(i).encode(), **kwargs) for i in range(count)]  # type: ignore[arg-type]


def leased(backend: Backend) -> int:
    """What the database says is leased now, on every channel."""
    with backend.engine().connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(deliveries.c.state == STATE_LEASED)
            ).scalar_one()
        )


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- max_leased ----------------------------------------------------------------------


def test_max_leased_caps_what_is_leased_across_clients(
    client: novaque.Client, backend: Backend, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", max_leased=2)
    publish(client, 5)
    other = backend.client(clock=clock)
    got = client.claim("t", "c", max_messages=5)
    assert len(got) == 2
    assert other.claim("t", "c", max_messages=5) == []
    assert client.claim("t", "c") == []
    client.ack(got[0])
    [more] = other.claim("t", "c", max_messages=5)
    assert other.claim("t", "c") == []
    client.requeue(got[1], delay=0)
    other.reject(more)
    assert len(client.claim("t", "c", max_messages=5)) == 2


def test_an_expired_lease_counts_until_it_is_reaped(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", max_leased=2)
    publish(client, 4)
    assert len(client.claim("t", "c", max_messages=4, lease=10)) == 2
    clock.advance(30)
    assert client.claim("t", "c", max_messages=4) == []  # expired, not reaped: still counted
    assert client.reap_leases() == 2
    assert len(client.claim("t", "c", max_messages=4)) == 2


def test_pop_takes_the_limit_minus_what_is_leased(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", max_leased=3)
    publish(client, 8)
    [held] = client.claim("t", "c")
    assert len(client.pop("t", "c", max_messages=8)) == 2
    assert len(client.pop("t", "c", max_messages=8)) == 2  # a pop leases nothing
    client.ensure_channel("t", "c", max_leased=1)
    assert client.pop("t", "c", max_messages=8) == []
    client.ack(held)
    assert len(client.pop("t", "c", max_messages=8)) == 1


def test_claim_deferred_gets_what_fits(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", max_leased=1)
    publish(client, 2)
    [first] = client.claim("t", "c")
    client.defer(first)
    [second] = client.claim("t", "c")
    assert client.claim_deferred("t", "c", [first.delivery_id]) == []
    client.ack(second)
    [again] = client.claim_deferred("t", "c", [first.delivery_id])
    assert (again.id, again.attempts) == (first.id, 2)
    assert client.claim("t", "c") == []


def test_a_repeated_attempt_id_returns_what_it_holds(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", max_leased=2, rate_limit=(2, 3600))
    publish(client, 4)
    got = client.claim("t", "c", max_messages=2, attempt_id="a1")
    again = client.claim("t", "c", max_messages=2, attempt_id="a1")  # full: still its own
    assert [(m.id, m.lease_token) for m in again] == [(m.id, m.lease_token) for m in got]
    client.ack_many(got)
    # The repeat was not counted: the window handed out 2 of 2.
    assert client.claim("t", "c", attempt_id="a2") == []


def test_a_consumer_never_holds_more_than_the_limit(
    client: novaque.Client, backend: Backend
) -> None:
    client.ensure_channel("t", "c", max_leased=2)
    publish(client, 12)
    seen: list[int] = []
    most = 0
    lock = threading.Lock()

    def handler(msg: novaque.Message) -> None:
        nonlocal most
        with lock:
            most = max(most, leased(backend))
            seen.append(msg.id)

    consumer = client.subscribe("t", "c", handler, max_in_flight=5, poll_interval=0.05)
    consumer.start()
    try:
        wait_until(lambda: len(seen) == 12)
    finally:
        consumer.shutdown(timeout=10)
    assert most <= 2


# -- rate_limit ----------------------------------------------------------------------


def test_rate_limit_counts_each_window_of_the_epoch(
    client: novaque.Client, backend: Backend, clock: FakeClock
) -> None:
    clock.set(EDGE + timedelta(seconds=50))
    client.ensure_channel("t", "c", rate_limit=(3, 60))
    publish(client, 10)
    other = backend.client(clock=clock)
    client.ack_many(client.claim("t", "c", max_messages=2))
    [one] = other.claim("t", "c", max_messages=5)  # 2 + 1 of 3 in this minute
    other.ack(one)
    assert client.claim("t", "c") == []  # acks give no room back: the window is spent
    assert client.pop("t", "c") == []
    clock.advance(9)  # 59 s: same window
    assert other.claim("t", "c") == []
    clock.advance(1)  # the next minute of the epoch
    assert len(client.pop("t", "c", max_messages=2)) == 2
    [deferred] = other.claim("t", "c")
    other.defer(deferred)
    assert client.claim_deferred("t", "c", [deferred.delivery_id]) == []
    clock.advance(60)
    assert len(client.claim_deferred("t", "c", [deferred.delivery_id])) == 1
    assert len(client.claim("t", "c", max_messages=5)) == 2


def test_a_changed_rate_keeps_what_the_window_handed_out(
    client: novaque.Client, clock: FakeClock
) -> None:
    clock.set(EDGE)
    client.ensure_channel("t", "c", rate_limit=(5, 60))
    publish(client, 10)
    client.ack_many(client.claim("t", "c", max_messages=3))
    client.ensure_channel("t", "c", rate_limit=(4, timedelta(minutes=1)))
    assert len(client.claim("t", "c", max_messages=5)) == 1
    # An hour's window begins with this minute's: what the minute handed out counts.
    client.ensure_channel("t", "c", rate_limit=(4, timedelta(hours=1)))
    assert client.claim("t", "c") == []


# -- group_max_leased -----------------------------------------------------------------


def test_group_max_leased_limits_each_group_not_the_ungrouped(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", group_max_leased=2)
    for group in ("a", "a", "a", "b", None, None, "a", "b", "b"):
        client.publish("t", b"", group=group)
    got = client.claim("t", "c", max_messages=10)
    assert sorted(m.group or "" for m in got) == ["", "", "a", "a", "b", "b"]
    assert client.claim("t", "c", max_messages=10) == []
    client.ack(next(m for m in got if m.group == "a"))
    [next_a] = client.claim("t", "c", max_messages=10)
    assert next_a.group == "a"
    client.ack_many([m for m in got if m.group == "b"])
    [last_b] = client.pop("t", "c", max_messages=10)
    assert last_b.group == "b"


def test_group_max_leased_keeps_priorities_first(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", group_max_leased=1)
    client.publish("t", b"a-late", group="a", priority=5)
    client.publish("t", b"a-urgent", group="a", priority=-5)
    client.publish("t", b"b", group="b")
    client.publish("t", b"b-urgent", group="b", priority=-1)
    got = client.claim("t", "c", max_messages=10)
    assert [m.body for m in got] == [b"a-urgent", b"b-urgent"]


def test_groups_and_max_leased_together(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", group_max_leased=1, max_leased=3)
    for group in ("a", "a", "b", "c", "d"):
        client.publish("t", b"", group=group)
    got = client.claim("t", "c", max_messages=10)
    assert [m.group for m in got] == ["a", "b", "c"]


# -- settings ------------------------------------------------------------------------


def test_limits_are_stored_and_reset(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", max_leased=5, rate_limit=(10, 60), group_max_leased=2)
    got = client.channel_settings("t", "c")
    assert (got.max_leased, got.rate_limit, got.group_max_leased) == (
        5,
        (10, timedelta(seconds=60)),
        2,
    )
    client.ensure_channel("t", "c", lease=30)  # None: not given, the limits stay
    assert client.channel_settings("t", "c").rate_limit == (10, timedelta(minutes=1))
    client.ensure_channel("t", "c", reset=("rate_limit", "max_leased"))
    got = client.channel_settings("t", "c")
    assert (got.max_leased, got.rate_limit, got.group_max_leased) == (None, None, 2)
    client.ensure_channel("t", "c", reset=["group_max_leased"])
    assert client.channel_settings("t", "c").group_max_leased is None


def test_a_reset_limit_stops_limiting(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", max_leased=1)
    publish(client, 3)
    assert len(client.claim("t", "c", max_messages=3)) == 1
    client.ensure_channel("t", "c", reset=("max_leased",))
    assert len(client.claim("t", "c", max_messages=3)) == 2


def test_claims_that_start_after_the_commit_follow_another_clients_setting(
    client: novaque.Client, backend: Backend, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    publish(client, 6)
    assert len(client.claim("t", "c")) == 1  # seen without limits
    other = backend.client(clock=clock)
    other.ensure_channel("t", "c", max_leased=2)
    # Never more than the limit, from the first claim after the commit ...
    first = len(client.claim("t", "c", max_messages=6))
    assert first <= 1
    client._context.limits.changed()  # (what a second of empty claims does)
    assert first + len(client.claim("t", "c", max_messages=6)) == 1
    assert leased(backend) == 2
    other.ensure_channel("t", "c", reset=("max_leased",))
    # ... and a limit gone is seen at the next claim.
    assert len(client.claim("t", "c", max_messages=6)) == 4


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"max_leased": 0}, novaque.InvalidOption, "max_leased must be from 1"),
        ({"max_leased": True}, TypeError, "max_leased must be an int"),
        ({"max_leased": 2.0}, TypeError, "max_leased must be an int"),
        ({"max_leased": 2**31}, novaque.InvalidOption, "max_leased"),
        ({"group_max_leased": -1}, novaque.InvalidOption, "group_max_leased must be from 1"),
        ({"group_max_leased": "2"}, TypeError, "group_max_leased must be an int"),
        ({"rate_limit": 10}, TypeError, r"rate_limit must be a \(count, period\) pair"),
        ({"rate_limit": (10,)}, TypeError, "pair"),
        ({"rate_limit": (10, 60, 1)}, TypeError, "pair"),
        ({"rate_limit": (0, 60)}, novaque.InvalidOption, "count must be from 1"),
        ({"rate_limit": (True, 60)}, TypeError, "count must be an int"),
        ({"rate_limit": (1.5, 60)}, TypeError, "count must be an int"),
        ({"rate_limit": (10, "60")}, TypeError, "period must be a timedelta"),
        ({"rate_limit": (10, True)}, TypeError, "period must be a timedelta"),
        ({"rate_limit": (10, 0.5)}, novaque.InvalidOption, "from 1 s to 86400 s"),
        ({"rate_limit": (10, timedelta(days=2))}, novaque.InvalidOption, "1 day"),
        ({"rate_limit": (10, float("nan"))}, novaque.InvalidOption, "period"),
        ({"group_max_leased": 2, "ordering": "group_fifo"}, novaque.InvalidOption, "standard"),
        ({"max_leased": 2, "reset": ("max_leased",)}, novaque.InvalidOption, "both"),
        ({"reset": ("rate",)}, novaque.InvalidOption, "rate_limit"),
    ],
)
def test_bad_limits_are_refused_and_store_nothing(
    client: novaque.Client, settings: dict[str, object], error: type[Exception], match: str
) -> None:
    client.ensure_channel("t", "c", max_leased=4)
    with pytest.raises(error, match=match):
        client.ensure_channel("t", "c", **settings)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        client.ensure_channel("t", "new", **settings)  # type: ignore[arg-type]
    assert client.list_channels("t") == ["c"]
    got = client.channel_settings("t", "c")
    assert (got.ordering, got.max_leased, got.rate_limit, got.group_max_leased) == (
        "standard",
        4,
        None,
        None,
    )


def test_a_group_limit_and_an_ordering_never_meet(client: novaque.Client) -> None:
    client.ensure_channel("t", "ordered", ordering="strict_fifo")
    with pytest.raises(novaque.InvalidOption, match="standard channels only"):
        client.ensure_channel("t", "ordered", group_max_leased=2)
    client.ensure_channel("t", "fair", group_max_leased=2)
    with pytest.raises(novaque.InvalidOption, match="standard channels only"):
        client.ensure_channel("t", "fair", ordering="group_fifo")
    assert client.channel_settings("t", "ordered").group_max_leased is None
    assert client.channel_settings("t", "fair").ordering == "standard"
    # Both in one call: the limit goes, the ordering comes.
    client.ensure_channel("t", "fair", ordering="group_fifo", reset=("group_max_leased",))
    got = client.channel_settings("t", "fair")
    assert (got.ordering, got.group_max_leased) == ("group_fifo", None)
    # And back: a standard ordering with a group limit.
    client.ensure_channel("t", "fair", group_max_leased=1, reset=("ordering",))
    got = client.channel_settings("t", "fair")
    assert (got.ordering, got.group_max_leased) == ("standard", 1)


def test_max_leased_and_rate_limit_on_an_ordered_channel(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo", max_leased=2)
    for group in ("a", "a", "b", "c"):
        client.publish("t", b"", group=group)
    got = client.claim("t", "c", max_messages=10)
    assert [m.group for m in got] == ["a", "b"]
    client.ack(got[0])
    [nxt] = client.claim("t", "c", max_messages=10)
    assert nxt.group in ("a", "c")


# -- consumers held back -------------------------------------------------------------

WAIT = 30.0


def test_a_held_back_consumer_claims_once_a_poll_interval_and_logs_nothing(
    client: novaque.Client, caplog: pytest.LogCaptureFixture
) -> None:
    client.ensure_channel("t", "c", max_leased=1)
    publish(client, 2)
    [held] = client.claim("t", "c", lease=300)
    poll = 0.05
    consumer = client.subscribe("t", "c", lambda msg: None, poll_interval=poll)
    with caplog.at_level(logging.DEBUG, logger="novaque"):
        consumer.start()
        try:
            assert consumer._signals.wait("held_back", 1, WAIT)
            caplog.clear()
            started = time.monotonic()
            seen = consumer._signals.count("held_back")
            assert consumer._signals.wait("held_back", seen + 4, WAIT)
            took = time.monotonic() - started
            logged = [r.getMessage() for r in caplog.records]
            assert consumer._signals.count("handled") == 0
        finally:
            consumer.shutdown(timeout=10)
    # Four more claims: three whole waits of a poll interval at least between them.
    assert took >= 3 * poll
    assert logged == []
    client.ack(held)


def test_an_ack_in_this_process_wakes_a_held_back_consumer_at_once(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "c", max_leased=1)
    publish(client, 2)
    [held] = client.claim("t", "c", lease=300)
    handled = threading.Event()
    consumer = client.subscribe("t", "c", lambda msg: handled.set(), poll_interval=60)
    consumer.start()
    try:
        assert consumer._signals.wait("held_back", 1, WAIT)
        started = time.monotonic()
        client.ack(held)
        assert handled.wait(WAIT)
        assert time.monotonic() - started < 30  # not the poll interval of 60 s
    finally:
        consumer.shutdown(timeout=10)


def test_a_rate_limited_consumer_waits_for_the_next_window(
    client: novaque.Client, clock: FakeClock
) -> None:
    clock.set(EDGE)
    client.ensure_channel("t", "c", rate_limit=(2, 3600))
    publish(client, 5)
    consumer = client.subscribe("t", "c", lambda msg: None, max_in_flight=4, poll_interval=0.01)
    consumer.start()
    try:
        assert consumer._signals.wait("acked", 2, WAIT)
        assert consumer._signals.wait("held_back", 1, WAIT)
        polls = consumer._signals.count("polls")
        clock.advance(1800)  # half the window: nothing to claim yet
        # Thirty poll intervals without a claim: it looks at the clock, not the database.
        assert not consumer._signals.wait("polls", polls + 2, 0.3)
        clock.advance(1800)  # the next hour
        assert consumer._signals.wait("acked", 4, WAIT)
        assert consumer._signals.count("handled") == 4
    finally:
        consumer.shutdown(timeout=10)
