"""The operator's calls: counters and backlog, dead letters, browsing, replay, prune.

:class:`OperatingClient` adds them to :class:`~novaque._core.CoreClient`, and
:class:`novaque.Client` inherits them. Reads never create a topic or a channel:
a missing topic raises :class:`~novaque.TopicNotFound`, a missing channel of an
existing topic :class:`~novaque.ChannelNotFound`.

Every statement here is portable SQLAlchemy Core, built once at import from
bound parameters. What differs per database (deleting with or without
RETURNING, EXPLAIN) goes through :mod:`novaque.dialects`.

Counters changed by these calls (``requeued``, ``published``, ``purged``) are
recorded with the transaction and buffered only once it commits, like every
other counter; reads of counters see what was flushed (:meth:`flush_stats`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa

from novaque import _validate
from novaque._core import CoreClient
from novaque._stats import Tally
from novaque._time import US, day_of, from_us, to_us
from novaque.errors import ChannelNotFound, MessageNotFound
from novaque.models import (
    Backlog,
    Counters,
    DeadLetter,
    DeliveryInfo,
    DeliveryState,
    MessageInfo,
)
from novaque.options import seconds
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

__all__ = ["BACKLOG", "DEAD_PAGE", "OperatingClient"]

d = deliveries
m = messages

#: Messages handled per statement by replay (keeps statements and IN lists small).
REPLAY_CHUNK = 500


def _p(name: str, type_: Any = sa.BigInteger) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=type_)


def _ids(name: str = "p_ids") -> sa.BindParameter[Any]:
    return sa.bindparam(name, expanding=True)


# -- counters -------------------------------------------------------------------------

_sums = [sa.func.coalesce(sa.func.sum(stats.c[col]), 0) for col in COUNTER_COLUMNS]
_channels_of = sa.select(channels.c.id).where(channels.c.topic_id == _p("p_topic_id", sa.Integer))

# -- backlog: four index-only range counts on ix_novaque_deliveries_state per channel ----
#
# Counting each state's range separately (rather than one GROUP BY with a CASE)
# keeps every planner on the index, even for a channel that holds most of the
# table, and is ~2.5x faster on PostgreSQL with a million rows.


def _count(*where: sa.ColumnElement[bool]) -> sa.ScalarSelect[Any]:
    return (
        sa.select(sa.func.count())
        .select_from(d)
        .where(d.c.channel_id == channels.c.id, *where)
        .correlate(channels)
        .scalar_subquery()
    )


_now = _p("p_now")
_backlog_columns = (
    channels.c.id,
    channels.c.name,
    _count(d.c.state == STATE_READY, d.c.visible_at > _now),  # pending
    _count(d.c.state == STATE_READY, d.c.visible_at <= _now),  # ready
    _count(d.c.state == STATE_LEASED),  # in flight
    _count(d.c.state == STATE_DEAD),  # dead
)

#: Live deliveries of one channel by state (``p_channel``, ``p_now``).
BACKLOG = sa.select(*_backlog_columns).where(channels.c.id == _p("p_channel", sa.Integer))
_TOPIC_BACKLOG = (
    sa.select(*_backlog_columns)
    .where(channels.c.topic_id == _p("p_topic_id", sa.Integer))
    .order_by(channels.c.name)
)

# -- dead letters: the tail of ix_novaque_deliveries_claim, in delivery-id order -------

# Dead rows, and only they, have visible_at = DEAD_VISIBLE_AT: an exact range of
# ix_novaque_deliveries_claim in id order. (Adding "state = dead" would tempt
# planners into ix_novaque_deliveries_state and a sort.) Updates and deletes of
# the rows found still check the state.
_dead_of_channel = sa.and_(
    d.c.channel_id == _p("p_channel", sa.Integer),
    d.c.visible_at == DEAD_VISIBLE_AT,
)


def _dead_page(with_body: bool) -> sa.Select[Any]:
    fields: list[Any] = [
        d.c.id,
        d.c.message_id,
        d.c.attempts,
        d.c.dead_reason,
        d.c.last_error,
        d.c.died_at,
        m.c.published_at,
        sa.func.length(m.c.body),
    ]
    if with_body:
        fields.append(m.c.body)
    return (
        sa.select(*fields)
        .join_from(d, m, m.c.id == d.c.message_id)
        .where(_dead_of_channel, d.c.id > _p("p_after"))
        .order_by(d.c.id)
        .limit(_p("p_limit", sa.Integer))
    )


#: One page of a channel's dead letters (``p_channel``, ``p_after``, ``p_limit``).
DEAD_PAGE = _dead_page(False)
_DEAD_PAGE_BODIES = _dead_page(True)

_dead_batch_after = (
    sa.select(d.c.id, d.c.message_id)
    .where(_dead_of_channel, d.c.id > _p("p_after"))
    .order_by(d.c.id)
    .limit(_p("p_limit", sa.Integer))
    .with_for_update()
)
_dead_batch_in = (
    sa.select(d.c.id, d.c.message_id)
    .where(_dead_of_channel, d.c.id.in_(_ids()))
    .order_by(d.c.id)
    .with_for_update()
)
_revive = (
    sa.update(d)
    .where(d.c.id.in_(_ids()), d.c.state == STATE_DEAD)
    .values(
        state=STATE_READY,
        visible_at=_p("p_now"),
        attempts=0,
        lease_token=None,
        dead_reason=None,
        died_at=None,
    )
)
_extend_expiry = (
    sa.update(m)
    .where(m.c.id.in_(_ids()), m.c.expires_at < _p("p_expires"))
    .values(expires_at=_p("p_expires"))
)
_dead_count = sa.select(sa.func.count()).where(
    d.c.channel_id == _p("p_channel", sa.Integer), d.c.state == STATE_DEAD
)
_dead_older_than = (
    sa.select(d.c.id)
    .where(_dead_of_channel, d.c.died_at < _p("p_cutoff"))
    .order_by(d.c.died_at, d.c.id)
    .limit(_p("p_limit", sa.Integer))
)
_dead_boundary = (
    sa.select(d.c.died_at, d.c.id)
    .where(_dead_of_channel)
    .order_by(d.c.died_at.desc(), d.c.id.desc())
    .limit(1)
    .offset(_p("p_offset", sa.Integer))
)
_dead_beyond = (
    sa.select(d.c.id)
    .where(
        _dead_of_channel,
        sa.or_(
            d.c.died_at < _p("p_died"),
            sa.and_(d.c.died_at == _p("p_died"), d.c.id < _p("p_id")),
        ),
    )
    .order_by(d.c.died_at, d.c.id)
    .limit(_p("p_limit", sa.Integer))
)

# -- messages ---------------------------------------------------------------------------

_message = (
    sa.select(m.c.id, topics.c.name, m.c.body, m.c.headers, m.c.published_at, m.c.expires_at)
    .join_from(m, topics, topics.c.id == m.c.topic_id)
    .where(m.c.id == _p("p_id"))
)
_deliveries_of = (
    sa.select(
        d.c.message_id, channels.c.name, d.c.state, d.c.attempts, d.c.last_error, d.c.visible_at
    )
    .join_from(d, channels, channels.c.id == d.c.channel_id)
    .where(d.c.message_id.in_(_ids()))
    .order_by(d.c.message_id, channels.c.name)
)
# Locks the message only: replays of one message take turns (no duplicate
# deliveries) and TTL purge or prune cannot delete it meanwhile.
_lock_message = (
    sa.select(m.c.topic_id, m.c.max_attempts).where(m.c.id == _p("p_id")).with_for_update()
)
_topic_name = sa.select(topics.c.name).where(topics.c.id == _p("p_topic_id", sa.Integer))
_live_pairs = sa.select(d.c.message_id, d.c.channel_id).where(d.c.message_id.in_(_ids()))
_range_chunk = (
    sa.select(m.c.id, m.c.max_attempts, m.c.published_at)
    .where(
        m.c.topic_id == _p("p_topic_id", sa.Integer),
        m.c.published_at >= _p("p_since"),
        m.c.published_at < _p("p_until"),
        sa.or_(
            m.c.published_at > _p("p_pub"),
            sa.and_(m.c.published_at == _p("p_pub"), m.c.id > _p("p_id")),
        ),
    )
    .order_by(m.c.published_at, m.c.id)
    .limit(_p("p_limit", sa.Integer))
    .with_for_update()
)
_prune_count = sa.select(sa.func.count()).where(
    m.c.topic_id == _p("p_topic_id", sa.Integer), m.c.published_at < _p("p_before")
)
_prune_batch = (
    sa.select(m.c.id)
    .where(m.c.topic_id == _p("p_topic_id", sa.Integer), m.c.published_at < _p("p_before"))
    .order_by(m.c.published_at, m.c.id)
    .limit(_p("p_limit", sa.Integer))
)


def _counters(row: Any) -> Counters:
    return Counters(*(int(v or 0) for v in row))


def _state(state: int, visible_at: int, now: int) -> DeliveryState:
    if state == STATE_DEAD:
        return "dead"
    if state == STATE_LEASED:
        return "in_flight"
    return "pending" if visible_at > now else "ready"


class OperatingClient(CoreClient):
    """Stats, backlog, dead letters, browsing, replay and prune (see the guide, "Operating")."""

    # -- counters -------------------------------------------------------------------------

    def channel_counters(
        self,
        topic: str,
        channel: str,
        *,
        since: date | None = None,
        until: date | None = None,
    ) -> Counters:
        """A channel's counters summed over the UTC days ``since``..``until`` (inclusive).

        Counters are buffered in each process and flushed every
        ``Options.stats_flush_interval``; this reads what was flushed. Call
        :meth:`flush_stats` first for this process's latest counts.
        """
        first, last = _validate.day_range(since, until)
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")

        def read(conn: sa.Connection) -> Counters:
            channel_id = self._existing_channel_id(conn, topic, channel)
            stmt = _window(sa.select(*_sums).where(stats.c.channel_id == channel_id), first, last)
            return _counters(conn.execute(stmt).one())

        return self._run(read)

    def topic_counters(
        self,
        topic: str,
        *,
        since: date | None = None,
        until: date | None = None,
    ) -> Counters:
        """The counters of every channel of ``topic`` added up (see :meth:`channel_counters`)."""
        first, last = _validate.day_range(since, until)
        _validate.name(topic, "topic")

        def read(conn: sa.Connection) -> Counters:
            topic_id = self._existing_topic_id(conn, topic)
            stmt = _window(
                sa.select(*_sums).where(stats.c.channel_id.in_(_channels_of)), first, last
            )
            return _counters(conn.execute(stmt, {"p_topic_id": topic_id}).one())

        return self._run(read)

    def daily_counters(
        self,
        topic: str,
        channel: str,
        *,
        since: date | None = None,
        until: date | None = None,
    ) -> list[tuple[date, Counters]]:
        """One ``(day, Counters)`` per UTC day with activity, oldest first (for charts).

        Reads flushed counters, like :meth:`channel_counters`.
        """
        first, last = _validate.day_range(since, until)
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")

        def read(conn: sa.Connection) -> list[tuple[date, Counters]]:
            channel_id = self._existing_channel_id(conn, topic, channel)
            stmt = _window(
                sa.select(stats.c.day, *(stats.c[col] for col in COUNTER_COLUMNS))
                .where(stats.c.channel_id == channel_id)
                .order_by(stats.c.day),
                first,
                last,
            )
            days = [(row[0], _counters(row[1:])) for row in conn.execute(stmt)]
            return [(day, counters) for day, counters in days if counters != Counters()]

        return self._run(read)

    # -- backlog ------------------------------------------------------------------------------

    def channel_backlog(self, topic: str, channel: str) -> Backlog:
        """The channel's live deliveries by state, counted now from the rows.

        Four index-only range counts on ``ix_novaque_deliveries_state``
        (channel, state, visible_at) in one statement, after the channel
        lookup: exact, with a cost that grows with the channel's live
        deliveries (about 80 ms per million on PostgreSQL) and not with other
        channels' rows.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")

        def read(conn: sa.Connection) -> Backlog:
            channel_id = self._existing_channel_id(conn, topic, channel)
            row = conn.execute(BACKLOG, {"p_channel": channel_id, "p_now": self._now()}).one()
            return Backlog(*(int(n) for n in row[2:]))

        return self._run(read)

    def topic_backlog(self, topic: str) -> dict[str, Backlog]:
        """The backlog of each channel of ``topic``, by channel name (sorted).

        Every channel is listed, idle ones with a zero :class:`Backlog`; add
        them up with ``+`` for the topic's total. One statement for all
        channels (the same index-only counts per channel).
        """
        _validate.name(topic, "topic")

        def read(conn: sa.Connection) -> dict[str, Backlog]:
            topic_id = self._existing_topic_id(conn, topic)
            rows = conn.execute(_TOPIC_BACKLOG, {"p_topic_id": topic_id, "p_now": self._now()})
            return {row[1]: Backlog(*(int(n) for n in row[2:])) for row in rows}

        return self._run(read)

    # -- dead letters ------------------------------------------------------------------------

    def list_dead(
        self,
        topic: str,
        channel: str,
        *,
        limit: int = 100,
        after_id: int | None = None,
        with_body: bool = False,
    ) -> list[DeadLetter]:
        """A page of the channel's dead letters in delivery-id order.

        For the next page pass the last ``delivery_id`` as ``after_id``
        (keyset pagination: stable while letters come and go). ``body`` is
        filled only ``with_body``; ``body_len`` always is.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        page = _validate.page_limit(limit)
        after = _validate.after_id(after_id)
        stmt = _DEAD_PAGE_BODIES if with_body else DEAD_PAGE

        def read(conn: sa.Connection) -> list[DeadLetter]:
            channel_id = self._existing_channel_id(conn, topic, channel)
            rows = conn.execute(
                stmt, {"p_channel": channel_id, "p_after": after, "p_limit": page}
            ).all()
            return [
                DeadLetter(
                    delivery_id=int(row[0]),
                    message_id=int(row[1]),
                    attempts=int(row[2]),
                    reason=row[3] or "rejected",
                    last_error=row[4],
                    body_len=int(row[7]),
                    published_at=from_us(row[6]),
                    died_at=from_us(row[5]),
                    body=bytes(row[8]) if with_body else None,
                )
                for row in rows
            ]

        return self._run(read)

    def requeue_dead(self, topic: str, channel: str, ids: Iterable[int] | None = None) -> int:
        """Make dead letters ready again, now; return how many were requeued.

        ``ids`` are delivery ids (from :meth:`list_dead`); ``None`` requeues
        every dead letter of the channel. Ids that are not dead letters of this
        channel are skipped. Each one gets a fresh attempt budget (attempts
        reset to 0) and a fresh TTL: its message is kept at least
        ``Options.default_ttl`` from now. Counted as ``requeued``. Works in
        transactions of ``Options.maintenance_batch`` letters.
        """
        wanted = None if ids is None else _validate.ids(ids)
        ttl_us = int(self._default_ttl * US)

        def revive(conn: sa.Connection, tally: Tally, channel_id: int, rows: list[Any]) -> int:
            now = self._now()
            delivery_ids = [int(r[0]) for r in rows]
            count = conn.execute(_revive, {"p_ids": delivery_ids, "p_now": now}).rowcount
            conn.execute(
                _extend_expiry,
                {"p_ids": sorted({int(r[1]) for r in rows}), "p_expires": now + ttl_us},
            )
            tally.add("requeued", day_of(now), {channel_id: count})
            if count:
                self._dialect.notify(conn, topic)
            return int(count)

        total = self._each_dead_batch(topic, channel, wanted, revive)
        if total:
            self._wake(topic)
        return total

    def delete_dead(self, topic: str, channel: str, ids: Iterable[int] | None = None) -> int:
        """Delete dead letters; return how many were deleted.

        ``ids`` are delivery ids; ``None`` deletes every dead letter of the
        channel. Messages stay (browsable until TTL). Deleted letters count as
        ``purged``, like every delivery that leaves without an ack, so
        ``published == acked + purged + live`` holds over a channel's life.
        """
        wanted = None if ids is None else _validate.ids(ids)

        def delete(conn: sa.Connection, tally: Tally, channel_id: int, rows: list[Any]) -> int:
            return self._delete_dead_rows(conn, tally, [int(r[0]) for r in rows])

        return self._each_dead_batch(topic, channel, wanted, delete)

    def _each_dead_batch(
        self,
        topic: str,
        channel: str,
        wanted: list[int] | None,
        apply: Callable[[sa.Connection, Tally, int, list[Any]], int],
    ) -> int:
        """Lock and hand over the channel's dead letters (``wanted`` ones or all) in batches."""
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        batch = self.options.maintenance_batch
        channel_id = self._run(lambda conn: self._existing_channel_id(conn, topic, channel))
        total = 0
        if wanted is not None:
            for i in range(0, len(wanted), batch):

                def chosen(
                    conn: sa.Connection, tally: Tally, chunk: list[int] = wanted[i : i + batch]
                ) -> int:
                    rows = conn.execute(
                        _dead_batch_in, {"p_channel": channel_id, "p_ids": chunk}
                    ).all()
                    return apply(conn, tally, channel_id, list(rows))

                total += self._run_counted(chosen)
            return total
        after = 0
        while True:

            def following(
                conn: sa.Connection, tally: Tally, after: int = after
            ) -> tuple[int, int, int]:
                return self._dead_batch(conn, tally, channel_id, after, batch, apply)

            seen, done, after = self._run_counted(following)
            total += done
            if seen < batch:
                return total

    def _dead_batch(
        self,
        conn: sa.Connection,
        tally: Tally,
        channel_id: int,
        after: int,
        batch: int,
        apply: Callable[[sa.Connection, Tally, int, list[Any]], int],
    ) -> tuple[int, int, int]:
        """The next ``batch`` dead letters after id ``after``: (seen, applied, last id)."""
        params = {"p_channel": channel_id, "p_after": after, "p_limit": batch}
        rows = conn.execute(_dead_batch_after, params).all()
        if not rows:
            return 0, 0, after
        return len(rows), apply(conn, tally, channel_id, list(rows)), int(rows[-1][0])

    def _delete_dead_rows(self, conn: sa.Connection, tally: Tally, delivery_ids: list[int]) -> int:
        if not delivery_ids:
            return 0
        purged = self._dialect.delete_deliveries(
            conn, sa.and_(d.c.id.in_(delivery_ids), d.c.state == STATE_DEAD)
        )
        self._count_purged(purged, self._now(), tally)
        return len(purged)

    def enforce_dead_retention(self) -> int:
        """Delete dead letters beyond their channel's bounds; return how many.

        Bounds are per channel (``ensure_channel(dead_max_age=, dead_max_count=)``),
        defaulting to ``Options.dead_max_age`` / ``Options.dead_max_count``;
        ``None`` means bounded by TTL only. Letters older than ``dead_max_age``
        (by ``died_at``) go, then all but the newest ``dead_max_count``,
        oldest first, in transactions of ``Options.maintenance_batch``. Only
        dead rows are touched; they count as ``purged``. Part of
        :meth:`run_maintenance`.
        """
        default_age = self.options.dead_max_age
        age_default = (
            None if default_age is None else int(seconds(default_age, "Options.dead_max_age") * US)
        )
        count_default = self.options.dead_max_count
        query = sa.select(
            channels.c.id, channels.c.dead_max_age, channels.c.dead_max_count
        ).order_by(channels.c.id)
        if age_default is None and count_default is None:
            query = query.where(
                sa.or_(channels.c.dead_max_age.is_not(None), channels.c.dead_max_count.is_not(None))
            )
        bounded = self._run(lambda conn: conn.execute(query).all())
        total = 0
        for channel_id, age, count in bounded:
            max_age = age if age is not None else age_default
            max_count = count if count is not None else count_default
            if max_age is not None:
                total += self._retire_older(int(channel_id), int(max_age))
            if max_count is not None:
                total += self._retire_beyond(int(channel_id), int(max_count))
        if total:
            self.log.debug("dead-letter retention deleted %d letters", total)
        return total

    def _purge_pass(self) -> int:
        """TTL purge, then dead-letter retention: the purge job of every
        maintenance pass, in ``run_maintenance()`` and in ``start()``'s loop."""
        return super()._purge_pass() + self.enforce_dead_retention()

    def _retire_older(self, channel_id: int, max_age_us: int) -> int:
        batch = self.options.maintenance_batch
        total = 0
        while True:

            def work(conn: sa.Connection, tally: Tally) -> tuple[int, int]:
                params = {
                    "p_channel": channel_id,
                    "p_cutoff": self._now() - max_age_us,
                    "p_limit": batch,
                }
                found = [int(r[0]) for r in conn.execute(_dead_older_than, params)]
                return len(found), self._delete_dead_rows(conn, tally, found)

            seen, deleted = self._run_counted(work)
            total += deleted
            if seen < batch:
                return total

    def _retire_beyond(self, channel_id: int, keep: int) -> int:
        """Delete all but the newest ``keep`` dead letters (by died_at), oldest first.

        Everything older than the ``keep``-th newest letter stays older than it
        as letters keep dying, so concurrent passes never delete too many.
        """

        def boundary(conn: sa.Connection) -> tuple[int, int] | None:
            """(died_at, id) of the oldest letter kept (older ones go); None: within bounds."""
            dead = int(conn.execute(_dead_count, {"p_channel": channel_id}).scalar_one())
            if dead <= keep:
                return None
            if keep == 0:
                return DEAD_VISIBLE_AT, 0  # beyond every real died_at: delete them all
            row = conn.execute(
                _dead_boundary, {"p_channel": channel_id, "p_offset": keep - 1}
            ).one_or_none()
            return None if row is None else (int(row[0]), int(row[1]))

        edge = self._run(boundary)
        if edge is None:
            return 0
        died, last_id = edge
        batch = self.options.maintenance_batch
        total = 0
        while True:

            def work(conn: sa.Connection, tally: Tally) -> tuple[int, int]:
                params = {
                    "p_channel": channel_id,
                    "p_died": died,
                    "p_id": last_id,
                    "p_limit": batch,
                }
                found = [int(r[0]) for r in conn.execute(_dead_beyond, params)]
                return len(found), self._delete_dead_rows(conn, tally, found)

            seen, deleted = self._run_counted(work)
            total += deleted
            if seen < batch:
                return total

    # -- browsing -------------------------------------------------------------------------------

    def get_message(self, id: int) -> MessageInfo:
        """A stored message with the state of each of its live deliveries.

        A channel missing from ``deliveries`` has acked the message (or did not
        exist when it was published). :class:`MessageNotFound` if no message
        has this id (never published, or purged by TTL or :meth:`prune`).
        """
        message_id = _validate.message_id(id)

        def read(conn: sa.Connection) -> MessageInfo:
            row = conn.execute(_message, {"p_id": message_id}).one_or_none()
            if row is None:
                raise MessageNotFound(f"message {message_id} does not exist")
            found = self._with_deliveries(conn, [row[0]], {row[0]: row[1]}, [row[2:]])
            return found[0]

        return self._run(read)

    def list_messages(
        self,
        topic: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        after_id: int | None = None,
    ) -> list[MessageInfo]:
        """A page of ``topic``'s stored messages in id (publish) order, with their deliveries.

        ``since`` (inclusive) and ``until`` (exclusive) bound ``published_at``;
        both are aware datetimes. For the next page pass the last id as
        ``after_id``. Acked messages stay listed until their TTL.
        """
        _validate.name(topic, "topic")
        page = _validate.page_limit(limit)
        after = _validate.after_id(after_id)
        stmt = (
            sa.select(m.c.id, m.c.body, m.c.headers, m.c.published_at, m.c.expires_at)
            .where(m.c.topic_id == _p("p_topic_id", sa.Integer), m.c.id > _p("p_after"))
            .order_by(m.c.id)
            .limit(_p("p_limit", sa.Integer))
        )
        params: dict[str, Any] = {"p_after": after, "p_limit": page}
        if since is not None:
            stmt = stmt.where(m.c.published_at >= _p("p_since"))
            params["p_since"] = to_us(_validate.moment(since, "since"))
        if until is not None:
            stmt = stmt.where(m.c.published_at < _p("p_until"))
            params["p_until"] = to_us(_validate.moment(until, "until"))

        def read(conn: sa.Connection) -> list[MessageInfo]:
            params["p_topic_id"] = self._existing_topic_id(conn, topic)
            rows = conn.execute(stmt, params).all()
            ids = [int(r[0]) for r in rows]
            return self._with_deliveries(
                conn, ids, dict.fromkeys(ids, topic), [r[1:] for r in rows]
            )

        return self._run(read)

    def _with_deliveries(
        self,
        conn: sa.Connection,
        ids: list[int],
        topic_of: dict[int, str],
        fields: list[Any],
    ) -> list[MessageInfo]:
        """MessageInfo for messages ``ids`` (fields: body, headers, published, expires)."""
        if not ids:
            return []
        now = self._now()
        found: dict[int, list[DeliveryInfo]] = {i: [] for i in ids}
        for message_id, name, state, attempts, error, visible in conn.execute(
            _deliveries_of, {"p_ids": ids}
        ):
            found[int(message_id)].append(
                DeliveryInfo(
                    channel=name,
                    state=_state(state, visible, now),
                    attempts=int(attempts),
                    last_error=error,
                    visible_at=None if state == STATE_DEAD else from_us(visible),
                )
            )
        return [
            MessageInfo(
                id=i,
                topic=topic_of[i],
                body=bytes(body),
                headers=_validate.decode_headers(headers),
                published_at=from_us(published),
                expires_at=from_us(expires),
                deliveries=found[i],
            )
            for i, (body, headers, published, expires) in zip(ids, fields, strict=True)
        ]

    # -- replay ---------------------------------------------------------------------------------

    def replay(self, message_id: int, channels: Iterable[str] | None = None) -> int:
        """Deliver a stored message again; return how many deliveries were created.

        ``channels`` are names of the message's topic (``None``: every channel
        it has now, including ones created after the publish). Each new
        delivery is ready at once with a fresh attempt budget; a channel that
        still holds a live delivery of the message (pending, ready, in flight
        or dead) gets none. The message is kept at least
        ``Options.default_ttl`` from now. One transaction; counted as
        ``published``.
        """
        wanted_id = _validate.message_id(message_id, "message_id")
        names = None if channels is None else _validate.names(channels, "channel")

        def write(conn: sa.Connection, tally: Tally) -> tuple[str, int]:
            row = conn.execute(_lock_message, {"p_id": wanted_id}).one_or_none()
            if row is None:
                raise MessageNotFound(f"message {wanted_id} does not exist")
            topic_id, max_attempts = int(row[0]), int(row[1])
            topic = conn.execute(_topic_name, {"p_topic_id": topic_id}).scalar_one()
            channel_ids = self._replay_channels(conn, topic, topic_id, names)
            created = self._replay_rows(
                conn, tally, topic, channel_ids, [(wanted_id, max_attempts)]
            )
            return topic, created

        topic, created = self._run_counted(write)
        if created:
            self._wake(topic)
        return created

    def replay_range(
        self,
        topic: str,
        since: datetime,
        until: datetime,
        channels: Iterable[str] | None = None,
    ) -> int:
        """:meth:`replay` every message of ``topic`` published in ``[since, until)``.

        One transaction for the whole range (its messages are locked while it
        runs, so keep ranges moderate); returns how many deliveries it created.
        """
        _validate.name(topic, "topic")
        first = to_us(_validate.moment(since, "since"))
        last = to_us(_validate.moment(until, "until"))
        names = None if channels is None else _validate.names(channels, "channel")

        def write(conn: sa.Connection, tally: Tally) -> int:
            topic_id = self._existing_topic_id(conn, topic)
            channel_ids = self._replay_channels(conn, topic, topic_id, names)
            created = 0
            pub, last_id = first - 1, 0
            while True:
                rows = conn.execute(
                    _range_chunk,
                    {
                        "p_topic_id": topic_id,
                        "p_since": first,
                        "p_until": last,
                        "p_pub": pub,
                        "p_id": last_id,
                        "p_limit": REPLAY_CHUNK,
                    },
                ).all()
                if rows:
                    created += self._replay_rows(
                        conn, tally, topic, channel_ids, [(int(r[0]), int(r[1])) for r in rows]
                    )
                    pub, last_id = int(rows[-1][2]), int(rows[-1][0])
                if len(rows) < REPLAY_CHUNK:
                    return created

        created: int = self._run_counted(write)
        if created:
            self._wake(topic)
        return created

    def _replay_channels(
        self, conn: sa.Connection, topic: str, topic_id: int, names: list[str] | None
    ) -> list[int]:
        query = sa.select(channels.c.name, channels.c.id).where(channels.c.topic_id == topic_id)
        if names is not None:
            query = query.where(channels.c.name.in_(names))
        found = {name: int(cid) for name, cid in conn.execute(query)}
        for name in names or ():
            if name not in found:
                raise ChannelNotFound(f"channel {name!r} of topic {topic!r} does not exist")
        return sorted(found.values())

    def _replay_rows(
        self,
        conn: sa.Connection,
        tally: Tally,
        topic: str,
        channel_ids: list[int],
        wanted: list[tuple[int, int]],
    ) -> int:
        """Create the missing deliveries of messages ``wanted`` ((id, max_attempts))."""
        if not channel_ids or not wanted:
            return 0
        now = self._now()
        ids = [mid for mid, _ in wanted]
        live = {(int(a), int(b)) for a, b in conn.execute(_live_pairs, {"p_ids": ids})}
        rows = [
            {
                "message_id": mid,
                "channel_id": cid,
                "state": STATE_READY,
                "visible_at": now,
                "attempts": 0,
                "max_attempts": attempts,
            }
            for mid, attempts in wanted
            for cid in channel_ids
            if (mid, cid) not in live
        ]
        if not rows:
            return 0
        conn.execute(
            _extend_expiry,
            {
                "p_ids": sorted({row["message_id"] for row in rows}),
                "p_expires": now + int(self._default_ttl * US),
            },
        )
        conn.execute(sa.insert(d), rows)
        self._dialect.notify(conn, topic)
        tally.add("published", day_of(now), Counter(row["channel_id"] for row in rows))
        return len(rows)

    # -- prune ----------------------------------------------------------------------------------

    def prune(self, before: datetime, *, dry_run: bool = False) -> int:
        """Delete every message published before ``before``, with its deliveries.

        Returns how many messages were deleted (with ``dry_run``: would be,
        and nothing changes). Works topic by topic in transactions of
        ``Options.maintenance_batch`` messages, so it never holds long locks.
        Deleted deliveries, dead ones included, count as ``purged``.
        """
        cutoff = to_us(_validate.moment(before, "before"))
        topic_ids = [
            int(r[0])
            for r in self._run(
                lambda conn: conn.execute(sa.select(topics.c.id).order_by(topics.c.id)).all()
            )
        ]
        if dry_run:

            def count(conn: sa.Connection) -> int:
                return sum(
                    int(
                        conn.execute(
                            _prune_count, {"p_topic_id": tid, "p_before": cutoff}
                        ).scalar_one()
                    )
                    for tid in topic_ids
                )

            return self._run(count)
        batch = self.options.maintenance_batch
        total = 0
        for topic_id in topic_ids:
            while True:

                def work(conn: sa.Connection, tally: Tally, tid: int = topic_id) -> tuple[int, int]:
                    params = {"p_topic_id": tid, "p_before": cutoff, "p_limit": batch}
                    ids = [int(r[0]) for r in conn.execute(_prune_batch, params)]
                    if not ids:
                        return 0, 0
                    purged = self._dialect.delete_deliveries(conn, d.c.message_id.in_(ids))
                    self._count_purged(purged, self._now(), tally)
                    deleted = conn.execute(sa.delete(m).where(m.c.id.in_(ids))).rowcount
                    return len(ids), int(deleted)

                seen, deleted = self._run_counted(work)
                total += deleted
                if seen < batch:
                    break
        if total:
            self.log.info("pruned %d messages published before %s", total, before.isoformat())
        return total


def _window(stmt: sa.Select[Any], first: date | None, last: date | None) -> sa.Select[Any]:
    if first is not None:
        stmt = stmt.where(stats.c.day >= first)
    if last is not None:
        stmt = stmt.where(stats.c.day <= last)
    return stmt
