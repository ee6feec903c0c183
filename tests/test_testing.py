"""novaque.testing: FakeClock, make_message, drain, and the pytest plugin's fixtures.

``drain`` runs on every backend (through ``client``); the plugin's
``novaque_client`` is SQLite by definition (a database file per test), and
is tested both in this suite (where the plugin is loaded by its entry point
beside the suite's own ``client`` and ``clock``) and in a pytest run of its own.
"""

from __future__ import annotations

import dataclasses
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import novaque
from novaque.testing import FakeClock, drain, make_message
from tests.conftest import Backend, run_pytest

WAIT = 60.0  # deadline of a wait on a consumer's threads


# -- FakeClock --------------------------------------------------------------------------


def test_fake_clock_moves_only_when_told() -> None:
    start = datetime(2030, 1, 1, tzinfo=timezone.utc)
    clock = FakeClock(start)
    assert clock() == start
    assert clock() == start
    assert clock.advance(30) == start + timedelta(seconds=30)
    assert clock.advance(timedelta(minutes=1)) == start + timedelta(seconds=90)
    assert clock.advance(days=1) == start + timedelta(days=1, seconds=90)
    assert clock.advance(0.5, hours=1) == start + timedelta(days=1, hours=1, seconds=90.5)
    clock.set(start)
    assert clock() == start
    assert clock().tzinfo is timezone.utc


def test_fake_clock_starts_now_and_keeps_utc() -> None:
    before = datetime.now(timezone.utc)
    clock = FakeClock()
    assert before <= clock() <= datetime.now(timezone.utc)
    paris = timezone(timedelta(hours=1))
    elsewhere = FakeClock(datetime(2030, 1, 1, 1, tzinfo=paris))
    assert elsewhere() == datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert elsewhere().tzinfo is timezone.utc


def test_fake_clock_refuses_naive_times_and_odd_steps() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        FakeClock(datetime(2030, 1, 1))
    clock = FakeClock()
    with pytest.raises(ValueError, match="timezone-aware"):
        clock.set(datetime(2030, 1, 1))
    with pytest.raises(TypeError, match="datetime"):
        clock.set("2030-01-01")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="number or a timedelta, got str"):
        clock.advance("30")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got bool"):
        clock.advance(True)


# -- make_message -----------------------------------------------------------------------


def test_make_message_defaults() -> None:
    before = datetime.now(timezone.utc)
    msg = make_message(body=b"hello")
    assert isinstance(msg, novaque.Message)
    assert (msg.topic, msg.channel, msg.body, msg.headers) == ("test", "test", b"hello", {})
    assert (msg.attempts, msg.max_attempts, msg.id, msg.delivery_id) == (1, 5, 1, 1)
    assert before <= msg.published_at <= datetime.now(timezone.utc)
    assert msg.published_at.tzinfo is timezone.utc
    assert msg.lease_expires_at == msg.published_at + timedelta(seconds=30)
    assert len(msg.lease_token) == 32
    assert make_message().body == b""
    assert make_message().lease_token != msg.lease_token


def test_make_message_takes_every_field() -> None:
    published = datetime(2030, 1, 1, tzinfo=timezone.utc)
    given: dict[str, Any] = {
        "id": 7,
        "topic": "orders",
        "channel": "mailer",
        "headers": {"lang": "fr"},
        "attempts": 3,
        "max_attempts": 9,
        "published_at": published,
        "delivery_id": 11,
        "lease_token": "t" * 32,
        "lease_expires_at": published + timedelta(hours=1),
    }
    msg = make_message("héllo", **given)
    assert msg.body == "héllo".encode()
    assert {k: getattr(msg, k) for k in given} == given
    assert make_message(published_at=published).lease_expires_at == published + timedelta(
        seconds=30
    )
    headers = {"a": "1"}
    assert make_message(headers=headers).headers is not headers  # a copy


def test_make_message_names_the_fields_it_knows() -> None:
    with pytest.raises(TypeError, match="unknown field.*attempt\\b.*a Message has: id, topic"):
        make_message(b"x", attempt=2)
    with pytest.raises(TypeError, match="channel_id"):
        make_message(b"x", channel_id=3)  # novaque's own, not a field to set
    with pytest.raises(TypeError, match="body must be bytes or str, got int"):
        make_message(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timezone-aware"):
        make_message(published_at=datetime(2030, 1, 1))


def test_a_handler_called_with_a_made_message() -> None:
    seen: list[tuple[str, bytes]] = []

    def handler(msg: novaque.Message) -> None:
        if msg.attempts >= msg.max_attempts:
            raise novaque.Reject("last try")
        seen.append((msg.headers["lang"], msg.body))

    handler(make_message(b"x", headers={"lang": "fr"}))
    assert seen == [("fr", b"x")]
    with pytest.raises(novaque.Reject):
        handler(make_message(attempts=5, headers={"lang": "fr"}))


# -- drain ------------------------------------------------------------------------------


class Calls:
    """A handler that records what it ran on and then does ``then`` (if given)."""

    def __init__(self, then: Any = None) -> None:
        self.then = then
        self.seen: list[tuple[bytes, int]] = []

    def __call__(self, msg: novaque.Message) -> None:
        self.seen.append((msg.body, msg.attempts))
        if self.then is not None:
            self.then(msg)


def fail(msg: novaque.Message) -> None:
    raise ConnectionError("mail server down")


def test_drain_acks_what_the_handler_returns_from(client: novaque.Client) -> None:
    client.ensure_channel("orders", "mailer")
    client.publish_many("orders", [b"a", b"b", b"c"])
    handler = Calls()
    assert drain(client, "orders", "mailer", handler) == 3
    assert handler.seen == [(b"a", 1), (b"b", 1), (b"c", 1)]
    assert client.channel_backlog("orders", "mailer").total == 0
    client.flush_stats()
    counters = client.channel_counters("orders", "mailer")
    assert (counters.claimed, counters.acked) == (3, 3)
    assert drain(client, "orders", "mailer", handler) == 0  # nothing left


def test_drain_retries_after_the_backoff_on_the_clock(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, backoff=novaque.Backoff(base=60, jitter=False))
    client.ensure_channel("orders", "mailer")
    mid = client.publish("orders", b"a", max_attempts=3)
    handler = Calls(then=fail)
    assert drain(client, "orders", "mailer", handler) == 1
    assert drain(client, "orders", "mailer", handler) == 0  # waiting out the backoff
    (delivery,) = client.get_message(mid).deliveries
    assert delivery.state == "pending"
    assert delivery.last_error == "ConnectionError: mail server down"
    assert delivery.visible_at == clock() + timedelta(seconds=60)
    clock.advance(59)
    assert drain(client, "orders", "mailer", handler) == 0
    clock.advance(1)
    assert drain(client, "orders", "mailer", handler) == 1
    clock.advance(120)  # the second failure waits twice the base
    assert drain(client, "orders", "mailer", handler) == 1
    assert handler.seen == [(b"a", 1), (b"a", 2), (b"a", 3)]
    (dead,) = client.list_dead("orders", "mailer")
    assert (dead.reason, dead.attempts) == ("max_attempts", 3)
    assert dead.last_error == "ConnectionError: mail server down"
    clock.advance(days=1)
    assert drain(client, "orders", "mailer", handler) == 0  # the dead stay dead


def test_drain_runs_an_immediate_retry_to_its_end(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, backoff=novaque.Backoff(base=0), default_max_attempts=4)
    client.ensure_channel("orders", "mailer")
    client.publish("orders", b"a")
    assert drain(client, "orders", "mailer", fail) == 4
    assert client.channel_backlog("orders", "mailer").dead == 1


def test_drain_dead_letters_a_rejection_at_once(client: novaque.Client) -> None:
    client.ensure_channel("orders", "mailer")
    client.publish("orders", b"{}")

    def reject(msg: novaque.Message) -> None:
        raise novaque.Reject("order has no email")

    assert drain(client, "orders", "mailer", reject) == 1
    (dead,) = client.list_dead("orders", "mailer")
    assert (dead.reason, dead.attempts) == ("order has no email", 1)


def test_drain_stops_at_the_limit(client: novaque.Client) -> None:
    client.ensure_channel("orders", "mailer")
    client.publish_many("orders", [b"1", b"2", b"3", b"4", b"5"])
    handler = Calls()
    assert drain(client, "orders", "mailer", handler, limit=2) == 2
    assert drain(client, "orders", "mailer", handler, limit=0) == 0
    assert client.channel_backlog("orders", "mailer").ready == 3
    assert client.channel_backlog("orders", "mailer").in_flight == 0  # nothing left leased
    assert drain(client, "orders", "mailer", handler, limit=10) == 3
    assert [body for body, _ in handler.seen] == [b"1", b"2", b"3", b"4", b"5"]


def test_drain_handles_what_the_handler_publishes(client: novaque.Client) -> None:
    client.ensure_channel("countdown", "w")
    client.publish("countdown", b"3")

    def step(msg: novaque.Message) -> None:
        left = int(msg.body)
        if left:
            client.publish("countdown", str(left - 1))

    handler = Calls(then=step)
    assert drain(client, "countdown", "w", handler) == 4
    assert [body for body, _ in handler.seen] == [b"3", b"2", b"1", b"0"]


def test_drain_refuses_bad_input(client: novaque.Client) -> None:
    client.ensure_channel("orders", "mailer")

    async def handler(msg: novaque.Message) -> None:
        return None

    with pytest.raises(TypeError, match="async function"):
        drain(client, "orders", "mailer", handler)
    with pytest.raises(TypeError, match="handler must be callable"):
        drain(client, "orders", "mailer", "not a handler")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"needs a novaque\.Client or novaque\.aio\.AsyncClient, got Engine"
    ):
        drain(client.engine, "orders", "mailer", Calls())  # type: ignore[arg-type]
    with pytest.raises(novaque.InvalidOption, match="limit must be >= 0"):
        drain(client, "orders", "mailer", Calls(), limit=-1)
    with pytest.raises(novaque.ChannelNotFound):
        drain(client, "orders", "typo", Calls())
    with pytest.raises(novaque.TopicNotFound):
        drain(client, "typo", "mailer", Calls())
    assert client.list_channels("orders") == ["mailer"]  # drain created nothing


def test_drain_raises_lease_lost_when_the_handler_settled_its_message(
    client: novaque.Client,
) -> None:
    client.ensure_channel("orders", "mailer")
    client.publish("orders", b"a")
    with pytest.raises(novaque.LeaseLost):
        drain(client, "orders", "mailer", client.ack)
    assert client.channel_backlog("orders", "mailer").total == 0


def test_drain_and_a_consumer_settle_alike(backend: Backend, clock: FakeClock) -> None:
    """One rule for what a result means: the dead letters of a consumer and
    of drain, for the same failures, are the same."""
    client = backend.client(clock=clock, backoff=novaque.Backoff(base=0), default_max_attempts=2)
    for channel in ("drained", "consumed"):
        client.ensure_channel("orders", channel)
    client.publish_many("orders", [b"fail", b"reject", b"ok"])

    def handler(msg: novaque.Message) -> None:
        if msg.body == b"fail":
            raise KeyError("no such order")
        if msg.body == b"reject":
            raise novaque.Reject("malformed")

    assert drain(client, "orders", "drained", handler) == 4  # 2 + 1 + 1
    consumer = client.subscribe_and_start("orders", "consumed", handler)
    assert consumer._signals.wait("dead", 2, WAIT), "timed out waiting for two dead letters"
    assert consumer._signals.wait("acked", 1, WAIT), "timed out waiting for the ack"
    consumer.shutdown()

    def letters(channel: str) -> list[tuple[Any, ...]]:
        return sorted(
            (d.message_id, d.reason, d.attempts, d.last_error)
            for d in client.list_dead("orders", channel)
        )

    assert letters("drained") == letters("consumed")
    assert [d[1] for d in letters("drained")] == ["max_attempts", "malformed"]
    assert letters("drained")[0][3] == "KeyError: 'no such order'"
    assert client.channel_backlog("orders", "consumed").total == 2  # the ok one acked


# -- the plugin's fixtures, in this suite ----------------------------------------------


def test_novaque_client_is_migrated_sqlite_on_the_fake_clock(
    novaque_client: novaque.Client, novaque_clock: FakeClock, tmp_path: Path
) -> None:
    assert novaque_client.database_family == "SQLite"
    assert novaque_client.engine.url.database == str(tmp_path / "novaque.db")
    assert novaque_client.list_topics() == []  # migrated, and empty
    novaque_client.ensure_channel("jobs", "w")
    novaque_client.publish("jobs", b"x", delay=10)
    assert drain(novaque_client, "jobs", "w", Calls()) == 0
    novaque_clock.advance(10)
    assert drain(novaque_client, "jobs", "w", Calls()) == 1


def test_the_suites_own_fixtures_live_beside_the_plugins(
    client: novaque.Client, clock: FakeClock, novaque_clock: FakeClock
) -> None:
    assert clock is not novaque_clock
    assert client.list_topics() == []


# -- the plugin, in a pytest run of its own ---------------------------------------------

PROJECT_TESTS = """
import dataclasses
import threading

import pytest

import novaque

SEEN = []


@pytest.fixture
def novaque_options():
    return {"default_max_attempts": 2}


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_has_a_database_of_its_own(novaque_client, novaque_clock, tmp_path, run):
    assert novaque_client.list_topics() == []
    novaque_client.ensure_channel("jobs", f"w{run}")
    novaque_client.publish("jobs", b"x")
    (msg,) = novaque_client.claim("jobs", f"w{run}")
    assert msg.published_at == novaque_clock()
    assert msg.max_attempts == 2
    assert tmp_path.joinpath("novaque.db").exists()
    SEEN.append(novaque_client)


def test_clients_are_shut_down_at_the_end_of_their_test():
    assert len(SEEN) == 2
    for client in SEEN:
        assert not any(c.running for c in client._runtime.consumers)
        assert not client._context.owns_engine or client.engine.pool.checkedout() == 0


def test_a_consumer_left_running_is_stopped(novaque_client):
    consumer = novaque_client.subscribe_and_start("jobs", "w", lambda msg: None)
    SEEN.append(consumer)


def test_the_consumer_was_stopped():
    assert not SEEN[-1].running
"""


def test_installing_novaque_gives_a_project_the_fixtures(tmp_path: Path) -> None:
    (tmp_path / "test_project.py").write_text(textwrap.dedent(PROJECT_TESTS))
    done = run_pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 passed" in done.stdout, done.stdout


def test_novaque_options_must_not_set_the_clock(tmp_path: Path) -> None:
    (tmp_path / "test_clock.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.fixture
            def novaque_options():
                return {"clock": lambda: None}

            def test_it(novaque_client):
                pass
            """
        )
    )
    done = run_pytest(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "novaque_options must not set clock" in done.stdout


def test_message_fields_match_make_message() -> None:
    """make_message offers every Message field but novaque's own (channel id,
    lease length, ordering key: fields left out of its repr)."""
    public = [f.name for f in dataclasses.fields(novaque.Message) if f.repr]
    assert "channel_id" not in public
    assert {"id", "topic", "channel", "body", "headers", "attempts", "group"} <= set(public)
    with pytest.raises(TypeError) as raised:
        make_message(nope=1)
    assert str(raised.value).endswith("a Message has: " + ", ".join(public))
