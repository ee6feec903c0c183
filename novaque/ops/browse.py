"""The operator's reads and repairs: counters, backlog, dead letters, messages,
replay and prune. Reads never create a topic or a channel."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import date, datetime
from typing import Any, Literal

import sqlalchemy as sa

from novaque import _filters, _validate, dialects
from novaque._stats import Tally
from novaque._tables import (
    COUNTER_COLUMNS,
    ORDERINGS,
    PARKED_OFFSET,
    STATE_DEAD,
    STATE_DEFERRED,
    STATE_LEASED,
    STATE_READY,
    channels,
    deliveries,
    messages,
    stats,
    topics,
)
from novaque._time import from_us
from novaque.errors import ChannelNotFound, MessageNotFound, TopicGone
from novaque.models import (
    Backlog,
    Counters,
    DeadLetter,
    DeliveryInfo,
    DeliveryState,
    MessageInfo,
)
from novaque.ops import Batch, Effects, _groups, _sql
from novaque.ops.maintain import count_purged, delete_dead_rows, delete_deliveries_of
from novaque.ops.publish import insert_deliveries, order_key
from novaque.ops.topology import existing_channel_id, existing_topic_id

d = deliveries
m = messages

#: Messages handled per statement by replay (keeps statements and IN lists small).
REPLAY_CHUNK = 500


def _counters(row: Any) -> Counters:
    return Counters(*(int(v or 0) for v in row))


def _state(state: int, visible_at: int, now: int) -> DeliveryState:
    if state == STATE_DEAD:
        return "dead"
    if state == STATE_LEASED:
        return "in_flight"
    if state == STATE_DEFERRED:
        return "deferred"
    if visible_at >= PARKED_OFFSET:
        return "ready"  # waiting behind its group's head
    return "pending" if visible_at > now else "ready"


# -- counters -----------------------------------------------------------------------------


def channel_counters(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    topic: str,
    channel: str,
    first: date | None,
    last: date | None,
) -> Counters:
    channel_id = existing_channel_id(conn, topic, channel)
    stmt = _sql.window(sa.select(*_sql._sums).where(stats.c.channel_id == channel_id), first, last)
    return _counters(conn.execute(stmt).one())


def topic_counters(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    topic: str,
    first: date | None,
    last: date | None,
) -> Counters:
    topic_id = existing_topic_id(conn, topic)
    stmt = _sql.window(
        sa.select(*_sql._sums).where(stats.c.channel_id.in_(_sql._channels_of)), first, last
    )
    return _counters(conn.execute(stmt, {"p_topic_id": topic_id}).one())


def daily_counters(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    topic: str,
    channel: str,
    first: date | None,
    last: date | None,
) -> list[tuple[date, Counters]]:
    channel_id = existing_channel_id(conn, topic, channel)
    stmt = _sql.window(
        sa.select(stats.c.day, *(stats.c[col] for col in COUNTER_COLUMNS))
        .where(stats.c.channel_id == channel_id)
        .order_by(stats.c.day),
        first,
        last,
    )
    days = [(row[0], _counters(row[1:])) for row in conn.execute(stmt)]
    return [(day, counters) for day, counters in days if counters != Counters()]


def minute_counters(
    conn: sa.Connection, dialect: dialects.Dialect, topic: str, channel: str, first: int
) -> list[tuple[datetime, Counters]]:
    """The channel's minute buckets from minute ``first`` (epoch microseconds,
    a whole minute) on, oldest first, without the empty ones."""
    channel_id = existing_channel_id(conn, topic, channel)
    rows = conn.execute(_sql.MINUTES, {"p_channel": channel_id, "p_first": first})
    minutes = [(from_us(int(row[0])), _counters(row[1:])) for row in rows]
    return [(minute, counters) for minute, counters in minutes if counters != Counters()]


# -- backlog ------------------------------------------------------------------------------


def channel_backlog(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, topic: str, channel: str
) -> Backlog:
    channel_id = existing_channel_id(conn, topic, channel)
    row = conn.execute(_sql.BACKLOG, {"p_channel": channel_id, "p_now": now}).one()
    return _backlog(row, now)


def topic_backlog(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, topic: str
) -> dict[str, Backlog]:
    topic_id = existing_topic_id(conn, topic)
    rows = conn.execute(_sql._TOPIC_BACKLOG, {"p_topic_id": topic_id, "p_now": now})
    return {row[1]: _backlog(row, now) for row in rows}


def _backlog(row: Any, now: int) -> Backlog:
    """A row of the backlog counts; parked deliveries count as ready."""
    pending, ready, in_flight, dead, parked, deferred = (int(n) for n in row[2:8])
    due = [t for t in (row[8], None if row[9] is None else row[9] - PARKED_OFFSET) if t is not None]
    earliest = min((int(t) for t in due if t <= now), default=None)
    return Backlog(
        pending,
        ready + parked,
        in_flight,
        dead,
        deferred,
        None if earliest is None else from_us(earliest),
    )


# -- dead letters -------------------------------------------------------------------------


def list_dead(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    topic: str,
    channel: str,
    page: int,
    after: int,
    with_body: bool,
) -> list[DeadLetter]:
    stmt = _sql._DEAD_PAGE_BODIES if with_body else _sql.DEAD_PAGE
    channel_id = existing_channel_id(conn, topic, channel)
    rows = conn.execute(stmt, {"p_channel": channel_id, "p_after": after, "p_limit": page}).all()
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


DeadAction = Literal["requeue", "delete"]


@dataclasses.dataclass(frozen=True)
class DeadWork:
    """What a pass over a channel's dead letters does, chunk after chunk.

    ``action``: requeue or delete; ``channel_id``: the channel whose letters
    they are; ``ttl_us``: the fresh TTL a requeued letter's message gets;
    ``died_before``: only letters that died earlier (epoch microseconds);
    ``target_id``: requeue into this channel of the same topic instead.
    """

    action: DeadAction
    topic: str
    channel_id: int
    ttl_us: int = 0
    died_before: int | None = None
    target_id: int | None = None


def dead_channels(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    topic: str,
    channel: str,
    to_channel: str | None,
) -> tuple[int, int | None]:
    """The ids of a pass's channel and of its target channel (None: none named)."""
    channel_id = existing_channel_id(conn, topic, channel)
    target = None if to_channel is None else existing_channel_id(conn, topic, to_channel)
    return channel_id, target


def oldest_dead(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    channel_id: int,
    chosen: list[int] | None,
    died_before: int | None,
    limit: int,
) -> list[int]:
    """The ids of the ``limit`` dead letters of the channel that died first
    (by died_at, then id), among ``chosen`` if given, in that order."""
    params: dict[str, Any] = {"p_channel": channel_id}
    if died_before is not None:
        params["p_before"] = died_before
    if chosen is None:
        stmt = _sql.OLDEST_DEAD[died_before is not None]
        return [int(r[0]) for r in conn.execute(stmt, {**params, "p_limit": limit})]
    found: list[tuple[int, int]] = []
    for i in range(0, len(chosen), ID_CHUNK):
        rows = conn.execute(_sql._dead_died_in, {**params, "p_ids": chosen[i : i + ID_CHUNK]})
        found += (
            (int(died), int(did))
            for did, died in rows
            if died is not None and (died_before is None or died < died_before)
        )
    return [did for _, did in sorted(found)[:limit]]


#: Ids sent in one IN list by :func:`oldest_dead` (SQLite takes 32,766 parameters).
ID_CHUNK = 1000


def dead_batch(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    work: DeadWork,
    chosen: list[int] | None,
    after: int,
    batch: int,
) -> tuple[int, int, int, Effects]:
    """Lock a chunk of the channel's dead letters (the ``chosen`` delivery ids, or
    the next ``batch`` after id ``after``) and requeue, move or delete them:
    (seen, done, last id seen, effects)."""
    params: dict[str, Any] = {"p_channel": work.channel_id}
    if work.died_before is not None:
        params["p_before"] = work.died_before
    stmt = _sql.DEAD_CHUNKS[(chosen is not None, work.died_before is not None)]
    if chosen is not None:
        rows = conn.execute(stmt, {**params, "p_ids": chosen}).all()
        last = after
    else:
        rows = conn.execute(stmt, {**params, "p_after": after, "p_limit": batch}).all()
        last = int(rows[-1][0]) if rows else after
    tally = Tally()
    if not rows:
        return 0, 0, last, Effects(tally=tally)
    letters = [(int(r[0]), int(r[1])) for r in rows]
    delivery_ids = [did for did, _ in letters]
    if work.action == "delete":
        done = delete_dead_rows(conn, dialect, now, delivery_ids, tally)
        return len(rows), done, last, Effects(tally=tally)
    if work.target_id is not None and work.target_id != work.channel_id:
        done = _move_letters(conn, dialect, now, work, letters, tally)
    else:
        done = int(conn.execute(_sql._revive, {"p_ids": delivery_ids, "p_now": now}).rowcount)
        # Ordered ones join their groups again: at the head, or parked.
        _groups.rejoin(conn, dialect, _groups.members_of(conn, d.c.id.in_(delivery_ids)))
        conn.execute(
            _sql._extend_expiry,
            {"p_ids": sorted({mid for _, mid in letters}), "p_expires": now + work.ttl_us},
        )
        tally.add("requeued", now, {work.channel_id: done})
    if done:
        dialect.notify(conn, work.topic)
    return len(rows), done, last, Effects(tally=tally, wake=(work.topic,) if done else ())


def _move_letters(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    work: DeadWork,
    letters: list[tuple[int, int]],
    tally: Tally,
) -> int:
    """Move locked dead letters ((delivery id, message id)) into the target
    channel: ready now, attempts reset, their delivery ids kept (their place in
    a FIFO channel), the target's filter not asked. A letter whose message
    already has a delivery there is deleted instead (counted purged in its
    channel). Returns how many moved.

    Counters keep ``published == acked + purged + live`` in both channels: a
    letter moved counts ``purged`` in its channel, ``published`` and
    ``requeued`` in the target.
    """
    target = work.target_id
    assert target is not None
    # The latest commit (MySQL: a locking read, which waits for a delete of it).
    found: Any = conn.execute(
        dialect.read_latest(_sql._target_channel), {"p_channel": target}
    ).one_or_none()
    if found is not None and dialect.holds_parents:
        # Held (Dialect.hold_topic): a delete of the target waits for this
        # move, or this move for it, and then finds the target gone.
        held_topic = dialect.hold_topic(conn, int(found[2]))
        found = conn.execute(_sql._target_channel, {"p_channel": target}).one_or_none()
        found = found if held_topic else None
    if found is None:
        raise ChannelNotFound(f"the channel to move dead letters to (id {target}) was deleted")
    ordering, budget = int(found[0]), found[1]
    message_ids = sorted({mid for _, mid in letters})
    conn.execute(_sql._lock_messages, {"p_ids": message_ids})
    held = {
        int(r[0])
        for r in conn.execute(_sql._held_in_channel, {"p_channel": target, "p_ids": message_ids})
    }
    delete_dead_rows(conn, dialect, now, [did for did, mid in letters if mid in held], tally)
    moving = [did for did, mid in letters if mid not in held]
    if not moving:
        return 0
    moved_messages = sorted({mid for _, mid in letters if mid not in held})
    _sql.widen_lanes_for(conn, dialect, channels.c.id == target, moved_messages)
    params = {"p_ids": moving, "p_now": now, "p_target": target, "p_budget": budget}
    done = int(conn.execute(_sql.MOVES[ordering], params).rowcount)
    if ordering != ORDERINGS["standard"]:
        _groups.rejoin(conn, dialect, _groups.members_of(conn, d.c.id.in_(moving)))
    conn.execute(
        _sql._extend_expiry,
        {"p_ids": moved_messages, "p_expires": now + work.ttl_us},
    )
    tally.add("purged", now, {work.channel_id: done})
    tally.add("published", now, {target: done})
    tally.add("requeued", now, {target: done})
    return done


# -- cancel -------------------------------------------------------------------------------


def cancel(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, message_id: int
) -> tuple[int, Effects]:
    """Delete the deliveries of message ``message_id`` never attempted (ready,
    pending or parked, attempts 0): how many, and the purged to count."""
    if conn.execute(_sql._lock_message, {"p_id": message_id}).one_or_none() is None:
        raise MessageNotFound(f"message {message_id} does not exist")
    where = sa.and_(d.c.message_id == message_id, d.c.state == STATE_READY, d.c.attempts == 0)
    members = _groups.members_of(conn, where)
    gone = dialect.delete_deliveries(conn, where)
    _groups.leave(conn, dialect, members)  # a head cancelled: its group moves on
    tally = Tally()
    count_purged(gone, now, tally)
    return len(gone), Effects(tally=tally)


# -- messages -----------------------------------------------------------------------------


def get_message(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, message_id: int
) -> MessageInfo:
    row = conn.execute(_sql._message, {"p_id": message_id}).one_or_none()
    if row is None:
        raise MessageNotFound(f"message {message_id} does not exist")
    return _with_deliveries(conn, now, [row[0]], {row[0]: row[1]}, [row[2:]])[0]


def list_messages(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    topic: str,
    since_us: int | None,
    until_us: int | None,
    page: int,
    after: int,
) -> list[MessageInfo]:
    stmt = (
        sa.select(
            m.c.id,
            m.c.body,
            m.c.headers,
            m.c.published_at,
            m.c.expires_at,
            m.c.group_key,
            m.c.priority,
        )
        .where(m.c.topic_id == _sql._p("p_topic_id", sa.Integer), m.c.id > _sql._p("p_after"))
        .order_by(m.c.id)
        .limit(_sql._p("p_limit", sa.Integer))
    )
    params: dict[str, Any] = {"p_after": after, "p_limit": page}
    if since_us is not None:
        stmt = stmt.where(m.c.published_at >= _sql._p("p_since"))
        params["p_since"] = since_us
    if until_us is not None:
        stmt = stmt.where(m.c.published_at < _sql._p("p_until"))
        params["p_until"] = until_us
    params["p_topic_id"] = existing_topic_id(conn, topic)
    rows = conn.execute(stmt, params).all()
    ids = [int(r[0]) for r in rows]
    return _with_deliveries(conn, now, ids, dict.fromkeys(ids, topic), [r[1:] for r in rows])


def _with_deliveries(
    conn: sa.Connection,
    now: int,
    ids: list[int],
    topic_of: dict[int, str],
    fields: list[Any],
) -> list[MessageInfo]:
    """MessageInfo for messages ``ids`` (fields: body, headers, published, expires,
    group, priority)."""
    if not ids:
        return []
    found: dict[int, list[DeliveryInfo]] = {i: [] for i in ids}
    for message_id, name, state, attempts, error, visible in conn.execute(
        _sql._deliveries_of, {"p_ids": ids}
    ):
        found[int(message_id)].append(
            DeliveryInfo(
                channel=name,
                state=_state(state, visible, now),
                attempts=int(attempts),
                last_error=error,
                visible_at=None
                if state in (STATE_DEAD, STATE_DEFERRED)
                else from_us(visible % PARKED_OFFSET if state == STATE_READY else visible),
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
            group=group,
            priority=int(priority),
        )
        for i, (body, headers, published, expires, group, priority) in zip(ids, fields, strict=True)
    ]


# -- replay -------------------------------------------------------------------------------


def replay(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    message_id: int,
    names: list[str] | None,
    ttl_us: int,
) -> tuple[int, Effects]:
    """Deliver message ``message_id`` again to channels ``names`` (None: all):
    how many deliveries were created, and what to count and wake."""
    row = conn.execute(_sql._lock_message, {"p_id": message_id}).one_or_none()
    if row is None:
        raise MessageNotFound(f"message {message_id} does not exist")
    topic_id, max_attempts = int(row[0]), int(row[1])
    topic = conn.execute(_sql._topic_name, {"p_topic_id": topic_id}).scalar_one()
    channel_ids = _replay_channels(conn, dialect, topic, topic_id, names)
    done = _Replayed(topic)
    wanted = [(message_id, max_attempts, row[2], row[3])]
    _replay_rows(conn, dialect, now, channel_ids, wanted, ttl_us, done)
    return done.created, done.effects()


def replay_range(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    topic: str,
    first: int,
    last: int,
    names: list[str] | None,
    ttl_us: int,
) -> tuple[int, Effects]:
    """:func:`replay` every message of ``topic`` published in ``[first, last)``."""
    topic_id = existing_topic_id(conn, topic)
    channel_ids = _replay_channels(conn, dialect, topic, topic_id, names)
    done = _Replayed(topic)
    pub, last_id = first - 1, 0
    while True:
        rows = conn.execute(
            _sql._range_chunk,
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
            wanted = [(int(r[0]), int(r[1]), r[3], r[4]) for r in rows]
            _replay_rows(conn, dialect, now, channel_ids, wanted, ttl_us, done)
            pub, last_id = int(rows[-1][2]), int(rows[-1][0])
        if len(rows) < REPLAY_CHUNK:
            return done.created, done.effects()


@dataclasses.dataclass
class _Replayed:
    """What a replay did so far: deliveries created, counted, filters that failed."""

    topic: str
    created: int = 0
    tally: Tally = dataclasses.field(default_factory=Tally)
    warnings: list[str] = dataclasses.field(default_factory=list)

    def effects(self) -> Effects:
        return Effects(
            tally=self.tally,
            wake=(self.topic,) if self.created else (),
            warnings=tuple(self.warnings),
        )


#: A channel replayed to: its id, its max_attempts setting, the filter a
#: message must pass (None: every message; naming channels bypasses filters),
#: and its ordering.
ReplayChannel = tuple[int, int | None, str | None, int]


def _replay_channels(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    topic: str,
    topic_id: int,
    names: list[str] | None,
) -> list[ReplayChannel]:
    """The channels to replay to, by id (the topic held until the transaction ends)."""
    if not dialect.hold_topic(conn, topic_id):
        raise TopicGone(topic)
    query = sa.select(
        channels.c.name,
        channels.c.id,
        channels.c.max_attempts,
        channels.c.filter_expr,
        channels.c.ordering,
    ).where(channels.c.topic_id == topic_id)
    if names is not None:
        query = query.where(channels.c.name.in_(names))
    found = {
        name: (int(cid), budget, None if names is not None else expression, int(ordering))
        for name, cid, budget, expression, ordering in conn.execute(query)
    }
    for name in names or ():
        if name not in found:
            raise ChannelNotFound(f"channel {name!r} of topic {topic!r} does not exist")
    return sorted(found.values())


def _replay_rows(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    channel_ids: list[ReplayChannel],
    wanted: list[tuple[int, int, str | None, str | None]],
    ttl_us: int,
    done: _Replayed,
) -> None:
    """Create the missing deliveries of messages ``wanted`` ((id, max_attempts,
    headers, group)) in the channels ``channel_ids`` whose filter takes them,
    at the end of their groups on ordered channels; counted in ``done``."""
    if not channel_ids or not wanted:
        return
    topic = done.topic
    ids = [mid for mid, _, _, _ in wanted]
    live = {(int(a), int(b)) for a, b in conn.execute(_sql._live_pairs, {"p_ids": ids})}

    def taken(expression: str | None, headers: str | None, group: str | None) -> bool:
        if expression is None:
            return True
        verdict = _filters.matches(expression, _validate.decode_headers(headers), group, topic)
        if isinstance(verdict, str):
            done.warnings.append(f"replay to topic {topic}: {verdict}")
        return verdict is True

    rows: list[dict[str, Any]] = [
        {
            "message_id": mid,
            "channel_id": cid,
            "state": STATE_READY,
            "visible_at": now,
            "attempts": 0,
            "max_attempts": attempts if budget is None else budget,
            "group_key": order_key(ordering, group),
        }
        for mid, attempts, headers, group in wanted
        for cid, budget, expression, ordering in channel_ids
        if (mid, cid) not in live and taken(expression, headers, group)
    ]
    if not rows:
        return
    replayed = sorted({row["message_id"] for row in rows})
    conn.execute(_sql._extend_expiry, {"p_ids": replayed, "p_expires": now + ttl_us})
    into = channels.c.id.in_(sorted({row["channel_id"] for row in rows}))
    _sql.widen_lanes_for(conn, dialect, into, replayed)
    insert_deliveries(conn, dialect, rows)
    # Their lane: their message's priority.
    conn.execute(_sql.RESTORE_LANES, {"p_ids": replayed})
    dialect.notify(conn, topic)
    done.tally.add("published", now, Counter(row["channel_id"] for row in rows))
    done.created += len(rows)


# -- prune --------------------------------------------------------------------------------


def topic_ids(conn: sa.Connection, dialect: dialects.Dialect) -> list[int]:
    """Every topic's id, in order."""
    return [int(r[0]) for r in conn.execute(sa.select(topics.c.id).order_by(topics.c.id))]


def prune_count(
    conn: sa.Connection, dialect: dialects.Dialect, topic_ids: list[int], cutoff: int
) -> int:
    """How many messages of ``topic_ids`` were published before ``cutoff``."""
    return sum(
        int(conn.execute(_sql._prune_count, {"p_topic_id": tid, "p_before": cutoff}).scalar_one())
        for tid in topic_ids
    )


def prune_batch(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    topic_id: int,
    cutoff: int,
    batch: int,
) -> Batch:
    """Delete up to ``batch`` messages of ``topic_id`` published before ``cutoff``
    with their deliveries: (seen, deleted, the purged to count)."""
    tally = Tally()
    params = {"p_topic_id": topic_id, "p_before": cutoff, "p_limit": batch}
    ids = [int(r[0]) for r in conn.execute(_sql._prune_batch, params)]
    if not ids:
        return 0, 0, Effects(tally=tally)
    delete_deliveries_of(conn, dialect, now, ids, tally)
    deleted = conn.execute(sa.delete(m).where(m.c.id.in_(ids))).rowcount
    return len(ids), int(deleted), Effects(tally=tally)
