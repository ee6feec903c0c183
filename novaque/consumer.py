"""The consumer runtime: one subscription's claim loop, workers, settler and heartbeat.

A :class:`Consumer` is made by :meth:`novaque.Client.subscribe` (and, inside
an :class:`~novaque.aio.AsyncConsumer`, by the asyncio twin). Once started it
runs four kinds of loops, threads for the sync client and tasks for the twin
(:mod:`novaque._waits`), the same code either way:

- the **claim loop** leases up to ``max_in_flight`` deliveries at a time, only
  as many as there are idle workers, so nothing it claims waits long; the
  acks that piled up since its last claim go in the same transaction (one
  commit for both, one round trip on PostgreSQL);
- ``max_in_flight`` **workers** run the handler, one message each;
- the **settler** writes retries and rejections, and the acks once claiming
  has stopped (in one ``ack_many`` round trip per batch);
- the **heartbeat** renews the lease of every delivery the consumer holds
  once half of it has run out, so a slow but alive handler is not delivered
  twice.

Idle, the claim loop polls with a delay that starts small and doubles up to
``poll_interval`` (each wait jittered by +-50 %). A publish in the same
process, a PostgreSQL ``NOTIFY`` or a worker becoming free wakes it at once.
Database errors are logged and retried with backoff; they never end a loop.
A result the settler cannot write is given up (logged at ERROR) at the first
error that trying again cannot cure, or after :data:`novaque._ledger.SETTLE_MAX_FAILURES`
transient ones in a row: its lease is then no longer renewed, so the delivery
is delivered again once the lease expires, instead of being held forever.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from novaque import _validate
from novaque._channel_limits import Hold
from novaque._ledger import Ledger, Outcome, split_failed
from novaque._settle import outcome_of, signal_of, write
from novaque._signals import Signals
from novaque._time import US
from novaque._waits import Event, Runner, Waits, jittered
from novaque.errors import LeaseLost, SchemaOutOfDate
from novaque.models import Message
from novaque.options import Backoff, microseconds

__all__ = ["Consumer", "ConsumerHost", "ConsumerRuntime", "Handler"]

#: A message handler: return to ack, raise to retry, raise Reject to dead-letter,
#: Defer to set the message aside, Snooze(delay) to put it back for a while.
Handler = Callable[[Message], object]


class ConsumerHost(Protocol):
    """What a consumer needs of its client: the one narrow door it goes through
    (the client's :class:`~novaque._consuming.Consuming` part).

    Claiming (with the acks that ride along), settling, renewing, releasing
    unstarted deliveries, and the clock.
    """

    log: logging.Logger
    #: Threads or tasks: how the consumer runs its loops and waits.
    waits: Waits

    def now(self) -> int: ...

    def channel_id(self, topic: str, channel: str) -> int: ...

    def ack_and_claim(
        self,
        acks: list[Message],
        topic: str,
        channel: str,
        channel_id: int,
        limit: int,
        lease_s: float,
        channel_lease: bool = False,
    ) -> tuple[list[Message], list[Message]]: ...

    def ack(self, msg: Message) -> None: ...

    def ack_many(self, msgs: list[Message]) -> list[Message]: ...

    def retry_after(self, msg: Message, delay_s: float, error: str | None) -> None: ...

    def reject(self, msg: Message, reason: str = "") -> None: ...

    def defer(self, msg: Message) -> None: ...

    def snooze_after(self, msg: Message, delay_s: float) -> None: ...

    def renew(self, msg: Message, *, lease: float | None = None) -> datetime: ...

    def release(self, msgs: list[Message]) -> int: ...

    def held_back(self, channel_id: int, since: float) -> Hold | None:
        """What held the client's claims of the channel back since ``since``
        (``time.monotonic()``), if a limit of the channel did."""
        ...

    def wait_for_room(self, channel_id: int, waker: Callable[[], None]) -> None:
        """Call ``waker`` once when the client settles a delivery of the channel."""
        ...


class ConsumerRuntime(Protocol):
    """Who runs the consumer (the client's runtime): told of its start and
    stop, so that it wakes it, lists it online and shuts it down with the client."""

    def consumer_started(self, consumer: Consumer) -> None: ...

    def consumer_stopped(self, consumer: Consumer) -> None: ...

    def messages_moving(self) -> None:
        """The consumer claimed messages (the change watcher looks often again)."""


#: First and largest wait (seconds) after a database error in a background loop.
ERROR_DELAY_FIRST_S = 0.1
ERROR_DELAY_CAP_S = 5.0
#: Longest wait of the claim loop for more handlers to finish before it claims.
CLAIM_LINGER_S = 0.002
#: Handlers quicker than this on average (once QUICK_AFTER have run): the
#: worker that takes a batch runs it one after another (Consumer._next_to_start).
QUICK_HANDLER_S = 0.0001
QUICK_AFTER = 16
#: Then the longest a delivery waits while others start none, before one more
#: worker is woken for it.
STANDBY_S = 0.005
#: Longest wait of a consumer that a rate limit holds back before it claims
#: again (it claims when the window ends, if that is sooner): how soon it
#: follows a rate limit changed in another process.
RATE_LOOK_S = 60.0
#: Bounds of the heartbeat's tick (seconds of real time): a quarter of the lease.
HEARTBEAT_TICK_MIN_S = 0.05
HEARTBEAT_TICK_MAX_S = 5.0


class RetryDelay:
    """Exponential, jittered waits after consecutive failures of a background loop."""

    def __init__(self, first: float = ERROR_DELAY_FIRST_S, cap: float = ERROR_DELAY_CAP_S) -> None:
        self.first = first
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        """Count one more failure; return how long to wait before trying again."""
        self.failures += 1
        raw = min(self.cap, self.first * 2.0 ** min(self.failures - 1, 30))
        return jittered(raw)

    def reset(self) -> None:
        self.failures = 0

    def level(self) -> int:
        """How to log a failure: ERROR for the first in a row, DEBUG for the
        ones that follow, so an outage is reported once where it starts (and
        once where it ends: :meth:`recovered`), not at every retry."""
        return logging.DEBUG if self.failures else logging.ERROR

    def recovered(
        self, log: logging.Logger | logging.LoggerAdapter[logging.Logger], what: str
    ) -> None:
        """The work succeeded: after a run of failures, say once (INFO) that
        ``what`` works again; then start counting afresh."""
        if self.failures:
            log.info(
                "%s works again after %d failed attempt%s",
                what,
                self.failures,
                "" if self.failures == 1 else "s",
            )
            self.failures = 0

    def traceback(self, exc: BaseException) -> BaseException | None:
        """What to log with ``exc_info``: the first failure in a row, unless the
        message says it all (:class:`SchemaOutOfDate` names the command to run)."""
        if self.failures or isinstance(exc, SchemaOutOfDate):
            return None
        return exc


_NEW, _RUNNING, _STOPPING, _STOPPED = "new", "running", "stopping", "stopped"


class Consumer:
    """Runs a handler on the messages of one channel; made by ``Client.subscribe``.

    Call :meth:`start` to begin and :meth:`shutdown` to stop. The handler
    contract: return ⇒ ack; raise ⇒ retry after the backoff (the exception's
    ``Type: text`` is kept as the delivery's last error), or dead with reason
    ``max_attempts`` once attempts run out; raise :class:`novaque.Reject` ⇒
    dead at once with its reason; raise :class:`novaque.Defer` ⇒ deferred
    (see :meth:`novaque.Client.defer`); raise :class:`novaque.Snooze` ⇒ due
    again after its delay without spending the attempt (see
    :meth:`novaque.Client.snooze`; a bad delay counts as a failure, and a
    delay past the message's expiry is not refused: the delivery is then
    purged at TTL). Error texts and reasons are stored with NUL
    and lone surrogates replaced by U+FFFD, so what a handler raised cannot
    make the settle fail. A retry is due after the backoff even when that
    reaches past the message's expiry: the delivery is then purged at TTL
    like any other still waiting (the backoff is not cut short, and the
    consumer raises nothing).

    Attributes ``topic``, ``channel``, ``max_in_flight``, ``lease`` (seconds),
    ``backoff`` and ``poll_interval`` (seconds) are the effective settings;
    with ``channel_lease`` (the subscriber named no lease) the channel's own
    ``lease`` setting, when it has one, replaces ``lease`` at each claim.
    """

    def __init__(
        self,
        client: ConsumerHost,
        runtime: ConsumerRuntime,
        topic: str,
        channel: str,
        handler: Handler,
        *,
        max_in_flight: int,
        lease: float,
        backoff: Backoff,
        poll_interval: float,
        channel_lease: bool = False,
    ) -> None:
        self.topic = topic
        self.channel = channel
        self.handler = handler
        self.max_in_flight = max_in_flight
        self.lease = lease
        self.channel_lease = channel_lease
        self.backoff = backoff
        self.poll_interval = poll_interval
        self._client = client
        self._runtime = runtime
        self._log = client.log
        waits = self._waits = client.waits
        # Held only between two waits, never across one (a task must not hold
        # it while the event loop runs the others).
        self._lock = threading.Lock()
        self._work_ready = waits.condition(self._lock)
        self._results_ready = waits.condition(self._lock)
        #: What it holds and owes (changed under ``_lock``).
        self._ledger = Ledger()
        self._wake = waits.event()
        #: Set when a limit that held claims back may have room again (this
        #: consumer's or the client's settles), or at shutdown.
        self._room = waits.event()
        self._stop_claiming = waits.event()
        self._stop_heartbeat = waits.event()
        self._stop_settling = waits.event()  # ends a settler's wait after an error
        self._workers_stop = False
        self._settler_stop = False
        self._settle_deadline = float("inf")
        self._state = _NEW
        self._loops: dict[str, list[Runner]] = {}
        #: What happened so far (claim passes, handlers started, acks, ...):
        #: tests wait on these instead of sleeping.
        self._signals = Signals()
        #: Running average of handler durations (seconds), see _linger and
        #: _one_by_one; how many handlers ran; when a worker last started one.
        self._handler_s = 0.0
        self._handled = 0
        self._last_start = 0.0

    def __repr__(self) -> str:
        return (
            f"<novaque.Consumer {self.topic}/{self.channel} {self._state} "
            f"max_in_flight={self.max_in_flight}>"
        )

    # -- lifecycle ------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`shutdown`."""
        return self._state == _RUNNING

    @property
    def in_flight(self) -> int:
        """Deliveries this consumer holds a lease on and has not settled yet."""
        with self._lock:
            return len(self._ledger.held)

    def start(self) -> Consumer:
        """Start claiming and handling messages; returns the consumer.

        Starting a running consumer does nothing; a consumer that was shut
        down cannot start again (subscribe again instead).
        """
        with self._lock:
            if self._state == _RUNNING:
                return self
            if self._state != _NEW:
                raise RuntimeError(
                    f"consumer of {self.topic}/{self.channel} was shut down; "
                    "call client.subscribe(...) again for a new one"
                )
            self._state = _RUNNING
        name = f"{self.topic}/{self.channel}"
        spawn = self._waits.spawn
        self._loops = {
            "claim": [spawn(self._claim_loop, f"novaque-claim {name}")],
            "workers": [
                spawn(self._worker, f"novaque-worker-{i} {name}") for i in range(self.max_in_flight)
            ],
            "settle": [spawn(self._settle_loop, f"novaque-settle {name}")],
            "heartbeat": [spawn(self._heartbeat_loop, f"novaque-heartbeat {name}")],
        }
        self._runtime.consumer_started(self)
        self._log.info(
            "consumer of %s/%s started (max_in_flight=%d, lease=%gs)",
            self.topic,
            self.channel,
            self.max_in_flight,
            self.lease,
        )
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop gracefully within ``timeout`` seconds.

        Stops claiming; releases the deliveries claimed but not yet started at
        once, without counting the attempt; lets running handlers finish;
        writes the pending acks and retries; returns. Deliveries whose
        handler is still running at the deadline keep their lease and are
        delivered again after it expires.
        """
        deadline = time.monotonic() + timeout
        if self._begin_shutdown():
            self._finish_shutdown(deadline)

    def _begin_shutdown(self) -> bool:
        """Stop claiming (returns at once); False if there is nothing to stop."""
        with self._lock:
            if self._state == _NEW:
                self._state = _STOPPED
                return False
            if self._state != _RUNNING:
                return False
            self._state = _STOPPING
        self._stop_claiming.set()
        self._wake.set()
        self._room.set()
        return True

    def _finish_shutdown(self, deadline: float) -> None:
        self._join("claim", deadline)
        with self._lock:
            unstarted = self._ledger.take_unstarted()
            self._workers_stop = True
            self._work_ready.notify_all()
        self._release(unstarted)
        self._join("workers", deadline)
        with self._lock:
            self._settle_deadline = deadline
            self._settler_stop = True
            self._results_ready.notify_all()
        self._stop_settling.set()
        self._join("settle", deadline)
        self._stop_heartbeat.set()
        self._join("heartbeat", deadline + 1.0)
        with self._lock:
            self._state = _STOPPED
            left_running, unsettled = self._ledger.clear()
        if left_running:
            self._log.warning(
                "consumer of %s/%s: %d handler(s) still running at the shutdown deadline; "
                "their deliveries will be delivered again after their lease expires",
                self.topic,
                self.channel,
                left_running,
            )
        if unsettled:
            self._log.error(
                "consumer of %s/%s: %d result(s) could not be written before the shutdown "
                "deadline; those deliveries will be delivered again after their lease expires",
                self.topic,
                self.channel,
                unsettled,
            )
        self._runtime.consumer_stopped(self)
        self._log.info("consumer of %s/%s stopped", self.topic, self.channel)

    def _join(self, group: str, deadline: float) -> None:
        for loop in self._loops.get(group, []):
            if not loop.is_current():  # shutdown called by a handler
                loop.join(max(0.0, deadline - time.monotonic()))

    def _wake_up(self) -> None:
        """Claim now (called on publish, NOTIFY, the change watcher, or a free worker)."""
        self._wake.set()

    # -- claiming ---------------------------------------------------------------------

    def _claim_loop(self) -> None:
        first_idle = min(self.poll_interval, max(self.poll_interval / 16, 0.005))
        idle = first_idle
        errors = RetryDelay()
        while True:
            self._wake.clear()
            self._room.clear()
            if self._stop_claiming.is_set():
                return
            self._linger()
            with self._lock:
                free = self.max_in_flight - self._ledger.busy
                acks = self._ledger.take_acks()
            if free <= 0:
                if acks:
                    self._settle_acks(acks)
                else:
                    self._wait_wake(1.0)
                continue
            try:
                # Cached by the client, and looked up again after empty claims
                # (a channel deleted and created again has a new id).
                channel_id = self._client.channel_id(self.topic, self.channel)
                since = time.monotonic()
                lost, got = self._client.ack_and_claim(
                    [o.msg for o in acks],
                    self.topic,
                    self.channel,
                    channel_id,
                    free,
                    self.lease,
                    self.channel_lease,
                )
            except Exception as exc:
                self._give_back(acks)
                self._signals.bump("claim_errors")
                self._log_failure(errors, "claiming", exc)
                self._stop_claiming.wait(errors.next())
                continue
            self._acked(acks, lost)
            errors.recovered(self._log, f"consumer of {self.topic}/{self.channel}: claiming")
            self._signals.bump("polls")
            if not got:
                hold = self._client.held_back(channel_id, since)
                if hold is not None:
                    self._signals.bump("held_back")
                    self._held_back(channel_id, hold)
                    continue
                self._wait_wake(jittered(idle))
                idle = min(idle * 2, self.poll_interval)
                continue
            idle = first_idle
            self._runtime.messages_moving()
            self._signals.bump("claimed", len(got))
            with self._lock:
                working = not self._stop_claiming.is_set()
                self._ledger.claimed(got, to_work=working)
                if working:
                    # One worker; each that takes a message wakes the next
                    # while work remains (see _worker).
                    self._work_ready.notify()
                    continue
            self._release(got)  # shutdown began during the claim
            return

    def _held_back(self, channel_id: int, hold: Hold) -> None:
        """Wait while a limit of the channel holds claims back: at most one claim
        per ``poll_interval``, nothing logged.

        Leases fill a limit (``max_leased``, a group's): claim again once the
        client settles a delivery of the channel (this consumer's own acks go
        with that claim), else after a poll interval (leases that other
        processes settle, or that expire). The rate window is used up: claim
        again when the client's clock reaches the next window (looked at every
        poll interval, without the database), or after :data:`RATE_LOOK_S`
        (a changed limit is then followed); meanwhile this consumer's acks are
        written as its handlers finish.
        """
        pace = self.poll_interval * random.uniform(1.0, 1.5)
        if hold.window_end_us is None:
            self._client.wait_for_room(channel_id, self._room.set)
            self._wait_wake(pace, self._room)
            return
        deadline = time.monotonic() + RATE_LOOK_S
        while not self._stop_claiming.is_set():
            left = min((hold.window_end_us - self._client.now()) / US, deadline - time.monotonic())
            if left <= 0:
                return
            self._wait_wake(min(left, pace), self._room)
            if self._room.is_set():
                self._room.clear()
                with self._lock:
                    acks = self._ledger.take_acks()
                if acks:
                    self._settle_acks(acks)

    def _release(self, msgs: list[Message]) -> None:
        """Give unstarted deliveries back at once, their attempt not counted."""
        if not msgs:
            return
        try:
            self._client.release(msgs)
            self._signals.bump("released", len(msgs))
            self._log.debug(
                "released %d unstarted deliveries of %s/%s", len(msgs), self.topic, self.channel
            )
        except Exception:
            self._log.error(
                "could not release %d unstarted deliveries of %s/%s; they will be "
                "delivered again after their lease expires",
                len(msgs),
                self.topic,
                self.channel,
                exc_info=True,
            )
        with self._lock:
            for msg in msgs:
                self._ledger.let_go(msg)

    # -- handling ---------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            with self._lock:
                msg = self._next_to_start()
                if msg is None:
                    return
            self._signals.bump("started")
            started = time.monotonic()
            outcome = self._handle(msg)
            # A running average of handler times: the claim loop lingers only
            # for handlers quicker than its linger, and quick ones run one
            # after another (benign race between workers).
            self._handler_s += (time.monotonic() - started - self._handler_s) / 16
            self._handled += 1
            with self._lock:
                late = self._state == _STOPPED
                self._ledger.finished(outcome, keep=not late)
                if not late and (outcome.kind != "ack" or self._stop_claiming.is_set()):
                    self._results_ready.notify()  # acks go with the next claim
                # A worker is free: claim more, unless this one goes on with
                # the batch (the claim loop would only linger meanwhile).
                free = not (self._ledger.work and self._one_by_one())
            if free:
                self._wake.set()
                self._room.set()
            self._signals.bump("handled")
            if late:
                self._log.warning(
                    "handler of delivery %d (%s/%s) finished after shutdown; it will be "
                    "delivered again after its lease expires",
                    msg.delivery_id,
                    self.topic,
                    self.channel,
                )

    def _one_by_one(self) -> bool:
        """Whether handlers are quick enough (:data:`QUICK_HANDLER_S`, once
        :data:`QUICK_AFTER` have run) for the worker that takes a batch to run
        it one after another: handing each delivery to a thread of its own
        cost more than the handler (a third of a drain's time on SQLite, W2)."""
        return self._handled >= QUICK_AFTER and self._handler_s < QUICK_HANDLER_S

    def _next_to_start(self) -> Message | None:
        """Under ``_lock``: wait for a delivery to handle and start it; None
        when the workers stop.

        Slow handlers: each worker that takes a delivery wakes one more while
        work remains, one at a time (a batch no longer wakes every worker at
        once to fight over this lock: a quarter of the claim loop's time in
        W2). Quick ones (:meth:`_one_by_one`): the worker goes on with the
        batch alone, and the claim loop wakes another one if no delivery
        started for :data:`STANDBY_S` (:meth:`_standby_left`: a handler that
        was quick so far may not be this time).
        """
        ledger = self._ledger
        while not ledger.work and not self._workers_stop:
            self._work_ready.wait()
        msg = ledger.start_next()
        self._last_start = time.monotonic()
        if ledger.work and not self._one_by_one():
            self._work_ready.notify()
        return msg

    def _standby_left(self) -> float | None:
        """Under ``_lock``, for the claim loop while quick handlers run one by
        one: wake one more worker when the next delivery has waited
        :data:`STANDBY_S` since the last start; the seconds until that is
        looked at again, or None when no delivery waits."""
        if not self._ledger.work or not self._one_by_one():
            return None
        left = self._last_start + STANDBY_S - time.monotonic()
        if left > 0:
            return left
        self._work_ready.notify()
        self._last_start = time.monotonic()
        return STANDBY_S

    def _wait_wake(self, timeout: float, event: Event | None = None) -> None:
        """Wait up to ``timeout`` for :meth:`_wake_up` (or ``event``), standing by
        for quick handlers meanwhile (:meth:`_standby_left`)."""
        woken = self._wake if event is None else event
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                check = self._standby_left()
            left = deadline - time.monotonic()
            if left <= 0 or woken.wait(left if check is None else min(left, check)):
                return

    def _handle(self, msg: Message) -> Outcome:
        return outcome_of(self.handler, msg, backoff=self.backoff, log=self._log, waits=self._waits)

    # -- settling ---------------------------------------------------------------------

    def _linger(self) -> None:
        """Before claiming for some free workers, wait a moment for the others.

        Quick handlers (on average shorter than :data:`CLAIM_LINGER_S`) that
        finish within that time of each other share one claim, and their acks
        one write, instead of one each. Never waits for slower handlers (a
        free worker would idle) nor when no handler runs (an idle consumer
        claims at once).
        """
        if self._handler_s >= CLAIM_LINGER_S:
            return
        until = time.monotonic() + CLAIM_LINGER_S
        while True:
            with self._lock:
                busy = self._ledger.busy
                if not busy or busy >= self.max_in_flight:
                    return
            left = until - time.monotonic()
            if left <= 0:
                return
            self._wake.clear()
            self._wait_wake(left)

    # Acks ride with the next claim: the claim loop takes the acks that piled
    # up and writes them in the transaction that leases the next batch (one
    # commit, and one round trip on PostgreSQL, instead of two). The settler
    # writes retries and rejections, and the acks once claiming has stopped.

    def _give_back(self, acks: list[Outcome]) -> None:
        """Acks the claim loop could not write go back to the queue, to be retried."""
        if acks:
            with self._lock:
                self._ledger.put_back(acks)
                self._results_ready.notify()

    def _settle_acks(self, acks: list[Outcome]) -> None:
        """Write acks without claiming (no worker is free)."""
        try:
            lost = self._client.ack_many([o.msg for o in acks])
        except Exception as exc:
            self._give_back(self._settle_failed(acks, exc))
            self._stop_claiming.wait(ERROR_DELAY_FIRST_S)
            return
        self._acked(acks, lost)

    def _acked(self, acks: list[Outcome], lost: list[Message]) -> None:
        """Book the outcome of written acks (``lost``: those whose lease was lost)."""
        if not acks:
            return
        lost_ids = {id(m) for m in lost}
        for outcome in acks:
            if id(outcome.msg) in lost_ids:
                self._lease_lost_on_settle(outcome)
            else:
                self._settled(outcome.msg)
        self._signals.bump("acked", len(acks) - len(lost))

    def _settle_loop(self) -> None:
        errors = RetryDelay()
        while True:
            with self._lock:
                batch = self._ledger.settler_batch(claiming=not self._stop_claiming.is_set())
                while not batch and not self._settler_stop:
                    self._results_ready.wait()
                    batch = self._ledger.settler_batch(claiming=not self._stop_claiming.is_set())
                if not batch:
                    return
            failed = self._settle(batch)
            if not failed:
                errors.recovered(self._log, f"consumer of {self.topic}/{self.channel}: settling")
                continue
            with self._lock:
                self._ledger.put_back(failed)
                stopping, deadline = self._settler_stop, self._settle_deadline
            wait = errors.next()
            if stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._stop_settling.clear()  # shutdown has begun: wait out the delay
                wait = min(wait, left)
            self._stop_settling.wait(wait)

    def _settle(self, batch: list[Outcome]) -> list[Outcome]:
        """Write outcomes; return those that failed on a database error (to retry)."""
        failed: list[Outcome] = []
        acks = [o for o in batch if o.kind == "ack"]
        if acks:
            try:
                lost = self._client.ack_many([o.msg for o in acks])
            except Exception as exc:
                failed.extend(self._settle_failed(acks, exc))
            else:
                self._acked(acks, lost)
        for outcome in batch:
            if outcome.kind == "ack":
                continue
            try:
                write(self._client, outcome)
            except LeaseLost:
                self._lease_lost_on_settle(outcome)
            except Exception as exc:
                failed.extend(self._settle_failed([outcome], exc))
            else:
                self._settled(outcome.msg)
                self._signals.bump(signal_of(outcome))
        return failed

    def _settle_failed(self, outcomes: list[Outcome], exc: Exception) -> list[Outcome]:
        """Book a failed write of ``outcomes`` (of one kind); return those to try again.

        A transient error (see :func:`novaque._ledger.transient`) is tried again, up to
        :data:`novaque._ledger.SETTLE_MAX_FAILURES` times in a row; any other one would fail
        the same way forever. A result given up is dropped from the held
        leases, so the heartbeat stops renewing it and the delivery comes back
        once its lease expires (its attempt stays counted).
        """
        self._signals.bump("settle_errors")
        kind = outcomes[0].kind
        retry, given_up = split_failed(outcomes, exc)
        if retry:
            self._log.error(
                "could not %s %d message(s) of %s/%s (retrying): %s",
                kind,
                len(retry),
                self.topic,
                self.channel,
                _short(exc),
            )
        if given_up:
            self._log.error(
                "could not %s message(s) %s of %s/%s, giving up after %d failure(s): %s; "
                "their leases are no longer renewed and they will be delivered again once "
                "the leases expire",
                kind,
                ", ".join(str(o.msg.id) for o in given_up[:10]),
                self.topic,
                self.channel,
                max(o.failures for o in given_up),
                _short(exc),
                exc_info=exc,
            )
        for outcome in given_up:
            self._give_up(outcome)
        return retry

    def _give_up(self, outcome: Outcome) -> None:
        with self._lock:
            self._ledger.let_go(outcome.msg)
        self._signals.bump("settle_given_up")

    def _settled(self, msg: Message) -> None:
        with self._lock:
            self._ledger.let_go(msg)
        self._signals.bump("settled")

    def _lease_lost_on_settle(self, outcome: Outcome) -> None:
        msg = outcome.msg
        self._log.error(
            "LeaseLost: could not %s message %d (delivery %d of %s/%s): its lease was "
            "reaped or claimed again while the handler ran; it will be (or was) delivered again",
            outcome.kind,
            msg.id,
            msg.delivery_id,
            self.topic,
            self.channel,
        )
        self._settled(msg)
        self._signals.bump("lease_lost")

    # -- heartbeat --------------------------------------------------------------------

    def _heartbeat_tick(self) -> float:
        """A quarter of the shortest lease held (a channel's lease may be shorter)."""
        with self._lock:
            shortest = self._ledger.shortest_lease_us()
        lease = self.lease if shortest is None else min(self.lease, shortest / US)
        return min(max(lease / 4, HEARTBEAT_TICK_MIN_S), HEARTBEAT_TICK_MAX_S)

    def _heartbeat_loop(self) -> None:
        half_us = microseconds(self.lease) // 2
        errors = RetryDelay()
        while not self._stop_heartbeat.wait(self._heartbeat_tick()):
            try:
                now = self._client.now()
            except Exception as exc:  # a user clock that fails
                self._log_failure(errors, "reading the clock", exc)
                errors.next()
                continue
            with self._lock:
                due = self._ledger.renewal_due(now, half_us)
            for msg in due:
                if self._stop_heartbeat.is_set():
                    return
                self._renew(msg, errors)
            self._signals.bump("heartbeats")

    def _renew(self, msg: Message, errors: RetryDelay) -> None:
        try:
            self._client.renew(msg, lease=None if self.channel_lease else self.lease)
        except LeaseLost:
            with self._lock:
                still_held = self._ledger.mark_lost(msg)
            if still_held:
                self._signals.bump("renew_lost")
                self._log.warning(
                    "lease of delivery %d (%s/%s) was lost before it could be renewed; "
                    "the message will be delivered again",
                    msg.delivery_id,
                    self.topic,
                    self.channel,
                )
        except Exception as exc:
            self._signals.bump("renew_errors")
            self._log_failure(errors, f"renewing the lease of delivery {msg.delivery_id}", exc)
            errors.next()
        else:
            errors.recovered(self._log, f"consumer of {self.topic}/{self.channel}: renewing")
            self._signals.bump("renewed")

    # -- helpers ----------------------------------------------------------------------

    def _log_failure(self, errors: RetryDelay, doing: str, exc: BaseException) -> None:
        """ERROR with the traceback the first time in a row, then DEBUG."""
        self._log.log(
            errors.level(),
            "consumer of %s/%s: error while %s (retrying): %s",
            self.topic,
            self.channel,
            doing,
            _short(exc),
            exc_info=errors.traceback(exc),
        )


def _short(exc: BaseException) -> str:
    text = _validate.error_text(exc) or type(exc).__name__
    first = text.splitlines()[0] if text else text
    return first[:300]


# -- the runtime's door to a consumer (and the asyncio twin's) ----------------------------


def waker_of(consumer: Consumer) -> Callable[[], None]:
    """What wakes ``consumer``'s claim loop (a publish, NOTIFY, the change watcher)."""
    return consumer._wake_up


def begin_shutdown(consumer: Consumer) -> bool:
    """Stop ``consumer`` claiming (returns at once); False if there is nothing to
    stop. :func:`finish_shutdown` then waits for the rest, so that a client stops
    its consumers together."""
    return consumer._begin_shutdown()


def finish_shutdown(consumer: Consumer, deadline: float) -> None:
    """The rest of ``consumer``'s shutdown after :func:`begin_shutdown`, by
    ``deadline`` (``time.monotonic()``)."""
    consumer._finish_shutdown(deadline)


def signals_of(consumer: Consumer) -> Signals:
    """What ``consumer`` did so far (claim passes, handlers started, acks): tests
    wait on these instead of sleeping."""
    return consumer._signals
