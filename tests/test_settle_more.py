"""More ways to settle (DESIGN §9), the consuming side: defer and claim_deferred,
snooze, pop (receive-and-delete), long polls, idempotent claims, and the
handler's Defer and Snooze, on every backend and both twins.

Time moves with the fake clock; a long poll's wait is real time, and the
tests wait for it through signals and joins with deadlines, never asserting
how long anything took.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque.schema import STATE_DEAD, STATE_DEFERRED, STATE_READY, deliveries
from novaque.testing import FakeClock, drain
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")

WAIT = 60.0


def waited(ok: bool, what: str) -> None:
    assert ok, f"timed out waiting for {what}"


def rows(backend: Backend) -> list[dict[str, Any]]:
    """Every delivery row, oldest first."""
    with backend.engine().connect() as conn:
        return [
            dict(r._mapping) for r in conn.execute(sa.select(deliveries).order_by(deliveries.c.id))
        ]


def counters(client: novaque.Client, channel: str = "c") -> novaque.Counters:
    client.flush_stats()
    return client.channel_counters("t", channel)


def live(client: novaque.Client, channel: str = "c") -> int:
    return client.channel_backlog("t", channel).total


def balanced(client: novaque.Client, channel: str = "c") -> bool:
    """Every delivery created is acked, purged or still live."""
    c = counters(client, channel)
    return c.published == c.acked + c.purged + live(client, channel)


def settle_calls(client: novaque.Client, msg: novaque.Message) -> list[Callable[[], object]]:
    return [
        lambda: client.ack(msg),
        lambda: client.requeue(msg, delay=0),
        lambda: client.requeue(msg, delay=5),
        lambda: client.snooze(msg, 0),
        lambda: client.snooze(msg, 5),
        lambda: client.renew(msg),
        lambda: client.reject(msg, "no"),
        lambda: client.defer(msg),
    ]


class InThread:
    """A call run on a thread of its own (a long poll while the test publishes)."""

    def __init__(self, call: Callable[[], list[novaque.Message]]) -> None:
        self._call = call
        self.result: list[novaque.Message] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._call()
        except BaseException as exc:
            self.error = exc

    def join(self) -> list[novaque.Message]:
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "the call did not return"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


# -- defer and claim_deferred -------------------------------------------------------------


def test_a_deferred_delivery_is_set_aside_until_claim_deferred_names_it(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "c")
    first = client.publish("t", b"one")
    client.publish("t", b"two")
    [msg] = client.claim("t", "c")
    assert msg.id == first
    client.defer(msg)
    assert client.channel_backlog("t", "c") == novaque.Backlog(ready=1, deferred=1)
    (info,) = client.get_message(first).deliveries
    assert (info.channel, info.state, info.attempts, info.visible_at) == ("c", "deferred", 1, None)
    [other] = client.claim("t", "c", max_messages=10)  # never the deferred one
    assert other.body == b"two"
    assert client.claim("t", "c") == []
    # Ids that are not deferred deliveries of the channel are ignored.
    [again] = client.claim_deferred("t", "c", [other.delivery_id, msg.delivery_id, 2**62])
    assert (again.id, again.delivery_id, again.body) == (first, msg.delivery_id, b"one")
    assert again.attempts == 2  # the attempt is counted
    assert again.lease_token not in ("", msg.lease_token)
    assert client.claim_deferred("t", "c", [msg.delivery_id]) == []  # leased now
    with pytest.raises(novaque.LeaseLost):
        client.ack(msg)  # the lease it was deferred with is gone
    client.ack_many([again, other])
    assert rows(backend) == []
    assert counters(client) == novaque.Counters(published=2, claimed=3, acked=2)


def test_defer_is_fenced_and_counts_nothing(backend: Backend, client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    [first] = client.claim("t", "c")
    client.requeue(first, delay=0)
    [second] = client.claim("t", "c")
    before = rows(backend)
    with pytest.raises(novaque.LeaseLost, match="no longer current"):
        client.defer(first)
    assert rows(backend) == before
    client.defer(second)
    with pytest.raises(novaque.LeaseLost):
        client.defer(second)  # twice
    for call in settle_calls(client, second):
        with pytest.raises(novaque.LeaseLost):
            call()
    (row,) = rows(backend)
    assert (row["state"], row["lease_token"], row["attempts"]) == (STATE_DEFERRED, None, 2)
    assert counters(client) == novaque.Counters(published=1, claimed=2, requeued=1)
    assert balanced(client)


def test_a_deferred_delivery_is_purged_at_its_ttl(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x", ttl=60)
    [msg] = client.claim("t", "c")
    client.defer(msg)
    clock.advance(59)
    client.run_maintenance()
    assert client.channel_backlog("t", "c").deferred == 1
    clock.advance(2)
    client.run_maintenance()
    assert rows(backend) == []
    assert counters(client) == novaque.Counters(published=1, claimed=1, purged=1)
    assert client.claim_deferred("t", "c", [msg.delivery_id]) == []


def test_claim_deferred_takes_the_lease_asked_for_or_the_channels(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", lease=120)
    client.publish_many("t", [b"a", b"b"])
    a, b = client.claim("t", "c", max_messages=2)
    client.defer(a)
    client.defer(b)
    [got_a] = client.claim_deferred("t", "c", [a.delivery_id])
    assert got_a.lease_expires_at == clock() + timedelta(seconds=120)
    [got_b] = client.claim_deferred("t", "c", [b.delivery_id], lease=timedelta(seconds=7))
    assert got_b.lease_expires_at == clock() + timedelta(seconds=7)
    assert client.renew(got_a) == clock() + timedelta(seconds=120)


def test_claim_deferred_on_a_paused_channel_gives_nothing(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    [msg] = client.claim("t", "c")
    client.defer(msg)
    client.pause_channel("t", "c")
    assert client.claim_deferred("t", "c", [msg.delivery_id]) == []
    client.resume_channel("t", "c")
    [again] = client.claim_deferred("t", "c", [msg.delivery_id])
    client.ack(again)


def test_a_delivery_deferred_on_its_last_attempt_dies_when_claimed(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x", max_attempts=1)
    [msg] = client.claim("t", "c")
    client.defer(msg)
    assert client.claim_deferred("t", "c", [msg.delivery_id]) == []
    [dead] = client.list_dead("t", "c")
    assert (dead.delivery_id, dead.reason, dead.attempts) == (msg.delivery_id, "max_attempts", 1)
    assert counters(client) == novaque.Counters(published=1, claimed=1, dead=1)
    client.requeue_dead("t", "c", [dead.delivery_id])  # fresh attempts
    [again] = client.claim("t", "c")
    assert again.attempts == 1
    client.ack(again)


def test_claim_deferred_checks_its_arguments(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    with pytest.raises(novaque.InvalidOption, match="delivery_ids"):
        client.claim_deferred("t", "c", 5)  # type: ignore[arg-type]
    with pytest.raises(novaque.InvalidOption, match="delivery_ids"):
        client.claim_deferred("t", "c", [0])
    with pytest.raises(novaque.InvalidOption, match="delivery_ids"):
        client.claim_deferred("t", "c", [2**63])
    with pytest.raises(novaque.InvalidOption, match="at most 1000"):
        client.claim_deferred("t", "c", range(1, 1002))
    with pytest.raises(novaque.InvalidOption, match="lease"):
        client.claim_deferred("t", "c", [1], lease=0)
    with pytest.raises(novaque.ChannelNotFound):
        client.claim_deferred("t", "nope", [1])
    with pytest.raises(novaque.InvalidName):
        client.claim_deferred("t", "bad name", [1])
    assert client.claim_deferred("t", "c", []) == []


def test_claim_deferred_ignores_the_deliveries_of_other_channels(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    client.ensure_channel("t", "d")
    client.publish("t", b"x")
    [on_d] = client.claim("t", "d")
    client.defer(on_d)
    assert client.claim_deferred("t", "c", [on_d.delivery_id]) == []
    [again] = client.claim_deferred("t", "d", [on_d.delivery_id])
    assert again.channel == "d"


def test_a_deferred_head_lets_its_group_go_on_and_rejoins_only_a_headless_group(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish_many("t", [b"a1", b"a2", b"b1"], groups=["a", "a", "b"])
    heads = {m.body: m for m in client.claim("t", "c", max_messages=10)}
    assert sorted(heads) == [b"a1", b"b1"]
    client.defer(heads[b"a1"])
    [a2] = client.claim("t", "c", max_messages=10)  # the deferred head let a2 go
    assert a2.body == b"a2"
    a1_id = heads[b"a1"].delivery_id
    assert client.claim_deferred("t", "c", [a1_id]) == []  # the group has a head: a2
    assert client.channel_backlog("t", "c").deferred == 1
    client.ack(a2)
    [a1] = client.claim_deferred("t", "c", [a1_id])  # a headless group: a1 heads it
    client.publish("t", b"a3", group="a")
    assert client.claim("t", "c", max_messages=10) == []  # a3 waits behind a1
    client.ack(a1)
    [a3] = client.claim("t", "c", max_messages=10)
    assert a3.body == b"a3"
    client.ack_many([a3, heads[b"b1"]])
    assert client.claim("t", "c") == []


def test_claim_deferred_gives_a_group_one_head(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", ordering="strict_fifo")
    client.publish_many("t", [b"1", b"2"])
    [one] = client.claim("t", "c")
    client.defer(one)
    [two] = client.claim("t", "c")
    client.defer(two)
    [first] = client.claim_deferred("t", "c", [two.delivery_id, one.delivery_id])
    assert first.body == b"1"  # the lower id heads the channel's one group
    assert client.claim_deferred("t", "c", [two.delivery_id]) == []
    client.ack(first)
    [second] = client.claim_deferred("t", "c", [two.delivery_id])
    client.ack(second)


# -- snooze -------------------------------------------------------------------------------


def test_snooze_puts_the_delivery_back_without_spending_its_attempt(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    message_id = client.publish("t", b"x", max_attempts=2)
    [first] = client.claim("t", "c")
    client.snooze(first, 30)
    (info,) = client.get_message(message_id).deliveries
    assert (info.state, info.attempts) == ("pending", 0)  # as if never attempted
    assert info.visible_at == clock() + timedelta(seconds=30)
    assert client.claim("t", "c") == []
    clock.advance(31)
    [second] = client.claim("t", "c")
    assert second.attempts == 1
    client.requeue(second, delay=0, error="boom")
    [third] = client.claim("t", "c")
    assert third.attempts == 2  # the last allowed attempt
    client.snooze(third, timedelta(0))  # due at once, attempt given back
    (row,) = rows(backend)
    assert (row["state"], row["attempts"], row["last_error"]) == (STATE_READY, 1, "boom")
    [fourth] = client.claim("t", "c")
    assert fourth.attempts == 2
    client.requeue(fourth, delay=0)  # the budget is spent: dead now
    assert [d.attempts for d in client.list_dead("t", "c")] == [2]
    assert counters(client) == novaque.Counters(published=1, claimed=4, requeued=3, dead=1)
    assert balanced(client)


def test_snooze_is_fenced_and_refuses_a_delay_past_the_expiry(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x", ttl=100)
    [first] = client.claim("t", "c", lease=5)
    clock.advance(6)
    [second] = client.claim("t", "c")
    with pytest.raises(novaque.LeaseLost):
        client.snooze(first, 0)
    with pytest.raises(novaque.LeaseLost):
        client.snooze(first, 10)
    before = rows(backend)
    with pytest.raises(novaque.InvalidOption, match="expires"):
        client.snooze(second, 94)  # due at the expiry: never
    for bad in (-1, "soon", 91 * 86_400):
        with pytest.raises(novaque.InvalidOption, match="delay"):
            client.snooze(second, bad)  # type: ignore[arg-type]
    assert rows(backend) == before
    client.snooze(second, 93)
    assert rows(backend)[0]["state"] == STATE_READY


def test_a_snoozed_head_stays_the_head_of_its_group(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish_many("t", [b"a1", b"a2"], groups=["a", "a"])
    [a1] = client.claim("t", "c", max_messages=10)
    client.snooze(a1, 30)
    assert client.claim("t", "c", max_messages=10) == []  # a2 still waits
    clock.advance(31)
    [again] = client.claim("t", "c", max_messages=10)
    assert (again.body, again.attempts) == (b"a1", 1)
    client.ack(again)
    [a2] = client.claim("t", "c", max_messages=10)
    assert a2.body == b"a2"


# -- pop ----------------------------------------------------------------------------------


def test_pop_takes_due_deliveries_and_deletes_them_in_one_go(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.ensure_channel("t", "other")
    ids = client.publish_many("t", [b"1", b"2", b"3"], headers={"k": "v"})
    client.publish("t", b"later", delay=60)
    popped = client.pop("t", "c", max_messages=2)
    assert [(m.id, m.body, m.headers, m.attempts) for m in popped] == [
        (ids[0], b"1", {"k": "v"}, 1),
        (ids[1], b"2", {"k": "v"}, 1),
    ]
    assert {(m.topic, m.channel, m.lease_token) for m in popped} == {("t", "c", "")}
    assert popped[0].lease_expires_at == clock()
    assert client.get_message(ids[0]).deliveries[0].channel == "other"  # gone from c only
    for msg in popped:
        for call in settle_calls(client, msg):
            with pytest.raises(novaque.LeaseLost):
                call()
    assert client.ack_many(popped) == popped
    assert [m.body for m in client.pop("t", "c", max_messages=10)] == [b"3"]
    assert client.pop("t", "c") == []  # "later" is not due
    assert counters(client) == novaque.Counters(published=4, claimed=3, acked=3)
    assert balanced(client)
    assert [r["channel_id"] for r in rows(backend)].count(popped[0].channel_id) == 1


def test_pop_hands_out_one_delivery_per_group_and_moves_it_on(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish_many("t", [b"a1", b"a2", b"b1", b"a3"], groups=["a", "a", "b", "a"])
    assert sorted(m.body for m in client.pop("t", "c", max_messages=10)) == [b"a1", b"b1"]
    assert [m.body for m in client.pop("t", "c", max_messages=10)] == [b"a2"]
    [a3] = client.claim("t", "c", max_messages=10)  # a plain claim sees the group moved on
    assert a3.body == b"a3"
    assert client.pop("t", "c") == []  # a3 is leased: the group waits
    client.ack(a3)
    assert client.pop("t", "c") == []


def test_pop_on_a_paused_channel_gives_nothing(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    client.pause_channel("t", "c")
    assert client.pop("t", "c") == []
    client.resume_channel("t", "c")
    assert [m.body for m in client.pop("t", "c")] == [b"x"]


def test_pop_checks_its_arguments(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    with pytest.raises(novaque.InvalidOption, match="max_messages"):
        client.pop("t", "c", max_messages=0)
    with pytest.raises(novaque.InvalidOption, match="wait"):
        client.pop("t", "c", wait=0)
    with pytest.raises(novaque.ChannelNotFound):
        client.pop("t", "nope")


# -- long polls ---------------------------------------------------------------------------


@pytest.mark.parametrize("call", ["claim", "pop"])
def test_a_waiting_call_is_woken_by_a_publish_of_its_client(
    backend: Backend, clock: FakeClock, call: str
) -> None:
    # Idle waits of at least 1800 s: only a wake-up returns the call in time.
    client = backend.client(clock=clock, poll_interval=3600)
    client.ensure_channel("t", "c")
    signals = client._runtime.signals
    poll = InThread(lambda: getattr(client, call)("t", "c", max_messages=5, wait=WAIT))
    waited(signals.wait("long_poll_fetches", 1, WAIT), "the first, empty fetch")
    message_id = client.publish("t", b"wake up")
    [msg] = poll.join()
    assert msg.id == message_id


@pytest.mark.sync_only  # the wait loop both clients share; the hook is the sync client's
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_wake_up_before_the_first_fetch_is_kept(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The listener's first wake-up can come before the waiting call's first
    # fetch has begun (it is spawned just before): it must still end the
    # first idle wait, as the listener may have missed a publish until then.
    client = backend.client(poll_interval=3600, watch_interval=None)
    client.ensure_channel("t", "c")
    listen = client._runtime.listen_locked

    def listen_and_wake_at_once() -> None:
        listen()
        client._context.wake_all()

    monkeypatch.setattr(client._runtime, "listen_locked", listen_and_wake_at_once)
    signals = client._runtime.signals
    poll = InThread(lambda: client.claim("t", "c", wait=WAIT))
    waited(signals.wait("long_poll_fetches", 2, WAIT), "the fetch the wake-up asked for")
    client.publish("t", b"x")
    [msg] = poll.join()
    client.ack(msg)


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # the server that pushes
def test_a_waiting_claim_is_woken_by_notify_from_another_client(backend: Backend) -> None:
    waiting = backend.client(poll_interval=3600)
    producer = backend.client()  # its own engine: no local wake-up
    waiting.ensure_channel("t", "c")
    signals = waiting._runtime.signals
    poll = InThread(lambda: waiting.claim("t", "c", wait=WAIT))
    waited(signals.wait("listen_connected", 1, WAIT), "the listener")
    # The listener wakes every waiter once it listens (a publish may have been
    # missed meanwhile): the second fetch, still empty, follows that.
    waited(signals.wait("long_poll_fetches", 2, WAIT), "the fetch after LISTEN")
    message_id = producer.publish("t", b"over the wire")
    [msg] = poll.join()
    assert msg.id == message_id
    assert signals.count("notified") >= 1
    assert waiting._runtime.listening is None  # no consumer, no other poll: the listener stopped
    waiting.ack(msg)


def test_a_wait_with_nothing_due_returns_nothing(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    assert client.claim("t", "c", wait=0.2) == []
    assert client.pop("t", "c", wait=timedelta(milliseconds=200)) == []
    client.publish("t", b"x")
    [msg] = client.claim("t", "c", wait=300)  # due already: no wait at all
    client.ack(msg)


@pytest.mark.parametrize("bad", [0, -1, 300.5, timedelta(minutes=6), "1", float("nan")])
def test_a_bad_wait_is_refused(client: novaque.Client, bad: object) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    with pytest.raises(novaque.InvalidOption, match="wait"):
        client.claim("t", "c", wait=bad)  # type: ignore[arg-type]
    with pytest.raises(novaque.InvalidOption, match="wait"):
        client.pop("t", "c", wait=bad)  # type: ignore[arg-type]
    assert client.channel_backlog("t", "c").ready == 1  # nothing was claimed


# -- idempotent claims --------------------------------------------------------------------


def test_a_repeated_attempt_id_returns_what_it_holds_and_claims_nothing_new(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "c")
    client.publish_many("t", [b"1", b"2", b"3"])
    first = client.claim("t", "c", max_messages=2, attempt_id="job-7")
    again = client.claim("t", "c", max_messages=5, attempt_id="job-7")
    key = [(m.delivery_id, m.lease_token, m.attempts, m.lease_expires_at) for m in first]
    assert [(m.delivery_id, m.lease_token, m.attempts, m.lease_expires_at) for m in again] == key
    assert [m.body for m in again] == [b"1", b"2"]
    assert counters(client).claimed == 2  # the repeat counted nothing
    [third] = client.claim("t", "c", max_messages=5)
    assert third.body == b"3"
    client.ack(again[0])
    [left] = client.claim("t", "c", attempt_id="job-7")
    assert (left.delivery_id, left.lease_token) == (first[1].delivery_id, first[1].lease_token)
    client.ack(left)
    # Nothing leased under it any more: the id claims afresh.
    assert client.claim("t", "c", attempt_id="job-7") == []
    client.publish("t", b"4")
    [fresh] = client.claim("t", "c", attempt_id="job-7")
    assert fresh.body == b"4"
    assert fresh.lease_token != first[0].lease_token
    [same] = client.claim("t", "c", attempt_id="job-7")
    assert same.lease_token == fresh.lease_token
    client.ack_many([fresh, third])
    assert balanced(client)


def claimed_together(sides: list[novaque.Client], attempt_id: str) -> list[list[novaque.Message]]:
    """What each client's claim with ``attempt_id`` got, all started at once."""
    start = threading.Barrier(len(sides))

    def claim(side: novaque.Client) -> list[novaque.Message]:
        start.wait(WAIT)
        return side.claim("t", "c", max_messages=3, attempt_id=attempt_id)

    calls = [InThread(functools.partial(claim, side)) for side in sides]
    return [call.join() for call in calls]


def test_claims_repeating_one_attempt_id_at_once_claim_once(
    backend: Backend, clock: FakeClock
) -> None:
    # Two clients (two engines): the claims really run side by side.
    sides = [backend.client(clock=clock) for _ in range(2)]
    sides[0].ensure_channel("t", "c")
    sides[0].publish_many("t", [b"%d" % i for i in range(40)])
    for attempt in range(8):
        first, second = claimed_together(sides, f"job-{attempt}")
        assert len(first) == 3
        assert [(m.delivery_id, m.lease_token) for m in first] == [
            (m.delivery_id, m.lease_token) for m in second
        ]
    assert sides[0].channel_backlog("t", "c").in_flight == 24


def test_an_attempt_id_whose_leases_expired_claims_afresh(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    [first] = client.claim("t", "c", lease=10, attempt_id="a")
    clock.advance(11)
    [second] = client.claim("t", "c", attempt_id="a")  # expired: no longer held
    assert (second.delivery_id, second.attempts) == (first.delivery_id, 2)
    assert second.lease_token != first.lease_token
    clock.advance(31)
    [other] = client.claim("t", "c")  # taken over by a claim without an id
    assert other.attempts == 3
    (row,) = rows(backend)
    assert row["attempt_id"] is None  # the old id is not kept by the new lease
    assert client.claim("t", "c", attempt_id="a") == []
    client.ack(other)


def test_a_repeated_attempt_id_returns_its_leases_on_a_paused_channel(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "c", lease=90)
    client.ensure_channel("t", "d")
    client.publish_many("t", [b"1", b"2"])
    [held] = client.claim("t", "c", attempt_id="a")
    client.pause_channel("t", "c")
    [again] = client.claim("t", "c", attempt_id="a")
    assert (again.delivery_id, again.lease_token) == (held.delivery_id, held.lease_token)
    assert client.renew(again) == held.lease_expires_at  # the channel's lease, as held
    assert client.claim("t", "c", attempt_id="b") == []  # a new id claims: paused
    assert client.claim("t", "c") == []
    # Attempt ids are per channel.
    [on_d] = client.claim("t", "d", attempt_id="a")
    assert on_d.body == b"1"
    client.resume_channel("t", "c")
    client.ack_many([again, on_d])


def test_an_attempt_id_with_a_long_poll(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    [held] = client.claim("t", "c", attempt_id="a", wait=0.1)
    [again] = client.claim("t", "c", attempt_id="a", wait=0.1)
    assert again.lease_token == held.lease_token
    assert client.claim("t", "c", attempt_id="b", wait=0.1) == []
    client.ack(again)


def test_a_bad_attempt_id_is_refused(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    with pytest.raises(TypeError, match="attempt_id must be a str"):
        client.claim("t", "c", attempt_id=7)  # type: ignore[arg-type]
    for bad in ("", "x" * 201, "nul\x00"):
        with pytest.raises(novaque.InvalidOption, match="attempt_id"):
            client.claim("t", "c", attempt_id=bad)
    assert client.channel_backlog("t", "c").ready == 1
    # Compared exactly: a trailing space makes another id.
    [held] = client.claim("t", "c", attempt_id="a" * 200)
    assert client.claim("t", "c", attempt_id="a" * 199 + " ") == []
    client.ack(held)


# -- the handler's Defer and Snooze -------------------------------------------------------


def test_a_handler_raising_defer_sets_the_message_aside(
    backend: Backend, client: novaque.Client
) -> None:
    seen: list[novaque.Message] = []

    def handler(msg: novaque.Message) -> None:
        seen.append(msg)
        raise novaque.Defer()

    consumer = client.subscribe_and_start("t", "c", handler, poll_interval=0.05)
    message_id = client.publish("t", b"later please")
    waited(consumer._signals.wait("deferred", 1, WAIT), "the deferral")
    consumer.shutdown()
    assert [m.id for m in seen] == [message_id]
    (row,) = rows(backend)
    assert (row["state"], row["attempts"], row["lease_token"]) == (STATE_DEFERRED, 1, None)
    [again] = client.claim_deferred("t", "c", [seen[0].delivery_id])
    assert again.attempts == 2
    client.ack(again)


def test_a_handler_raising_snooze_gets_the_message_again_after_the_delay(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    attempts: list[int] = []

    def handler(msg: novaque.Message) -> None:
        attempts.append(msg.attempts)
        if len(attempts) == 1:
            raise novaque.Snooze(timedelta(seconds=30))

    consumer = client.subscribe_and_start("t", "c", handler, poll_interval=0.02)
    client.publish("t", b"x", max_attempts=1)
    signals = consumer._signals
    waited(signals.wait("snoozed", 1, WAIT), "the snooze")
    (row,) = rows(backend)
    assert (row["state"], row["attempts"]) == (STATE_READY, 0)
    polls = signals.count("polls")
    waited(signals.wait("polls", polls + 2, WAIT), "two more claim passes")
    assert attempts == [1]  # not due yet
    clock.advance(31)
    waited(signals.wait("acked", 1, WAIT), "the second run")
    consumer.shutdown()
    assert attempts == [1, 1]  # the snooze spent no attempt: the one allowed is left
    assert rows(backend) == []


def test_a_snooze_with_a_bad_delay_is_a_failure_of_the_handler(
    backend: Backend, client: novaque.Client
) -> None:
    def handler(msg: novaque.Message) -> None:
        raise novaque.Snooze("tomorrow")  # type: ignore[arg-type]

    consumer = client.subscribe_and_start("t", "c", handler, poll_interval=0.05)
    client.publish("t", b"x", max_attempts=1)
    waited(consumer._signals.wait("dead", 1, WAIT), "the failure")
    consumer.shutdown()
    (row,) = rows(backend)
    assert (row["state"], row["dead_reason"]) == (STATE_DEAD, "max_attempts")
    assert row["last_error"].startswith("InvalidOption: delay must be")


def test_a_handler_snoozing_a_held_group_head_keeps_its_place(
    client: novaque.Client, clock: FakeClock
) -> None:
    order: list[bytes] = []

    def handler(msg: novaque.Message) -> None:
        order.append(msg.body)
        if order == [b"a1"]:
            raise novaque.Snooze(10)

    client.ensure_channel("t", "c", ordering="group_fifo")
    consumer = client.subscribe_and_start("t", "c", handler, max_in_flight=4, poll_interval=0.02)
    client.publish_many("t", [b"a1", b"a2"], groups=["a", "a"])
    signals = consumer._signals
    waited(signals.wait("snoozed", 1, WAIT), "the snooze")
    polls = signals.count("polls")
    waited(signals.wait("polls", polls + 2, WAIT), "two more claim passes")
    assert order == [b"a1"]  # a2 waits behind its snoozed head
    clock.advance(11)
    waited(signals.wait("acked", 2, WAIT), "both")
    consumer.shutdown()
    assert order == [b"a1", b"a1", b"a2"]


@pytest.mark.sync_only  # drain takes a novaque.Client (or an AsyncClient, awaited)
def test_drain_follows_defer_and_snooze(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("t", "c")
    client.publish_many("t", [b"defer", b"snooze", b"ack"])
    seen: list[tuple[bytes, int]] = []

    def handler(msg: novaque.Message) -> None:
        seen.append((msg.body, msg.attempts))
        if msg.body == b"defer":
            raise novaque.Defer()
        if msg.body == b"snooze" and len(seen) < 4:
            raise novaque.Snooze(5)

    assert drain(client, "t", "c", handler) == 3
    assert client.channel_backlog("t", "c") == novaque.Backlog(pending=1, deferred=1)
    clock.advance(6)
    assert drain(client, "t", "c", handler) == 1
    assert seen[-1] == (b"snooze", 1)
    assert client.channel_backlog("t", "c") == novaque.Backlog(deferred=1)
