"""Maintenance: the lease reaper, TTL purge, dead-letter retention, stats flush and prune."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import date
from typing import Any

import sqlalchemy as sa

from novaque import dialects
from novaque._stats import MINUTE_US, Tally
from novaque._tables import (
    COUNTER_COLUMNS,
    DEAD_VISIBLE_AT,
    FAR_PAST,
    STATE_DEAD,
    STATE_LEASED,
    STATE_READY,
    channels,
    deliveries,
    messages,
    minute_stats,
    stats,
)
from novaque._time import day_of
from novaque.ops import Batch, Effects, _groups, _sql

d = deliveries


#: What a flush writes: rows of the day table, rows of the minute table.
StatsRows = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def stats_rows(deltas: dict[tuple[int, int], Any], only: str | None = None) -> StatsRows:
    """Rows for :meth:`Dialect.upsert_stats`, per (channel, UTC day) and per
    (channel, UTC minute): ``deltas`` maps (channel, minute since the epoch) to
    the counter values in :data:`COUNTER_COLUMNS` order, or, with ``only``, to
    the count of that one counter."""
    days: dict[tuple[int, date], list[int]] = {}
    minutes = []
    for (channel_id, minute), values in sorted(deltas.items()):
        counts = (
            list(values) if only is None else [values if c == only else 0 for c in COUNTER_COLUMNS]
        )
        minutes.append(
            {"channel_id": channel_id, "minute": minute * MINUTE_US}
            | dict(zip(COUNTER_COLUMNS, counts, strict=True))
        )
        bucket = days.setdefault((channel_id, day_of(minute * MINUTE_US)), [0] * len(counts))
        for i, count in enumerate(counts):
            bucket[i] += count
    day_rows = [
        {"channel_id": channel_id, "day": day} | dict(zip(COUNTER_COLUMNS, counts, strict=True))
        for (channel_id, day), counts in days.items()
    ]
    return day_rows, minutes


def count_purged(channel_ids: list[int], now: int, tally: Tally) -> None:
    """Count deleted deliveries (one channel id each) as purged in ``tally``."""
    if channel_ids:
        tally.add("purged", now, Counter(channel_ids))


def delete_deliveries_of(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    message_ids: list[int],
    tally: Tally,
    spare: sa.ColumnElement[bool] | None = None,
) -> None:
    """Delete every delivery of messages ``message_ids`` (but those matching
    ``spare``), counted as purged in ``tally``; the groups whose heads went
    move on."""
    where: sa.ColumnElement[bool] = d.c.message_id.in_(message_ids)
    if spare is not None:
        where = sa.and_(where, sa.not_(spare))
    members = _groups.members_of(conn, where)
    count_purged(dialect.delete_deliveries(conn, where), now, tally)
    _groups.leave(conn, dialect, members)


def delete_dead_rows(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, delivery_ids: list[int], tally: Tally
) -> int:
    """Delete the dead ones of deliveries ``delivery_ids``, counted as purged in
    ``tally``; return how many."""
    if not delivery_ids:
        return 0
    purged = dialect.delete_deliveries(
        conn, sa.and_(d.c.id.in_(delivery_ids), d.c.state == STATE_DEAD)
    )
    count_purged(purged, now, tally)
    return len(purged)


# -- the lease reaper -------------------------------------------------------------------


def reap_batch(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, batch: int, since: int | None = None
) -> Batch:
    """Release up to ``batch`` expired leases (dead-letter those out of attempts),
    those expired after ``since`` (None: whenever): how many expired leases
    were found, how many deliveries changed, and the deaths to count."""
    expired = conn.execute(
        sa.select(d.c.id, d.c.channel_id, d.c.attempts >= d.c.max_attempts, d.c.group_key)
        .join_from(
            channels,
            d,
            sa.and_(
                d.c.channel_id == channels.c.id,
                d.c.state == STATE_LEASED,
                d.c.visible_at >= (FAR_PAST if since is None else since),
                d.c.visible_at <= now,
            ),
        )
        .order_by(d.c.id)
        .limit(batch)
    ).all()
    groups: dict[tuple[int, bool], list[int]] = {}
    dying: list[_groups.Member] = []
    for delivery_id, channel_id, spent, key in expired:
        groups.setdefault((int(channel_id), bool(spent)), []).append(int(delivery_id))
        if spent and key is not None:
            dying.append((int(channel_id), str(key), int(delivery_id)))
    leased_expired = sa.and_(d.c.state == STATE_LEASED, d.c.visible_at <= now)
    dead: Counter[int] = Counter()
    changed = 0
    for (channel_id, spent), ids in sorted(groups.items()):
        if spent:
            values: dict[str, Any] = {
                **_sql.dead_values("max_attempts", now),
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
    _groups.leave(conn, dialect, dying)  # dead heads: their groups move on
    tally = Tally()
    tally.add("dead", now, dead)
    return len(expired), changed, Effects(tally=tally)


# -- TTL purge --------------------------------------------------------------------------


def purge_batch(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    batch: int,
    *,
    dead_letter_expired: bool,
    default_ttl_us: int,
) -> Batch:
    """Delete up to ``batch`` messages past their TTL with their deliveries: how
    many messages were seen and how many deleted, and the deliveries to count.

    On channels whose ``dead_letter_expired`` setting (None: the client's
    ``dead_letter_expired``) is true, a live delivery (ready, pending, parked,
    leased, deferred) becomes a dead letter with reason ``"expired"`` instead
    (counted ``dead``), and its message is kept ``default_ttl_us`` longer: the
    next purge after that takes it with its letters. Dead letters, and the live
    deliveries of the other channels, are deleted (counted ``purged``).
    """
    tally = Tally()
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
        return 0, 0, Effects(tally=tally)
    # Dead letters on expiry: the live deliveries of the batch in channels that
    # keep them are locked (in id order) before anything else is deleted, so
    # that none of them changes state meanwhile and "live in such a channel"
    # spares exactly those rows from the delete.
    dying = [
        int(r[0]) for r in conn.execute(_sql.DYING_CHANNELS[dead_letter_expired], {"p_ids": ids})
    ]
    expiring = (
        conn.execute(_sql._expiring, {"p_ids": ids, "p_channels": dying}).all() if dying else []
    )
    spare = sa.and_(d.c.channel_id.in_(dying), d.c.state != STATE_DEAD) if expiring else None
    delete_deliveries_of(conn, dialect, now, ids, tally, spare)
    kept = _bury_expired(conn, dialect, now, expiring, tally)
    if kept:
        params = {"p_ids": sorted(kept), "p_expires": now + default_ttl_us}
        conn.execute(_sql._keep_messages, params)
    gone = [i for i in ids if i not in kept]
    if gone:
        conn.execute(sa.delete(messages).where(messages.c.id.in_(gone)))
    return len(ids), len(gone), Effects(tally=tally)


#: Deliveries made dead letters per statement (bounds the statement's parameters).
BURY_CHUNK = 1000


def _bury_expired(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    rows: Sequence[Any],
    tally: Tally,
) -> set[int]:
    """Make the locked live deliveries ``rows`` (id, channel id, message id,
    group key) of expired messages dead letters with reason ``"expired"``,
    counted ``dead``; return the ids of their messages (to keep)."""
    if not rows:
        return set()
    died = [int(r[0]) for r in rows]
    for i in range(0, len(died), BURY_CHUNK):
        conn.execute(_sql._die_expired, {"p_ids": died[i : i + BURY_CHUNK], "p_now": now})
    tally.add("dead", now, Counter(int(r[1]) for r in rows))
    # Heads that died: their groups move on (parked ones that died wait no
    # more, so the next head is a live one).
    _groups.leave(
        conn, dialect, [(int(r[1]), str(r[3]), int(r[0])) for r in rows if r[3] is not None]
    )
    return {int(r[2]) for r in rows}


# -- dead-letter retention --------------------------------------------------------------


def dead_bounds(
    conn: sa.Connection, dialect: dialects.Dialect, only_bounded: bool
) -> list[tuple[int, int | None, int | None, int | None]]:
    """(channel id, dead_max_age, dead_max_count, dead_max_bytes) of every
    channel; with ``only_bounded``, only of those with a bound of their own."""
    bounds = (channels.c.dead_max_age, channels.c.dead_max_count, channels.c.dead_max_bytes)
    query = sa.select(channels.c.id, *bounds).order_by(channels.c.id)
    if only_bounded:
        query = query.where(sa.or_(*(bound.is_not(None) for bound in bounds)))
    return [
        (int(r[0]), _int_or_none(r[1]), _int_or_none(r[2]), _int_or_none(r[3]))
        for r in conn.execute(query)
    ]


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def retire_older_batch(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    channel_id: int,
    max_age_us: int,
    batch: int,
) -> Batch:
    """Delete up to ``batch`` dead letters that died over ``max_age_us`` ago: how
    many were found, how many deleted, and the purged to count."""
    params = {"p_channel": channel_id, "p_cutoff": now - max_age_us, "p_limit": batch}
    found = [int(r[0]) for r in conn.execute(_sql._dead_older_than, params)]
    tally = Tally()
    return len(found), delete_dead_rows(conn, dialect, now, found, tally), Effects(tally=tally)


def dead_boundary(
    conn: sa.Connection, dialect: dialects.Dialect, channel_id: int, keep: int
) -> tuple[int, int] | None:
    """(died_at, id) of the oldest letter kept (older ones go); None: within bounds."""
    dead = int(conn.execute(_sql._dead_count, {"p_channel": channel_id}).scalar_one())
    if dead <= keep:
        return None
    if keep == 0:
        return DEAD_VISIBLE_AT, 0  # beyond every real died_at: delete them all
    row = conn.execute(
        _sql._dead_boundary, {"p_channel": channel_id, "p_offset": keep - 1}
    ).one_or_none()
    return None if row is None else (int(row[0]), int(row[1]))


def dead_bytes_boundary(
    conn: sa.Connection, dialect: dialects.Dialect, channel_id: int, max_bytes: int
) -> tuple[int, int] | None:
    """(died_at, id) of the oldest letter kept under a bound of ``max_bytes`` body
    bytes (the newest that fit; older ones go); None: within bounds.

    One sum of the channel's dead bytes first; over the bound, one pass over
    its dead letters, newest died first, with a running total."""
    params = {"p_channel": channel_id, "p_max": max_bytes}
    total = int(conn.execute(_sql._dead_bytes, params).scalar_one())
    if total <= max_bytes:
        return None
    row = conn.execute(_sql._dead_bytes_boundary, params).one_or_none()
    if row is None:
        return DEAD_VISIBLE_AT, 0  # not even the newest fits: delete them all
    return int(row[0]), int(row[1])


def retire_beyond_batch(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    channel_id: int,
    edge: tuple[int, int],
    batch: int,
) -> Batch:
    """Delete up to ``batch`` dead letters older than ``edge`` (see
    :func:`dead_boundary`): how many were found, how many deleted, and the
    purged to count."""
    died, last_id = edge
    params = {"p_channel": channel_id, "p_died": died, "p_id": last_id, "p_limit": batch}
    found = [int(r[0]) for r in conn.execute(_sql._dead_beyond, params)]
    tally = Tally()
    return len(found), delete_dead_rows(conn, dialect, now, found, tally), Effects(tally=tally)


# -- counters ---------------------------------------------------------------------------


def flush_stats(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    day_rows: list[dict[str, Any]],
    minute_rows: list[dict[str, Any]],
) -> None:
    """Add counter rows (see :func:`stats_rows`) to the day and the minute
    tables; those of channels deleted since are dropped with them."""
    alive = {
        int(r[0])
        for r in conn.execute(
            sa.select(channels.c.id).where(
                channels.c.id.in_({row["channel_id"] for row in day_rows})
            )
        )
    }
    kept = [row for row in day_rows if row["channel_id"] in alive]
    if kept:
        dialect.upsert_stats(conn, kept)
        dialect.upsert_stats(
            conn, [row for row in minute_rows if row["channel_id"] in alive], minute_stats
        )


def prune_stats(
    conn: sa.Connection, dialect: dialects.Dialect, first_kept: date, first_minute_kept: int
) -> int:
    """Delete the day buckets before ``first_kept`` and the minute buckets
    before ``first_minute_kept`` (epoch microseconds); return how many day
    buckets went."""
    conn.execute(sa.delete(minute_stats).where(minute_stats.c.minute < first_minute_kept))
    result: int = conn.execute(sa.delete(stats).where(stats.c.day < first_kept)).rowcount
    return result


# -- space ------------------------------------------------------------------------------


def space(conn: sa.Connection, dialect: dialects.Dialect) -> dialects.FileSpace:
    """The database file's size and free space (where the dialect
    ``keeps_free_pages``)."""
    return dialect.space(conn)


def return_free_pages(conn: sa.Connection, dialect: dialects.Dialect) -> int:
    """Give a bounded number of the database file's free pages back to the
    file system (where the dialect ``keeps_free_pages``); how many bytes the
    database shrank by."""
    return dialect.return_free_pages(conn)
