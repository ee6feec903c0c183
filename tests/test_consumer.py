"""The consumer runtime in one process: subscribe, handler contract, backoff,
heartbeat, lost leases, shutdown and wake-ups.

Background threads are awaited through the consumer's signals (counters it
bumps as it works) with a deadline, never with a bare sleep; time-based
behaviour moves the fake clock.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque import _settle
from novaque.schema import STATE_DEAD, STATE_LEASED, STATE_READY, deliveries
from novaque.testing import FakeClock, make_message
from tests.conftest import Backend

pytestmark = [pytest.mark.usefixtures("twin"), pytest.mark.pooled]

LOG = logging.getLogger("novaque")
WAIT = 60.0  # deadline of every wait on a background thread (generous: shared machine)


class Recorder:
    """A handler that records every call and runs ``behaviour`` (if any)."""

    def __init__(self, behaviour: Callable[[novaque.Message], object] | None = None) -> None:
        self.behaviour = behaviour
        self.lock = threading.Lock()
        self.calls: list[novaque.Message] = []

    def __call__(self, msg: novaque.Message) -> None:
        with self.lock:
            self.calls.append(msg)
        if self.behaviour is not None:
            self.behaviour(msg)

    def ids(self) -> list[int]:
        with self.lock:
            return [m.id for m in self.calls]


def rows(backend: Backend) -> list[dict[str, Any]]:
    """Every delivery row, oldest first."""
    with backend.engine().connect() as conn:
        return [
            dict(r._mapping) for r in conn.execute(sa.select(deliveries).order_by(deliveries.c.id))
        ]


def waited(ok: bool, what: str) -> None:
    assert ok, f"timed out waiting for {what}"


def test_500_messages_through_subscribe_leave_nothing_in_flight(
    backend: Backend, client: novaque.Client
) -> None:
    handler = Recorder()
    consumer = client.subscribe("load", "workers", handler, max_in_flight=4)
    assert client.list_channels("load") == ["workers"]  # subscribe creates both
    published: list[int] = []
    for start in range(0, 500, 100):
        published += client.publish_many("load", [f"m{i}" for i in range(start, start + 100)])
    consumer.start()
    waited(consumer._signals.wait("acked", 500, WAIT), "500 acks")
    consumer.shutdown(timeout=10)
    assert not consumer.running
    assert consumer.in_flight == 0
    assert rows(backend) == []
    assert sorted(handler.ids()) == sorted(published)
    assert Counter(handler.ids()).most_common(1)[0][1] == 1
    assert {m.body for m in handler.calls} == {f"m{i}".encode() for i in range(500)}
    # The workers really ran side by side, and acks went out in batches.
    assert consumer._signals.count("claimed") == 500


def test_handlers_run_side_by_side_up_to_max_in_flight(client: novaque.Client) -> None:
    # Workers wake one another one at a time while work remains: each of the
    # four handlers waits for the other three, so all four must run at once.
    together = threading.Barrier(4, timeout=WAIT)
    handler = Recorder(lambda m: together.wait())
    consumer = client.subscribe("side", "by-side", handler, max_in_flight=4)
    client.publish_many("side", ["a", "b", "c", "d"])
    consumer.start()
    waited(consumer._signals.wait("acked", 4, WAIT), "4 acks")
    consumer.shutdown(timeout=10)
    assert sorted(m.body for m in handler.calls) == [b"a", b"b", b"c", b"d"]
    assert all(m.attempts == 1 for m in handler.calls)


def test_a_handler_slow_after_quick_ones_holds_back_none_of_the_rest(
    client: novaque.Client,
) -> None:
    # Quick handlers run one after another on the worker that took their
    # batch; when one of them blocks, the rest of the batch must not wait for
    # it: another worker takes them.
    release = threading.Event()
    handler = Recorder(lambda m: release.wait(WAIT) if m.body == b"slow" else None)
    consumer = client.subscribe("quick", "c", handler, max_in_flight=4)
    client.publish_many("quick", [f"q{i}" for i in range(40)])
    consumer.start()
    try:
        waited(consumer._signals.wait("acked", 40, WAIT), "40 quick acks")
        client.publish_many("quick", ["slow", "a", "b", "c"])
        waited(consumer._signals.wait("handled", 43, WAIT), "the three behind the slow one")
        assert sorted(m.body for m in handler.calls[40:]) == [b"a", b"b", b"c", b"slow"]
    finally:
        release.set()
    waited(consumer._signals.wait("acked", 44, WAIT), "the slow one's ack")
    consumer.shutdown(timeout=10)


def test_a_failing_handler_is_retried_then_dead_with_its_last_error(
    backend: Backend, client: novaque.Client
) -> None:
    def fail(msg: novaque.Message) -> None:
        raise ValueError(f"boom on attempt {msg.attempts}")

    handler = Recorder(fail)
    client.publish("jobs", b"x", max_attempts=3)  # no channel yet: this one is not seen
    consumer = client.subscribe_and_start(
        "jobs", "runner", handler, backoff=novaque.Backoff(base=0), poll_interval=0.05
    )
    message_id = client.publish("jobs", b"poison", max_attempts=3)
    waited(consumer._signals.wait("dead", 1, WAIT), "the delivery to die")
    consumer.shutdown()
    assert [m.attempts for m in handler.calls] == [1, 2, 3]
    assert consumer._signals.count("retried") == 2
    (row,) = rows(backend)
    assert row["message_id"] == message_id
    assert row["state"] == STATE_DEAD
    assert row["attempts"] == 3
    assert row["dead_reason"] == "max_attempts"
    assert row["last_error"] == "ValueError: boom on attempt 3"


@pytest.mark.parametrize(
    ("reason", "kept", "logged"),
    [
        ("bad payload", "bad payload", ": bad payload"),
        ("", "rejected", " (no reason given)"),
        ("no \x00 here", "no \ufffd here", ": no \ufffd here"),
    ],
)
def test_reject_dead_letters_at_once_with_its_reason(
    backend: Backend,
    client: novaque.Client,
    caplog: pytest.LogCaptureFixture,
    reason: str,
    kept: str,
    logged: str,
) -> None:
    def reject(msg: novaque.Message) -> None:
        raise novaque.Reject(reason)

    handler = Recorder(reject)
    with caplog.at_level(logging.INFO, logger="novaque"):
        consumer = client.subscribe_and_start("jobs", "runner", handler, poll_interval=0.05)
        message_id = client.publish("jobs", b"x", max_attempts=5)
        waited(consumer._signals.wait("dead", 1, WAIT), "the rejection")
        consumer.shutdown()
    assert len(handler.calls) == 1
    (row,) = rows(backend)
    assert (row["state"], row["attempts"], row["dead_reason"]) == (STATE_DEAD, 1, kept)
    # The log line says why, as the dead letter keeps it.
    rejected = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in rejected] == [
        ("INFO", f"message {message_id} rejected by the handler of jobs/runner{logged}")
    ]


@pytest.mark.sync_only
def test_a_reject_whose_reason_cannot_be_shown_is_kept_by_its_type_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    def reject(msg: novaque.Message) -> None:
        raise novaque.Reject(Unprintable())  # type: ignore[arg-type]

    msg = make_message(b"x", id=7, topic="jobs", channel="runner")
    with caplog.at_level(logging.INFO, logger="novaque"):
        outcome = _settle.outcome_of(reject, msg, backoff=novaque.Backoff(), log=LOG)
    assert (outcome.kind, outcome.text) == ("reject", "<Unprintable whose str() failed>")
    assert [r.getMessage() for r in caplog.records] == [
        "message 7 rejected by the handler of jobs/runner: <Unprintable whose str() failed>"
    ]


def test_retry_delays_follow_the_backoff_and_the_clock(backend: Backend, clock: FakeClock) -> None:
    # The client's policy would wait 1000 s; the consumer's override wins.
    client = backend.client(clock=clock, backoff=novaque.Backoff(base=1000))
    attempts: list[int] = []

    def fail(msg: novaque.Message) -> None:
        attempts.append(msg.attempts)
        raise RuntimeError("try later")

    consumer = client.subscribe_and_start(
        "jobs",
        "runner",
        fail,
        backoff=novaque.Backoff(base=10, cap=25, jitter=False),
        poll_interval=0.02,
    )
    client.publish("jobs", b"x", max_attempts=4)
    signals = consumer._signals
    for attempt, delay in ((1, 10.0), (2, 20.0), (3, 25.0)):
        waited(signals.wait("retried", attempt, WAIT), f"retry {attempt}")
        (row,) = rows(backend)
        now_us = novaque._time.to_us(clock())
        assert row["state"] == STATE_READY
        assert row["visible_at"] - now_us == int(delay * 1_000_000)
        assert row["last_error"] == "RuntimeError: try later"
        # Just before the delay runs out, claim passes find nothing.
        clock.advance(delay - 0.5)
        polls = signals.count("polls")
        waited(signals.wait("polls", polls + 2, WAIT), "two more claim passes")
        assert attempts == list(range(1, attempt + 1))
        clock.advance(0.5)
    waited(signals.wait("dead", 1, WAIT), "the last attempt")
    consumer.shutdown()
    assert attempts == [1, 2, 3, 4]


def test_heartbeat_keeps_a_handler_running_past_its_lease_from_redelivery(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    release = threading.Event()
    handler = Recorder(lambda msg: release.wait(WAIT))
    consumer = client.subscribe_and_start(
        "slow", "c", handler, lease=0.6, max_in_flight=2, poll_interval=0.02
    )
    client.publish("slow", b"x")
    signals = consumer._signals
    waited(signals.wait("started", 1, WAIT), "the handler to start")
    # Five times 0.4 s: the handler runs 2.0 s of clock time, over 3 leases.
    for step in range(5):
        renewed = signals.count("renewed")
        clock.advance(0.4)
        waited(signals.wait("renewed", renewed + 1, WAIT), f"renewal {step}")
        assert client.reap_leases() == 0
        assert client.claim("slow", "c") == []
        (row,) = rows(backend)
        assert row["state"] == STATE_LEASED
        assert row["visible_at"] > novaque._time.to_us(clock())
    release.set()
    waited(signals.wait("acked", 1, WAIT), "the ack")
    consumer.shutdown()
    assert len(handler.calls) == 1
    assert rows(backend) == []
    assert signals.count("lease_lost") == 0


@pytest.mark.sync_only
def test_a_lost_lease_makes_the_late_ack_a_no_op_and_the_message_comes_back(
    backend: Backend,
    client: novaque.Client,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A long pause of the process (GC, swap) stops the heartbeat too: here it
    # blocks in renew until the test is done.
    unpaused = threading.Event()
    real_renew = client._consuming.renew

    def paused_renew(msg: novaque.Message, **kw: Any) -> Any:
        unpaused.wait(WAIT)
        return real_renew(msg, **kw)

    monkeypatch.setattr(client._consuming, "renew", paused_renew)
    first_may_finish = threading.Event()

    def behaviour(msg: novaque.Message) -> None:
        if msg.attempts == 1:
            first_may_finish.wait(WAIT)

    handler = Recorder(behaviour)
    consumer = client.subscribe_and_start(
        "t", "c", handler, lease=30, max_in_flight=2, poll_interval=0.02
    )
    message_id = client.publish("t", b"x")
    signals = consumer._signals
    waited(signals.wait("started", 1, WAIT), "the first attempt")
    clock.advance(31)  # the lease expires: the delivery may be claimed again
    client.reap_leases()
    waited(signals.wait("acked", 1, WAIT), "the second attempt's ack")
    assert [m.attempts for m in handler.calls] == [1, 2]
    assert rows(backend) == []
    with caplog.at_level(logging.ERROR, logger="novaque"):
        first_may_finish.set()
        waited(signals.wait("lease_lost", 1, WAIT), "the late ack to be refused")
    assert any("LeaseLost" in r.getMessage() for r in caplog.records)
    assert signals.count("acked") == 1
    unpaused.set()
    consumer.shutdown()
    assert handler.ids() == [message_id, message_id]
    assert rows(backend) == []


@pytest.mark.sync_only
def test_shutdown_releases_claimed_unstarted_deliveries_without_counting_the_attempt(
    backend: Backend, client: novaque.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_claim = client._consuming.claim_batch
    claimed = threading.Event()

    def claim_then_see_shutdown(*args: Any) -> list[novaque.Message]:
        got: list[novaque.Message] = real_claim(*args)
        if got:
            claimed.set()
            # Shutdown begins while this claim is on its way back.
            assert consumer._stop_claiming.wait(WAIT)
        return got

    monkeypatch.setattr(client._consuming, "claim_batch", claim_then_see_shutdown)
    client.ensure_channel("t", "c")
    client.publish_many("t", [b"a", b"b", b"c"])
    handler = Recorder()
    consumer = client.subscribe("t", "c", handler, max_in_flight=3, poll_interval=0.02)
    consumer.start()
    waited(claimed.wait(WAIT), "the claim")
    consumer.shutdown()
    assert handler.calls == []
    assert consumer._signals.count("released") == 3
    assert [(r["state"], r["attempts"], r["lease_token"]) for r in rows(backend)] == [
        (STATE_READY, 0, None)
    ] * 3
    # Released at once: another consumer gets them now, as first attempts.
    monkeypatch.undo()
    got = client.claim("t", "c", max_messages=10)
    assert [m.attempts for m in got] == [1, 1, 1]


@pytest.mark.sync_only
def test_shutdown_lets_running_handlers_finish_and_flushes_their_acks(
    backend: Backend, client: novaque.Client
) -> None:
    go_on = threading.Event()
    handler = Recorder(lambda msg: go_on.wait(WAIT))
    consumer = client.subscribe_and_start("t", "c", handler, max_in_flight=2, poll_interval=0.02)
    client.publish_many("t", [b"a", b"b"])
    waited(consumer._signals.wait("started", 2, WAIT), "both handlers")
    stopper = threading.Thread(target=consumer.shutdown, kwargs={"timeout": WAIT})
    stopper.start()
    assert consumer._stop_claiming.wait(WAIT)
    assert stopper.is_alive()  # still waiting for the handlers
    go_on.set()
    stopper.join(WAIT)
    assert not stopper.is_alive()
    assert rows(backend) == []
    assert consumer.in_flight == 0


def test_handlers_still_running_at_the_deadline_keep_their_lease(
    backend: Backend,
    client: novaque.Client,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    go_on, entered = threading.Event(), threading.Event()
    handler = Recorder(lambda msg: (entered.set(), go_on.wait(WAIT)))
    consumer = client.subscribe_and_start("t", "c", handler, lease=30, poll_interval=0.02)
    client.publish("t", b"x")
    waited(entered.wait(WAIT), "the handler")
    token = handler.calls[0].lease_token
    with caplog.at_level(logging.WARNING, logger="novaque"):
        consumer.shutdown(timeout=0.05)
    assert any("still running" in r.getMessage() for r in caplog.records)
    go_on.set()
    waited(consumer._signals.wait("handled", 1, WAIT), "the handler to return")
    (row,) = rows(backend)
    assert (row["state"], row["lease_token"]) == (STATE_LEASED, token)
    clock.advance(31)
    (again,) = client.claim("t", "c")
    assert again.attempts == 2


def test_a_publish_in_the_same_process_wakes_an_idle_consumer(client: novaque.Client) -> None:
    handler = Recorder()
    # Idle waits of this consumer last at least 112 s: only a wake-up can
    # make it see the message before the test's deadline.
    consumer = client.subscribe_and_start("t", "c", handler, poll_interval=3600)
    signals = consumer._signals
    waited(signals.wait("polls", 1, WAIT), "the first, empty claim pass")
    client.publish("t", b"wake up")
    waited(signals.wait("acked", 1, WAIT), "the woken consumer")
    consumer.shutdown()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # the server that pushes
def test_notify_wakes_an_idle_consumer_of_another_client(backend: Backend) -> None:
    consumer_side = backend.client()
    assert consumer_side._context.dialect.supports_notify
    producer_side = backend.client()  # its own engine: no local wake-up
    handler = Recorder()
    consumer = consumer_side.subscribe_and_start("t", "c", handler, poll_interval=3600)
    signals = consumer_side._runtime.signals
    waited(signals.wait("listen_connected", 1, WAIT), "the listener")
    waited(consumer._signals.wait("polls", 1, WAIT), "the first claim pass")
    producer_side.publish("t", b"over the wire")
    # Idle waits last at least 112 s: only the NOTIFY can wake the consumer in time.
    waited(consumer._signals.wait("acked", 1, WAIT), "the notified consumer")
    assert signals.count("notified") >= 1
    consumer.shutdown()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # the server that pushes
def test_the_listener_reconnects_when_its_connection_is_killed(backend: Backend) -> None:
    consumer_side = backend.client()
    assert consumer_side._context.dialect.supports_notify
    producer_side = backend.client()
    handler = Recorder()
    consumer = consumer_side.subscribe_and_start("t", "c", handler, poll_interval=3600)
    signals = consumer_side._runtime.signals
    waited(signals.wait("listen_connected", 1, WAIT), "the listener")
    with producer_side.engine.connect() as conn:
        conn.exec_driver_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND query ILIKE 'LISTEN%%'"
        )
    waited(signals.wait("listen_connected", 2, WAIT), "the listener to reconnect")
    assert signals.count("listen_errors") >= 1
    producer_side.publish("t", b"after the drop")
    waited(consumer._signals.wait("acked", 1, WAIT), "the notified consumer")
    consumer.shutdown()


@pytest.mark.sync_only
def test_subscribe_checks_its_arguments(client: novaque.Client) -> None:
    def handler(msg: novaque.Message) -> None:
        pass

    with pytest.raises(novaque.InvalidName):
        client.subscribe("bad topic", "c", handler)
    with pytest.raises(TypeError, match="handler must be callable"):
        client.subscribe("t", "c", "not a function")  # type: ignore[arg-type]

    async def async_handler(msg: novaque.Message) -> None:
        pass

    with pytest.raises(TypeError, match="async function"):
        client.subscribe("t", "c", async_handler)
    with pytest.raises(novaque.InvalidOption, match="max_in_flight must be between 1 and 1000"):
        client.subscribe("t", "c", handler, max_in_flight=0)
    with pytest.raises(novaque.InvalidOption, match="lease"):
        client.subscribe("t", "c", handler, lease=0)
    with pytest.raises(novaque.InvalidOption, match="backoff must be a novaque.Backoff"):
        client.subscribe("t", "c", handler, backoff=5)  # type: ignore[arg-type]
    with pytest.raises(novaque.InvalidOption, match="poll_interval"):
        client.subscribe("t", "c", handler, poll_interval=-1)
    assert client.list_topics() == []  # nothing was created by a refused call
    consumer = client.subscribe("t", "c", handler, max_in_flight=3, lease=12, poll_interval=0.5)
    assert (consumer.max_in_flight, consumer.lease, consumer.poll_interval) == (3, 12.0, 0.5)
    assert consumer.backoff == client.options.backoff
    assert client.list_channels("t") == ["c"]


def test_a_consumer_starts_once(client: novaque.Client) -> None:
    consumer = client.subscribe("t", "c", lambda msg: None, poll_interval=0.05)
    assert consumer.start() is consumer
    assert consumer.start() is consumer  # already running: nothing happens
    assert consumer.running
    consumer.shutdown()
    consumer.shutdown()  # twice is fine
    with pytest.raises(RuntimeError, match="subscribe"):
        consumer.start()
