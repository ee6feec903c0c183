"""The room a limited channel has for one claim: its row taken, its limits
read, what is leased counted (see :mod:`novaque.ops.limits`).

Shared by the limited claims (:mod:`novaque.ops.limits`) and the claim of
deferred deliveries (:func:`novaque.ops.consume.claim_deferred`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from novaque._tables import STATE_LEASED, channels, deliveries, messages

__all__ = ["Turn", "count_handed_out", "take_turn"]

d = deliveries
m = messages

#: The channel's row, locked until the transaction ends, with its limits: a
#: limited channel's claims take turns, each counting what the one before it
#: committed. FOR NO KEY UPDATE on PostgreSQL: publishes, which only check
#: the row's key, go on (on MySQL/MariaDB their foreign-key check waits for
#: these few statements; SQLite's write transaction serializes every writer).
_channel_locked = (
    sa.select(
        channels.c.max_leased,
        channels.c.rate_count,
        channels.c.rate_period,
        channels.c.group_max_leased,
        channels.c.rate_window,
        channels.c.rate_used,
        channels.c.lease,
        channels.c.paused,
    )
    .where(channels.c.id == sa.bindparam("p_channel"))
    .with_for_update(key_share=True)
)
#: The channel's deliveries leased now, an expired lease not yet reaped
#: included (an index range of ``(channel_id, state, visible_at)``).
_leased = sa.select(sa.func.count()).where(
    d.c.channel_id == sa.bindparam("p_channel"), d.c.state == STATE_LEASED
)
#: The same, by the group of their message (None: without a group).
_leased_by_group = (
    sa.select(m.c.group_key, sa.func.count())
    .join_from(d, m, m.c.id == d.c.message_id)
    .where(d.c.channel_id == sa.bindparam("p_channel"), d.c.state == STATE_LEASED)
    .group_by(m.c.group_key)
)
#: What the rate window handed out, once a claim took some.
_count_window = (
    sa.update(channels)
    .where(channels.c.id == sa.bindparam("p_channel"))
    .values(rate_window=sa.bindparam("p_window"), rate_used=sa.bindparam("p_used"))
)


@dataclass
class Turn:
    """A claim's turn on a channel whose row it holds: how many deliveries it
    may still take (``room``), and what left none, if a limit did."""

    #: Whether the channel has any limit, and whether it is paused.
    limited: bool
    paused: bool
    #: The channel's own lease (microseconds; None: none).
    lease: int | None
    #: How many the claim may still take.
    room: int
    #: The channel's limits (None: none).
    max_leased: int | None = None
    rate_count: int | None = None
    group_max_leased: int | None = None
    #: The rate window (its start, its end, what it handed out before this claim).
    window: int = 0
    window_end: int = 0
    used: int = 0
    #: Leased deliveries per group (with a group limit), as this claim goes.
    groups: dict[str, int] = field(default_factory=dict)
    #: How many deliveries this claim passed over because their group was full.
    passed_over: int = 0
    #: What ran out: "max_leased", "rate_limit", or None.
    spent: str | None = None

    def admit(self, group: str | None) -> bool:
        """Whether a delivery of ``group`` fits; if so, it is counted taken."""
        if self.room <= 0:
            return False
        if group is not None and self.group_max_leased is not None:
            held = self.groups.get(group, 0)
            if held >= self.group_max_leased:
                self.passed_over += 1
                return False
            self.groups[group] = held + 1
        self.room -= 1
        return True

    @property
    def by_group(self) -> bool:
        """Whether the claim must pick group by group (a group limit)."""
        return self.group_max_leased is not None


def take_turn(conn: sa.Connection, now: int, channel_id: int, asked: int) -> Turn | None:
    """Take the channel's row (until the transaction ends) and work out how
    many of ``asked`` deliveries fit its limits at ``now``: min(asked,
    max_leased - leased, rate_count - handed out in the current window);
    None if the channel is gone."""
    row = conn.execute(_channel_locked, {"p_channel": channel_id}).one_or_none()
    if row is None:
        return None
    max_leased, rate_count, rate_period, group_max, rate_window, rate_used, lease, paused = row
    turn = Turn(
        limited=max_leased is not None or rate_count is not None or group_max is not None,
        paused=bool(paused),
        lease=None if lease is None else int(lease),
        room=0 if paused else asked,
        max_leased=max_leased,
        rate_count=rate_count,
        group_max_leased=group_max,
    )
    if turn.paused or not turn.limited:
        return turn
    params = {"p_channel": channel_id}
    if group_max is not None:
        counts = {key: int(n) for key, n in conn.execute(_leased_by_group, params)}
        leased = sum(counts.values())
        counts.pop(None, None)
        turn.groups = counts
    elif max_leased is not None:
        leased = int(conn.execute(_leased, params).scalar_one())
    if max_leased is not None and max_leased - leased < turn.room:
        turn.room = max(0, max_leased - leased)
        turn.spent = "max_leased" if turn.room == 0 else None
    if rate_count is not None:
        period = int(rate_period)
        turn.window = now - now % period
        turn.window_end = turn.window + period
        # What the stored window handed out counts when it began in this one
        # (a window of the same period, or of a shorter one before the period
        # changed); an older one counts nothing.
        if rate_window is not None and int(rate_window) >= turn.window:
            turn.used = int(rate_used or 0)
        left = max(0, rate_count - turn.used)
        if left < turn.room:
            turn.room = left
            if left == 0:
                turn.spent = "rate_limit"
    return turn


def count_handed_out(conn: sa.Connection, channel_id: int, turn: Turn, taken: int) -> None:
    """Count ``taken`` deliveries handed out in the turn's rate window."""
    if turn.rate_count is not None and taken:
        conn.execute(
            _count_window,
            {"p_channel": channel_id, "p_window": turn.window, "p_used": turn.used + taken},
        )
