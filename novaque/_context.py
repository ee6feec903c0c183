"""What the parts of a client share: the client's context.

One :class:`Context` per client holds the state its parts work with (the
engine and novaque's executor on it, the dialect, the options, the clock, the
counters buffered, the topic ids learned, the wakers of this process's
consumers and long polls, whether the schema was checked) and the few things
every part does with it: run an operation in one of novaque's transactions,
and apply what the operation left to do once it committed
(:meth:`Context.apply`). The parts (:mod:`novaque._publishing`,
:mod:`novaque._topology`, :mod:`novaque._consuming`,
:mod:`novaque._maintenance`, and above them :mod:`novaque._operator_calls` and
:mod:`novaque._runtime`) each hold the context, never each other's state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar, cast

import sqlalchemy as sa

from novaque import _migrate, dialects
from novaque._channel_limits import LimitedChannels
from novaque._claim_cursors import ClaimCursors
from novaque._executor import SyncExecutor
from novaque._stats import StatsBuffer
from novaque._time import Clock
from novaque._waits import Waits
from novaque.dialects.params import Link
from novaque.ops import Batch, Effects
from novaque.options import Options, seconds

__all__ = ["CLOCK_SAMPLE_S", "Context", "transaction_timeout"]

T = TypeVar("T")
P = ParamSpec("P")

#: How often the server clock is sampled again (at most once per maintenance pass).
CLOCK_SAMPLE_S = 60.0

#: Topics a publish without any channel was logged for (once per process).
_warned_no_channel: set[str] = set()


def transaction_timeout(options: Options) -> float | None:
    """``Options.transaction_timeout`` in seconds (None: no limit)."""
    limit = options.transaction_timeout
    return None if limit is None else seconds(limit, "Options.transaction_timeout")


class Context:
    """The state a client's parts share, and running operations over it.

    ``engine``: the application's engine; ``executor``: novaque's own
    transactions (on ``executor.engine``, which on SQLite is a second engine
    on the same file); ``waits``: threads' or asyncio's (the twin's).
    """

    def __init__(
        self,
        engine: sa.Engine,
        options: Options,
        dialect: dialects.Dialect,
        executor: SyncExecutor,
        waits: Waits,
    ) -> None:
        self.engine = engine
        self.options = options
        self.log = options.logger
        self.dialect = dialect
        self.executor = executor
        self.waits = waits
        self.clock = Clock(options.clock)
        self.stats = StatsBuffer(on_first=self.counters_added)
        self.default_ttl = seconds(options.default_ttl, "Options.default_ttl")
        self.default_lease = seconds(options.default_lease, "Options.default_lease")
        self.consumer_heartbeat = seconds(options.consumer_heartbeat, "Options.consumer_heartbeat")
        #: Topic ids learned in novaque's own committed transactions.
        self.topic_ids: dict[str, int] = {}
        #: When the maintenance loop next looks for due schedule fires (epoch
        #: microseconds on the client's clock; 0: at its next tick). Set by
        #: each look from the earliest fire it found, and back to 0 when this
        #: client defines or resumes a schedule.
        self.schedules_look_at = 0
        #: Set by :func:`novaque.connect`: the engine is novaque's to dispose.
        self.owns_engine = False
        self._schema_lock = executor.mutex()
        self._schema_ok = threading.Event()
        self._clock_sampled_at = 0.0
        self._wake_lock = threading.Lock()
        self._wakers: dict[str, list[Callable[[], None]]] = {}
        #: Which channels have limits, as this client last saw them, and the
        #: consumers a limit holds back.
        self.limits = LimitedChannels()
        #: Where this client's claims of each channel start reading.
        self.cursors = ClaimCursors()
        #: Told when counters arrive in the empty buffer (add_counters_listener).
        self._counters_listeners: list[Callable[[], None]] = []

    # -- the schema and the clock -------------------------------------------------------

    def ready(self) -> None:
        """Check the schema once (again after a failure) and sample the server clock."""
        if self._schema_ok.is_set():
            return
        with self._schema_lock:
            if self._schema_ok.is_set():
                return
            with self.executor.connect() as conn:
                _migrate.require_current(conn)
                self.dialect.learn_server(conn)
                self.clock.sample(lambda: self.dialect.db_now_us(conn))
            self._clock_sampled_at = time.monotonic()
            self._schema_ok.set()

    @property
    def schema_checked(self) -> bool:
        """Whether the schema was found current (until :meth:`schema_changed`)."""
        return self._schema_ok.is_set()

    def schema_changed(self) -> None:
        """The schema was migrated: check it again at the next call."""
        self._schema_ok.clear()
        self.cursors.forget()

    def now(self) -> int:
        """The client's clock, in epoch microseconds."""
        return self.clock.now_us()

    def resample_clock(self) -> None:
        """Sample the server clock again if :data:`CLOCK_SAMPLE_S` passed since."""
        if time.monotonic() - self._clock_sampled_at < CLOCK_SAMPLE_S:
            return
        with self.executor.connect() as conn:
            self.clock.sample(lambda: self.dialect.db_now_us(conn))
        self._clock_sampled_at = time.monotonic()

    # -- running operations ---------------------------------------------------------------

    def run(self, fn: Callable[[sa.Connection], T], *, op: str = "") -> T:
        """Run ``fn`` in one of novaque's transactions.

        ``op`` names the hot operation ``fn`` performs: where the dialect
        does it in one statement, the transaction costs one round trip, and
        where the dialect writes it for the driver, ``fn`` (an operation of
        :mod:`novaque.ops` that takes a link) is handed a
        :class:`~novaque.dialects.params.Driver` (:meth:`SyncExecutor.run`).
        """
        self.ready()
        return self.executor.run(cast("Callable[[Link], T]", fn), op=op)

    def run_op(
        self,
        op: str,
        fn: Callable[Concatenate[sa.Connection, dialects.Dialect, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run the operation ``fn`` with ``args`` in one of novaque's transactions
        (``op``: as for :meth:`run`)."""
        return self.run(lambda conn: fn(conn, self.dialect, *args, **kwargs), op=op)

    def run_timed(
        self,
        op: str,
        fn: Callable[Concatenate[sa.Connection, dialects.Dialect, int, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Like :meth:`run_op`, passing ``fn`` the time of each attempt (a retried
        transaction runs at the time it is retried)."""
        return self.run(lambda conn: fn(conn, self.dialect, self.now(), *args, **kwargs), op=op)

    def in_batches(
        self,
        fn: Callable[Concatenate[sa.Connection, dialects.Dialect, int, P], Batch],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> int:
        """Run the batch operation ``fn`` (its result: how many rows it saw, how
        many it changed, its effects) in transactions of its own until a batch
        sees fewer than ``Options.maintenance_batch`` rows; return how many it
        changed in all."""
        total = 0
        while True:
            seen, changed, effects = self.run_timed("", fn, *args, **kwargs)
            self.apply(effects)
            total += changed
            if seen < self.options.maintenance_batch:
                return total

    def apply(self, effects: Effects) -> None:
        """After a transaction committed: what its operation left to do."""
        effects.tally.apply(self.stats)
        self.topic_ids.update(effects.topic_ids)
        for topic in effects.wake:
            self.wake(topic)
        for text in effects.warnings:
            self.log.warning("%s", text)
        lonely = effects.no_channel
        if lonely is not None and lonely not in _warned_no_channel:
            _warned_no_channel.add(lonely)
            self.log.warning(
                "topic %s has no channel: its messages are kept (browsable, replayable) "
                "but delivered to nobody; declare channels with ensure_channel() at deploy",
                lonely,
            )

    def is_ours(self, conn: sa.Connection) -> bool:
        """Whether a caller's connection is on this client's database."""
        engine = conn.engine
        return (
            engine is self.engine
            or engine is self.executor.engine
            or (engine.url == self.engine.url)
        )

    # -- counters -------------------------------------------------------------------------

    def counters_added(self) -> None:
        """Counters arrived in the empty buffer: tell whoever
        :meth:`add_counters_listener` added (the client, which flushes them at
        exit at the latest; the runtime, which starts its stats flusher)."""
        for listener in self._counters_listeners:
            listener()

    def add_counters_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever counters arrive in the empty buffer."""
        self._counters_listeners.append(listener)

    # -- local wake-ups (of consumers and long polls) ---------------------------------------

    def add_waker(self, topic: str, waker: Callable[[], None]) -> None:
        """Call ``waker`` when ``topic`` gets deliveries (until :meth:`remove_waker`)."""
        with self._wake_lock:
            self._wakers.setdefault(topic, []).append(waker)

    def remove_waker(self, topic: str, waker: Callable[[], None]) -> None:
        with self._wake_lock:
            found = self._wakers.get(topic, [])
            if waker in found:
                found.remove(waker)

    def wake(self, topic: str) -> None:
        """Wake the waiters of ``topic``."""
        with self._wake_lock:
            wakers = list(self._wakers.get(topic, ()))
        for waker in wakers:
            waker()

    def wake_all(self) -> None:
        """Wake every waiter of every topic (a wake-up may have been missed)."""
        with self._wake_lock:
            wakers = [w for found in self._wakers.values() for w in found]
        for waker in wakers:
            waker()

    # -- connections ----------------------------------------------------------------------

    def close_engines(self) -> None:
        """Close the connections of the engines novaque opened itself (calls
        after it open new ones)."""
        if self.executor.engine is not self.engine:
            self.executor.engine.dispose()
        self.executor.close()
        if self.owns_engine:
            self.engine.dispose()
