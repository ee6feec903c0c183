"""The operator's statements (counters, backlog, dead letters, messages, replay,
prune): portable SQLAlchemy Core, built once at import from bound parameters."""

from __future__ import annotations

from datetime import date
from typing import Any

import sqlalchemy as sa

from novaque import dialects
from novaque._tables import (
    COUNTER_COLUMNS,
    DEAD_VISIBLE_AT,
    ORDERINGS,
    PARKED_OFFSET,
    STATE_DEAD,
    STATE_DEFERRED,
    STATE_LEASED,
    STATE_READY,
    ExactKey,
    channels,
    deliveries,
    messages,
    minute_stats,
    stats,
    topics,
)

d = deliveries
m = messages


def dead_values(reason: Any, died_at: Any) -> dict[str, Any]:
    """What every delivery that becomes a dead letter gets written (a lease
    reaped out of attempts, a reject, an expiry, a deferred one out of
    attempts): the dead state at the tail of the claim index's lane 0, no
    lease, no attempt id, its reason and time of death."""
    return {
        "state": STATE_DEAD,
        "visible_at": DEAD_VISIBLE_AT,
        "lease_token": None,
        "attempt_id": None,
        "dead_reason": reason,
        "died_at": died_at,
        "priority": 0,
    }


#: A delivery's claim lane while it can be claimed: its message's priority
#: (dead and deferred ones lie in lane 0, and get it back with this).
MESSAGE_LANE = (
    sa.select(m.c.priority).where(m.c.id == d.c.message_id).correlate(d).scalar_subquery()
)


def widen_lanes(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    of_channels: sa.ColumnElement[bool],
    low: int,
    high: int,
) -> None:
    """Make the lanes of the channels ``of_channels`` reach
    priorities ``low`` to ``high``, in the transaction that brings them
    deliveries of those priorities, before it writes them (their lanes must
    be visible when the deliveries are).

    The channels are read as the latest committed (``dialect.read_latest``:
    on MySQL/MariaDB a shared lock, as the fan-out's own read and the foreign
    keys of its deliveries take; an UPDATE in a REPEATABLE READ transaction
    would lock every channel row of the topic it looked at), and only those
    whose lanes do not reach them yet are written: most publishes of a
    priority write nothing here. Two transactions widening one channel at
    once can deadlock there (both raise a shared lock); the database then
    rolls one back, and novaque repeats its own transactions."""
    low, high = min(low, 0), max(high, 0)
    if low == high == 0:
        return
    narrow = sa.select(channels.c.id).where(
        of_channels, sa.or_(channels.c.low_lane > low, channels.c.high_lane < high)
    )
    ids = [int(i) for i in conn.execute(dialect.read_latest(narrow)).scalars()]
    if ids:
        conn.execute(
            sa.update(channels)
            .where(channels.c.id.in_(ids))
            .values(
                low_lane=sa.case((channels.c.low_lane > low, low), else_=channels.c.low_lane),
                high_lane=sa.case((channels.c.high_lane < high, high), else_=channels.c.high_lane),
            )
        )


def _p(name: str, type_: Any = sa.BigInteger) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=type_)


def _ids(name: str = "p_ids") -> sa.BindParameter[Any]:
    return sa.bindparam(name, expanding=True)


#: The lowest and highest priority of messages ``p_ids``.
_lanes_of_messages = sa.select(
    sa.func.coalesce(sa.func.min(m.c.priority), 0),
    sa.func.coalesce(sa.func.max(m.c.priority), 0),
).where(m.c.id.in_(_ids()))


def widen_lanes_for(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    of_channels: sa.ColumnElement[bool],
    message_ids: list[int],
) -> None:
    """:func:`widen_lanes` for the priorities of messages ``message_ids``."""
    low, high = conn.execute(_lanes_of_messages, {"p_ids": sorted(message_ids)}).one()
    widen_lanes(conn, dialect, of_channels, int(low), int(high))


# -- counters -------------------------------------------------------------------------

_sums = [sa.func.coalesce(sa.func.sum(stats.c[col]), 0) for col in COUNTER_COLUMNS]
_channels_of = sa.select(channels.c.id).where(channels.c.topic_id == _p("p_topic_id", sa.Integer))

#: A channel's minute buckets from ``p_first`` on (a range of its primary key).
MINUTES = (
    sa.select(minute_stats.c.minute, *(minute_stats.c[col] for col in COUNTER_COLUMNS))
    .where(
        minute_stats.c.channel_id == _p("p_channel", sa.Integer),
        minute_stats.c.minute >= _p("p_first"),
    )
    .order_by(minute_stats.c.minute)
)

# -- backlog: index-only range counts on ix_novaque_deliveries_state per channel ----
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


def _earliest(*where: sa.ColumnElement[bool]) -> sa.ScalarSelect[Any]:
    return (
        sa.select(sa.func.min(d.c.visible_at))
        .where(d.c.channel_id == channels.c.id, *where)
        .correlate(channels)
        .scalar_subquery()
    )


_now = _p("p_now")
_backlog_columns = (
    channels.c.id,
    channels.c.name,
    _count(
        d.c.state == STATE_READY, d.c.visible_at > _now, d.c.visible_at < PARKED_OFFSET
    ),  # pending
    _count(d.c.state == STATE_READY, d.c.visible_at <= _now),  # ready
    _count(d.c.state == STATE_LEASED),  # in flight
    _count(d.c.state == STATE_DEAD),  # dead
    # waiting behind their group's head (parked): ready too
    _count(d.c.state == STATE_READY, d.c.visible_at >= PARKED_OFFSET),
    _count(d.c.state == STATE_DEFERRED),  # deferred
    # the earliest due time of the unparked and of the parked ready ones: the
    # first entry of each index range
    _earliest(d.c.state == STATE_READY, d.c.visible_at < PARKED_OFFSET),
    _earliest(d.c.state == STATE_READY, d.c.visible_at >= PARKED_OFFSET),
)

#: Live deliveries of one channel by state (``p_channel``, ``p_now``).
BACKLOG = sa.select(*_backlog_columns).where(channels.c.id == _p("p_channel", sa.Integer))
_TOPIC_BACKLOG = (
    sa.select(*_backlog_columns)
    .where(channels.c.topic_id == _p("p_topic_id", sa.Integer))
    .order_by(channels.c.name)
)

# -- dead letters: the tail of ix_novaque_deliveries_claim, in delivery-id order -------

# Dead rows, and only they, have visible_at = DEAD_VISIBLE_AT, in lane 0: an
# exact range of ix_novaque_deliveries_claim in id order. (Adding "state = dead" would tempt
# planners into ix_novaque_deliveries_state and a sort.) Updates and deletes of
# the rows found still check the state.
_dead_of_channel = sa.and_(
    d.c.channel_id == _p("p_channel", sa.Integer),
    d.c.priority == 0,
    d.c.visible_at == DEAD_VISIBLE_AT,
)
#: The claimable deliveries of messages ``p_ids`` given their message's lane.
RESTORE_LANES = (
    sa.update(d)
    .where(d.c.message_id.in_(_ids()), d.c.state.in_((STATE_READY, STATE_LEASED)))
    .values(priority=MESSAGE_LANE)
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


def _dead_chunk(*, by_ids: bool, before: bool) -> sa.Select[Any]:
    """A locking read of a chunk of a channel's dead letters, in id order: the
    ``p_ids`` among them, or the next ``p_limit`` after ``p_after``; with
    ``before``, only those that died before ``p_before``."""
    stmt = sa.select(d.c.id, d.c.message_id).where(_dead_of_channel)
    if before:
        stmt = stmt.where(d.c.died_at < _p("p_before"))
    if by_ids:
        stmt = stmt.where(d.c.id.in_(_ids()))
    else:
        stmt = stmt.where(d.c.id > _p("p_after")).limit(_p("p_limit", sa.Integer))
    return stmt.order_by(d.c.id).with_for_update()


#: The chunks of a pass over dead letters: {(by ids, with died_before): statement}.
DEAD_CHUNKS = {
    (by_ids, before): _dead_chunk(by_ids=by_ids, before=before)
    for by_ids in (False, True)
    for before in (False, True)
}
_dead_batch_after = DEAD_CHUNKS[(False, False)]
_dead_batch_in = DEAD_CHUNKS[(True, False)]


def _oldest_dead(*, before: bool) -> sa.Select[Any]:
    stmt = sa.select(d.c.id).where(_dead_of_channel)
    if before:
        stmt = stmt.where(d.c.died_at < _p("p_before"))
    # A BIGINT limit: requeue_dead(limit=) takes any 64-bit count.
    return stmt.order_by(d.c.died_at, d.c.id).limit(_p("p_limit"))


#: The ``p_limit`` oldest died dead letters of a channel (``p_before``: that
#: died earlier), read once per pass with a ``limit``: one sort of the
#: channel's dead range, whatever the number of chunks that follow.
OLDEST_DEAD = {before: _oldest_dead(before=before) for before in (False, True)}
#: When the given dead letters (``p_ids``) of a channel died.
_dead_died_in = sa.select(d.c.id, d.c.died_at).where(_dead_of_channel, d.c.id.in_(_ids()))

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
        priority=MESSAGE_LANE,
    )
)
_extend_expiry = (
    sa.update(m)
    .where(m.c.id.in_(_ids()), m.c.expires_at < _p("p_expires"))
    .values(expires_at=_p("p_expires"))
)

# -- moving dead letters to another channel of the topic (requeue_dead(to_channel=)) --

#: The target's ordering and max_attempts setting (``p_channel``).
_target_channel = sa.select(
    channels.c.ordering, channels.c.max_attempts, channels.c.topic_id
).where(channels.c.id == _p("p_channel", sa.Integer))
# Locks the messages moved, in id order: a replay of one of them (which locks
# its message too) and another move into the channel take turns with this one,
# so a message never gets two live deliveries in one channel.
_lock_messages = sa.select(m.c.id).where(m.c.id.in_(_ids())).order_by(m.c.id).with_for_update()
#: Which of messages ``p_ids`` have a live delivery (any state) in ``p_channel``.
_held_in_channel = sa.select(d.c.message_id).where(
    d.c.channel_id == _p("p_channel", sa.Integer), d.c.message_id.in_(_ids())
)


def _move(group_key: sa.ColumnElement[Any]) -> sa.Update:
    """Dead letters ``p_ids`` become ready deliveries of channel ``p_target``,
    now, with a fresh budget (``p_budget``, the target's setting, or the one
    they had) and their key in the target's ordering."""
    return (
        sa.update(d)
        .where(d.c.id.in_(_ids()), d.c.state == STATE_DEAD)
        .values(
            channel_id=_p("p_target", sa.Integer),
            state=STATE_READY,
            visible_at=_p("p_now"),
            attempts=0,
            max_attempts=sa.func.coalesce(_p("p_budget", sa.Integer), d.c.max_attempts),
            lease_token=None,
            dead_reason=None,
            died_at=None,
            group_key=group_key,
            priority=MESSAGE_LANE,
        )
    )


#: :func:`_move` by the target's ordering code (see ``schema.ORDERINGS``):
#: standard (no key), group_fifo (the message's group), strict_fifo ("").
MOVES = {
    ORDERINGS["standard"]: _move(sa.null()),
    ORDERINGS["group_fifo"]: _move(
        sa.select(m.c.group_key).where(m.c.id == d.c.message_id).scalar_subquery()
    ),
    ORDERINGS["strict_fifo"]: _move(sa.bindparam("p_key", "", type_=ExactKey())),
}

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
#: Total body bytes of a channel's dead letters (``p_channel``).
_dead_bytes = (
    sa.select(sa.func.coalesce(sa.func.sum(sa.func.length(m.c.body)), 0))
    .join_from(d, m, m.c.id == d.c.message_id)
    .where(_dead_of_channel)
)
# Newest died first, each letter with the bytes of itself and of every letter
# that died after it ((died_at, id) is unique: the window's default frame, up
# to the current row, holds exactly those). The oldest whose running total
# still fits ``p_max`` is the oldest kept; older ones go, by _dead_beyond.
_running = (
    sa.select(
        d.c.died_at,
        d.c.id,
        sa.func.sum(sa.func.length(m.c.body))
        .over(order_by=(d.c.died_at.desc(), d.c.id.desc()))
        .label("running"),
    )
    .join_from(d, m, m.c.id == d.c.message_id)
    .where(_dead_of_channel)
    .subquery("running")
)
#: (died_at, id) of the oldest dead letter kept under a bytes bound
#: (``p_channel``, ``p_max``); no row: not even the newest fits.
_dead_bytes_boundary = (
    sa.select(_running.c.died_at, _running.c.id)
    .where(_running.c.running <= _p("p_max"))
    .order_by(_running.c.died_at, _running.c.id)
    .limit(1)
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

# -- TTL purge: dead letters on expiry -------------------------------------------------

_expiring_topics = sa.select(m.c.topic_id).where(m.c.id.in_(_ids()))
#: The channels of the topics of messages ``p_ids`` whose live deliveries become
#: dead letters when their message expires, by the client's default: the setting
#: True (default False), or True or unset (default True). A scan of the
#: channels of those topics through their unique index.
DYING_CHANNELS = {
    default: sa.select(channels.c.id)
    .where(
        channels.c.topic_id.in_(_expiring_topics),
        sa.or_(
            channels.c.dead_letter_expired.is_(None), channels.c.dead_letter_expired == sa.true()
        )
        if default
        else channels.c.dead_letter_expired == sa.true(),
    )
    .order_by(channels.c.id)
    for default in (False, True)
}
#: The live deliveries (ready, pending, parked, leased, deferred) of messages
#: ``p_ids`` in channels ``p_channels``, locked in id order.
_expiring = (
    sa.select(d.c.id, d.c.channel_id, d.c.message_id, d.c.group_key)
    .where(
        d.c.message_id.in_(_ids()),
        d.c.channel_id.in_(_ids("p_channels")),
        d.c.state != STATE_DEAD,
    )
    .order_by(d.c.id)
    .with_for_update()
)
_die_expired = (
    sa.update(d)
    .where(d.c.id.in_(_ids()), d.c.state != STATE_DEAD)
    .values(dead_values("expired", _p("p_now")))
)
_keep_messages = sa.update(m).where(m.c.id.in_(_ids())).values(expires_at=_p("p_expires"))

# -- messages ---------------------------------------------------------------------------

_message = (
    sa.select(
        m.c.id,
        topics.c.name,
        m.c.body,
        m.c.headers,
        m.c.published_at,
        m.c.expires_at,
        m.c.group_key,
        m.c.priority,
    )
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
    sa.select(m.c.topic_id, m.c.max_attempts, m.c.headers, m.c.group_key)
    .where(m.c.id == _p("p_id"))
    .with_for_update()
)
_topic_name = sa.select(topics.c.name).where(topics.c.id == _p("p_topic_id", sa.Integer))
_live_pairs = sa.select(d.c.message_id, d.c.channel_id).where(d.c.message_id.in_(_ids()))
_range_chunk = (
    sa.select(m.c.id, m.c.max_attempts, m.c.published_at, m.c.headers, m.c.group_key)
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
# Locked before their deliveries are deleted: a replay of one of them (which
# locks it first) commits its new delivery before, and it is deleted too.
_prune_batch = (
    sa.select(m.c.id)
    .where(m.c.topic_id == _p("p_topic_id", sa.Integer), m.c.published_at < _p("p_before"))
    .order_by(m.c.published_at, m.c.id)
    .limit(_p("p_limit", sa.Integer))
    .with_for_update()
)


def window(stmt: sa.Select[Any], first: date | None, last: date | None) -> sa.Select[Any]:
    if first is not None:
        stmt = stmt.where(stats.c.day >= first)
    if last is not None:
        stmt = stmt.where(stats.c.day <= last)
    return stmt
