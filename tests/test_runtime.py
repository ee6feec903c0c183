"""The client's background side: maintenance loops, start/shutdown, ``with client:``."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque.consumer import RetryDelay
from novaque.ops import maintain
from novaque.schema import STATE_DEAD, messages, stats
from novaque.testing import FakeClock
from tests.conftest import Backend
from tests.test_consumer import WAIT, Recorder, rows, waited

pytestmark = [pytest.mark.usefixtures("twin"), pytest.mark.pooled]

FAST = {
    "reap_interval": 0.02,
    "purge_interval": 0.02,
    "stats_flush_interval": 0.02,
    "stats_prune_interval": 0.02,
}


def passes(client: novaque.Client) -> dict[str, int]:
    return client._runtime.signals.snapshot()


def wait_passes(client: novaque.Client, *jobs: str, more: int = 2) -> None:
    """Wait until each job ran ``more`` more passes than now."""
    signals = client._runtime.signals
    target = {job: signals.count(job) + more for job in jobs}
    waited(
        signals.wait_until(lambda c: all(c[j] >= n for j, n in target.items()), WAIT),
        f"maintenance passes of {', '.join(jobs)}",
    )


def counter_totals(backend: Backend) -> dict[str, int]:
    with backend.engine().connect() as conn:
        row = conn.execute(
            sa.select(
                *(
                    sa.func.coalesce(sa.func.sum(stats.c[c]), 0).label(c)
                    for c in ("published", "claimed", "acked", "dead", "purged")
                )
            )
        ).one()
    return {k: int(v) for k, v in row._mapping.items()}


def test_start_runs_every_maintenance_job_repeatedly(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, **FAST)
    client.ensure_channel("t", "c")
    client.publish("t", b"short-lived", ttl=60)
    client.publish("t", b"last chance", max_attempts=1)
    (msg,) = [m for m in client.claim("t", "c", max_messages=2, lease=10) if m.max_attempts == 1]
    client.start()
    client.start()  # already running: nothing happens
    wait_passes(client, "reap", "purge", "flush", "prune")
    assert len(rows(backend)) == 2
    clock.advance(61)  # the lease ran out on its last attempt, and the TTL of the first
    wait_passes(client, "reap", "purge")
    (row,) = rows(backend)
    assert (row["message_id"], row["state"], row["dead_reason"]) == (
        msg.id,
        STATE_DEAD,
        "max_attempts",
    )
    with backend.engine().connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(messages)).scalar() == 1
    wait_passes(client, "flush")
    totals = counter_totals(backend)
    assert (totals["published"], totals["dead"], totals["purged"]) == (2, 1, 1)
    assert passes(client).get("errors", 0) == 0
    client.shutdown()
    assert client._runtime.maintenance is None


@pytest.mark.sync_only
def test_a_failing_job_is_logged_once_where_it_starts_failing_and_once_where_it_works(
    backend: Backend, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage is one ERROR (with its traceback) and one INFO, however many
    passes fail in between; the failures in between are DEBUG lines."""
    client = backend.client(**FAST)
    real_reap = client._maintenance.reap_since_last_pass
    failures = iter([RuntimeError("database went away"), RuntimeError("still away")])

    def flaky_reap() -> int:
        for exc in failures:
            raise exc
        return real_reap()

    monkeypatch.setattr(client._maintenance, "reap_since_last_pass", flaky_reap)
    with caplog.at_level(logging.DEBUG, logger="novaque"):
        client.start()
        waited(client._runtime.signals.wait("reap", 1, WAIT), "a reap pass after the failures")
    assert client._runtime.signals.count("reap_errors") == 2
    reap = [r for r in caplog.records if "maintenance job reap" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in reap] == [
        ("ERROR", "maintenance job reap failed (retrying): RuntimeError: database went away"),
        ("DEBUG", "maintenance job reap failed (retrying): RuntimeError: still away"),
        ("INFO", "maintenance job reap works again after 2 failed attempts"),
    ]
    assert reap[0].exc_info is not None  # the first failure in a row has its traceback
    # The other jobs did not wait for the failing one.
    assert client._runtime.signals.count("flush") >= 1
    client.shutdown()


@pytest.mark.sync_only
def test_a_consumers_claim_outage_is_logged_once_where_it_starts_and_once_where_it_ends(
    backend: Backend, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = backend.client()
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    real = client._consuming.ack_and_claim
    failures = iter([RuntimeError("database went away"), RuntimeError("still away")])

    def flaky(*args: Any, **kwargs: Any) -> Any:
        for exc in failures:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(client._consuming, "ack_and_claim", flaky)
    handled = threading.Event()
    with caplog.at_level(logging.DEBUG, logger="novaque"):
        client.subscribe_and_start("t", "c", lambda msg: handled.set())
        waited(handled.wait(WAIT), "the message handled after the outage")
        client.shutdown()
    claiming = [r for r in caplog.records if "claiming" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in claiming] == [
        (
            "ERROR",
            "consumer of t/c: error while claiming (retrying): RuntimeError: database went away",
        ),
        ("DEBUG", "consumer of t/c: error while claiming (retrying): RuntimeError: still away"),
        ("INFO", "consumer of t/c: claiming works again after 2 failed attempts"),
    ]


def test_a_stats_flush_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    backend: Backend, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flusher of a client that runs no maintenance, pass by pass: while
    the database is unreachable its counts wait in memory, and the outage is
    one ERROR at its start and one INFO at its end, however many passes fail."""
    # The flusher's own loop waits an hour for its first pass: the test runs the passes.
    client = backend.client(stats_flush_interval=3600)
    client.ensure_channel("t", "c")
    unreachable = sa.exc.OperationalError(
        "INSERT INTO novaque_stats ...", {}, ConnectionRefusedError(111, "Connection refused")
    )
    failing = [0]
    real_flush = maintain.flush_stats

    def flush_stats(*args: Any, **kwargs: Any) -> Any:
        if failing[0]:
            failing[0] -= 1
            raise unreachable
        return real_flush(*args, **kwargs)

    monkeypatch.setattr(maintain, "flush_stats", flush_stats)
    errors = RetryDelay()
    # The error as the executor raised it: the driver's, or on a server backend
    # the DatabaseUnavailable that chains it.
    started = (
        "could not flush stats (the counts stay in memory; retrying, and logging again "
        "once it works): "
    )
    with caplog.at_level(logging.DEBUG, logger="novaque"):
        client.publish("t", b"x")
        failing[0] = 5
        waits = [client._runtime._flush_tick(errors) for _ in range(6)]
        client.publish("t", b"y")
        failing[0] = 1
        waits += [client._runtime._flush_tick(errors) for _ in range(2)]
    assert [w is None for w in waits] == [False] * 5 + [True, False, True]
    logged = [r for r in caplog.records if r.levelno >= logging.INFO]
    for record in logged[::2]:
        assert "Connection refused" in record.getMessage()
    assert [(r.levelname, r.getMessage().split(": ")[0] + ": ") for r in logged[::2]] == [
        ("ERROR", started),
        ("ERROR", started),
    ]
    assert [(r.levelname, r.getMessage()) for r in logged[1::2]] == [
        ("INFO", "flushed stats again after 5 failed attempts; no counts were lost"),
        ("INFO", "flushed stats again after 1 failed attempt; no counts were lost"),
    ]
    assert [r.exc_info is not None for r in logged] == [True, False, True, False]
    assert counter_totals(backend)["published"] == 2


def test_several_clients_maintain_and_consume_at_once_without_double_counting(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """Maintenance in many processes at once: here three clients, each with its
    own engine (as separate processes would have), all reaping, purging and
    flushing every 20 ms while their consumers share one channel."""
    clients = [backend.client(**FAST) for _ in range(3)]
    clients[0].ensure_channel("busy", "c")
    ids = clients[0].publish_many("busy", [f"m{i}" for i in range(300)])
    recorders = [Recorder() for _ in clients]
    with caplog.at_level(logging.ERROR, logger="novaque"):
        for client in clients:
            client.start()
        consumers = [
            c.subscribe_and_start("busy", "c", r, max_in_flight=3, poll_interval=0.02)
            for c, r in zip(clients, recorders, strict=True)
        ]
        waited(
            consumers[0]._signals.wait_until(
                lambda _: sum(c._signals.count("acked") for c in consumers) >= 300, WAIT
            ),
            "300 acks",
        )
        for client in clients:
            client.shutdown()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    handled = sorted(i for r in recorders for i in r.ids())
    assert handled == sorted(ids)
    assert rows(backend) == []
    totals = counter_totals(backend)
    assert (totals["published"], totals["claimed"], totals["acked"]) == (300, 300, 300)


def test_with_client_starts_and_shuts_everything_down(backend: Backend) -> None:
    client = backend.client(**FAST)
    handler = Recorder()
    with client as entered:
        assert entered is client
        thread = client._runtime.maintenance
        assert thread is not None
        assert thread.is_alive()
        consumer = client.subscribe_and_start("t", "c", handler, poll_interval=0.02)
        client.publish("t", b"x")
        waited(consumer._signals.wait("acked", 1, WAIT), "the ack")
    assert not thread.is_alive()
    assert not consumer.running
    assert client._runtime.consumers == []
    # The counters buffered by the consumer were flushed at shutdown.
    assert counter_totals(backend)["acked"] == 1


def test_shutdown_closes_the_connections_novaque_opened(backend: Backend, tmp_path: Any) -> None:
    client = novaque.connect(backend.scratch_url(tmp_path))
    client.migrate()
    consumer = client.subscribe_and_start("t", "c", Recorder(), poll_interval=0.02)
    client.publish("t", b"x")
    waited(consumer._signals.wait("acked", 1, WAIT), "the ack")
    client.shutdown()
    for engine in {client.engine, client._context.executor.engine}:
        assert engine.pool.checkedout() == 0
        assert engine.pool.checkedin() == 0  # type: ignore[attr-defined]
    # Still usable afterwards: new connections are opened on demand.
    assert client.list_topics() == ["t"]
    client.shutdown()


def test_an_applications_engine_is_left_open(backend: Backend) -> None:
    engine = backend.engine()
    client = novaque.Client(engine)
    client.publish("t", b"x")
    with engine.connect():
        pass
    client.shutdown()
    assert engine.pool.checkedin() >= 1  # type: ignore[attr-defined]
    if client._context.executor.engine is not engine:  # novaque's own engine (SQLite) is closed
        assert client._context.executor.engine.pool.checkedin() == 0  # type: ignore[attr-defined]


def test_shutdown_without_start_is_harmless(client: novaque.Client) -> None:
    client.shutdown()
    client.shutdown(timeout=0)
    assert client._runtime.maintenance is None


@pytest.mark.sync_only
def test_shutdown_keeps_stats_it_could_not_flush(
    backend: Backend, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = backend.client()
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    real_run = client._context.run
    broken = threading.Event()
    broken.set()

    def run(fn: Any, **kwargs: Any) -> Any:
        if broken.is_set():
            raise RuntimeError("database went away")
        return real_run(fn, **kwargs)

    monkeypatch.setattr(client._context, "run", run)
    with caplog.at_level(logging.ERROR, logger="novaque"):
        client.shutdown()
    assert "could not flush stats at shutdown" in caplog.text
    broken.clear()
    client.flush_stats()
    assert counter_totals(backend)["published"] == 1
