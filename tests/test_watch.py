"""The change watcher of SQLite and MySQL/MariaDB: consumers and long polls woken by
deliveries committed elsewhere, as PostgreSQL's NOTIFY wakes them.

"Elsewhere" is another client on its own engine (or another process): no
in-process wake-up reaches the waiting side. The waiting side polls every hour
(idle waits of at least 112 s), so only the watcher can wake it within the
tests' bound. Every test runs on novaque.Client and on the asyncio twin.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque.dialects import for_engine
from novaque.dialects.watch import ChangeWatcher, MySQLWatcher, SQLiteWatcher
from tests.conftest import Backend
from tests.test_consumer import WAIT, Recorder, waited
from tests.test_consumer_processes import Worker, eventually, go, live_deliveries
from tests.test_settle_more import InThread

pytestmark = pytest.mark.usefixtures("twin")

#: How soon a publish elsewhere must reach the waiting side: far below its idle
#: waits (>= 112 s), generous for a shared machine.
WOKEN_WITHIN = 5.0
#: The backends with a change watcher (PostgreSQL listens instead).
watched = pytest.mark.parametrize("backend", ["sqlite", "mysql"], indirect=True)


def watcher_of(client: novaque.Client) -> ChangeWatcher:
    """The running watcher of ``client`` (the twin's SQLite one runs on a thread
    of its own, behind a wrapper)."""
    run = client._runtime.listening
    assert run is not None
    assert run.conn is not None
    found = getattr(run.conn, "_listener", run.conn)
    assert isinstance(found, ChangeWatcher)
    return found


class _Lost:
    """A SQLite connection that fails like a lost one; closing it closes the real one."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self._real = real

    def cursor(self) -> sqlite3.Cursor:
        raise sqlite3.OperationalError("disk I/O error (the test's lost connection)")

    def close(self) -> None:
        self._real.close()


@watched
def test_a_publish_of_another_client_wakes_an_idle_consumer(backend: Backend) -> None:
    # Plain engines: on MySQL the default REPEATABLE READ, which the watcher's
    # reads must not be stuck in.
    consumer_side = backend.client(poll_interval=3600)
    producer_side = backend.client()  # its own engine: no local wake-up
    handler = Recorder()
    consumer = consumer_side.subscribe_and_start("t", "c", handler)
    signals = consumer_side._runtime.signals
    waited(signals.wait("listen_connected", 1, WAIT), "the watcher")
    waited(consumer._signals.wait("polls", 1, WAIT), "the first claim pass")
    for n in range(1, 4):  # and again: each one is news
        producer_side.publish("t", f"over the file {n}".encode())
        waited(consumer._signals.wait("acked", n, WOKEN_WITHIN), f"the woken consumer ({n})")
    assert signals.count("notified") >= 3
    assert consumer_side._runtime.listening is not None
    consumer.shutdown()
    assert consumer_side._runtime.listening is None  # its last consumer gone: the watcher stopped


@watched
def test_a_waiting_claim_is_woken_by_a_publish_of_another_client(backend: Backend) -> None:
    waiting = backend.client(poll_interval=3600)
    producer = backend.client()
    waiting.ensure_channel("t", "c")
    signals = waiting._runtime.signals
    poll = InThread(lambda: waiting.claim("t", "c", wait=WAIT))
    waited(signals.wait("listen_connected", 1, WAIT), "the watcher")
    # The watcher wakes every waiter once it runs (a publish may have come
    # before it looked): the second fetch, still empty, follows that.
    waited(signals.wait("long_poll_fetches", 2, WAIT), "the fetch after the watcher started")
    message_id = producer.publish("t", b"over the file")
    waited(signals.wait("long_poll_fetches", 3, WOKEN_WITHIN), "the woken fetch")
    [msg] = poll.join()
    assert msg.id == message_id
    assert waiting._runtime.listening is None  # no consumer, no other poll: the watcher stopped
    waiting.ack(msg)


@watched
def test_topics_without_waiters_wake_nobody_and_news_is_told_once(backend: Backend) -> None:
    consumer_side = backend.client(poll_interval=3600)
    producer_side = backend.client()
    producer_side.ensure_channel("other", "c")
    consumer = consumer_side.subscribe_and_start("t", "c", Recorder())
    signals = consumer_side._runtime.signals
    waited(signals.wait("listen_connected", 1, WAIT), "the watcher")
    producer_side.publish_many("other", [b"1", b"2", b"3"])
    producer_side.publish("t", b"x")
    waited(consumer._signals.wait("acked", 1, WOKEN_WITHIN), "the woken consumer")
    # Two topics had news, each told once (the consumer's own ack is no news).
    waited(signals.wait("notified", 2, WAIT), "both topics told")
    assert signals.count("notified") == 2
    consumer.shutdown()


@watched
def test_no_watcher_runs_while_nothing_waits(backend: Backend) -> None:
    client = backend.client(poll_interval=3600)
    client.publish("t", b"x")  # publishing, claiming without wait: no watcher
    client.ensure_channel("t", "c")
    assert client.claim("t", "c") == []
    assert client._runtime.listening is None
    consumer = client.subscribe_and_start("t", "c", Recorder())
    waited(client._runtime.signals.wait("listen_connected", 1, WAIT), "the watcher")
    consumer.shutdown()
    assert client._runtime.listening is None
    assert client._runtime.signals.count("listen_connected") == 1


@watched
def test_with_the_watcher_off_consumers_poll(backend: Backend) -> None:
    consumer_side = backend.client(poll_interval=0.05, watch_interval=None)
    producer_side = backend.client()
    assert consumer_side._runtime.watch_s is None
    consumer = consumer_side.subscribe_and_start("t", "c", Recorder())
    waited(consumer._signals.wait("polls", 1, WAIT), "the first claim pass")
    producer_side.publish("t", b"found by polling")
    waited(consumer._signals.wait("acked", 1, WAIT), "the polling consumer")
    assert consumer_side._runtime.listening is None
    assert consumer_side._runtime.signals.count("listen_connected") == 0
    consumer.shutdown()


@watched
def test_the_watcher_reconnects_when_its_connection_is_lost(backend: Backend) -> None:
    consumer_side = backend.client(poll_interval=3600)
    producer_side = backend.client()
    consumer = consumer_side.subscribe_and_start("t", "c", Recorder())
    signals = consumer_side._runtime.signals
    waited(signals.wait("listen_connected", 1, WAIT), "the watcher")
    watcher = watcher_of(consumer_side)
    if isinstance(watcher, MySQLWatcher):
        with producer_side.engine.connect() as conn:
            conn.exec_driver_sql(f"KILL {watcher.session_id}")
    else:
        # SQLite has no server to drop it: its next look fails as on a lost
        # connection (swapped in, not closed from here: the watcher's own
        # thread may be inside a statement).
        watcher._conn = _Lost(watcher._conn)
    waited(signals.wait("listen_connected", 2, WAIT), "the watcher to reconnect")
    assert signals.count("listen_errors") >= 1
    producer_side.publish("t", b"after the drop")
    waited(consumer._signals.wait("acked", 1, WOKEN_WITHIN), "the woken consumer")
    consumer.shutdown()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_sqlite_watcher_holds_no_read_transaction(backend: Backend, tmp_path: Any) -> None:
    consumer_side = backend.client(poll_interval=3600)
    producer_side = backend.client()
    consumer = consumer_side.subscribe_and_start("t", "c", Recorder())
    signals = consumer_side._runtime.signals
    waited(signals.wait("listen_connected", 1, WAIT), "the watcher")
    producer_side.publish("t", b"x")
    waited(consumer._signals.wait("acked", 1, WOKEN_WITHIN), "the woken consumer")
    # A read transaction left open would pin the WAL: a TRUNCATE checkpoint
    # could not complete (busy = 1) while the watcher keeps looking.
    path = sa.make_url(backend.url).database
    assert path is not None
    raw = sqlite3.connect(path, timeout=30)
    try:
        for _ in range(5):
            busy, _log, _done = raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            assert busy == 0
    finally:
        raw.close()
    consumer.shutdown()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_postgres_listens_instead_of_watching(backend: Backend) -> None:
    client = backend.client()
    assert client._runtime.watch_s is None
    assert client._context.dialect.supports_notify


# -- the watcher itself --------------------------------------------------------------------


@pytest.mark.sync_only
@watched
def test_a_watcher_reports_each_topic_with_news_once(backend: Backend) -> None:
    producer = backend.client()
    producer.ensure_channel("a", "c")
    producer.ensure_channel("b", "c")
    producer.ensure_topic("none")  # a topic without channels gets no deliveries
    producer.publish("a", b"before")  # before the watcher: not news to it
    engine = backend.engine()
    watcher = for_engine(engine).open_watcher(engine, 0.001)
    try:
        assert isinstance(watcher, (SQLiteWatcher, MySQLWatcher))
        assert watcher.wait(0.01) == []
        producer.publish("a", b"1")
        producer.publish_many("b", [b"2", b"3"])
        producer.publish("none", b"to nobody")
        seen: list[str] = []
        while len(seen) < 2:
            found = watcher.wait(WAIT)
            assert found, "the watcher saw nothing"
            seen += found
        assert sorted(seen) == ["a", "b"]
        # Acks, stats, settings: commits that are no new deliveries.
        for msg in producer.claim("a", "c", max_messages=5):
            producer.ack(msg)
        producer.flush_stats()
        assert watcher.wait(0.02) == []
    finally:
        watcher.close()
        watcher.close()  # twice is harmless


@pytest.mark.sync_only
@watched
def test_interrupt_ends_a_watchers_wait_at_once(backend: Backend) -> None:
    engine = backend.engine()
    watcher = for_engine(engine).open_watcher(engine, 0.001)
    try:
        result: list[list[str]] = []
        waiting = threading.Thread(target=lambda: result.append(watcher.wait(WAIT)))
        waiting.start()
        watcher.interrupt()
        waiting.join(WOKEN_WITHIN)
        assert not waiting.is_alive()
        assert result == [[]]
    finally:
        watcher.close()


@pytest.mark.sync_only
def test_watch_interval_is_validated() -> None:
    assert novaque.Options().watch_interval == 0.002
    assert novaque.Options(watch_interval=None).watch_interval is None
    assert novaque.Options(watch_interval=timedelta(milliseconds=5)).watch_interval
    with pytest.raises(novaque.InvalidOption, match="None turns the change watcher off"):
        novaque.Options(watch_interval=0)
    with pytest.raises(novaque.InvalidOption, match="None turns the change watcher off"):
        novaque.Options(watch_interval=timedelta(0))
    with pytest.raises(novaque.InvalidOption, match="Options.watch_interval must be > 0"):
        novaque.Options(watch_interval=-1)
    with pytest.raises(novaque.InvalidOption, match="watch_interval must be a timedelta"):
        novaque.Options(watch_interval="2ms")  # type: ignore[arg-type]
    with pytest.raises(novaque.InvalidOption, match="the limit is 60 s"):
        novaque.Options(watch_interval=61)
    with pytest.raises(novaque.InvalidOption, match="must be > 0"):
        novaque.Options(watch_interval=float("nan"))
    with pytest.raises(novaque.InvalidOption, match="rounds to 0 .*; None turns the change"):
        novaque.Options(watch_interval=1e-9)


# -- another process -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.sync_only
def test_a_consumer_in_another_process_is_woken_by_a_publish(
    backend: Backend, tmp_path: Path, workers: list[Worker]
) -> None:
    """On every backend: NOTIFY on PostgreSQL, the watcher on the others."""
    client = backend.client()
    client.ensure_channel("t", "c")
    worker = Worker(backend, tmp_path / "woken.txt", max_in_flight=1, poll_interval=3600)
    workers.append(worker)
    go([worker])
    for n in range(1, 4):
        # The last one is acked (its row gone: the ack rode with the claim
        # after it, which found nothing): the worker idles for >= 112 s now.
        eventually(lambda: live_deliveries(backend) == 0, "the previous ack")
        sent = time.monotonic_ns()
        message_id = client.publish("t", f"news {n}".encode())

        def handled(message_id: int = message_id) -> bool:
            return any(line[0] == "S" and int(line[3]) == message_id for line in worker.lines())

        eventually(handled, f"the woken worker ({n})", timeout=WOKEN_WITHIN)
        started = next(int(line[4]) for line in worker.lines() if int(line[3]) == message_id)
        assert started - sent < WOKEN_WITHIN * 1e9
    worker.stop()
    assert worker.proc.returncode == 0
