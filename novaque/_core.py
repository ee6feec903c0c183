"""The core of the synchronous client: publishing, topology, low-level consuming,
maintenance. :class:`novaque.Client` adds the consumer runtime and the
operator's calls on top of :class:`CoreClient`."""

from __future__ import annotations

import atexit
import dataclasses
import secrets
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import date, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

from novaque import _migrate, _validate, dialects
from novaque._executor import SyncExecutor
from novaque._stats import StatsBuffer, Tally
from novaque._time import US, Clock, day_of, from_us
from novaque.errors import (
    ChannelNotFound,
    InvalidOption,
    LeaseLost,
    TopicNotFound,
)
from novaque.models import Message
from novaque.options import Duration, Options, check_int, seconds
from novaque.schema import (
    COUNTER_COLUMNS,
    DEAD_VISIBLE_AT,
    STATE_DEAD,
    STATE_LEASED,
    STATE_READY,
    channels,
    deliveries,
    messages,
    stats,
    topics,
)

__all__ = ["CoreClient"]

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
            client.flush_stats()
        except Exception as exc:
            client.log.warning(
                "novaque could not flush its counters at exit (they are lost): %s",
                _validate.error_text(exc),
            )


T = TypeVar("T")

d = deliveries
MAX_CLAIM = 1000
#: How long a cached channel id is trusted when claims come back empty.
CHANNEL_CACHE_S = 5.0
#: How often the server clock is sampled again (at most once per maintenance pass).
CLOCK_SAMPLE_S = 60.0

_channel_ids = (
    sa.select(channels.c.id)
    .join_from(channels, topics, channels.c.topic_id == topics.c.id)
    .where(topics.c.name == sa.bindparam("p_topic"), channels.c.name == sa.bindparam("p_channel"))
)
_topic_id = sa.select(topics.c.id).where(topics.c.name == sa.bindparam("p_topic"))
_requeue = (
    sa.update(d)
    .where(d.c.id == sa.bindparam("p_id"), d.c.lease_token == sa.bindparam("p_token"))
    .values(
        state=STATE_READY,
        visible_at=sa.bindparam("p_visible"),
        lease_token=None,
        last_error=sa.bindparam("p_error"),
    )
)
# An explicit delay must leave the retry due before the message expires.
_requeue_before_expiry = _requeue.where(
    sa.select(messages.c.expires_at).where(messages.c.id == d.c.message_id).scalar_subquery()
    > sa.bindparam("p_visible")
)
_expiry_if_leased = (
    sa.select(messages.c.expires_at)
    .join_from(d, messages, messages.c.id == d.c.message_id)
    .where(d.c.id == sa.bindparam("p_id"), d.c.lease_token == sa.bindparam("p_token"))
)
_kill = (
    sa.update(d)
    .where(d.c.id == sa.bindparam("p_id"), d.c.lease_token == sa.bindparam("p_token"))
    .values(
        state=STATE_DEAD,
        visible_at=DEAD_VISIBLE_AT,
        lease_token=None,
        last_error=sa.func.coalesce(sa.bindparam("p_error", type_=sa.Text), d.c.last_error),
        dead_reason=sa.bindparam("p_reason"),
        died_at=sa.bindparam("p_now"),
    )
)
_renew = (
    sa.update(d)
    .where(
        d.c.id == sa.bindparam("p_id"),
        d.c.lease_token == sa.bindparam("p_token"),
        d.c.state == STATE_LEASED,
    )
    .values(visible_at=sa.bindparam("p_until"))
)


@dataclasses.dataclass
class _Published:
    ids: list[int]
    fanout: Counter[int]
    now: int
    stored: int  # messages written (a repeated dedup key writes none)


class CoreClient:
    """A handle on novaque's tables in the database behind ``engine``.

    Creating a client touches no database. The first call that does checks once
    that the migrations were applied (:class:`~novaque.SchemaOutOfDate`
    otherwise). A client is safe to share between threads.

    On SQLite novaque runs its own transactions on a second engine opened on
    the same file, so that it can take the write lock up front (``BEGIN
    IMMEDIATE``) without changing how the application's own engine behaves.
    """

    def __init__(self, engine: sa.Engine, options: Options | None = None) -> None:
        if not isinstance(engine, sa.Engine):
            raise TypeError(f"Client needs a SQLAlchemy Engine, got {type(engine).__name__}")
        self.options = options if options is not None else Options()
        if not isinstance(self.options, Options):
            raise TypeError(f"options must be novaque.Options, got {type(options).__name__}")
        self.engine = engine
        self.log = self.options.logger
        self._dialect = dialects.for_engine(engine)
        self._executor = SyncExecutor(dialects.own_engine(engine), self._dialect)
        self._clock = Clock(self.options.clock)
        self._stats = StatsBuffer(on_first=self._counters_added)
        self._schema_lock = threading.Lock()
        self._schema_ok = threading.Event()
        self._clock_sampled_at = 0.0
        #: Topic ids learned in novaque's own committed transactions.
        self._topic_ids: dict[str, int] = {}
        #: Engines of callers' connections whose schema was checked.
        self._checked_engines: weakref.WeakSet[sa.Engine] = weakref.WeakSet()
        self._channel_cache: dict[tuple[str, str], tuple[int, float]] = {}
        self._wake_lock = threading.Lock()
        self._wakers: dict[str, list[Callable[[], None]]] = {}
        self._default_ttl = seconds(self.options.default_ttl, "Options.default_ttl")
        self._default_lease = seconds(self.options.default_lease, "Options.default_lease")

    def __repr__(self) -> str:
        return f"<novaque.Client {self._dialect.name} {self.engine.url.render_as_string()}>"

    # -- schema ---------------------------------------------------------------------

    def migrate(self, to: str = "head") -> None:
        """Apply novaque's migrations up to ``to`` (Alembic ``upgrade``).

        Checks the database version floor first (:class:`UnsupportedDatabase`).
        Running it again is a no-op.
        """
        with self._executor.migration_transaction() as conn:
            self._dialect.check_floor(conn)
            with self._dialect.migration_lock(conn):
                _migrate.upgrade(conn, to)
        self._schema_ok.clear()
        self.log.info("novaque schema migrated to %s", to)

    def downgrade(self, to: str = "base") -> None:
        """Revert novaque's migrations down to ``to``; ``base`` drops every table."""
        with self._executor.migration_transaction() as conn, self._dialect.migration_lock(conn):
            _migrate.downgrade(conn, to)
        self._schema_ok.clear()
        self._topic_ids.clear()
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
                self._clock.sample(lambda: self._dialect.db_now_us(conn))
            self._clock_sampled_at = time.monotonic()
            self._schema_ok.set()

    def _now(self) -> int:
        return self._clock.now_us()

    def _counters_added(self) -> None:
        """Counters arrived in the empty buffer: they are flushed at exit at the latest."""
        _unflushed.add(self)

    def _run(self, fn: Callable[[sa.Connection], T], *, op: str = "") -> T:
        """Run ``fn`` in one of novaque's transactions.

        ``op`` names the hot-path operation ``fn`` performs; where the dialect
        does it in one statement, the transaction costs one round trip.
        """
        self._ready()
        return self._executor.run(fn, one_statement=op in self._dialect.one_statement_ops)

    def _run_counted(self, fn: Callable[[sa.Connection, Tally], T]) -> T:
        """Like :meth:`_run`; counters ``fn`` records count once the transaction commits."""
        tallies: list[Tally] = []

        def attempt(conn: sa.Connection) -> T:
            tallies.append(Tally())
            return fn(conn, tallies[-1])

        result = self._run(attempt)
        tallies[-1].apply(self._stats)
        return result

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
        connection: sa.Connection | None = None,
        session: Session | None = None,
    ) -> int:
        """Publish one message to ``topic``; return its id.

        One delivery is written for each channel the topic has, in the same
        transaction as the message. With ``connection`` or ``session`` the
        message joins that transaction (and commits or rolls back with it);
        otherwise novaque commits it before returning. A topic that does not
        exist is created. With ``dedup_key``, publishing again with the same
        key while the first message lives returns the first id and writes
        nothing.
        """
        return self._publish(
            topic,
            [body],
            delay=delay,
            ttl=ttl,
            max_attempts=max_attempts,
            headers=headers,
            dedup_keys=[_validate.dedup_key(dedup_key)],
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
        connection: sa.Connection | None = None,
        session: Session | None = None,
    ) -> list[int]:
        """Publish many messages to ``topic`` in one transaction with bulk inserts.

        Returns their ids in order. ``delay``, ``ttl``, ``max_attempts`` and
        ``headers`` apply to every message; ``dedup_keys``, if given, has one
        key (or None) per body.
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
        return self._publish(
            topic,
            body_list,
            delay=delay,
            ttl=ttl,
            max_attempts=max_attempts,
            headers=headers,
            dedup_keys=keys,
            connection=connection,
            session=session,
        )

    def _publish(
        self,
        topic: str,
        bodies: list[bytes | str],
        *,
        delay: Duration | None,
        ttl: Duration | None,
        max_attempts: int | None,
        headers: dict[str, str] | None,
        dedup_keys: list[str | None],
        connection: sa.Connection | None,
        session: Session | None,
    ) -> list[int]:
        _validate.name(topic, "topic")
        data = [_validate.body(b, self.options.max_body_bytes) for b in bodies]
        ttl_s = _validate.ttl(ttl, self._default_ttl)
        delay_s = _validate.delay(delay, ttl_s)
        attempts = _validate.max_attempts(max_attempts, self.options.default_max_attempts)
        header_text = _validate.headers(headers)
        if connection is not None and session is not None:
            raise InvalidOption("pass either connection or session to publish, not both")
        if not data:
            return []

        def write(conn: sa.Connection, topic_id: int) -> _Published:
            now = self._now()
            rows = [
                {
                    "body": body,
                    "headers": header_text,
                    "published_at": now,
                    "expires_at": now + int(ttl_s * US),
                    "max_attempts": attempts,
                    "dedup_key": key,
                }
                for body, key in zip(data, dedup_keys, strict=True)
            ]
            visible = now + int(delay_s * US)
            ids, fanout, stored = self._write_messages(conn, topic, topic_id, rows, visible)
            return _Published(ids, fanout, now, stored)

        if session is not None:
            connection = session.connection()
        if connection is not None:
            # The caller's transaction: the topic id is read in it (never
            # taken from the cache, which may hold an id of another database
            # or one deleted since), so it commits or rolls back with it.
            if self._is_ours(connection):
                self._ready()
                done = write(connection, self._topic_id_in(connection, topic))
                _after_commit(connection, lambda: self._published(topic, done))
            else:
                # Another database: its counters are written there, in the
                # caller's transaction (this client's buffer is for its own).
                self._ready_elsewhere(connection)
                done = write(connection, self._topic_id_in(connection, topic))
                if done.fanout:
                    self._dialect.upsert_stats(
                        connection,
                        _stats_rows(
                            {(c, day_of(done.now)): n for c, n in done.fanout.items()}, "published"
                        ),
                    )
            return done.ids
        # One statement where the dialect can: the topic id is known, no dedup
        # keys, and the bodies fit one INSERT batch.
        one = (
            topic in self._topic_ids
            and all(k is None for k in dedup_keys)
            and len(data) <= INSERT_BATCH_ROWS
            and sum(map(len, data)) <= INSERT_BATCH_BYTES
        )
        done = self._run_publish(topic, write, one)
        self._published(topic, done)
        return done.ids

    def _run_publish(
        self, topic: str, write: Callable[[sa.Connection, int], _Published], one: bool
    ) -> _Published:
        """Publish in novaque's own transaction; the topic id is cached once it committed."""
        learned: list[int] = []

        def work(conn: sa.Connection) -> _Published:
            topic_id = self._topic_ids.get(topic)
            if topic_id is None:
                topic_id = self._topic_id_in(conn, topic)
                learned.append(topic_id)
            return write(conn, topic_id)

        try:
            result = self._run(work, op="publish" if one else "")
        except sa.exc.IntegrityError:
            # A cached topic id may belong to a topic deleted elsewhere (ids are
            # never reused, so it cannot name another topic): look it up again.
            if self._topic_ids.pop(topic, None) is None:
                raise
            result = self._run(work)
        if learned:
            self._topic_ids[topic] = learned[-1]
        return result

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

    def _write_messages(
        self,
        conn: sa.Connection,
        topic: str,
        topic_id: int,
        rows: list[dict[str, Any]],
        visible: int,
    ) -> tuple[list[int], Counter[int], int]:
        """Insert messages and their deliveries: the ids in order, the deliveries per
        channel, and how many messages were stored (a repeated dedup key stores none)."""
        for row in rows:
            row["topic_id"] = topic_id
        if all(row["dedup_key"] is None for row in rows):
            fields = {k: v for k, v in rows[0].items() if k not in ("body", "dedup_key")}
            new_ids: list[int] = []
            counts: Counter[int] = Counter()
            for chunk in _chunks(list(range(len(rows))), rows):
                chunk_ids, chunk_counts = self._dialect.publish_plain(
                    conn, topic, fields, [rows[i]["body"] for i in chunk], visible
                )
                new_ids += chunk_ids
                counts.update(chunk_counts)
            return new_ids, counts, len(new_ids)
        ids: list[int | None] = [None] * len(rows)
        fresh: list[int] = []  # ids of the messages really inserted
        plain = [i for i, row in enumerate(rows) if row["dedup_key"] is None]
        for chunk in _chunks(plain, rows):
            for i, message_id in zip(
                chunk,
                self._dialect.insert_messages(conn, [rows[i] for i in chunk]),
                strict=True,
            ):
                ids[i] = message_id
                fresh.append(message_id)
        for i, row in enumerate(rows):
            if row["dedup_key"] is not None:
                ids[i], inserted = self._insert_deduplicated(conn, row)
                if inserted:
                    fresh.append(ids[i])  # type: ignore[arg-type]
        fanout: Counter[int] = Counter()
        if fresh:
            fanout.update(
                self._dialect.fan_out(
                    conn, topic, topic_id, fresh, visible, rows[0]["max_attempts"]
                )
            )
        return [int(i) for i in ids if i is not None], fanout, len(fresh)

    def _insert_deduplicated(self, conn: sa.Connection, row: dict[str, Any]) -> tuple[int, bool]:
        # A locking read sees the latest committed row even when the caller's
        # transaction is REPEATABLE READ (MySQL's default), whose snapshot may
        # predate the winner's commit.
        lookup = (
            sa.select(messages.c.id)
            .where(messages.c.topic_id == row["topic_id"], messages.c.dedup_key == row["dedup_key"])
            .with_for_update(read=True)
        )
        for _ in range(5):
            inserted = self._dialect.insert_deduplicated(conn, row)
            if inserted is not None:
                return inserted, True
            existing = conn.execute(lookup).scalar_one_or_none()
            if existing is not None:
                return int(existing), False
            # The holder of the key was purged in between: try the insert again.
        raise RuntimeError(f"could not settle dedup_key {row['dedup_key']!r}")  # pragma: no cover

    def _published(self, topic: str, done: _Published) -> None:
        """After a publish commits: count deliveries and wake local consumers."""
        if done.fanout:
            self._stats.add("published", day_of(done.now), done.fanout)
            self._wake(topic)
        elif done.stored and topic not in _warned_no_channel:
            _warned_no_channel.add(topic)
            self.log.warning(
                "topic %s has no channel: its messages are kept (browsable, replayable) "
                "but delivered to nobody; declare channels with ensure_channel() at deploy",
                topic,
            )

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

    # -- topology ---------------------------------------------------------------------

    def _topic_id_in(self, conn: sa.Connection, topic: str) -> int:
        """The id of ``topic`` as ``conn``'s transaction sees the latest commit,
        creating the topic if it does not exist."""
        lookup = self._dialect.read_latest(_topic_id)
        found = conn.execute(lookup, {"p_topic": topic}).scalar_one_or_none()
        if found is None:
            self._dialect.insert_ignore(conn, topics, {"name": topic, "created_at": self._now()})
            found = conn.execute(lookup, {"p_topic": topic}).scalar_one()
        return int(found)

    def _existing_topic_id(self, conn: sa.Connection, topic: str) -> int:
        found = conn.execute(_topic_id, {"p_topic": topic}).scalar_one_or_none()
        if found is None:
            raise TopicNotFound(f"topic {topic!r} does not exist")
        return int(found)

    def _existing_channel_id(self, conn: sa.Connection, topic: str, channel: str) -> int:
        found = conn.execute(
            _channel_ids, {"p_topic": topic, "p_channel": channel}
        ).scalar_one_or_none()
        if found is None:
            self._existing_topic_id(conn, topic)
            raise ChannelNotFound(f"channel {channel!r} of topic {topic!r} does not exist")
        return int(found)

    def _channel_id(self, topic: str, channel: str) -> int:
        """A channel's id for the hot path, cached (see :data:`CHANNEL_CACHE_S`)."""
        cached = self._channel_cache.get((topic, channel))
        if cached is not None:
            return cached[0]
        self._ready()
        with self._executor.connect() as conn:
            channel_id = self._existing_channel_id(conn, topic, channel)
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
        self._run(lambda conn: self._topic_id_in(conn, topic))

    def ensure_channel(
        self,
        topic: str,
        channel: str,
        *,
        dead_max_age: Duration | None = None,
        dead_max_count: int | None = None,
    ) -> None:
        """Create ``channel`` on ``topic`` (and the topic) if missing.

        A new channel receives messages published from now on. ``dead_max_age``
        and ``dead_max_count`` bound its dead letters (default: the client's
        ``Options``); given for an existing channel, they replace its bounds.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        age_us = None
        if dead_max_age is not None:
            age_us = _validate.dead_max_age_us(dead_max_age)
        if dead_max_count is not None:
            _validate.dead_max_count(dead_max_count)

        def write(conn: sa.Connection) -> None:
            topic_id = self._topic_id_in(conn, topic)
            self._dialect.insert_ignore(
                conn,
                channels,
                {
                    "topic_id": topic_id,
                    "name": channel,
                    "created_at": self._now(),
                    "dead_max_age": age_us,
                    "dead_max_count": dead_max_count,
                },
            )
            bounds = {
                k: v
                for k, v in (("dead_max_age", age_us), ("dead_max_count", dead_max_count))
                if v is not None
            }
            if bounds:
                conn.execute(
                    sa.update(channels)
                    .where(channels.c.topic_id == topic_id, channels.c.name == channel)
                    .values(bounds)
                )

        self._run(write)

    def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` with its channels, messages, deliveries and counters."""
        _validate.name(topic, "topic")

        def write(conn: sa.Connection) -> None:
            topic_id = self._existing_topic_id(conn, topic)
            channel_ids = sa.select(channels.c.id).where(channels.c.topic_id == topic_id)
            conn.execute(sa.delete(stats).where(stats.c.channel_id.in_(channel_ids)))
            conn.execute(sa.delete(d).where(d.c.channel_id.in_(channel_ids)))
            conn.execute(sa.delete(messages).where(messages.c.topic_id == topic_id))
            conn.execute(sa.delete(channels).where(channels.c.topic_id == topic_id))
            conn.execute(sa.delete(topics).where(topics.c.id == topic_id))

        self._run(write)
        self._forget(topic)
        self.log.info("deleted topic %s", topic)

    def delete_channel(self, topic: str, channel: str) -> None:
        """Delete a channel with its deliveries and counters; messages stay."""
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")

        def write(conn: sa.Connection) -> None:
            channel_id = self._existing_channel_id(conn, topic, channel)
            conn.execute(sa.delete(stats).where(stats.c.channel_id == channel_id))
            conn.execute(sa.delete(d).where(d.c.channel_id == channel_id))
            conn.execute(sa.delete(channels).where(channels.c.id == channel_id))

        self._run(write)
        self._forget(topic, channel)
        self.log.info("deleted channel %s/%s", topic, channel)

    def _forget(self, topic: str, channel: str | None = None) -> None:
        if channel is None:
            self._topic_ids.pop(topic, None)
        for key in [k for k in self._channel_cache if k[0] == topic and channel in (None, k[1])]:
            self._channel_cache.pop(key, None)

    def list_topics(self) -> list[str]:
        """Every topic's name, sorted."""
        rows = self._run(
            lambda conn: conn.execute(sa.select(topics.c.name).order_by(topics.c.name)).all()
        )
        return [r[0] for r in rows]

    def list_channels(self, topic: str) -> list[str]:
        """The channel names of ``topic``, sorted; :class:`TopicNotFound` if missing."""
        _validate.name(topic, "topic")

        def read(conn: sa.Connection) -> list[str]:
            topic_id = self._existing_topic_id(conn, topic)
            return [
                r[0]
                for r in conn.execute(
                    sa.select(channels.c.name)
                    .where(channels.c.topic_id == topic_id)
                    .order_by(channels.c.name)
                )
            ]

        return self._run(read)

    # -- low-level consuming ------------------------------------------------------------

    def claim(
        self,
        topic: str,
        channel: str,
        *,
        max_messages: int = 1,
        lease: Duration | None = None,
    ) -> list[Message]:
        """Lease up to ``max_messages`` due deliveries of a channel, oldest first.

        Returns ``[]`` when nothing is due. Each delivery's attempt counter goes
        up by one. Settle each message with :meth:`ack`, :meth:`requeue` or
        :meth:`reject` before ``lease`` runs out (or :meth:`renew` it); an
        expired lease makes the delivery claimable again.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        check_int(max_messages, "max_messages", 1, MAX_CLAIM)
        lease_s = _validate.lease(lease, self._default_lease)
        channel_id = self._channel_id(topic, channel)
        return self._claim(topic, channel, channel_id, max_messages, lease_s)

    def _claim(
        self, topic: str, channel: str, channel_id: int, limit: int, lease_s: float
    ) -> list[Message]:
        token = secrets.token_hex(16)
        holder: dict[str, int] = {}

        def write(conn: sa.Connection) -> list[dialects.ClaimedRow]:
            now = self._now()
            holder["now"], holder["until"] = now, now + int(lease_s * US)
            return self._dialect.claim(conn, channel_id, limit, now, holder["until"], token)

        rows = self._run(write, op="claim")
        if not rows:
            self._channel_maybe_gone(topic, channel)
            return []
        self._stats.add("claimed", day_of(holder["now"]), {channel_id: len(rows)})
        return self._messages(rows, topic, channel, channel_id, token, holder["until"])

    def _ack_and_claim(
        self,
        acks: Sequence[Message],
        topic: str,
        channel: str,
        channel_id: int,
        limit: int,
        lease_s: float,
    ) -> tuple[list[Message], list[Message]]:
        """Ack ``acks`` and lease up to ``limit`` more deliveries in one transaction.

        What a consumer does between two batches: one commit (one round trip
        on PostgreSQL) instead of two. Returns the acks whose lease was lost
        (as :meth:`ack_many`) and the messages claimed (as :meth:`claim`).
        """
        if not acks:
            return [], self._claim(topic, channel, channel_id, limit, lease_s) if limit else []
        if limit <= 0:
            return self.ack_many(acks), []
        token = secrets.token_hex(16)
        pairs = [(msg.delivery_id, msg.lease_token) for msg in acks]
        holder: dict[str, int] = {}

        def write(
            conn: sa.Connection,
        ) -> tuple[set[tuple[int, str]], list[dialects.ClaimedRow]]:
            now = self._now()
            holder["now"], holder["until"] = now, now + int(lease_s * US)
            return self._dialect.ack_and_claim(
                conn, pairs, channel_id, limit, now, holder["until"], token
            )

        done, rows = self._run(write, op="ack_claim")
        day = day_of(holder["now"])
        acked = [msg for msg in acks if (msg.delivery_id, msg.lease_token) in done]
        self._stats.add("acked", day, Counter(msg.channel_id for msg in acked))
        lost = [msg for msg in acks if (msg.delivery_id, msg.lease_token) not in done]
        if not rows:
            self._channel_maybe_gone(topic, channel)
            return lost, []
        self._stats.add("claimed", day, {channel_id: len(rows)})
        return lost, self._messages(rows, topic, channel, channel_id, token, holder["until"])

    def _messages(
        self,
        rows: list[dialects.ClaimedRow],
        topic: str,
        channel: str,
        channel_id: int,
        token: str,
        until: int,
    ) -> list[Message]:
        expires = from_us(until)
        return [
            Message(
                id=row.message_id,
                topic=topic,
                channel=channel,
                body=row.body,
                headers=_validate.decode_headers(row.headers),
                attempts=row.attempts,
                max_attempts=row.max_attempts,
                published_at=from_us(row.published_at),
                delivery_id=row.delivery_id,
                lease_token=token,
                lease_expires_at=expires,
                channel_id=channel_id,
            )
            for row in rows
        ]

    def ack(self, msg: Message) -> None:
        """Settle ``msg`` as done: its delivery is deleted (the message stays until TTL).

        Raises :class:`LeaseLost` if the lease is no longer current.
        """
        if self.ack_many([msg]):
            raise LeaseLost(_lost_text(msg))

    def ack_many(self, msgs: Sequence[Message]) -> list[Message]:
        """Ack many messages in one transaction; return those whose lease was lost."""
        if not msgs:
            return []
        pairs = [(msg.delivery_id, msg.lease_token) for msg in msgs]

        def write(conn: sa.Connection) -> tuple[set[tuple[int, str]], int]:
            return self._dialect.delete_leased_pairs(conn, pairs), self._now()

        done, now = self._run(write, op="ack")
        acked = [msg for msg in msgs if (msg.delivery_id, msg.lease_token) in done]
        self._stats.add("acked", day_of(now), Counter(msg.channel_id for msg in acked))
        return [msg for msg in msgs if (msg.delivery_id, msg.lease_token) not in done]

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
        once (reason ``max_attempts``). Raises :class:`LeaseLost` if the lease
        is no longer current.

        A positive ``delay`` that would make the retry due only at or after
        the message's expiry (its TTL) raises :class:`InvalidOption` and
        changes nothing: the message would be purged before the retry. A delay
        from the backoff policy (``delay=None``, as the consumer retries) is
        not refused: if it reaches past the expiry, the delivery is purged at
        TTL like any other still waiting then.
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

        def write(conn: sa.Connection) -> tuple[int, int]:
            now = self._now()
            result = conn.execute(
                _requeue_before_expiry if within_ttl else _requeue,
                {
                    "p_id": msg.delivery_id,
                    "p_token": msg.lease_token,
                    "p_visible": now + int(delay_s * US),
                    "p_error": error,
                },
            )
            return result.rowcount, now

        changed, now = self._run(write, op="settle")
        if not changed:
            if within_ttl:
                self._refuse_past_expiry(msg, delay_s)
            raise LeaseLost(_lost_text(msg))
        self._stats.add("requeued", day_of(now), {msg.channel_id: 1})

    def _refuse_past_expiry(self, msg: Message, delay_s: float) -> None:
        """After a requeue that changed nothing: InvalidOption if the lease is
        still current (so the expiry refused the delay); else return."""

        def read(conn: sa.Connection) -> tuple[int | None, int]:
            params = {"p_id": msg.delivery_id, "p_token": msg.lease_token}
            return conn.execute(_expiry_if_leased, params).scalar_one_or_none(), self._now()

        expires, now = self._run(read)
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
        def write(conn: sa.Connection) -> tuple[int, int]:
            now = self._now()
            result = conn.execute(
                _kill,
                {
                    "p_id": msg.delivery_id,
                    "p_token": msg.lease_token,
                    "p_error": error,
                    "p_reason": reason,
                    "p_now": now,
                },
            )
            return result.rowcount, now

        changed, now = self._run(write, op="settle")
        if not changed:
            raise LeaseLost(_lost_text(msg))
        self._stats.add("dead", day_of(now), {msg.channel_id: 1})

    def renew(self, msg: Message, *, lease: Duration | None = None) -> Any:
        """Extend ``msg``'s lease to ``lease`` from now (default ``Options.default_lease``).

        Keeps the token, updates ``msg.lease_expires_at`` and returns the new
        expiry. Raises :class:`LeaseLost` if the lease is no longer current.
        """
        lease_s = _validate.lease(lease, self._default_lease)

        def write(conn: sa.Connection) -> tuple[int, int]:
            until = self._now() + int(lease_s * US)
            result = conn.execute(
                _renew,
                {
                    "p_id": msg.delivery_id,
                    "p_token": msg.lease_token,
                    "p_until": until,
                },
            )
            return result.rowcount, until

        changed, until = self._run(write, op="settle")
        if not changed:
            raise LeaseLost(_lost_text(msg))
        msg.lease_expires_at = from_us(until)
        return msg.lease_expires_at

    # -- maintenance ------------------------------------------------------------------

    def run_maintenance(self) -> None:
        """Run one pass of every maintenance job, synchronously.

        The lease reaper, TTL purge, dead-letter retention, stats flush and
        stats prune. For tests, and for deployments that run maintenance from
        cron instead of calling :meth:`start`.
        """
        self._ready()
        self._resample_clock()
        self.reap_leases()
        self._purge_pass()
        self.flush_stats()
        self.prune_stats()

    def _purge_pass(self) -> int:
        """The purge job of a maintenance pass: TTL purge (and, with the
        operating calls, dead-letter retention)."""
        return self.purge_expired()

    def _resample_clock(self) -> None:
        if time.monotonic() - self._clock_sampled_at < CLOCK_SAMPLE_S:
            return
        with self._executor.connect() as conn:
            self._clock.sample(lambda: self._dialect.db_now_us(conn))
        self._clock_sampled_at = time.monotonic()

    def reap_leases(self) -> int:
        """Release deliveries whose lease expired; dead-letter those out of attempts.

        Returns how many deliveries it changed. Tokens of reaped leases stop
        working (:class:`LeaseLost`).
        """
        batch = self.options.maintenance_batch
        total = 0
        while True:
            changed = self._run_counted(lambda conn, tally: self._reap_batch(conn, tally, batch))
            total += changed
            if changed < batch:
                return total

    def _reap_batch(self, conn: sa.Connection, tally: Tally, batch: int) -> int:
        now = self._now()
        expired = conn.execute(
            sa.select(d.c.id, d.c.channel_id, d.c.attempts >= d.c.max_attempts)
            .join_from(
                channels,
                d,
                sa.and_(
                    d.c.channel_id == channels.c.id,
                    d.c.state == STATE_LEASED,
                    d.c.visible_at <= now,
                ),
            )
            .order_by(d.c.id)
            .limit(batch)
        ).all()
        groups: dict[tuple[int, bool], list[int]] = {}
        for delivery_id, channel_id, spent in expired:
            groups.setdefault((int(channel_id), bool(spent)), []).append(int(delivery_id))
        leased_expired = sa.and_(d.c.state == STATE_LEASED, d.c.visible_at <= now)
        dead: Counter[int] = Counter()
        changed = 0
        for (channel_id, spent), ids in sorted(groups.items()):
            if spent:
                values: dict[str, Any] = {
                    "state": STATE_DEAD,
                    "visible_at": DEAD_VISIBLE_AT,
                    "lease_token": None,
                    "dead_reason": "max_attempts",
                    "died_at": now,
                    "last_error": sa.func.coalesce(d.c.last_error, "lease expired"),
                }
            else:
                values = {"state": STATE_READY, "visible_at": now, "lease_token": None}
            count = conn.execute(
                sa.update(d).where(d.c.id.in_(ids), leased_expired).values(values)
            ).rowcount
            changed += count
            if spent:
                dead[channel_id] += count
        tally.add("dead", day_of(now), dead)
        if changed:
            self.log.debug("reaped %d expired leases", changed)
        return len(expired)

    def purge_expired(self) -> int:
        """Delete messages past their TTL with all their deliveries (dead included).

        Works in batches of ``Options.maintenance_batch``; returns how many
        messages it deleted.
        """
        batch = self.options.maintenance_batch
        total = 0
        while True:
            deleted = self._run_counted(lambda conn, tally: self._purge_batch(conn, tally, batch))
            total += deleted
            if deleted < batch:
                return total

    def _purge_batch(self, conn: sa.Connection, tally: Tally, batch: int) -> int:
        now = self._now()
        # Locked (skipping messages another purge or a replay holds), and the
        # expiry checked on the latest committed row: a replay that has just
        # extended a message's life keeps it, and its new delivery with it.
        ids = [
            int(r[0])
            for r in conn.execute(
                sa.select(messages.c.id)
                .where(messages.c.expires_at <= now)
                .order_by(messages.c.expires_at, messages.c.id)
                .limit(batch)
                .with_for_update(skip_locked=True)
            )
        ]
        if not ids:
            return 0
        purged = self._dialect.delete_deliveries(conn, d.c.message_id.in_(ids))
        self._count_purged(purged, now, tally)
        conn.execute(sa.delete(messages).where(messages.c.id.in_(ids)))
        return len(ids)

    def _count_purged(self, channel_ids: list[int], now: int, tally: Tally | None = None) -> None:
        """Count deleted deliveries as purged: in ``tally`` (at commit), else at once."""
        if channel_ids:
            (tally or self._stats).add("purged", day_of(now), Counter(channel_ids))

    def flush_stats(self) -> None:
        """Write the buffered counter deltas to the database now.

        Safe to run in many processes at once: each adds its own deltas with
        an upsert. A failed flush keeps the deltas for the next one.
        """
        taken = self._stats.take()
        if not taken:
            return
        rows = _stats_rows(taken)

        def write(conn: sa.Connection) -> None:
            alive = {
                int(r[0])
                for r in conn.execute(
                    sa.select(channels.c.id).where(
                        channels.c.id.in_({row["channel_id"] for row in rows})
                    )
                )
            }
            # Counters of channels deleted since are dropped with them.
            kept = [row for row in rows if row["channel_id"] in alive]
            if kept:
                self._dialect.upsert_stats(conn, kept)

        try:
            self._run(write)
        except BaseException:
            self._stats.give_back(taken)
            raise

    def prune_stats(self) -> int:
        """Delete day buckets older than ``Options.stats_retention_days``; return how many."""
        today = day_of(self._now())
        first_kept = today - timedelta(days=self.options.stats_retention_days - 1)
        result: int = self._run(
            lambda conn: conn.execute(sa.delete(stats).where(stats.c.day < first_kept)).rowcount
        )
        return result


#: Largest batch of bodies sent in one INSERT. PyMySQL sends bodies escaped
#: into the statement text (up to twice their size), and MariaDB's default
#: ``max_allowed_packet`` is 16 MiB: 4 MiB batches fit with room to spare.
INSERT_BATCH_BYTES = 4 * 1024 * 1024
INSERT_BATCH_ROWS = 1000


def _chunks(indexes: list[int], rows: list[dict[str, Any]]) -> Iterator[list[int]]:
    """Split row indexes into batches bounded in rows and in body bytes."""
    chunk: list[int] = []
    size = 0
    for i in indexes:
        length = len(rows[i]["body"])
        if chunk and (size + length > INSERT_BATCH_BYTES or len(chunk) >= INSERT_BATCH_ROWS):
            yield chunk
            chunk, size = [], 0
        chunk.append(i)
        size += length
    if chunk:
        yield chunk


def _stats_rows(
    deltas: dict[tuple[int, date], Any], only: str | None = None
) -> list[dict[str, Any]]:
    """Rows for :meth:`Dialect.upsert_stats`: ``deltas`` maps (channel, day) to the
    counter values in :data:`COUNTER_COLUMNS` order, or, with ``only``, to the
    count of that one counter."""
    rows = []
    for (channel_id, day), values in sorted(deltas.items()):
        counts = (
            dict(zip(COUNTER_COLUMNS, values, strict=True))
            if only is None
            else {c: values if c == only else 0 for c in COUNTER_COLUMNS}
        )
        rows.append({"channel_id": channel_id, "day": day, **counts})
    return rows


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


def _drop_pending(conn: sa.Connection) -> None:
    with _pending_lock:
        _pending[conn] = []


def _drop_savepoint(conn: sa.Connection, name: str, context: object) -> None:
    with _pending_lock:
        _pending[conn] = [entry for entry in _pending.get(conn, []) if name not in entry[0]]
