"""The change watcher of SQLite and MySQL/MariaDB: consumers and long polls woken by
deliveries committed elsewhere, as PostgreSQL's NOTIFY wakes them.

"Elsewhere" is another client on its own engine (or another process): no
in-process wake-up reaches the waiting side. The waiting side polls every hour
(idle waits of at least 112 s), so only the watcher can wake it within the
tests' bound. Every test runs on novaque.Client and on the asyncio twin.

How often the watcher looks (its back-off while idle) is a pure schedule,
:class:`~novaque.dialects.watch.Pace`, tested on given times; a watcher's
waits are tested on a clock the test moves (its pauses take no time); one
test on MariaDB counts, on the wire, what an idle started client sends in a
second of real time.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from benchmarks._wire import CommandCounter
from novaque.dialects import for_engine
from novaque.dialects.watch import QUIET_SHARE, ChangeWatcher, MySQLWatcher, Pace, SQLiteWatcher
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
#: The watcher's two intervals by default (Options.watch_interval, .watch_idle_interval).
FAST = novaque.Options().watch_interval
IDLE = novaque.Options().watch_idle_interval


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


@pytest.mark.sync_only
def test_watch_idle_interval_is_validated() -> None:
    assert novaque.Options().watch_idle_interval == 0.2
    assert novaque.Options(watch_idle_interval=timedelta(seconds=2)).watch_idle_interval
    assert novaque.Options(watch_idle_interval=0.001, watch_interval=0.002)  # no back-off
    with pytest.raises(novaque.InvalidOption, match="allowed: > 0 and at most 60 s, and one at"):
        novaque.Options(watch_idle_interval=0)
    with pytest.raises(novaque.InvalidOption, match="Options.watch_idle_interval must be > 0"):
        novaque.Options(watch_idle_interval=-1)
    with pytest.raises(novaque.InvalidOption, match="watch_idle_interval must be a timedelta"):
        novaque.Options(watch_idle_interval=None)  # type: ignore[arg-type]
    with pytest.raises(novaque.InvalidOption, match="is 61 s; the limit is 60 s"):
        novaque.Options(watch_idle_interval=61)
    with pytest.raises(novaque.InvalidOption, match="must be > 0"):
        novaque.Options(watch_idle_interval=float("inf"))


# -- how often it looks --------------------------------------------------------------------


def schedule(
    pace: Pace, start: float, end: float, published: list[float]
) -> list[tuple[float, float]]:
    """The watcher's looks from ``start`` to ``end`` while deliveries are
    published at ``published`` (sorted): a look that finds some is news, one
    that finds none waits as ``pace`` says. Returns, for each delivery, when
    it was published and when a look saw it."""
    seen: list[tuple[float, float]] = []
    now = start
    while now <= end:
        fresh = [at for at in published[len(seen) :] if at <= now]
        if fresh:
            seen += [(at, now) for at in fresh]
            pace.news(now)
        now += pace.wait(now)
    return seen


@pytest.mark.sync_only
def test_the_pace_looks_often_after_news_and_backs_off_to_the_idle_interval() -> None:
    assert (FAST, IDLE) == (0.002, 0.2)
    pace = Pace(FAST, IDLE, now=10.0)
    assert pace.wait(10.0) == FAST
    assert pace.wait(10.0 + FAST / QUIET_SHARE) == pytest.approx(FAST)  # 20 ms of quiet
    assert pace.wait(10.05) == pytest.approx(0.005)  # a tenth of the quiet
    assert pace.wait(10.5) == pytest.approx(0.05)
    assert pace.wait(11.0) == pytest.approx(0.1)
    assert pace.wait(12.0) == pytest.approx(IDLE)  # two seconds of quiet: idle
    assert pace.wait(1000.0) == IDLE
    pace.news(1000.0)
    assert pace.wait(1000.0) == FAST
    pace.news(999.0)  # news told late never moves it back
    assert pace.news_at == 1000.0
    assert pace.wait(1000.001) == FAST

    # The waits from news to idle: each at most 1.1 times the one before.
    pace = Pace(FAST, IDLE, now=0.0)
    now, waits = 0.0, []
    while not waits or waits[-1] < IDLE:
        waits.append(pace.wait(now))
        now += waits[-1]
    assert all(b >= a for a, b in itertools.pairwise(waits))
    assert all(b <= a * (1 + QUIET_SHARE) + 1e-12 for a, b in itertools.pairwise(waits))
    assert 50 <= len(waits) <= 70, waits  # about 60 looks from news to idle
    assert now < 2.4
    # Then idle: 1 / IDLE looks a second.
    looks_in_a_second = 0
    end = now + 1.0
    while now < end - 1e-9:
        now += pace.wait(now)
        looks_in_a_second += 1
    assert looks_in_a_second == round(1 / IDLE)


@pytest.mark.sync_only
def test_a_steady_stream_sees_the_interval_and_a_burst_after_quiet_pays_the_idle_once() -> None:
    # Idle for 5 s, then W3: 300 deliveries 10 ms apart.
    stream = [5.0 + n * 0.010 for n in range(300)]
    seen = schedule(Pace(FAST, IDLE, 0.0), 0.0, stream[-1] + 1, stream)
    assert len(seen) == 300
    first_look = seen[0][1]
    assert first_look - seen[0][0] <= IDLE + 1e-9  # the first after the quiet: the idle interval
    # Those published before that look (at most the idle interval's worth) are
    # seen by it; every later one within the interval, as without back-off.
    assert first_look - stream[0] <= IDLE + 1e-9
    later = [(at, look) for at, look in seen if at > first_look]
    assert len(later) >= 300 - IDLE / 0.010 - 1
    assert max(look - at for at, look in later) <= FAST + 1e-9
    # Gaps longer than ten intervals: within a tenth of the gap (and a look).
    for gap in (0.05, 0.3, 0.9):
        stream = [1.0 + n * gap for n in range(20)]
        seen = schedule(Pace(FAST, IDLE, 0.0), 0.0, stream[-1] + 1, stream)
        latency = max(look - at for at, look in seen if at > seen[0][1])
        assert latency <= max(FAST, min(IDLE, QUIET_SHARE * gap * 1.1)) + 1e-9, gap


@pytest.mark.sync_only
def test_an_idle_interval_at_or_below_the_interval_never_backs_off() -> None:
    for idle in (0.05, 0.01):
        pace = Pace(0.05, idle, now=0.0)
        assert pace.idle_interval == 0.05
        assert {pace.wait(t) for t in (0.0, 1.0, 3600.0)} == {0.05}


class Watched:
    """A watcher on a clock of the test's: its pauses take no time, they move
    the clock (and still see an interrupt or a hurry sent meanwhile)."""

    def __init__(self, watcher: ChangeWatcher) -> None:
        self.watcher = watcher
        self.now = 1000.0
        self.pauses: list[float] = []
        #: Called inside a pause, with the pause's length.
        self.during: Any = None
        watcher._clock = lambda: self.now
        watcher.pace = Pace(watcher.pace.interval, watcher.pace.idle_interval, self.now)
        self._real_pause = watcher._pause
        watcher._pause = self._pause  # type: ignore[method-assign]

    def _pause(self, timeout: float) -> bool:
        self.pauses.append(timeout)
        if self.during is not None:
            self.during(timeout)
        self.now += timeout
        return self._real_pause(0.0)


@pytest.mark.sync_only
@watched
def test_a_watcher_backs_off_while_idle_and_looks_often_again_on_news(backend: Backend) -> None:
    producer = backend.client()
    producer.ensure_channel("t", "c")
    engine = backend.engine()
    watcher = for_engine(engine).open_watcher(engine, FAST, idle_interval=IDLE)
    try:
        watched_ = Watched(watcher)
        pauses = watched_.pauses
        sent = watcher.statements
        assert watcher.wait(3.0) == []
        # One statement a look that found nothing, a pause between two looks.
        assert watcher.statements - sent == len(pauses) + 1
        assert pauses[0] == FAST
        assert pauses[:-1] == sorted(pauses[:-1])  # (the last one ends at the deadline)
        assert max(pauses) == pytest.approx(IDLE)
        started = 1000.0
        last_second = [p for n, p in enumerate(pauses) if started + sum(pauses[:n]) >= 1002.0]
        assert len(last_second) <= round(1 / IDLE) + 1
        assert 50 <= len(pauses) <= 85  # ~60 to idle, then 5 a second

        # A hurry (messages moving in the process) ends a long pause at once.
        del pauses[:]

        def hurry_once(timeout: float) -> None:
            if timeout > FAST and watched_.during is not None:
                watched_.during = None
                watcher.hurry()

        watched_.during = hurry_once
        assert watcher.wait(0.5) == []
        assert pauses[0] == pytest.approx(IDLE)  # it had backed off
        assert pauses[1] == FAST  # the hurried pause ended: looking often again
        assert watched_.during is None

        # Backed off again, then news: found at the next look; often again after.
        assert watcher.wait(3.0) == []
        producer.publish("t", b"while backed off")
        del pauses[:]
        assert watcher.wait(3.0) == ["t"]
        assert pauses == []  # the first look found it
        assert watcher.wait(0.01) == []
        assert set(pauses[:-1]) == {FAST}  # (the last one ends at the deadline)
        assert pauses[-1] <= FAST
    finally:
        watcher.close()


@watched
def test_messages_claimed_here_hurry_the_watcher(backend: Backend) -> None:
    client = backend.client(poll_interval=3600)
    client.ensure_channel("u", "c")
    consumer = client.subscribe_and_start("t", "c", Recorder())
    signals = client._runtime.signals
    waited(signals.wait("listen_connected", 1, WAIT), "the watcher")
    watcher = watcher_of(client)
    hurried: list[str] = []
    real_hurry = watcher.hurry

    def hurry() -> None:
        hurried.append(threading.current_thread().name)
        real_hurry()

    watcher.hurry = hurry  # type: ignore[method-assign]
    client.publish("t", b"for the consumer")
    waited(consumer._signals.wait("acked", 1, WAIT), "the consumer")
    assert len(hurried) >= 1  # its claim that got the message
    before = len(hurried)
    client.publish("u", b"for a long poll")
    [msg] = client.claim("u", "c", wait=WAIT)  # the fetch gets it at once
    assert len(hurried) == before + 1
    client.ack(msg)
    consumer.shutdown()


@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_an_idle_started_client_sends_at_most_20_statements_a_second(backend: Backend) -> None:
    """What the client sends is counted on the wire (a relay between it and the
    server), over a second of real time once its watcher backed off: the
    watcher's looks and the maintenance. (Its consumer polls every hour here;
    at the default ``poll_interval`` each idle consumer adds about 5 claims a
    second of its own.)"""
    target = sa.make_url(backend.url)
    with CommandCounter(target.host or "127.0.0.1", target.port or 3306) as relay:
        through = target.set(host="127.0.0.1", port=relay.port)
        consumer_side = backend.client(
            through.render_as_string(hide_password=False), poll_interval=3600
        )
        producer_side = backend.client()  # straight to the server, its own engine
        consumer_side.start()  # maintenance runs too
        consumer = consumer_side.subscribe_and_start("t", "c", Recorder())
        signals = consumer_side._runtime.signals
        waited(signals.wait("listen_connected", 1, WAIT), "the watcher")
        waited(consumer._signals.wait("polls", 1, WAIT), "the first claim pass")
        watcher = watcher_of(consumer_side)
        pace = watcher.pace
        # About a second of quiet (real time: the watcher's own clock).
        eventually(lambda: pace.wait(watcher._clock()) == pace.idle_interval, "the back-off")

        def watchers_link() -> int:
            [link] = [x for x in relay.links if x.last_query.startswith("SELECT MAX(id)")]
            return link.commands

        own, wire, link, started = (
            watcher.statements,
            relay.commands(),
            watchers_link(),
            time.monotonic(),
        )
        threading.Event().wait(1.0)  # a second of idleness, measured
        elapsed = time.monotonic() - started
        own, wire, link = watcher.statements - own, relay.commands() - wire, watchers_link() - link
        assert wire <= 20 * elapsed + 2, (wire, elapsed, relay.links)
        assert own >= 3  # the watcher did look meanwhile (about 10 times)
        assert own <= elapsed / IDLE + 2
        assert abs(link - own) <= 1  # the wire saw what the watcher says it sent
        assert wire >= link

        # Still woken promptly by a publish elsewhere, then looking often again.
        sent = watcher._clock()
        producer_side.publish("t", b"after the quiet")
        waited(consumer._signals.wait("acked", 1, WOKEN_WITHIN), "the woken consumer")
        assert pace.news_at >= sent
        consumer_side.shutdown()


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
