"""Claims from a channel with limits: ``max_leased``, ``rate_limit``,
``group_max_leased``.

Every other claim takes nothing from a channel with a limit: the claim
statements refuse it as they refuse a paused channel
(:data:`novaque.dialects.base.limited_channel`), unless the claim says it
holds the channel's row (``ClaimParams.held``). The claims here do: in one
transaction each takes the channel's row (:func:`novaque.ops._room.take_turn`:
FOR NO KEY UPDATE / FOR UPDATE, SQLite's write transaction), so the claims of
a limited channel count and lease one at a time across every process and
host, then reads the limits, counts what is leased and takes what fits:

    room = min(asked, max_leased - leased, rate_count - handed out in the window)

``leased``: the channel's deliveries in the leased state, an expired lease
not yet reaped included. The rate window is ``period`` long and aligned to
the Unix epoch; what it handed out is counted on the channel's row
(``rate_window``, ``rate_used``) by these claims, so from the moment the
channel has a limit: deliveries handed out earlier in the window, while it
had none, are not counted.

The deliveries are taken by the dialect's own claim or pop (priority lanes,
lowest first, oldest due first, SKIP LOCKED), told that the row is held.
With a group limit a claim picks instead (:func:`_pick_by_group`): the due
deliveries lane by lane, oldest due first, passing over those whose
message's group has ``group_max_leased`` leased (counting what the claim
takes); its cost is one count of the channel's leased deliveries by group
(a read of each leased delivery's message) and the deliveries it passes
over, at most :data:`PASS_OVER_MAX` per claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from novaque import dialects
from novaque._channel_limits import Hold
from novaque._tables import STATE_LEASED, channels, deliveries, messages
from novaque.dialects.base import core, limited_channel
from novaque.dialects.params import ClaimParams, Link
from novaque.models import Message
from novaque.ops import Effects, _room, consume

__all__ = ["PASS_OVER_MAX", "Seen", "ack_and_claim", "claim", "is_limited", "pop"]

d = deliveries
m = messages

#: Most due deliveries of full groups one claim passes over (beyond them it
#: takes what it found: the rest wait for the next claim).
PASS_OVER_MAX = 10_000


@dataclass(frozen=True, slots=True)
class Seen:
    """What a limited claim saw of its channel: whether it has a limit, and
    what held the claim back (None: nothing did)."""

    limited: bool
    hold: Hold | None = None


#: The claim's rows, its time, its effects, and what it saw.
Claimed = tuple[list[dialects.ClaimedRow], int, Effects, Seen]

_limited = sa.select(limited_channel).where(channels.c.id == sa.bindparam("p_channel"))


def is_limited(conn: sa.Connection, dialect: dialects.Dialect, channel_id: int) -> bool:
    """Whether the channel has a limit now (False if it is gone)."""
    return bool(conn.execute(_limited, {"p_channel": channel_id}).scalar())


def claim(link: Link, dialect: dialects.Dialect, now: int, p: ClaimParams) -> Claimed:
    """Lease what fits the channel's limits of ``p.limit`` due deliveries at
    ``now`` (see the module docstring; ``p`` as for
    :func:`novaque.ops.consume.claim`, and a repeated attempt id returns
    what it holds, not counted)."""
    conn = core(link)
    p = p.at(now)
    turn = _room.take_turn(conn, now, p.channel_id, p.limit)
    if turn is None:
        return [], now, Effects(), Seen(False)
    if p.attempt_id is not None:
        held = consume.held_leases(conn, dialect, now, p.channel_id, p.attempt_id, turn.lease)
        if held:
            return held, now, Effects(), Seen(turn.limited)
    rows = _take(conn, dialect, now, p, turn, pop=False)
    _room.count_handed_out(conn, p.channel_id, turn, len(rows))
    effects = consume.counted("claimed", now, {p.channel_id: len(rows)} if rows else {})
    return rows, now, effects, _seen(turn, rows)


def pop(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, channel_id: int, limit: int
) -> Claimed:
    """:func:`novaque.ops.consume.pop` of what fits the channel's limits (a pop
    leases nothing: it takes at most ``max_leased`` minus what is leased)."""
    p = ClaimParams(channel_id, limit, 0, "", now=now)
    turn = _room.take_turn(conn, now, channel_id, limit)
    if turn is None:
        return [], now, Effects(), Seen(False)
    rows = _take(conn, dialect, now, p, turn, pop=True)
    _room.count_handed_out(conn, channel_id, turn, len(rows))
    return rows, now, consume.popped(conn, dialect, now, channel_id, rows), _seen(turn, rows)


def ack_and_claim(
    link: Link, dialect: dialects.Dialect, now: int, acks: Sequence[Message], p: ClaimParams
) -> tuple[list[Message], Claimed]:
    """:func:`novaque.ops.consume.ack` of ``acks``, then :func:`claim`, in one
    transaction (the acked deliveries leave room before the claim counts)."""
    conn = core(link)
    lost, effects = consume.ack(conn, dialect, now, acks)
    rows, now, _, seen = claim(conn, dialect, now, p)  # (its claims counted here, with the acks)
    if rows:
        effects.tally.add("claimed", now, {p.channel_id: len(rows)})
    return lost, (rows, now, effects, seen)


def _seen(turn: _room.Turn, rows: list[dialects.ClaimedRow]) -> Seen:
    if rows or not turn.limited:
        return Seen(turn.limited)
    if turn.spent == "rate_limit":
        return Seen(True, Hold(turn.window_end))
    if turn.spent == "max_leased" or turn.passed_over:
        return Seen(True, Hold())
    return Seen(True)


def _take(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    p: ClaimParams,
    turn: _room.Turn,
    *,
    pop: bool,
) -> list[dialects.ClaimedRow]:
    """Lease (or with ``pop`` delete) what the turn has room for."""
    if turn.room <= 0:
        return []
    if not turn.by_group:
        held = ClaimParams(
            p.channel_id, turn.room, p.lease_us, p.token, p.channel_lease, p.attempt_id, now, True
        )
        return dialect.pop(conn, held) if pop else dialect.claim(conn, held)
    picked = _pick_by_group(conn, now, p.channel_id, turn)
    if not picked:
        return []
    ids = [int(r[0]) for r in picked]
    if pop:
        until, lease = now, None
        conn.execute(sa.delete(d).where(d.c.id.in_(ids)))
    else:
        lease = turn.lease
        until = now + lease if p.channel_lease and lease is not None else p.until
        conn.execute(
            sa.update(d)
            .where(d.c.id.in_(ids))
            .values(
                state=STATE_LEASED,
                visible_at=until,
                lease_token=p.token,
                attempts=d.c.attempts + 1,
                attempt_id=p.attempt_id,
            )
        )
    leased = [consume.just_leased(r, until, lease, None) for r in picked]
    return dialect._with_messages(conn, leased)


#: The lowest lane of the channel above ``p_after`` (one probe of the claim index).
_lane_above = sa.select(sa.func.min(d.c.priority)).where(
    d.c.channel_id == sa.bindparam("p_channel"), d.c.priority > sa.bindparam("p_after")
)
#: Due deliveries of one lane after ``(p_from_at, p_from_id)``, oldest due
#: first, with their message's group (an index range of the claim index).
_due_in_lane = (
    sa.select(
        d.c.id,
        d.c.visible_at,
        sa.select(m.c.group_key)
        .where(m.c.id == d.c.message_id)
        .correlate(d)
        .scalar_subquery()
        .label("group_key"),
    )
    .where(
        d.c.channel_id == sa.bindparam("p_channel"),
        d.c.priority == sa.bindparam("p_lane"),
        d.c.visible_at >= sa.bindparam("p_from_at"),
        d.c.visible_at <= sa.bindparam("p_now"),
        sa.or_(d.c.visible_at > sa.bindparam("p_from_at"), d.c.id > sa.bindparam("p_from_id")),
        d.c.attempts < d.c.max_attempts,
    )
    .order_by(d.c.visible_at, d.c.id)
    .limit(sa.bindparam("p_limit"))
)
#: The deliveries picked, locked, that are still due (skipping those another
#: transaction holds: an expired lease being settled by its holder).
_lock_picked = (
    sa.select(d.c.id, d.c.message_id, d.c.attempts, d.c.max_attempts)
    .where(
        d.c.id.in_(sa.bindparam("p_ids", expanding=True)),
        d.c.visible_at <= sa.bindparam("p_now"),
        d.c.attempts < d.c.max_attempts,
    )
    .order_by(d.c.id)
    .with_for_update(skip_locked=True)
)


def _pick_by_group(
    conn: sa.Connection, now: int, channel_id: int, turn: _room.Turn
) -> list[tuple[Any, ...]]:
    """Due deliveries of the channel that fit the turn (its room, its groups'
    counts), lane by lane and oldest due first, locked (see the module
    docstring): id, message id, attempts and attempt budget of each."""
    chosen: list[int] = []
    lane = conn.execute(_lane_above, {"p_channel": channel_id, "p_after": -(2**15)}).scalar()
    while lane is not None and turn.room > 0 and turn.passed_over < PASS_OVER_MAX:
        params = {"p_channel": channel_id, "p_lane": lane, "p_now": now}
        from_at, from_id = -(2**62), 0
        while turn.room > 0 and turn.passed_over < PASS_OVER_MAX:
            batch = min(turn.room + turn.passed_over + 16, 1000)
            found = conn.execute(
                _due_in_lane,
                {**params, "p_from_at": from_at, "p_from_id": from_id, "p_limit": batch},
            ).all()
            for row in found:
                if turn.admit(row[2]):
                    chosen.append(int(row[0]))
                    if turn.room <= 0:
                        break
            if len(found) < batch:
                break
            from_at, from_id = int(found[-1][1]), int(found[-1][0])
        lane = conn.execute(_lane_above, {"p_channel": channel_id, "p_after": lane}).scalar()
    if not chosen:
        return []
    return [tuple(r) for r in conn.execute(_lock_picked, {"p_ids": chosen, "p_now": now})]
