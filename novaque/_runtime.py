"""The running side of the client: consumers, maintenance loops, and wake-ups.

:class:`Runtime` is the part of :class:`novaque.Client` that runs things over
the parts of its core (:class:`~novaque._core.Parts`; the client forwards to it):

- ``subscribe`` / ``subscribe_and_start``, which make :class:`~novaque.Consumer`
  objects;
- ``start`` / ``shutdown`` / ``with client:``: one maintenance loop that runs
  the lease reaper, the TTL purge with dead-letter retention (and on SQLite
  a step of giving free pages back), the stats flush, the stats prune and
  the cleanup of consumers that died at their intervals. Every job is safe
  to run in many processes at once; a failure is logged at ERROR and the job
  is tried again after a backoff;
- one wake-up connection per client that wakes the local consumers and long
  polls (``claim(wait=)``, ``pop(wait=)``) of a topic that got deliveries
  from elsewhere, held while any of them runs: PostgreSQL's ``LISTEN``
  (the server pushes ``NOTIFY``), or on SQLite and MySQL/MariaDB the change
  watcher, which looks for new deliveries every ``Options.watch_interval``
  while messages move and backs off to every ``Options.watch_idle_interval``
  when none do (``watch_interval=None``: none, consumers poll;
  ``Options.listen=False``: no wake-up connection at all). Consumers' claims
  and long polls' fetches that get messages tell it (:meth:`Runtime.messages_moving`).
  It reconnects when the connection drops
  and then wakes every one once, since a wake-up may have been missed. A
  ``LISTEN`` that cannot be delivered (PgBouncer's transaction pooling) is
  reported once, and the client's consumers poll from then on.

Each loop is a thread for :class:`novaque.Client` and a task for the asyncio
twin (``_waits``: :mod:`novaque._waits`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from novaque import _validate
from novaque._consumers_online import Presence
from novaque._core import Parts
from novaque._signals import Signals
from novaque._waits import Event, Runner, jittered
from novaque.consumer import (
    Consumer,
    Handler,
    RetryDelay,
    begin_shutdown,
    finish_shutdown,
    waker_of,
)
from novaque.dialects import ListenNotDelivered, NotifyListener
from novaque.errors import InvalidOption, SchemaOutOfDate
from novaque.models import Message
from novaque.options import Backoff, Duration, check_int, seconds, watch_interval

__all__ = ["Runtime"]


#: Largest ``max_in_flight`` of one consumer (it is also its number of threads).
MAX_IN_FLIGHT = 1000
#: How long a listener waits for notifications before looking at its stop flag.
LISTEN_WAIT_S = 5.0
#: Spread of maintenance intervals (+-10 %), so processes do not run in lockstep.
INTERVAL_JITTER = 0.1
#: How often the maintenance loop publishes the due fires of schedules (a
#: fire is published at most this late, plus the time the pass takes).
SCHEDULES_INTERVAL_S = 1.0


@dataclass
class _Job:
    name: str
    interval: float
    run: Callable[[], object]
    due: float = 0.0
    errors: RetryDelay | None = None


@dataclass
class _Listening:
    """One run of the listener loop, with its own stop flag."""

    stop: Event
    lock: threading.Lock = field(default_factory=threading.Lock)
    loop: Runner | None = None
    conn: NotifyListener | None = None


class Runtime:
    """Consumers, background maintenance and wake-ups over the parts of one
    client's core.

    It holds no SQL and no operation: what it runs goes through the parts'
    methods (its consumers claim and settle through the client's
    :class:`~novaque._consuming.Consuming`). It registers two things with
    them: a counter arriving in the empty buffer starts the stats flusher
    (unless maintenance runs), and a long poll (``claim(wait=)``,
    ``pop(wait=)``) waits here.
    """

    def __init__(self, parts: Parts) -> None:
        self.context = context = parts.context
        self.topology = parts.topology
        self.consuming = parts.consuming
        self.jobs = parts.maintenance
        self.options = context.options
        self.log = context.log
        self._waits = waits = context.waits
        self._lock = threading.Lock()
        #: Consumers that shut down with the client; those running now.
        self.consumers: list[Consumer] = []
        self._running: set[Consumer] = set()
        self.maintenance: Runner | None = None
        self._maintenance_stop = waits.event()
        #: The wake-up loop's current run, while one is wanted.
        self.listening: _Listening | None = None
        #: Long polls waiting now (they share the listener with the consumers).
        self._pollers = 0
        #: Whether this client holds a wake-up connection (``Options.listen``;
        #: off for good once a LISTEN was found not delivered).
        self.listens = context.options.listen
        #: Seconds between two looks of the change watcher, or None: no watcher
        #: (PostgreSQL listens instead; ``Options.watch_interval=None``).
        interval = context.options.watch_interval
        self.watch_s: float | None = None
        if context.dialect.supports_watch and interval is not None:
            self.watch_s = watch_interval(interval, "Options.watch_interval")
        #: Its interval once nothing moved for a while (``Options.watch_idle_interval``).
        self.watch_idle_s = watch_interval(
            context.options.watch_idle_interval, "Options.watch_idle_interval", idle=True
        )
        # Counters of a client that runs no maintenance (a process that only
        # publishes) are flushed by a loop of their own while there are any.
        self._flusher_lock = threading.Lock()
        self._flusher: Runner | None = None
        self._flusher_stop = waits.event()
        #: Maintenance passes and errors, by job name (``reap``, ``purge``,
        #: ``flush``, ``prune``, ``errors``), and listener events: tests wait
        #: on these instead of sleeping.
        self.signals = Signals()
        #: Consumers online: the rows of this client's running consumers.
        self.presence = Presence(context, context.consumer_heartbeat)
        context.add_counters_listener(self._counters_added)
        self.consuming.set_long_poll(self.long_poll)

    # -- consumers ------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        channel: str,
        handler: Handler,
        *,
        max_in_flight: int | None = None,
        lease: Duration | None = None,
        backoff: Backoff | None = None,
        poll_interval: Duration | None = None,
    ) -> Consumer:
        """A consumer that runs ``handler`` on every message of ``topic``/``channel``.

        Creates the topic and the channel if they are missing. The keyword
        arguments override the client's :class:`~novaque.Options` for this consumer:
        ``max_in_flight`` (worker threads and claim batch size), ``lease``,
        ``backoff`` (retry delays) and ``poll_interval`` (longest idle wait).
        The consumer is not started: call :meth:`~novaque.Consumer.start`, or use
        :meth:`subscribe_and_start`.
        """
        consumer = self.new_consumer(
            topic,
            channel,
            handler,
            max_in_flight=max_in_flight,
            lease=lease,
            backoff=backoff,
            poll_interval=poll_interval,
        )
        self.topology.ensure_channel(topic, channel)
        with self._lock:
            self.consumers.append(consumer)
        return consumer

    def new_consumer(
        self,
        topic: str,
        channel: str,
        handler: Handler,
        *,
        max_in_flight: int | None,
        lease: Duration | None,
        backoff: Backoff | None,
        poll_interval: Duration | None,
        register: bool = False,
    ) -> Consumer:
        """A consumer with its settings checked (no I/O); ``register``: shut
        down with the client from now on."""
        options = self.options
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        _validate.handler(handler, self._waits)
        workers = check_int(
            options.max_in_flight if max_in_flight is None else max_in_flight,
            "max_in_flight",
            1,
            MAX_IN_FLIGHT,
        )
        lease_s = _validate.lease(lease, self.context.default_lease)
        policy = options.backoff if backoff is None else backoff
        if not isinstance(policy, Backoff):
            raise InvalidOption(f"backoff must be a novaque.Backoff, got {type(policy).__name__}")
        poll_s = seconds(
            options.poll_interval if poll_interval is None else poll_interval,
            "poll_interval",
            allow_zero=False,
        )
        consumer = Consumer(
            self.consuming,
            self,
            topic,
            channel,
            handler,
            max_in_flight=workers,
            lease=lease_s,
            backoff=policy,
            poll_interval=poll_s,
            channel_lease=lease is None,
        )
        if register:
            with self._lock:
                self.consumers.append(consumer)
        return consumer

    def start_consumer(self, consumer: Consumer) -> None:
        """Create the consumer's channel if missing, then start it (the asyncio
        twin's ``subscribe`` does no I/O, so its consumers do this at start)."""
        if not consumer.running:
            self.topology.ensure_channel(consumer.topic, consumer.channel)
        consumer.start()

    def subscribe_and_start(
        self,
        topic: str,
        channel: str,
        handler: Handler,
        *,
        max_in_flight: int | None = None,
        lease: Duration | None = None,
        backoff: Backoff | None = None,
        poll_interval: Duration | None = None,
    ) -> Consumer:
        """:meth:`subscribe`, then :meth:`~novaque.Consumer.start`; returns the running consumer."""
        return self.subscribe(
            topic,
            channel,
            handler,
            max_in_flight=max_in_flight,
            lease=lease,
            backoff=backoff,
            poll_interval=poll_interval,
        ).start()

    def consumer_started(self, consumer: Consumer) -> None:
        self.context.add_waker(consumer.topic, waker_of(consumer))
        with self._lock:
            self._running.add(consumer)
            self.listen_locked()
        self.presence.joined(consumer)

    def consumer_stopped(self, consumer: Consumer) -> None:
        self.context.remove_waker(consumer.topic, waker_of(consumer))
        self.presence.left(consumer)
        with self._lock:
            self._running.discard(consumer)
            if consumer in self.consumers:
                self.consumers.remove(consumer)
        self._stop_listener(timeout=5.0, unless_needed=True)

    def beat_consumers(self) -> None:
        """Refresh the consumers online rows of this client's consumers now
        (what its heartbeat loop does every ``Options.consumer_heartbeat``)."""
        self.presence.beat()

    # -- long polls -----------------------------------------------------------------

    def long_poll(
        self, topic: str, channel: str, fetch: Callable[[], list[Message]], wait_s: float
    ) -> list[Message]:
        """Call ``fetch`` (of ``topic``/``channel``) until it returns something, or
        return ``[]`` once ``wait_s`` seconds of real time have passed.

        Between two calls it waits, holding no connection, for a wake-up of
        ``topic`` (a publish of this client, the listener's ``NOTIFY``, the change
        watcher) or at
        most a jittered ``Options.poll_interval``. The listener runs while
        any long poll or consumer of the client waits. A missing channel
        raises before the wait begins.
        """
        context = self.context
        channel_id = self.topology.channel_id(topic, channel)
        poll_s = seconds(self.options.poll_interval, "poll_interval", allow_zero=False)
        deadline = time.monotonic() + wait_s
        woken = self._waits.event()
        wake = woken.set
        context.add_waker(topic, wake)
        with self._lock:
            self._pollers += 1
            self.listen_locked()
        signals = self.signals
        try:
            while True:
                got = fetch()
                signals.bump("long_poll_fetches")
                if got:
                    self.messages_moving()
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    return got
                if context.limits.limited(channel_id):
                    # A limit may hold the channel back: a settle here makes room.
                    context.limits.wait_for_room(channel_id, wake)
                # A wake-up since the waker was added (during the fetch, or
                # the listener's first one, before it) ends the wait at once;
                # cleared after it, as the next fetch follows whatever set it.
                woken.wait(min(left, jittered(poll_s)))
                woken.clear()
        finally:
            context.remove_waker(topic, wake)
            with self._lock:
                self._pollers -= 1
            self._stop_listener(timeout=5.0, unless_needed=True)

    # -- wake-ups -------------------------------------------------------------------

    def listen_locked(self) -> None:
        """Start the listener if the database pushes wake-ups (or the change
        watcher where it does not) and it is not running (under ``_lock``)."""
        listens = self.context.dialect.supports_notify or self.watch_s is not None
        if listens and self.listens and self.listening is None:
            run = self.listening = _Listening(self._waits.event())
            run.loop = self._waits.spawn(lambda: self._listen_loop(run), "novaque-listener")

    def messages_moving(self) -> None:
        """Messages move in this process (a claim or a fetch got some): the
        change watcher looks every ``watch_interval`` again (more may follow)."""
        run = self.listening
        conn = None if run is None else run.conn
        if conn is not None:
            conn.hurry()

    def _open_listener(self) -> NotifyListener | None:
        executor = self.context.executor
        if self.watch_s is not None:
            return executor.open_watcher(self.watch_s, self.watch_idle_s)
        return executor.open_listener()

    def _listen_loop(self, run: _Listening) -> None:
        """Hold the client's one listening connection (or change watcher); wake
        consumers of the topics it reports."""
        stop = run.stop
        errors = RetryDelay()
        listener: NotifyListener | None = None
        signals = self.signals
        what = "NOTIFY listener" if self.watch_s is None else "change watcher"
        try:
            while not stop.is_set():
                try:
                    if listener is None:
                        listener = self._open_listener()
                        if listener is None:
                            self.log.warning(
                                "psycopg 3 is not installed: consumers poll instead of "
                                "listening for NOTIFY"
                            )
                            return
                        with run.lock:
                            run.conn = listener
                        if errors.failures:
                            self.log.info("%s connected again", what)
                        errors.reset()
                        signals.bump("listen_connected")
                        # Anything published while we were not listening was missed.
                        self.context.wake_all()
                        continue
                    topics = listener.wait(LISTEN_WAIT_S)
                    for topic in dict.fromkeys(topics):
                        self.context.wake(topic)
                    if topics:
                        signals.bump("notified", len(topics))
                except ListenNotDelivered as exc:
                    self.listens = False
                    signals.bump("listen_refused")
                    self.log.warning("%s", exc)
                    return
                except Exception as exc:
                    signals.bump("listen_errors")
                    self.log.log(
                        errors.level(),
                        "%s failed (reconnecting; consumers poll meanwhile): %s",
                        what,
                        _validate.error_text(exc),
                        exc_info=errors.traceback(exc),
                    )
                    if listener is not None:
                        with run.lock:
                            run.conn = None
                        listener.close()
                        listener = None
                    stop.wait(errors.next())
        finally:
            with run.lock:
                run.conn = None
            if listener is not None:
                listener.close()

    def _stop_listener(self, timeout: float, *, unless_needed: bool = False) -> None:
        """Stop the listener; ``unless_needed``: only if no consumer runs and no
        long poll waits (checked under the lock that starts it)."""
        with self._lock:
            if unless_needed and (self._running or self._pollers):
                return
            run, self.listening = self.listening, None
        if run is None:
            return
        run.stop.set()
        with run.lock:
            if run.conn is not None:
                run.conn.interrupt()
        if run.loop is not None:
            run.loop.join(timeout)

    # -- maintenance ----------------------------------------------------------------

    def start(self) -> None:
        """Start the background maintenance in this process (idempotent).

        One loop (a thread; a task on the asyncio twin) runs the lease
        reaper every ``reap_interval``, the TTL purge with dead-letter
        retention (and on SQLite a step of giving free pages back) every
        ``purge_interval``, the stats flush every ``stats_flush_interval``,
        the stats prune every ``stats_prune_interval`` and the cleanup of
        consumers that died every ``consumer_heartbeat``. Running it in many processes at once is
        safe. A failing job is tried again after a backoff; a run of failures
        (the database unreachable, say) is logged once at ERROR where it
        starts and once at INFO where it ends. Consumers are started on
        their own (:meth:`~novaque.Consumer.start`).

        On a database that was not migrated it raises
        :class:`~novaque.SchemaOutOfDate` at once, instead of leaving the loops to log
        it; any other error of that first check is left to the loops' retries.
        """
        try:
            self.context.ready()
        except SchemaOutOfDate:
            raise
        except Exception:  # e.g. the database not reachable yet: the loops retry
            pass
        with self._lock:
            if self.maintenance is not None and self.maintenance.is_alive():
                return
            self._maintenance_stop.clear()
            self.maintenance = self._waits.spawn(self._maintenance_loop, "novaque-maintenance")
        self.log.info("novaque maintenance started")

    def _maintenance_jobs(self) -> list[_Job]:
        jobs = self.jobs
        o = self.options
        return [
            _Job("reap", seconds(o.reap_interval, "reap_interval"), self._reap_pass),
            _Job("schedules", SCHEDULES_INTERVAL_S, jobs.fire_due_schedules),
            _Job("purge", seconds(o.purge_interval, "purge_interval"), jobs.purge_pass),
            _Job("flush", seconds(o.stats_flush_interval, "flush"), jobs.flush_stats),
            _Job("prune", seconds(o.stats_prune_interval, "prune"), jobs.prune_stats),
            _Job("consumers", self.context.consumer_heartbeat, jobs.forget_stale_consumers),
            # Each cursor is looked behind every LOOK_BEHIND_US; this pass finds those due.
            _Job("cursors", 1.0, jobs.look_behind_claim_cursors),
        ]

    def _counters_added(self) -> None:
        """Counters arrived in the empty buffer: flush them on a loop of their
        own unless maintenance runs (which flushes them)."""
        with self._flusher_lock:
            if self.maintenance is not None or (
                self._flusher is not None and self._flusher.is_alive()
            ):
                return
            self._flusher = self._waits.spawn(self._flush_loop, "novaque-stats-flush")

    def _flush_loop(self) -> None:
        """Flush every ``stats_flush_interval`` until nothing is left (or maintenance
        took over); the next counter starts the loop again."""
        stats = self.context.stats
        interval = seconds(self.options.stats_flush_interval, "stats_flush_interval")
        errors = RetryDelay()
        wait = interval
        while not self._flusher_stop.wait(wait):
            retry = self._flush_tick(errors)
            if retry is not None:
                wait = min(interval, retry)
                continue
            wait = interval
            with self._flusher_lock:
                if not stats or self.maintenance is not None:
                    self._flusher = None
                    return

    def _flush_tick(self, errors: RetryDelay) -> float | None:
        """One flush of the stats flusher: None when it worked, else how long to
        wait before the next try (``errors``: the failures in a row).

        An outage (the database unreachable, say) is logged once at its start
        (ERROR, with the traceback) and once at its end (INFO); the passes
        that fail in between log at DEBUG only. The counts wait in memory.
        """
        try:
            self.jobs.flush_stats()
        except Exception as exc:
            self.log.log(
                errors.level(),
                "could not flush stats (the counts stay in memory; retrying, and "
                "logging again once it works): %s",
                _validate.error_text(exc),
                exc_info=errors.traceback(exc),
            )
            return errors.next()
        if errors.failures:
            self.log.info(
                "flushed stats again after %d failed attempt%s; no counts were lost",
                errors.failures,
                "" if errors.failures == 1 else "s",
            )
            errors.reset()
        return None

    def _stop_flusher(self, timeout: float) -> None:
        with self._flusher_lock:
            thread, self._flusher = self._flusher, None
            self._flusher_stop.set()
        if thread is not None:
            thread.join(timeout)
        self._flusher_stop.clear()

    def _reap_pass(self) -> int:
        context = self.context
        context.ready()
        context.resample_clock()
        return self.jobs.reap_since_last_pass()

    def _maintenance_loop(self) -> None:
        jobs = self._maintenance_jobs()
        signals = self.signals
        stop = self._maintenance_stop
        while not stop.is_set():
            now = time.monotonic()
            for job in jobs:
                if job.due > now or stop.is_set():
                    continue
                try:
                    job.run()
                except Exception as exc:
                    job.errors = job.errors or RetryDelay()
                    self.log.log(
                        job.errors.level(),
                        "maintenance job %s failed (retrying): %s",
                        job.name,
                        _validate.error_text(exc),
                        exc_info=job.errors.traceback(exc),
                    )
                    job.due = time.monotonic() + min(job.interval, job.errors.next())
                    signals.bump("errors")
                    signals.bump(f"{job.name}_errors")
                else:
                    if job.errors is not None:
                        job.errors.recovered(self.log, f"maintenance job {job.name}")
                    spread = random.uniform(1 - INTERVAL_JITTER, 1 + INTERVAL_JITTER)
                    job.due = time.monotonic() + job.interval * spread
                    signals.bump(job.name)
            stop.wait(max(0.0, min(job.due for job in jobs) - time.monotonic()))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop everything this client runs, within about ``timeout`` seconds.

        Shuts every consumer down (see :meth:`~novaque.Consumer.shutdown`; they share
        the timeout), stops the maintenance loop and the listener, flushes
        the buffered stats, and closes the connections of the engine novaque
        opened itself (SQLite's second engine, or the engine
        :func:`novaque.connect` built). The client stays usable: calls open
        new connections, and :meth:`start` starts maintenance again.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            consumers = list(self.consumers)
        stopping = [c for c in consumers if begin_shutdown(c)]
        for consumer in stopping:
            finish_shutdown(consumer, deadline)
        with self._lock:
            self.consumers = [c for c in self.consumers if c.running]
            thread = self.maintenance
            self.maintenance = None
            self._maintenance_stop.set()
        if thread is not None:
            thread.join(max(1.0, deadline - time.monotonic()))
            if thread.is_alive():
                self.log.warning("novaque maintenance did not stop within the timeout")
        self._stop_listener(timeout=max(1.0, deadline - time.monotonic()))
        self._stop_flusher(timeout=max(1.0, deadline - time.monotonic()))
        self.jobs.close()
        if thread is not None or stopping:
            self.log.info("novaque client shut down")
