"""The core of the synchronous client: publishing, topology, low-level consuming,
maintenance. :class:`novaque.Client` adds the consumer runtime on top of
:class:`CoreClient` and composes the operator's calls
(:class:`novaque._operator_calls.Operations`)."""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

import sqlalchemy as sa

from novaque import _hooks, _migrate, _validate, dialects
from novaque._executor import SyncExecutor
from novaque._stats import MINUTE_US, MINUTES_KEPT_US, StatsBuffer
from novaque._tables import (
    deliveries,
)
from novaque._time import US, Clock, day_of, from_us
from novaque._waits import THREADS, Waits
from novaque.dialects.params import ClaimParams, Link
from novaque.errors import (
    InvalidOption,
    LeaseLost,
    TopicGone,
)
from novaque.models import ChannelSettings, Message
from novaque.ops import Batch, Effects, consume, maintain, presence, topology
from novaque.ops import publish as publish_op
from novaque.options import Duration, Options, check_int, microseconds, seconds

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["CoreClient"]

#: How often a publish of novaque's own is tried with its filters evaluated
#: before its transaction when they change meanwhile (see
#: CoreClient._publish_evaluated); the try after evaluates them in it.
EVALUATION_TRIES = 3


def _groups_of(params: dict[str, Any]) -> list[str | None]:
    """The groups of a publish's messages (``params`` as _write_messages makes them)."""
    groups: list[str | None] = params["groups"] or [None]
    return groups


#: Topics a publish without any channel was logged for (once per process).
_warned_no_channel: set[str] = set()
#: Clients that counted something: their counters are flushed at a clean exit.
_unflushed: weakref.WeakSet[CoreClient] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for client in list(_unflushed):
        if not client._stats:
            continue
        try:
            client._executor.detached(client.flush_stats)
        except Exception as exc:
            client.log.warning(
                "novaque could not flush its counters at exit (they are lost): %s",
                _validate.error_text(exc),
            )


def _forget_parent_counters() -> None:
    """In a forked child: the counters buffered so far are the parent's to flush.

    Without this a child of a pre-forking server (Celery's prefork pool,
    gunicorn with ``--preload``) would flush them again at its exit, on the
    parent's connections.
    """
    for client in list(_unflushed):
        client._stats.forget()
    _unflushed.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_counters)


T = TypeVar("T")
P = ParamSpec("P")

#: How a long poll waits: ``(topic, channel, fetch, wait_s)`` → what ``fetch`` found.
LongPoll = Callable[[str, str, Callable[[], list[Message]], float], list[Message]]

d = deliveries
MAX_CLAIM = 1000
#: How long a cached channel id is trusted when claims come back empty.
CHANNEL_CACHE_S = 5.0
#: How often the server clock is sampled again (at most once per maintenance pass).
CLOCK_SAMPLE_S = 60.0


class CoreClient:
    """A handle on novaque's tables in the database behind ``engine``.

    Creating a client touches no database. The first call that does checks once
    that the migrations were applied (:class:`~novaque.SchemaOutOfDate`
    otherwise). A client is safe to share between threads.

    On SQLite novaque runs its own transactions on a second engine opened on
    the same file, so that it can take the write lock up front (``BEGIN
    IMMEDIATE``) without changing how the application's own engine behaves.
    """

    #: How statements are executed: on threads here; awaited through
    #: SQLAlchemy's greenlet bridge for the asyncio twin.
    _executor_type: type[SyncExecutor] = SyncExecutor
    #: How the client waits (background loops, long polls, paced calls):
    #: threads' events here, asyncio's for the asyncio twin.
    _waits: Waits = THREADS

    def __init__(self, engine: sa.Engine, options: Options | None = None) -> None:
        if not isinstance(engine, sa.Engine):
            raise TypeError(
                f"Client needs a SQLAlchemy Engine, got {type(engine).__name__}"
                + _validate.async_hint(engine)
            )
        if engine.dialect.is_async != self._executor_type.asynchronous:
            raise TypeError(
                f"the engine's driver {engine.dialect.driver} is "
                + (
                    "asyncio's: use novaque.aio.AsyncClient with its AsyncEngine"
                    if engine.dialect.is_async
                    else "not an asyncio one: novaque.aio.AsyncClient needs one"
                )
            )
        #: The client's :class:`~novaque.Options` (the defaults when none were given).
        self.options = options if options is not None else Options()
        if not isinstance(self.options, Options):
            raise TypeError(f"options must be novaque.Options, got {type(options).__name__}")
        #: The application's engine, as given (or made by :func:`~novaque.connect`).
        self.engine = engine
        #: The logger novaque logs to (``Options.logger``).
        self.log = self.options.logger
        self._dialect = dialects.for_engine(engine)
        self._executor = self._new_executor(dialects.own_engine(engine))
        self._clock = Clock(self.options.clock)
        self._stats = StatsBuffer(on_first=self._counters_added)
        self._schema_lock = self._executor.mutex()
        self._schema_ok = threading.Event()
        self._clock_sampled_at = 0.0
        #: Topic ids learned in novaque's own committed transactions.
        self._topic_ids: dict[str, int] = {}
        #: Engines of callers' connections whose schema was checked.
        self._checked_engines: weakref.WeakSet[sa.Engine] = weakref.WeakSet()
        self._channel_cache: dict[tuple[str, str], tuple[int, float]] = {}
        #: Topics last seen with routed channels: published in a transaction
        #: (a hint only: each publish learns the truth in its own statements).
        self._routed_topics: set[str] = set()
        #: The driver path's plan of each topic, from its last publish there
        #: (checked by the database, so a stale one costs time, not deliveries).
        self._plans: dict[str, str] = {}
        #: The filters of each topic's channels as its last publish read them,
        #: evaluated before the next one's transaction (a hint: the
        #: transaction reads them again, see _publish_evaluated).
        self._topic_filters: dict[str, frozenset[str]] = {}
        self._wake_lock = threading.Lock()
        self._wakers: dict[str, list[Callable[[], None]]] = {}
        self._default_ttl = seconds(self.options.default_ttl, "Options.default_ttl")
        self._default_lease = seconds(self.options.default_lease, "Options.default_lease")
        self._consumer_heartbeat = seconds(
            self.options.consumer_heartbeat, "Options.consumer_heartbeat"
        )
        #: What a maintenance pass runs after the TTL purge (_add_purge_pass).
        self._purge_passes: list[Callable[[], int]] = []
        #: Told when counters arrive in the empty buffer (_add_counters_listener).
        self._counters_listeners: list[Callable[[], None]] = []
        #: How ``claim(wait=)`` and ``pop(wait=)`` wait (_set_long_poll).
        self._long_poller: LongPoll | None = None
        #: Set by :func:`novaque.connect`: the engine is novaque's to dispose.
        self._owns_engine = False

    def __repr__(self) -> str:
        return f"<novaque.Client {self._dialect.name} {self.engine.url.render_as_string()}>"

    # -- schema ---------------------------------------------------------------------

    def migrate(self, to: str = "head") -> None:
        """Apply novaque's migrations up to ``to`` (Alembic ``upgrade``).

        Checks the database version floor first (:class:`~novaque.UnsupportedDatabase`).
        Running it again is a no-op.
        """
        if _migrate.is_head(to):
            # Nothing to do (the usual case, once per worker process): no
            # lock, no Alembic, nothing logged.
            with self._executor.connect() as conn:
                self._dialect.check_floor(conn)
                if _migrate.is_current(conn):
                    return
        with self._executor.migration_transaction() as conn:
            self._dialect.check_floor(conn)
            with self._dialect.migration_lock(conn):
                before = _migrate.upgrade(conn, to)
        self._schema_ok.clear()
        if _migrate.is_head(to):
            _migrate.remember(self.engine.url)
        after = _migrate.head() if _migrate.is_head(to) else to
        if before != after:
            self.log.info("novaque schema migrated from %s to %s", before or "base", after)

    def downgrade(self, to: str = "base") -> None:
        """Revert novaque's migrations down to ``to``; ``base`` drops every table."""
        with self._executor.migration_transaction() as conn, self._dialect.migration_lock(conn):
            _migrate.downgrade(conn, to)
        _migrate.forget(self.engine.url)
        self._schema_ok.clear()
        self._topic_ids.clear()
        self._plans.clear()
        self._channel_cache.clear()
        self.log.info("novaque schema downgraded to %s", to)

    def _ready(self) -> None:
        """Check the schema once (again after a failure) and sample the server clock."""
        if self._schema_ok.is_set():
            return
        with self._schema_lock:
            if self._schema_ok.is_set():
                return
            with self._executor.connect() as conn:
                _migrate.require_current(conn)
                self._dialect.learn_server(conn)
                self._clock.sample(lambda: self._dialect.db_now_us(conn))
            self._clock_sampled_at = time.monotonic()
            self._schema_ok.set()

    def _now(self) -> int:
        return self._clock.now_us()

    def _new_executor(self, engine: sa.Engine) -> SyncExecutor:
        """The executor of novaque's own transactions on ``engine``."""
        return self._executor_type(engine, self._dialect, timeout=self._transaction_timeout())

    def _transaction_timeout(self) -> float | None:
        """``Options.transaction_timeout`` in seconds (None: no limit)."""
        limit = self.options.transaction_timeout
        return None if limit is None else seconds(limit, "Options.transaction_timeout")

    def _counters_added(self) -> None:
        """Counters arrived in the empty buffer: they are flushed at exit at the
        latest, and sooner by whoever :meth:`_add_counters_listener` added."""
        _unflushed.add(self)
        for listener in self._counters_listeners:
            listener()

    def _add_counters_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever counters arrive in the empty buffer (the
        runtime starts its stats flusher then)."""
        self._counters_listeners.append(listener)

    def _run(self, fn: Callable[[sa.Connection], T], *, op: str = "") -> T:
        """Run ``fn`` in one of novaque's transactions.

        ``op`` names the hot operation ``fn`` performs: where the dialect
        does it in one statement, the transaction costs one round trip, and
        where the dialect writes it for the driver, ``fn`` (an operation of
        :mod:`novaque.ops` that takes a link) is handed a
        :class:`~novaque.dialects.params.Driver` (:meth:`SyncExecutor.run`).
        """
        self._ready()
        return self._executor.run(cast("Callable[[Link], T]", fn), op=op)

    def _run_op(
        self,
        op: str,
        fn: Callable[Concatenate[sa.Connection, dialects.Dialect, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run the operation ``fn`` with ``args`` in one of novaque's transactions
        (``op``: as for :meth:`_run`)."""
        return self._run(lambda conn: fn(conn, self._dialect, *args, **kwargs), op=op)

    def _run_timed(
        self,
        op: str,
        fn: Callable[Concatenate[sa.Connection, dialects.Dialect, int, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Like :meth:`_run_op`, passing ``fn`` the time of each attempt (a retried
        transaction runs at the time it is retried)."""
        return self._run(lambda conn: fn(conn, self._dialect, self._now(), *args, **kwargs), op=op)

    def _in_batches(
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
            seen, changed, effects = self._run_timed("", fn, *args, **kwargs)
            self._apply(effects)
            total += changed
            if seen < self.options.maintenance_batch:
                return total

    # -- publishing -----------------------------------------------------------------

    def publish(
        self,
        topic: str,
        body: bytes | str,
        *,
        delay: Duration | None = None,
        ttl: Duration | None = None,
        max_attempts: int | None = None,
        headers: dict[str, str] | None = None,
        dedup_key: str | None = None,
        group: str | None = None,
        connection: sa.Connection | None = None,
        session: Session | None = None,
    ) -> int:
        """Publish one message to ``topic``; return its id.

        One delivery is written for each channel the topic has, in the same
        transaction as the message. With ``connection`` or ``session`` the
        message joins that transaction (and commits or rolls back with it);
        otherwise novaque commits it before returning. A topic that does not
        exist is created. With ``dedup_key``, publishing again with the same
        key while the first message lives (until its TTL purge or
        :meth:`prune`) returns the first id and writes nothing when the body,
        headers and group are the same (headers of a trace context,
        ``traceparent``, ``tracestate`` and ``baggage``, are not compared: a
        publish retried from another trace is the same message); when one
        differs it raises
        :class:`~novaque.DedupConflict` (with the key and the first id) and
        writes nothing. ``group`` (1-200 characters) is the message's ordering key:
        a ``group_fifo`` channel hands out the messages of one group one at a
        time, in order (see docs/how-to/ordering.md).
        """
        return self._publish(
            topic,
            [body],
            batch=False,
            delay=delay,
            ttl=ttl,
            max_attempts=max_attempts,
            headers=headers,
            dedup_keys=[_validate.dedup_key(dedup_key)],
            groups=[_validate.group(group)],
            connection=connection,
            session=session,
        )[0]

    def publish_many(
        self,
        topic: str,
        bodies: Iterable[bytes | str],
        *,
        delay: Duration | None = None,
        ttl: Duration | None = None,
        max_attempts: int | None = None,
        headers: dict[str, str] | None = None,
        dedup_keys: Sequence[str | None] | None = None,
        groups: Sequence[str | None] | None = None,
        connection: sa.Connection | None = None,
        session: Session | None = None,
    ) -> list[int]:
        """Publish many messages to ``topic`` in one transaction with bulk inserts.

        Returns their ids in order. ``delay``, ``ttl``, ``max_attempts`` and
        ``headers`` apply to every message; ``dedup_keys`` and ``groups``, if
        given, have one key (or None) per body.

        A body whose dedup key is held by a live message returns that
        message's id (as :meth:`publish`); if one such holder has another
        body, headers or group, :class:`~novaque.DedupConflict` is raised and
        the whole call writes nothing, also in a caller's transaction
        (``connection``/``session``), which may go on. A key given twice in
        one call must come with the same body and group (else
        :class:`~novaque.InvalidOption`, before any statement): the second
        gets the first one's id.
        """
        body_list = list(bodies)
        if dedup_keys is None:
            keys: list[str | None] = [None] * len(body_list)
        else:
            keys = [_validate.dedup_key(k) for k in dedup_keys]
            if len(keys) != len(body_list):
                raise InvalidOption(
                    f"dedup_keys has {len(keys)} entries for {len(body_list)} bodies"
                )
        if groups is None:
            group_list: list[str | None] = [None] * len(body_list)
        else:
            if isinstance(groups, str):
                raise TypeError("groups must be a sequence of str or None, one per body")
            group_list = [_validate.group(g) for g in groups]
            if len(group_list) != len(body_list):
                raise InvalidOption(
                    f"groups has {len(group_list)} entries for {len(body_list)} bodies"
                )
        return self._publish(
            topic,
            body_list,
            batch=True,
            delay=delay,
            ttl=ttl,
            max_attempts=max_attempts,
            headers=headers,
            dedup_keys=keys,
            groups=group_list,
            connection=connection,
            session=session,
        )

    def _publish(
        self,
        topic: str,
        bodies: list[bytes | str],
        *,
        batch: bool,
        delay: Duration | None,
        ttl: Duration | None,
        max_attempts: int | None,
        headers: Mapping[str, str] | None,
        dedup_keys: list[str | None],
        groups: list[str | None],
        connection: sa.Connection | None,
        session: Session | None,
    ) -> list[int]:
        """Publish through the instrumentation's hook if one is installed
        (:mod:`novaque._hooks`: a ``publish`` span around the write, its trace
        context added to the headers), else directly."""
        _validate.name(topic, "topic")
        hook = _hooks.publish
        if hook is None or not bodies:
            return self._write_messages(
                topic,
                bodies,
                headers,
                delay=delay,
                ttl=ttl,
                max_attempts=max_attempts,
                dedup_keys=dedup_keys,
                groups=groups,
                connection=connection,
                session=session,
            )
        # A partial, not a closure: the path without a hook creates no cells.
        write = functools.partial(
            self._write_messages,
            topic,
            bodies,
            delay=delay,
            ttl=ttl,
            max_attempts=max_attempts,
            dedup_keys=dedup_keys,
            groups=groups,
            connection=connection,
            session=session,
        )
        return hook(topic, len(bodies), batch, headers, write)

    def _write_messages(
        self,
        topic: str,
        bodies: list[bytes | str],
        headers: Mapping[str, str] | None,
        *,
        delay: Duration | None,
        ttl: Duration | None,
        max_attempts: int | None,
        dedup_keys: list[str | None],
        groups: list[str | None],
        connection: sa.Connection | None,
        session: Session | None,
    ) -> list[int]:
        data = [_validate.body(b, self.options.max_body_bytes) for b in bodies]
        ttl_s = _validate.ttl(ttl, self._default_ttl)
        delay_s = _validate.delay(delay, ttl_s)
        attempts = _validate.max_attempts(max_attempts, self.options.default_max_attempts)
        header_text = _validate.headers(headers)
        _check_repeated_keys(dedup_keys, data, groups)
        if connection is not None and session is not None:
            raise InvalidOption("pass either connection or session to publish, not both")
        if connection is not None and not isinstance(connection, sa.Connection):
            raise TypeError(
                "connection must be a SQLAlchemy Connection, got "
                f"{type(connection).__name__}{_validate.async_hint(connection)}"
            )
        if session is not None and not _is_session(session):
            raise TypeError(
                "session must be a SQLAlchemy Session, got "
                f"{type(session).__name__}{_validate.async_hint(session)}"
            )
        if not data:
            return []
        params: dict[str, Any] = {
            "topic": topic,
            "bodies": data,
            "dedup_keys": dedup_keys,
            "groups": groups,
            "headers": header_text,
            "ttl_us": microseconds(ttl_s),
            "delay_us": microseconds(delay_s),
            "max_attempts": attempts,
        }
        if session is not None:
            connection = session.connection()
        if connection is not None:
            # The caller's transaction: the topic id is read in it (never
            # taken from the cache, which may hold an id of another database
            # or one deleted since), so it commits or rolls back with it.
            ours = self._is_ours(connection)
            if ours:
                self._ready()
            else:
                self._ready_elsewhere(connection)
            # The topic's filters known here evaluated before the publish writes
            # (on SQLite, before the caller's transaction may take the write
            # lock); those met in it that were not are evaluated there.
            verdicts = self._verdicts(topic, params) if ours else None
            done = publish_op.publish(
                connection, self._dialect, self._now(), topic_id=None, verdicts=verdicts, **params
            )
            if ours:
                self._learn_filters(topic, done)
                # Not cached: the id is the caller's transaction's until it commits.
                effects = dataclasses.replace(done.effects(topic), topic_ids=())
                _after_commit(connection, lambda: self._apply(effects))
            else:
                # Another database: its counters are written there, in the
                # caller's transaction (this client's buffer is for its own).
                publish_op.count_here(connection, self._dialect, done)
            return done.ids
        return self._run_publish(topic, params)

    def _run_publish(self, topic: str, params: dict[str, Any]) -> list[int]:
        """Publish in novaque's own transaction; the topic id is cached once it committed."""
        topic_id = self._topic_ids.get(topic)
        # One statement where the dialect can: the topic id is known, no dedup
        # keys, the bodies fit one INSERT batch, and the topic was not seen
        # with routed channels (a filter, an ordering), whose deliveries are
        # written by a second statement of the same transaction.
        one = (
            topic_id is not None
            and topic not in self._routed_topics
            and publish_op.one_statement(params["bodies"], params["dedup_keys"])
        )
        try:
            # One message without a group: the dialect may write it in the
            # driver's SQL (the executor's choice), with the topic's plan.
            single = len(params["bodies"]) == 1 and params["groups"][0] is None
            op = ("publish_one" if single else "publish") if one else ""
            done = self._publish_evaluated(
                op, topic, params, topic_id=topic_id, routed=not one, plan=self._plans.get(topic)
            )
            if done.plan is not None:
                self._plans[topic] = done.plan
            if done.declined:  # routed channels after all: nothing was written
                self._routed_topics.add(topic)
                done = self._publish_evaluated("", topic, params, topic_id=topic_id)
        except (sa.exc.IntegrityError, TopicGone):
            # A cached topic id may belong to a topic deleted elsewhere (ids are
            # never reused, so it cannot name another topic): look it up again.
            if self._topic_ids.pop(topic, None) is None:
                raise
            done = self._publish_evaluated("", topic, params, topic_id=None)
        if not done.routed:
            self._routed_topics.discard(topic)
            self._topic_filters.pop(topic, None)
        self._apply(done.effects(topic))
        return done.ids

    def _publish_evaluated(
        self, op: str, topic: str, params: dict[str, Any], **how: Any
    ) -> publish_op.Published:
        """:func:`novaque.ops.publish.publish` of ``params`` in novaque's own
        transaction (``op``: as for :meth:`_run`; ``how``: its ``topic_id`` and
        ``routed``), the topic's filters evaluated before the transaction
        begins: evaluated in it, they would hold its locks meanwhile (on SQLite
        the database's write lock, which every other writer waits for).

        The filters evaluated are those the topic's last publish read. The
        transaction reads the channels again and finds each verdict by the
        filter's text; one it lacks (a filter set or changed since) rolls it
        back (:class:`~novaque.ops.publish.Unevaluated`), to be evaluated and
        published again. Should the filters change at every try, the last
        evaluates them in the transaction."""
        verdicts = self._verdicts(topic, params)
        for _ in range(EVALUATION_TRIES):
            try:
                done = self._run_timed(
                    op, publish_op.publish, verdicts=verdicts, evaluate_here=False, **how, **params
                )
            except publish_op.Unevaluated as met:
                self._topic_filters[topic] = met.filters
                self._verdicts(topic, params, verdicts)
                continue
            self._learn_filters(topic, done)
            return done
        done = self._run_timed(op, publish_op.publish, verdicts=verdicts, **how, **params)
        self._learn_filters(topic, done)
        return done

    def _verdicts(
        self, topic: str, params: dict[str, Any], verdicts: publish_op.Verdicts | None = None
    ) -> publish_op.Verdicts:
        """``verdicts`` (a new dict if None) with those it lacks of the filters
        last read for ``topic`` (none if it has none) on the messages of
        ``params``."""
        filters = self._topic_filters.get(topic, ())
        return publish_op.evaluate(filters, params["headers"], _groups_of(params), topic, verdicts)

    def _learn_filters(self, topic: str, done: publish_op.Published) -> None:
        """Keep the filters a publish read of ``topic``'s channels, if it read them."""
        if done.filters:
            self._topic_filters[topic] = done.filters
        elif done.filters is not None:
            self._topic_filters.pop(topic, None)

    def _apply(self, effects: Effects) -> None:
        """After a transaction committed: what its operation left to do."""
        effects.tally.apply(self._stats)
        self._topic_ids.update(effects.topic_ids)
        for topic in effects.wake:
            self._wake(topic)
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

    def _is_ours(self, conn: sa.Connection) -> bool:
        """Whether a caller's connection is on this client's database."""
        engine = conn.engine
        return (
            engine is self.engine
            or engine is self._executor.engine
            or (engine.url == self.engine.url)
        )

    def _ready_elsewhere(self, conn: sa.Connection) -> None:
        """The checks for a caller's connection to another database (once per engine)."""
        if conn.engine in self._checked_engines:
            return
        if dialects.class_for(conn) is not type(self._dialect):
            raise InvalidOption(
                f"this client works with {self._dialect.name}; the connection given to "
                f"publish is to {conn.dialect.name}: use a client of that database"
            )
        # On a connection of its own: a failed query must not break the
        # caller's transaction.
        with conn.engine.connect() as probe:
            _migrate.require_current(probe)
        self._checked_engines.add(conn.engine)

    # -- local wake-ups (used by consumers) -----------------------------------------------

    def _add_waker(self, topic: str, waker: Callable[[], None]) -> None:
        with self._wake_lock:
            self._wakers.setdefault(topic, []).append(waker)

    def _remove_waker(self, topic: str, waker: Callable[[], None]) -> None:
        with self._wake_lock:
            found = self._wakers.get(topic, [])
            if waker in found:
                found.remove(waker)

    def _wake(self, topic: str) -> None:
        with self._wake_lock:
            wakers = list(self._wakers.get(topic, ()))
        for waker in wakers:
            waker()

    def _wake_all(self) -> None:
        """Wake every waiter of every topic (a wake-up may have been missed)."""
        with self._wake_lock:
            wakers = [w for found in self._wakers.values() for w in found]
        for waker in wakers:
            waker()

    # -- topology ---------------------------------------------------------------------

    def _channel_id(self, topic: str, channel: str) -> int:
        """A channel's id for the hot path, cached (see :data:`CHANNEL_CACHE_S`)."""
        cached = self._channel_cache.get((topic, channel))
        if cached is not None:
            return cached[0]
        self._ready()
        with self._executor.connect() as conn:
            channel_id = topology.channel_id(conn, self._dialect, topic, channel)
        self._channel_cache[(topic, channel)] = (channel_id, time.monotonic())
        return channel_id

    def _channel_maybe_gone(self, topic: str, channel: str) -> None:
        """An empty claim: distrust a cached channel id that has not been checked lately."""
        cached = self._channel_cache.get((topic, channel))
        if cached is not None and time.monotonic() - cached[1] > CHANNEL_CACHE_S:
            del self._channel_cache[(topic, channel)]

    def ensure_topic(self, topic: str) -> None:
        """Create ``topic`` if it does not exist."""
        _validate.name(topic, "topic")
        self._run_timed("", topology.ensure_topic, topic)

    def ensure_channel(
        self,
        topic: str,
        channel: str,
        *,
        ordering: str | None = None,
        filter: str | None = None,
        lease: Duration | None = None,
        max_attempts: int | None = None,
        dead_max_age: Duration | None = None,
        dead_max_count: int | None = None,
        dead_max_bytes: int | None = None,
        dead_letter_expired: bool | None = None,
        reset: Iterable[str] = (),
    ) -> None:
        """Create ``channel`` on ``topic`` (and the topic) if missing, with settings.

        A new channel receives messages published from now on and takes the
        settings given (the others: ``"standard"`` ordering and the client's
        ``Options``). For an existing channel each setting given replaces the
        stored one and the others keep theirs; ``reset`` names settings to
        return to the client's defaults.

        - ``ordering``: ``"standard"``, ``"group_fifo"`` or ``"strict_fifo"``;
        - ``filter``: a boolean CEL expression over ``headers``, ``group`` and
          ``topic`` that a message must satisfy to be delivered to the channel
          (``""`` removes it); compiled and checked here (its types, its
          depth, and its cost: at most 20,000 evaluation steps), raising
          :class:`~novaque.InvalidFilter` (and storing nothing) for a bad one;
        - ``lease``: of claims and consumers on the channel that name none;
        - ``max_attempts``: the budget of every delivery created in the channel
          from then on, whatever the publish said;
        - ``dead_max_age``, ``dead_max_count``, ``dead_max_bytes`` (total body
          bytes): bounds of its dead letters, the oldest died going first;
        - ``dead_letter_expired``: whether a delivery still live when its
          message's TTL passes becomes a dead letter (reason ``"expired"``)
          instead of being purged.

        Settings committed here hold for every claim and publish that starts
        afterwards, in every process.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        settings = _validate.channel_settings(
            reset,
            ordering=ordering,
            filter=filter,
            lease=lease,
            max_attempts=max_attempts,
            dead_max_age=dead_max_age,
            dead_max_count=dead_max_count,
            dead_max_bytes=dead_max_bytes,
            dead_letter_expired=dead_letter_expired,
        )
        self._run_timed("", topology.ensure_channel, topic, channel, settings)

    def channel_settings(self, topic: str, channel: str) -> ChannelSettings:
        """The stored settings of a channel (see :meth:`ensure_channel`)."""
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        return self._run_op("", topology.channel_settings, topic, channel)

    def pause_channel(self, topic: str, channel: str) -> None:
        """Stop handing out the channel's deliveries, in every process.

        A paused channel still receives deliveries, and leases already held
        can still be settled and renewed, but no claim or consumer gets
        anything from it until :meth:`resume_channel`.
        """
        self._set_paused(topic, channel, True)

    def resume_channel(self, topic: str, channel: str) -> None:
        """Hand out the channel's deliveries again; its consumers pick up within
        a poll interval (at once on PostgreSQL, through NOTIFY)."""
        self._set_paused(topic, channel, False)

    def _set_paused(self, topic: str, channel: str, paused: bool) -> None:
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        self._apply(self._run_op("", topology.set_paused, topic, channel, paused))
        self.log.info("%s channel %s/%s", "paused" if paused else "resumed", topic, channel)

    def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` with its channels, messages, deliveries and counters."""
        _validate.name(topic, "topic")
        self._run_op("", topology.delete_topic, topic)
        self._forget(topic)
        self.log.info("deleted topic %s", topic)

    def delete_channel(self, topic: str, channel: str) -> None:
        """Delete a channel with its deliveries and counters; messages stay."""
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        self._run_op("", topology.delete_channel, topic, channel)
        self._forget(topic, channel)
        self.log.info("deleted channel %s/%s", topic, channel)

    def _forget(self, topic: str, channel: str | None = None) -> None:
        if channel is None:
            self._topic_ids.pop(topic, None)
        for key in [k for k in self._channel_cache if k[0] == topic and channel in (None, k[1])]:
            self._channel_cache.pop(key, None)

    def list_topics(self) -> list[str]:
        """Every topic's name, sorted."""
        return self._run_op("", topology.list_topics)

    def list_channels(self, topic: str) -> list[str]:
        """The channel names of ``topic``, sorted; :class:`~novaque.TopicNotFound` if missing."""
        _validate.name(topic, "topic")
        return self._run_op("", topology.list_channels, topic)

    # -- low-level consuming ------------------------------------------------------------

    def claim(
        self,
        topic: str,
        channel: str,
        *,
        max_messages: int = 1,
        lease: Duration | None = None,
        wait: Duration | None = None,
        attempt_id: str | None = None,
    ) -> list[Message]:
        """Lease up to ``max_messages`` due deliveries of a channel, oldest first.

        Returns ``[]`` when nothing is due. Each delivery's attempt counter goes
        up by one. Settle each message with :meth:`ack`, :meth:`requeue`,
        :meth:`snooze`, :meth:`defer` or :meth:`reject` before ``lease`` runs
        out (or :meth:`renew` it); an expired lease makes the delivery
        claimable again.

        ``wait`` (0 < wait <= 300 s): when nothing is due, wait up to that long
        (real time) for a delivery instead of returning ``[]`` at once; a
        publish in this process or a PostgreSQL ``NOTIFY`` wakes the wait,
        else it polls every ``Options.poll_interval``. No connection is held
        while it waits.

        ``attempt_id`` (1-200 characters) makes the claim idempotent: a claim
        that repeats it on the channel while deliveries are leased under it
        (and their leases have not expired) returns those deliveries, with
        the same tokens and attempt counts, and claims nothing new, even on a
        paused channel; once none is leased under it, it claims afresh.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        check_int(max_messages, "max_messages", 1, MAX_CLAIM)
        lease_s = _validate.lease(lease, self._default_lease)
        wait_s = _validate.wait(wait)
        attempt = _validate.attempt_id(attempt_id)

        def fetch() -> list[Message]:
            return self._claim(
                topic,
                channel,
                self._channel_id(topic, channel),
                max_messages,
                lease_s,
                lease is None,
                attempt,
            )

        return fetch() if wait_s is None else self._long_poll(topic, channel, fetch, wait_s)

    def _claim(
        self,
        topic: str,
        channel: str,
        channel_id: int,
        limit: int,
        lease_s: float,
        channel_lease: bool = False,
        attempt_id: str | None = None,
    ) -> list[Message]:
        """Claim with ``lease_s``; with ``channel_lease`` the channel's own lease,
        when it has one, replaces it (``attempt_id``: see :meth:`claim`)."""
        token = secrets.token_hex(16)
        claim = ClaimParams(
            channel_id, limit, microseconds(lease_s), token, channel_lease, attempt_id
        )
        op = "claim" if attempt_id is None else ""
        rows, now, effects = self._run_timed(op, consume.claim, claim)
        return self._handed_out(topic, channel, channel_id, token, rows, now, effects)

    def _hand_out(
        self,
        topic: str,
        channel: str,
        channel_id: int,
        token: str,
        op: str,
        fn: Callable[
            Concatenate[sa.Connection, dialects.Dialect, int, int, P],
            tuple[list[dialects.ClaimedRow], int, Effects],
        ],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> list[Message]:
        """Run the operation ``fn`` that hands deliveries of the channel out (its
        rows, its time, its effects; ``op``: as for :meth:`_run`): their
        messages, leased with ``token``."""
        rows, now, effects = self._run_timed(op, fn, channel_id, *args, **kwargs)
        return self._handed_out(topic, channel, channel_id, token, rows, now, effects)

    def _handed_out(
        self,
        topic: str,
        channel: str,
        channel_id: int,
        token: str,
        rows: list[dialects.ClaimedRow],
        now: int,
        effects: Effects,
    ) -> list[Message]:
        """After an operation handed ``rows`` out at ``now``: their messages."""
        self._apply(effects)
        if not rows:
            self._channel_maybe_gone(topic, channel)
            return []
        return consume.messages_of(rows, topic, channel, channel_id, token, now)

    def _long_poll(
        self, topic: str, channel: str, fetch: Callable[[], list[Message]], wait_s: float
    ) -> list[Message]:
        """Call ``fetch`` (of ``topic``/``channel``) until it returns something, or
        return ``[]`` once ``wait_s`` seconds of real time have passed (the
        wait is the runtime's: :meth:`_set_long_poll`)."""
        if self._long_poller is None:
            raise RuntimeError("this client has no runtime to wait with")
        return self._long_poller(topic, channel, fetch, wait_s)

    def _set_long_poll(self, long_poll: LongPoll) -> None:
        """Wait with ``long_poll`` in ``claim(wait=)`` and ``pop(wait=)``."""
        self._long_poller = long_poll

    def pop(
        self,
        topic: str,
        channel: str,
        *,
        max_messages: int = 1,
        wait: Duration | None = None,
    ) -> list[Message]:
        """Receive-and-delete: take up to ``max_messages`` due deliveries of a
        channel, oldest first, and delete them in the same transaction.

        At-most-once: a message popped is gone from the channel even if the
        caller then fails. Counted ``claimed`` and ``acked``; each message's
        ``attempts`` counts this one. The messages carry no lease
        (``lease_token == ""``): settling one raises :class:`~novaque.LeaseLost`.
        Ordering applies (a popped head lets its group's next delivery go, as
        an ack does), and a paused channel gives ``[]``. ``wait``: as for
        :meth:`claim`.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        check_int(max_messages, "max_messages", 1, MAX_CLAIM)
        wait_s = _validate.wait(wait)

        def fetch() -> list[Message]:
            channel_id = self._channel_id(topic, channel)
            return self._hand_out(topic, channel, channel_id, "", "", consume.pop, max_messages)

        return fetch() if wait_s is None else self._long_poll(topic, channel, fetch, wait_s)

    def claim_deferred(
        self,
        topic: str,
        channel: str,
        delivery_ids: Iterable[int],
        *,
        lease: Duration | None = None,
    ) -> list[Message]:
        """Lease the deferred deliveries of a channel named by ``delivery_ids``
        (``Message.delivery_id`` of each message given to :meth:`defer`).

        As :meth:`claim` does: each attempt counted, the lease ``lease`` (the
        channel's own when None, else ``Options.default_lease``), the
        messages in delivery-id order. Ids that are not deferred deliveries
        of this channel are ignored (at most 1000 ids per call), and a paused
        channel gives ``[]``. On an ordered channel a deferred delivery is
        leased only when nothing of its group is leased and no delivery of
        the group with a lower delivery id waits; it then heads its group
        again (the later ones wait for it). Otherwise it stays deferred. One
        whose attempts are all spent (it was deferred on its last attempt)
        becomes a dead letter instead, with reason ``max_attempts`` (counted
        ``dead``): ``requeue_dead`` gives it fresh attempts.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        ids = _validate.ids(delivery_ids, "delivery_ids")
        if len(ids) > MAX_CLAIM:
            raise InvalidOption(
                f"delivery_ids has {len(ids)} ids; at most {MAX_CLAIM} are claimed at once"
            )
        lease_s = _validate.lease(lease, self._default_lease)
        channel_id = self._channel_id(topic, channel)
        if not ids:
            return []
        token = secrets.token_hex(16)
        return self._hand_out(
            topic,
            channel,
            channel_id,
            token,
            "",
            consume.claim_deferred,
            ids,
            microseconds(lease_s),
            token,
            lease is None,
        )

    def _ack_and_claim(
        self,
        acks: Sequence[Message],
        topic: str,
        channel: str,
        channel_id: int,
        limit: int,
        lease_s: float,
        channel_lease: bool = False,
    ) -> tuple[list[Message], list[Message]]:
        """Ack ``acks`` and lease up to ``limit`` more deliveries in one transaction.

        What a consumer does between two batches: one commit (one round trip
        on PostgreSQL) instead of two. Returns the acks whose lease was lost
        (as :meth:`ack_many`) and the messages claimed (as :meth:`claim`).
        Ordered acks move their groups on first, so the claim may take their
        next deliveries; on PostgreSQL's driver path the two statements go in
        one pipeline, still one round trip and one commit.
        """
        if not acks:
            if not limit:
                return [], []
            return [], self._claim(topic, channel, channel_id, limit, lease_s, channel_lease)
        if limit <= 0:
            return self.ack_many(acks), []
        token = secrets.token_hex(16)
        claim = ClaimParams(channel_id, limit, microseconds(lease_s), token, channel_lease)
        op = "ack_ordered_claim" if consume.ordered(acks) else "ack_claim"
        lost, rows, now, effects = self._run_timed(op, consume.ack_and_claim, acks, claim)
        self._apply(effects)
        if not rows:
            self._channel_maybe_gone(topic, channel)
            return lost, []
        return lost, consume.messages_of(rows, topic, channel, channel_id, token, now)

    def ack(self, msg: Message) -> None:
        """Settle ``msg`` as done: its delivery is deleted (the message stays until TTL).

        Raises :class:`~novaque.LeaseLost` if the lease is no longer current.
        """
        if self.ack_many([msg]):
            raise LeaseLost(_lost_text(msg))

    def ack_many(self, msgs: Sequence[Message]) -> list[Message]:
        """Ack many messages in one transaction; return those whose lease was lost."""
        if not msgs:
            return []
        op = "ack_ordered" if consume.ordered(msgs) else "ack"
        lost, effects = self._run_timed(op, consume.ack, msgs)
        self._apply(effects)
        return lost

    def requeue(
        self,
        msg: Message,
        *,
        delay: Duration | None = None,
        error: str | BaseException | None = None,
    ) -> None:
        """Give ``msg`` back for another attempt after ``delay``.

        ``delay=None`` applies the client's backoff policy; ``delay=0`` retries
        at once. ``error`` (text or exception) is kept as the delivery's last
        error (at most 4000 characters; NUL and lone surrogates replaced by
        U+FFFD). After the last allowed attempt the delivery becomes dead at
        once (reason ``max_attempts``). Raises :class:`~novaque.LeaseLost` if the lease
        is no longer current.

        A positive ``delay`` that would make the retry due only at or after
        the message's expiry (its TTL) raises :class:`~novaque.InvalidOption` and
        changes nothing: the message would be purged before the retry. A delay
        from the backoff policy (``delay=None``, as the consumer retries) is
        not refused: if it reaches past the expiry, the delivery is purged at
        TTL like any other still waiting then.

        On an ordered channel the delivery stays its group's head, unless a
        delivery of the group with a lower delivery id came back while it was
        leased (a requeued dead letter): it then waits behind that one.
        """
        delay_s = (
            self.options.backoff.delay(msg.attempts)
            if delay is None
            else _validate.retry_delay(delay)
        )
        explicit = delay is not None and delay_s > 0
        self._retry(msg, delay_s, _validate.error_text(error), within_ttl=explicit)

    def _retry(
        self, msg: Message, delay_s: float, error: str | None, *, within_ttl: bool = False
    ) -> None:
        if msg.attempts >= msg.max_attempts:
            self._bury(msg, "max_attempts", error)
            return
        self._put_back(msg, delay_s, error, within_ttl=within_ttl)

    def snooze(self, msg: Message, delay: Duration) -> None:
        """Give ``msg`` back for ``delay`` without spending its attempt.

        The delivery is due again ``delay`` from now with ``attempts`` as
        before the claim (so a snooze never brings it closer to
        ``max_attempts``, and one snoozed on its first attempt counts as never
        attempted) and its last error kept; counted ``requeued``. On an
        ordered channel a snoozed head stays its group's head, unless a
        delivery of the group with a lower delivery id came back while it was
        leased (a requeued dead letter): it then waits behind that one. A positive
        ``delay`` that would make it due only at or after the message's
        expiry raises :class:`~novaque.InvalidOption` and changes nothing, as for
        :meth:`requeue`. Raises :class:`~novaque.LeaseLost` if the lease is no longer
        current.
        """
        delay_s = _validate.retry_delay(delay)
        self._snooze(msg, delay_s, within_ttl=delay_s > 0)

    def _snooze(self, msg: Message, delay_s: float, *, within_ttl: bool = False) -> None:
        self._put_back(msg, delay_s, None, within_ttl=within_ttl, refund=True)

    def _put_back(
        self,
        msg: Message,
        delay_s: float,
        error: str | None,
        *,
        within_ttl: bool,
        refund: bool = False,
    ) -> None:
        """Make ``msg`` due again after ``delay_s`` (a retry, or with ``refund`` a snooze)."""
        # An ordered head given back may yield to a delivery below it: not one statement.
        op = "" if consume.ordered([msg]) else "settle"
        changed, effects = self._run_timed(
            op, consume.requeue, msg, microseconds(delay_s), error, within_ttl, refund
        )
        if not changed:
            if within_ttl:
                self._refuse_past_expiry(msg, delay_s)
            raise LeaseLost(_lost_text(msg))
        self._apply(effects)

    def _refuse_past_expiry(self, msg: Message, delay_s: float) -> None:
        """After a requeue that changed nothing: InvalidOption if the lease is
        still current (so the expiry refused the delay); else return."""
        expires, now = self._run_timed("", consume.expiry_if_leased, msg)
        if expires is not None:
            raise InvalidOption(
                f"delay is {delay_s:.15g} s but message {msg.id} expires at "
                f"{from_us(int(expires)).isoformat()}, {(int(expires) - now) / US:.15g} s from "
                "now: the retry would never run; the delay must end before the expiry"
            )

    def reject(self, msg: Message, reason: str = "") -> None:
        """Dead-letter ``msg`` at once; ``reason`` is kept (``"rejected"`` when empty).

        At most 4000 characters of it, with NUL and lone surrogates replaced
        by U+FFFD.
        """
        self._bury(msg, _validate.reason(reason), None)

    def _bury(self, msg: Message, reason: str, error: str | None) -> None:
        self._leave(msg, consume.kill, reason, error)

    def defer(self, msg: Message) -> None:
        """Set ``msg`` aside: its delivery becomes ``"deferred"``.

        A deferred delivery is never claimed, by :meth:`claim` or a consumer;
        it stays (``Backlog.deferred``, ``get_message``) until its message's
        TTL purges it, or until :meth:`claim_deferred` names its
        ``msg.delivery_id``. Its attempt stays counted; nothing else is
        counted (the delivery is still live). On an ordered channel the
        group's next delivery goes on at once. Raises :class:`~novaque.LeaseLost` if
        the lease is no longer current.
        """
        self._leave(msg, consume.defer)

    def _leave(
        self,
        msg: Message,
        fn: Callable[
            Concatenate[sa.Connection, dialects.Dialect, int, Message, P], tuple[bool, Effects]
        ],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> None:
        """Settle ``msg`` with ``fn`` (whether its lease was current, and its
        effects), which moves its group on when it is ordered."""
        op = "" if consume.ordered([msg]) else "settle"
        changed, effects = self._run_timed(op, fn, msg, *args, **kwargs)
        if not changed:
            raise LeaseLost(_lost_text(msg))
        self._apply(effects)

    def renew(self, msg: Message, *, lease: Duration | None = None) -> Any:
        """Extend ``msg``'s lease to ``lease`` from now (default: the channel's
        ``lease`` setting as the claim read it, else ``Options.default_lease``).

        Keeps the token, updates ``msg.lease_expires_at`` and returns the new
        expiry. Raises :class:`~novaque.LeaseLost` if the lease is no longer current.
        """
        if lease is None and msg.channel_lease_us is not None:
            lease_s = msg.channel_lease_us / US
        else:
            lease_s = _validate.lease(lease, self._default_lease)
        until = self._run_timed("settle", consume.renew, msg, microseconds(lease_s))
        if until is None:
            raise LeaseLost(_lost_text(msg))
        msg.lease_expires_at = from_us(until)
        return msg.lease_expires_at

    def _release(self, msgs: Sequence[Message]) -> int:
        """Release leased, unstarted deliveries at once; their attempt is not counted."""
        return self._run_timed("", consume.release, msgs)

    def release(self, msgs: Sequence[Message]) -> int:
        """Give leased deliveries back at once, without counting their attempt.

        For a consumer of its own that claimed more than it will handle (a
        prefetch buffer given back at shutdown): the deliveries are due again
        at once and their ``attempts`` are as before the claim. Messages whose
        lease is no longer current are left alone (no :class:`~novaque.LeaseLost`);
        returns how many were released. Use :meth:`requeue` for a message
        that was worked on. On an ordered channel a released head waits, as
        after :meth:`requeue`, behind a delivery of its group with a lower
        delivery id that came back while it was leased.
        """
        if not msgs:
            return 0
        return self._release(msgs)

    # -- maintenance ------------------------------------------------------------------

    def run_maintenance(self) -> None:
        """Run one pass of every maintenance job, synchronously.

        The lease reaper, TTL purge, dead-letter retention, stats flush and
        stats prune, and the cleanup of consumers that died. For tests, and
        for deployments that run maintenance from cron instead of calling
        :meth:`start`.
        """
        self._ready()
        self._resample_clock()
        self.reap_leases()
        self._purge_pass()
        self.flush_stats()
        self.prune_stats()
        self.forget_stale_consumers()

    def _add_purge_pass(self, run: Callable[[], int]) -> None:
        """Run ``run`` after the TTL purge in every maintenance pass (the
        operator's calls add dead-letter retention); it returns how many rows
        it deleted."""
        self._purge_passes.append(run)

    def _purge_pass(self) -> int:
        """The purge job of a maintenance pass, in ``run_maintenance()`` and in
        ``start()``'s loop: TTL purge, then what :meth:`_add_purge_pass` added."""
        return self.purge_expired() + sum(run() for run in self._purge_passes)

    def _resample_clock(self) -> None:
        if time.monotonic() - self._clock_sampled_at < CLOCK_SAMPLE_S:
            return
        with self._executor.connect() as conn:
            self._clock.sample(lambda: self._dialect.db_now_us(conn))
        self._clock_sampled_at = time.monotonic()

    def reap_leases(self) -> int:
        """Release deliveries whose lease expired; dead-letter those out of attempts.

        Returns how many deliveries it changed. Tokens of reaped leases stop
        working (:class:`~novaque.LeaseLost`).
        """
        changed = self._in_batches(maintain.reap_batch, self.options.maintenance_batch)
        if changed:
            self.log.debug("reaped %d expired leases", changed)
        return changed

    def purge_expired(self) -> int:
        """Delete messages past their TTL with all their deliveries (dead included).

        On a channel with ``dead_letter_expired`` (``ensure_channel`` setting,
        else ``Options.dead_letter_expired``), a delivery still live when its
        message expires (ready, pending, in flight or deferred) becomes a dead
        letter with reason ``"expired"`` instead (counted ``dead``; its lease,
        if any, is lost), and the message is kept ``Options.default_ttl``
        longer for it: the letters go by the channel's dead-letter bounds, or
        with their message at that later expiry. Works in batches of
        ``Options.maintenance_batch``; returns how many messages it deleted.
        """
        return self._in_batches(
            maintain.purge_batch,
            self.options.maintenance_batch,
            dead_letter_expired=self.options.dead_letter_expired,
            default_ttl_us=microseconds(self._default_ttl),
        )

    def flush_stats(self) -> None:
        """Write the buffered counter deltas to the database now.

        Safe to run in many processes at once: each adds its own deltas with
        an upsert. A failed flush keeps the deltas for the next one.
        """
        taken = self._stats.take()
        if not taken:
            return
        try:
            self._run_op("", maintain.flush_stats, *maintain.stats_rows(taken))
        except BaseException:
            self._stats.give_back(taken)
            raise

    def prune_stats(self) -> int:
        """Delete day buckets older than ``Options.stats_retention_days``, and
        minute buckets (:meth:`minute_counters`) older than 24 hours; return how
        many day buckets went."""
        now = self._now()
        first_kept = day_of(now) - timedelta(days=self.options.stats_retention_days - 1)
        first_minute = (now - MINUTES_KEPT_US) // MINUTE_US * MINUTE_US
        return self._run_op("", maintain.prune_stats, first_kept, first_minute)

    def forget_stale_consumers(self) -> int:
        """Drop the consumers online (:meth:`list_consumers`) not seen for three
        ``Options.consumer_heartbeat`` by the clock (their process died); return
        how many. Part of :meth:`run_maintenance`, and of the maintenance loop
        once per heartbeat."""
        before = self._now() - microseconds(3 * self._consumer_heartbeat)
        return self._run_op("", presence.forget_stale, before)

    # -- connections ------------------------------------------------------------------

    def _close(self) -> None:
        """Flush the buffered stats, then close the connections of the engines
        novaque opened itself (the end of ``shutdown()``; calls after it open
        new ones)."""
        try:
            self.flush_stats()
        except Exception as exc:
            self.log.error(
                "could not flush stats at shutdown (kept in memory): %s",
                _validate.error_text(exc),
            )
        if self._executor.engine is not self.engine:
            self._executor.engine.dispose()
        self._executor.close()
        if self._owns_engine:
            self.engine.dispose()


def _is_session(obj: object) -> bool:
    """Whether ``obj`` is a SQLAlchemy ORM session (or scoped session), without
    importing the ORM: an application that holds a session has imported it."""
    if "sqlalchemy.orm" not in sys.modules:
        return False
    from sqlalchemy.orm import Session, scoped_session

    return isinstance(obj, (Session, scoped_session))


def _check_repeated_keys(
    keys: Sequence[str | None], bodies: Sequence[bytes], groups: Sequence[str | None]
) -> None:
    """A dedup key given twice in one call must name one message: the same body
    and group (the headers are the call's), else :class:`~novaque.InvalidOption`."""
    first: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        j = first.setdefault(key, i)
        if j != i and (bodies[j] != bodies[i] or groups[j] != groups[i]):
            raise InvalidOption(
                f"dedup_keys gives {key!r} to bodies {j} and {i} with a different "
                "body or group: one key names one message (give each its own key)"
            )


def _lost_text(msg: Message) -> str:
    return (
        f"lease of delivery {msg.delivery_id} (message {msg.id} on {msg.topic}/{msg.channel}) "
        "is no longer current: it was settled, reaped after expiry or claimed again"
    )


# -- running code when the caller's transaction commits --------------------------------

_pending_lock = threading.Lock()
#: Per connection: the callbacks waiting for its commit, each with the names of
#: the savepoints open when it was registered.
_pending: weakref.WeakKeyDictionary[
    sa.Connection, list[tuple[frozenset[str], Callable[[], None]]]
] = weakref.WeakKeyDictionary()


def _after_commit(conn: sa.Connection, callback: Callable[[], None]) -> None:
    """Run ``callback`` once the transaction of ``conn`` commits; drop it on a
    rollback, and on the rollback of a savepoint that was open when it was added."""
    inside = _open_savepoints(conn)
    with _pending_lock:
        queue = _pending.get(conn)
        if queue is None:
            queue = _pending[conn] = []
            sa.event.listen(conn, "commit", _run_pending)
            sa.event.listen(conn, "rollback", _drop_pending)
            sa.event.listen(conn, "rollback_savepoint", _drop_savepoint)
        queue.append((inside, callback))


def _open_savepoints(conn: sa.Connection) -> frozenset[str]:
    names: set[str] = set()
    nested: Any = conn.get_nested_transaction()
    while nested is not None:
        names.add(nested._savepoint)
        nested = nested._previous_nested
    return frozenset(names)


def _run_pending(conn: sa.Connection) -> None:
    with _pending_lock:
        callbacks = _pending.get(conn, [])
        _pending[conn] = []
    for _, callback in callbacks:
        callback()


def take_after_commit(conn: sa.Connection) -> list[Callable[[], None]]:
    """Take the callbacks waiting for the commit of ``conn`` away from it: for a
    connection committed by someone SQLAlchemy does not see (Django's), who
    runs them at that commit instead."""
    with _pending_lock:
        waiting = _pending.pop(conn, [])
    return [callback for _, callback in waiting]


def _drop_pending(conn: sa.Connection) -> None:
    with _pending_lock:
        _pending[conn] = []


def _drop_savepoint(conn: sa.Connection, name: str, context: object) -> None:
    with _pending_lock:
        _pending[conn] = [entry for entry in _pending.get(conn, []) if name not in entry[0]]
