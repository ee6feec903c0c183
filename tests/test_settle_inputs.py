"""Settling never fails because of what a handler raised, and never holds a
delivery forever: text the database cannot store is stored replaced, a
retry cannot be asked for past the message's expiry, and a result the
consumer cannot write is given up so its lease lapses.

On every backend; time moves with the fake clock, background threads are
awaited through the consumer's signals.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque import _ledger
from novaque.schema import STATE_LEASED, deliveries
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")

WAIT = 60.0

#: What os.fsdecode makes of a byte that is not UTF-8: a lone surrogate.
SURROGATE = os.fsdecode(b"\xff")
REPLACED = "\ufffd"


def waited(ok: bool, what: str) -> None:
    assert ok, f"timed out waiting for {what}"


def delivery_row(backend: Backend, delivery_id: int) -> dict[str, Any]:
    with backend.engine().connect() as conn:
        row = conn.execute(sa.select(deliveries).where(deliveries.c.id == delivery_id)).one()
    return dict(row._mapping)


# -- text the database cannot store ---------------------------------------------------------


def test_requeue_and_reject_store_nul_and_lone_surrogates_replaced(
    client: novaque.Client,
) -> None:
    assert SURROGATE == "\udcff"
    client.ensure_channel("t", "c")
    first = client.publish("t", b"a", max_attempts=2)
    second = client.publish("t", b"b")
    msg_a, msg_b = client.claim("t", "c", max_messages=2)

    client.requeue(msg_a, delay=0, error=f"path {SURROGATE} and \x00 end")
    (info,) = client.get_message(first).deliveries
    assert (info.state, info.last_error) == ("ready", f"path {REPLACED} and {REPLACED} end")

    client.reject(msg_b, f"{SURROGATE}\x00why")
    (retry,) = client.claim("t", "c")
    assert retry.id == first
    # The last attempt: requeue buries it, with the exception's text replaced.
    client.requeue(retry, delay=0, error=OSError(f"no file {SURROGATE}\x00"))

    dead = {d.message_id: d for d in client.list_dead("t", "c")}
    assert dead[second].reason == f"{REPLACED}{REPLACED}why"
    assert dead[first].reason == "max_attempts"
    assert dead[first].last_error == f"OSError: no file {REPLACED}{REPLACED}"
    # An exception whose str() itself fails is kept by its type name.

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    client.requeue_dead("t", "c", [dead[first].delivery_id])
    (again,) = client.claim("t", "c")
    client.requeue(again, delay=0, error=Unprintable())
    (info,) = client.get_message(first).deliveries
    assert info.last_error == "Unprintable: <Unprintable whose str() failed>"


def test_a_handler_raising_unstorable_text_is_retried_then_dead_with_it_replaced(
    client: novaque.Client,
) -> None:
    def handler(msg: novaque.Message) -> None:
        if msg.body == b"reject":
            raise novaque.Reject(f"{SURROGATE}\x00")
        raise OSError(f"cannot open {SURROGATE}\x00")

    consumer = client.subscribe("t", "c", handler, backoff=novaque.Backoff(base=0))
    failing = client.publish("t", b"fail", max_attempts=2)
    rejected = client.publish("t", b"reject")
    consumer.start()
    waited(consumer._signals.wait("dead", 2, WAIT), "two dead letters")
    signals = consumer._signals.snapshot()
    consumer.shutdown(timeout=10)
    assert signals["retried"] == 1
    assert signals.get("settle_errors", 0) == 0
    assert consumer.in_flight == 0
    dead = {d.message_id: d for d in client.list_dead("t", "c")}
    assert dead[failing].reason == "max_attempts"
    assert dead[failing].attempts == 2
    assert dead[failing].last_error == f"OSError: cannot open {REPLACED}{REPLACED}"
    assert dead[rejected].reason == f"{REPLACED}{REPLACED}"


def test_a_body_str_with_a_lone_surrogate_is_refused(
    backend: Backend, client: novaque.Client
) -> None:
    with pytest.raises(novaque.InvalidOption, match="at index 3, which UTF-8 cannot encode"):
        client.publish("t", f"abc{SURROGATE}")
    assert client.list_topics() == []


# -- requeue past the message's expiry --------------------------------------------------------


def test_requeue_with_a_delay_past_the_expiry_is_refused_and_changes_nothing(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    message_id = client.publish("t", b"x", ttl=100)
    (msg,) = client.claim("t", "c")
    before = delivery_row(backend, msg.delivery_id)
    for delay in (100, 101, timedelta(days=30)):
        with pytest.raises(novaque.InvalidOption, match=r"message \d+ expires at .*100 s from now"):
            client.requeue(msg, delay=delay, error="late")
    assert delivery_row(backend, msg.delivery_id) == before  # still leased, same token
    # A stale token is LeaseLost, whatever the delay.
    stale = novaque.Message(**{**_fields(msg), "lease_token": "0" * 32})
    with pytest.raises(novaque.LeaseLost):
        client.requeue(stale, delay=1000)
    # Just before the expiry is fine: the retry is due while the message lives.
    clock.advance(10)
    client.requeue(msg, delay=89.5)
    (info,) = client.get_message(message_id).deliveries
    assert info.state == "pending"
    clock.advance(89.5)
    (again,) = client.claim("t", "c")
    assert again.attempts == 2
    # Once expired (not yet purged), delay=0 still retries at once: nothing is refused.
    clock.advance(1)
    client.requeue(again, delay=0)
    client.run_maintenance()
    with pytest.raises(novaque.MessageNotFound):
        client.get_message(message_id)


def _fields(msg: novaque.Message) -> dict[str, Any]:
    return {name: getattr(msg, name) for name in msg.__slots__}


def test_a_consumer_backoff_past_the_expiry_is_kept_and_the_message_purged_at_ttl(
    client: novaque.Client, clock: FakeClock
) -> None:
    def fail(msg: novaque.Message) -> None:
        raise ValueError("try later")

    consumer = client.subscribe(
        "t", "c", fail, backoff=novaque.Backoff(base=3600, jitter=False)
    ).start()
    message_id = client.publish("t", b"x", ttl=60)
    waited(consumer._signals.wait("retried", 1, WAIT), "the retry")
    assert consumer._signals.count("settle_errors") == 0
    assert client.channel_backlog("t", "c").pending == 1
    (info,) = client.get_message(message_id).deliveries
    assert info.last_error == "ValueError: try later"
    clock.advance(61)
    client.run_maintenance()
    consumer.shutdown(timeout=10)
    with pytest.raises(novaque.MessageNotFound):
        client.get_message(message_id)
    assert client.channel_counters("t", "c").purged == 1


# -- a result the consumer cannot write ---------------------------------------------------------


class FlakyRetry:
    """Stands in for ``client._consuming.retry_after``: raises ``error`` until told to stop."""

    def __init__(self, client: novaque.Client, error: Exception) -> None:
        self.real = client._consuming.retry_after
        self.error = error
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        with self.lock:
            self.calls += 1
        raise self.error


@pytest.mark.sync_only
def test_a_settle_failing_for_good_is_given_up_and_its_lease_lapses(
    backend: Backend,
    client: novaque.Client,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs: list[int] = []

    def handler(msg: novaque.Message) -> None:
        runs.append(msg.attempts)
        if len(runs) == 1:
            raise ValueError("first try fails")

    flaky = FlakyRetry(client, sa.exc.DataError("UPDATE ...", {}, Exception("value too long")))
    monkeypatch.setattr(client._consuming, "retry_after", flaky)
    # A short lease: the heartbeat ticks every quarter of it (in real time).
    consumer = client.subscribe("t", "c", handler, lease=0.4, backoff=novaque.Backoff(base=0))
    message_id = client.publish("t", b"x")
    with caplog.at_level(logging.ERROR, logger="novaque"):
        consumer.start()
        waited(consumer._signals.wait("settle_given_up", 1, WAIT), "the settle given up")
    assert flaky.calls == 1  # not tried again: it would fail the same way
    assert consumer.in_flight == 0
    assert any("giving up after 1 failure" in r.getMessage() for r in caplog.records)
    leased = delivery_row(backend, only_delivery(backend))
    assert leased["state"] == STATE_LEASED
    # Past half the lease the heartbeat would renew a held delivery: not this one.
    clock.advance(0.3)
    beats = consumer._signals.count("heartbeats")
    waited(consumer._signals.wait("heartbeats", beats + 2, WAIT), "two heartbeats")
    assert delivery_row(backend, leased["id"])["visible_at"] == leased["visible_at"]
    # The lease lapses, the reaper releases it, and the consumer handles it again.
    monkeypatch.setattr(client._consuming, "retry_after", flaky.real)
    clock.advance(0.2)
    client.run_maintenance()
    waited(consumer._signals.wait("acked", 1, WAIT), "the second attempt's ack")
    consumer.shutdown(timeout=10)
    assert runs == [1, 2]
    assert client.get_message(message_id).deliveries == []  # acked


def only_delivery(backend: Backend) -> int:
    with backend.engine().connect() as conn:
        return int(conn.execute(sa.select(deliveries.c.id)).scalar_one())


@pytest.mark.sync_only
def test_a_settle_failing_transiently_is_retried_up_to_a_bound(
    client: novaque.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_ledger, "SETTLE_MAX_FAILURES", 3)
    flaky = FlakyRetry(client, sa.exc.OperationalError("UPDATE ...", {}, Exception("gone away")))
    monkeypatch.setattr(client._consuming, "retry_after", flaky)

    def fail(msg: novaque.Message) -> None:
        raise ValueError("no")

    consumer = client.subscribe("t", "c", fail).start()
    client.publish("t", b"x")
    waited(consumer._signals.wait("settle_given_up", 1, WAIT), "the settle given up")
    assert flaky.calls == 3
    assert consumer._signals.count("settle_errors") == 3
    assert consumer.in_flight == 0
    consumer.shutdown(timeout=10)
