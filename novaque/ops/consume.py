"""Low-level consuming: claim, ack, ack-and-claim, requeue, snooze, reject,
defer, renew, release, claim of deferred deliveries, receive-and-delete.

The settling operations (requeue, snooze, reject, defer, renew) of an
unordered delivery execute exactly one statement, as do claim and ack: a
dialect may run them without BEGIN and COMMIT (``op=`` names in the client's
``_run``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from novaque import _validate, dialects
from novaque._stats import Tally
from novaque._tables import (
    DEFERRED_VISIBLE_AT,
    STATE_DEFERRED,
    STATE_LEASED,
    STATE_READY,
    channels,
    deliveries,
    messages,
)
from novaque._time import from_us
from novaque.dialects.base import core, limited_channel
from novaque.dialects.params import AckClaimParams, ClaimParams, Link
from novaque.models import Message
from novaque.ops import Effects, _groups, _room
from novaque.ops._sql import MESSAGE_LANE, dead_values

d = deliveries

_fenced = (d.c.id == sa.bindparam("p_id"), d.c.lease_token == sa.bindparam("p_token"))


def _put_back(**values: object) -> tuple[sa.Update, sa.Update]:
    """A leased delivery made due again at ``p_visible``: the statement, and the
    same one that changes nothing unless that is before the message expires
    (for an explicit delay)."""
    stmt = (
        sa.update(d)
        .where(*_fenced)
        .values(state=STATE_READY, visible_at=sa.bindparam("p_visible"), lease_token=None, **values)
    )
    expires = sa.select(messages.c.expires_at).where(messages.c.id == d.c.message_id)
    return stmt, stmt.where(expires.scalar_subquery() > sa.bindparam("p_visible"))


_requeue, _requeue_before_expiry = _put_back(last_error=sa.bindparam("p_error"))
# A snooze gives its attempt back and keeps the last error.
_snooze, _snooze_before_expiry = _put_back(attempts=d.c.attempts - 1)
_defer = (
    sa.update(d)
    .where(*_fenced)
    .values(state=STATE_DEFERRED, visible_at=DEFERRED_VISIBLE_AT, lease_token=None, priority=0)
)
_expiry_if_leased = (
    sa.select(messages.c.expires_at)
    .join_from(d, messages, messages.c.id == d.c.message_id)
    .where(*_fenced)
)
_kill = (
    sa.update(d)
    .where(*_fenced)
    .values(
        {
            **dead_values(sa.bindparam("p_reason"), sa.bindparam("p_now")),
            "last_error": sa.func.coalesce(sa.bindparam("p_error", type_=sa.Text), d.c.last_error),
        }
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
_release = (
    sa.update(d)
    .where(
        d.c.id.in_(sa.bindparam("p_ids", expanding=True)),
        d.c.lease_token == sa.bindparam("p_token"),
        d.c.state == STATE_LEASED,
    )
    .values(
        state=STATE_READY,
        visible_at=sa.bindparam("p_now"),
        lease_token=None,
        attempts=d.c.attempts - 1,
    )
)


def counted(field: str, now: int, channel_ids: dict[int, int]) -> Effects:
    tally = Tally()
    tally.add(field, now, channel_ids)
    return Effects(tally=tally)


def claim(
    link: Link, dialect: dialects.Dialect, now: int, p: ClaimParams
) -> tuple[list[dialects.ClaimedRow], int, Effects]:
    """Lease up to ``p.limit`` due deliveries at ``now`` (see
    :class:`ClaimParams`): the rows, ``now``, and the claims to count.

    With an attempt id, the deliveries still leased under that id (by an
    earlier claim that repeats it) are returned instead, with their own
    tokens (``ClaimedRow.token``) and nothing counted; only when there are
    none does it claim, storing the id with the new leases.
    """
    p = p.at(now)
    if p.attempt_id is not None:
        held = _held(core(link), dialect, now, p.channel_id, p.attempt_id)
        if held:
            return held, now, Effects()
    rows = dialect.claim(link, p)
    return rows, now, counted("claimed", now, {p.channel_id: len(rows)} if rows else {})


#: The channel's row, locked by a claim with an attempt id: two claims
#: repeating one id take turns, so they never both claim afresh. FOR NO KEY
#: UPDATE on PostgreSQL: publishes, which only check the row's key, go on; on
#: MySQL/MariaDB the foreign-key check of a publish to the channel waits for
#: these few statements. Claims without an attempt id never take it.
_channel_turn = (
    sa.select(channels.c.lease)
    .where(channels.c.id == sa.bindparam("p_channel"))
    .with_for_update(key_share=True)
)
#: What settling a leased delivery needs, of its row (as ClaimedRow names it).
_LEASE_COLUMNS = (
    d.c.id.label("delivery_id"),
    d.c.message_id,
    d.c.attempts,
    d.c.max_attempts,
    d.c.visible_at.label("until"),
    d.c.group_key.label("order_key"),
    d.c.lease_token.label("token"),
)
#: The leases an attempt id holds on a channel (not expired by the clock).
_held_leases = (
    sa.select(*_LEASE_COLUMNS)
    .where(
        d.c.channel_id == sa.bindparam("p_channel"),
        d.c.state == STATE_LEASED,
        d.c.visible_at > sa.bindparam("p_now"),
        d.c.attempt_id == sa.bindparam("p_attempt_id", type_=d.c.attempt_id.type),
    )
    .order_by(d.c.id)
)


def _held(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, channel_id: int, attempt_id: str
) -> list[dialects.ClaimedRow]:
    """The deliveries leased under ``attempt_id`` on the channel, with their tokens."""
    found = conn.execute(_channel_turn, {"p_channel": channel_id}).one_or_none()
    if found is None:
        return []
    return held_leases(conn, dialect, now, channel_id, attempt_id, found[0])


def held_leases(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    channel_id: int,
    attempt_id: str,
    lease: int | None,
) -> list[dialects.ClaimedRow]:
    """The deliveries leased under ``attempt_id`` on the channel, whose row the
    caller holds (``lease``: the channel's own), with their tokens."""
    params = {"p_channel": channel_id, "p_now": now, "p_attempt_id": attempt_id}
    leases = conn.execute(_held_leases, params).all()
    if not leases:
        return []
    return dialect._with_messages(conn, [{**r._mapping, "channel_lease": lease} for r in leases])


#: Deliveries by id (the primary key alone: no other condition that a planner
#: could prefer an index of the channel's backlog for), with what settling
#: them needs; :func:`leased` keeps those of the channel leased with the token.
_leased_with = (
    sa.select(*_LEASE_COLUMNS, channels.c.lease.label("channel_lease"), d.c.channel_id, d.c.state)
    .join_from(d, channels, channels.c.id == d.c.channel_id)
    .where(d.c.id.in_(sa.bindparam("p_ids", expanding=True)))
)


def leased(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    channel_id: int,
    pairs: Sequence[tuple[int, str]],
) -> list[dialects.ClaimedRow]:
    """The deliveries of ``pairs`` (``(delivery_id, lease_token)``) leased on the
    channel with that token now (expired or not: a lease still current past
    its expiry still settles), without their messages' bodies: what settling
    them by id and token needs. Those not found are not leased with it."""
    tokens = dict(pairs)
    found: list[dialects.ClaimedRow] = []
    for row in conn.execute(_leased_with, {"p_ids": sorted(tokens)}):
        if (
            row.channel_id != channel_id
            or row.state != STATE_LEASED
            or row.token is None
            or row.token != tokens[row.delivery_id]
        ):
            continue
        found.append(
            dialects.ClaimedRow(
                delivery_id=row.delivery_id,
                message_id=row.message_id,
                attempts=row.attempts,
                max_attempts=row.max_attempts,
                body=b"",
                headers=None,
                published_at=0,
                until=row.until,
                channel_lease=row.channel_lease,
                order_key=row.order_key,
                token=row.token,
            )
        )
    return found


def ack_named(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    channel_id: int,
    pairs: Sequence[tuple[int, str]],
) -> tuple[set[int], Effects]:
    """Ack the deliveries of ``pairs`` (``(delivery_id, lease_token)``) leased on
    the channel with that token, in one transaction (:func:`leased`, then
    :func:`ack`): the delivery ids acked, and the acks to count."""
    msgs = messages_of(leased(conn, dialect, channel_id, pairs), "", "", channel_id, "", now)
    lost, effects = ack(conn, dialect, now, msgs)
    gone = {msg.delivery_id for msg in lost}
    return {msg.delivery_id for msg in msgs if msg.delivery_id not in gone}, effects


def ack(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, msgs: Sequence[Message]
) -> tuple[list[Message], Effects]:
    """Delete the deliveries of ``msgs`` still leased with their token: the
    messages whose lease was lost, and the acks to count."""
    pairs = [(msg.delivery_id, msg.lease_token) for msg in msgs]
    if ordered(msgs):
        done = _delete_ordered(conn, dialect, msgs, pairs)
    else:
        done = dialect.delete_leased_pairs(conn, pairs)
    return _settled(msgs, done, now)


def _delete_ordered(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    msgs: Sequence[Message],
    pairs: Sequence[tuple[int, str]],
) -> set[tuple[int, str]]:
    """Delete the leased ``pairs`` of ``msgs`` and move on the groups whose head
    left: the pairs deleted. One statement where the dialect has one
    (PostgreSQL's function), else the DELETE and :func:`_groups.leave`."""
    done = dialect.delete_leased_pairs_moving_groups(conn, pairs)
    if done is None:
        done = dialect.delete_leased_pairs(conn, pairs)
        _groups.leave(conn, dialect, _members(msgs, done), gone=True)
    return done


def ordered(msgs: Sequence[Message]) -> bool:
    """Whether settling ``msgs`` may move a group on: then more than one statement."""
    return any(msg.order_key is not None for msg in msgs)


def _members(msgs: Sequence[Message], done: set[tuple[int, str]]) -> list[_groups.Member]:
    """The ordered deliveries among ``msgs`` that ``done`` settled."""
    return [
        (msg.channel_id, msg.order_key, msg.delivery_id)
        for msg in msgs
        if msg.order_key is not None and (msg.delivery_id, msg.lease_token) in done
    ]


def _settled(
    msgs: Sequence[Message], done: set[tuple[int, str]], now: int
) -> tuple[list[Message], Effects]:
    acked = Counter(msg.channel_id for msg in msgs if (msg.delivery_id, msg.lease_token) in done)
    lost = [msg for msg in msgs if (msg.delivery_id, msg.lease_token) not in done]
    return lost, counted("acked", now, acked)


def claimable_behind(
    conn: sa.Connection, dialect: dialects.Dialect, channel_id: int, since: int
) -> bool:
    """Whether the channel holds a claimable delivery due before ``since`` (a
    claim cursor's; a read without locks, from the first entry of the
    channel's range)."""
    found = conn.execute(
        sa.select(d.c.id)
        .where(
            d.c.channel_id == channel_id,
            d.c.visible_at < since,
            d.c.attempts < d.c.max_attempts,
        )
        .limit(1)
    ).first()
    return found is not None


def ack_and_claim(
    link: Link, dialect: dialects.Dialect, now: int, acks: Sequence[Message], p: ClaimParams
) -> tuple[list[Message], list[dialects.ClaimedRow], int, Effects]:
    """:func:`ack` of ``acks`` and :func:`claim` in one transaction: the acks
    whose lease was lost, the rows claimed, ``now``, and what to count."""
    p = p.at(now)
    pairs = [(msg.delivery_id, msg.lease_token) for msg in acks]
    found = dialect.ack_and_claim(link, AckClaimParams(pairs, p, ordered(acks)))
    if found is None:
        # Ordered acks the dialect leaves to us: the acked heads' groups move
        # on first, so their next deliveries may be claimed at once.
        conn = core(link)
        done = _delete_ordered(conn, dialect, acks, pairs)
        found = done, dialect.claim(conn, p)
    done, rows = found
    return _acked_and_claimed(acks, done, rows, p.channel_id, now)


def _acked_and_claimed(
    acks: Sequence[Message],
    done: set[tuple[int, str]],
    rows: list[dialects.ClaimedRow],
    channel_id: int,
    now: int,
) -> tuple[list[Message], list[dialects.ClaimedRow], int, Effects]:
    lost, effects = _settled(acks, done, now)
    if rows:
        effects.tally.add("claimed", now, {channel_id: len(rows)})
    return lost, rows, now, effects


def messages_of(
    rows: Sequence[dialects.ClaimedRow],
    topic: str,
    channel: str,
    channel_id: int,
    token: str,
    now: int,
) -> list[Message]:
    """The messages of rows claimed at ``now`` with ``token`` (a row's own token,
    if it has one, instead)."""
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
            lease_token=token if row.token is None else row.token,
            lease_expires_at=from_us(row.until),
            channel_id=channel_id,
            group=row.group_key,
            priority=row.priority,
            lease_us=row.until - now,
            channel_lease_us=row.channel_lease,
            order_key=row.order_key,
        )
        for row in rows
    ]


def requeue(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    msg: Message,
    delay_us: int,
    error: str | None,
    within_ttl: bool,
    refund: bool = False,
) -> tuple[bool, Effects]:
    """Make ``msg``'s delivery due again ``delay_us`` from ``now`` (with
    ``within_ttl``, only if that is before the message expires): whether its
    lease was current, and the requeue to count.

    ``refund``: a snooze, which gives the attempt back (``attempts`` as before
    the claim) and keeps the last error (``error`` is not used).
    """
    if refund:
        stmt = _snooze_before_expiry if within_ttl else _snooze
    else:
        stmt = _requeue_before_expiry if within_ttl else _requeue
    result = conn.execute(
        stmt,
        {
            "p_id": msg.delivery_id,
            "p_token": msg.lease_token,
            "p_visible": now + delay_us,
            "p_error": error,
        },
    )
    changed = bool(result.rowcount)
    if changed and msg.order_key is not None:
        _groups.give_back(conn, dialect, [(msg.channel_id, msg.order_key, msg.delivery_id)])
    return changed, counted("requeued", now, {msg.channel_id: 1} if changed else {})


def expiry_if_leased(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, msg: Message
) -> tuple[int | None, int]:
    """The expiry of ``msg`` if its lease is still current (else None), and ``now``."""
    params = {"p_id": msg.delivery_id, "p_token": msg.lease_token}
    return conn.execute(_expiry_if_leased, params).scalar_one_or_none(), now


def kill(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    msg: Message,
    reason: str,
    error: str | None,
) -> tuple[bool, Effects]:
    """Dead-letter ``msg``'s delivery: whether its lease was current, and the
    death to count."""
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
    changed = bool(result.rowcount)
    if changed:
        _left_group(conn, dialect, msg)
    return changed, counted("dead", now, {msg.channel_id: 1} if changed else {})


def defer(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, msg: Message
) -> tuple[bool, Effects]:
    """Set ``msg``'s delivery aside (deferred: out of every claim's range until
    :func:`claim_deferred` names it): whether its lease was current, and the
    effects (nothing counted: the delivery stays live)."""
    result = conn.execute(_defer, {"p_id": msg.delivery_id, "p_token": msg.lease_token})
    changed = bool(result.rowcount)
    if changed:
        _left_group(conn, dialect, msg)
    return changed, Effects()


def _left_group(conn: sa.Connection, dialect: dialects.Dialect, msg: Message) -> None:
    """``msg``'s delivery left its group (dead or deferred): the group moves on."""
    if msg.order_key is not None:
        member = (msg.channel_id, msg.order_key, msg.delivery_id)
        _groups.leave(conn, dialect, [member], gone=True)


_channel_state = sa.select(channels.c.lease, channels.c.paused, limited_channel).where(
    channels.c.id == sa.bindparam("p_channel")
)
_message_group = (
    sa.select(messages.c.group_key)
    .where(messages.c.id == d.c.message_id)
    .correlate(d)
    .scalar_subquery()
)
_deferred_named = (
    sa.select(d.c.id, d.c.message_id, d.c.attempts, d.c.max_attempts, d.c.group_key, _message_group)
    .where(
        d.c.id.in_(sa.bindparam("p_ids", expanding=True)),
        d.c.channel_id == sa.bindparam("p_channel"),
        d.c.state == STATE_DEFERRED,
    )
    .order_by(d.c.id)
    .with_for_update(skip_locked=True)
)
_deferred_of_ids = (
    d.c.id.in_(sa.bindparam("p_ids", expanding=True)),
    d.c.state == STATE_DEFERRED,
)
_lease_deferred = (
    sa.update(d)
    .where(*_deferred_of_ids)
    .values(
        state=STATE_LEASED,
        visible_at=sa.bindparam("p_until"),
        lease_token=sa.bindparam("p_token"),
        attempts=d.c.attempts + 1,
        attempt_id=None,
        priority=MESSAGE_LANE,
    )
)
_bury_deferred = (
    sa.update(d).where(*_deferred_of_ids).values(dead_values("max_attempts", sa.bindparam("p_now")))
)


def claim_deferred(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    channel_id: int,
    delivery_ids: Sequence[int],
    lease_us: int,
    token: str,
    channel_lease: bool = False,
) -> tuple[list[dialects.ClaimedRow], int, Effects]:
    """Lease the deferred deliveries of the channel among ``delivery_ids`` with
    ``token`` (as :func:`claim`; ids that are not are ignored, and a paused
    channel gives nothing): the rows, ``now``, and what to count.

    An ordered one is leased only when nothing of its group is leased and
    nothing below it waits (:func:`_groups.take_turn`): it becomes the head,
    and a later head that waited is parked behind it. One whose attempts are
    spent becomes a dead letter instead (reason ``max_attempts``): no claim
    hands out an attempt beyond the budget.
    """
    setting = conn.execute(_channel_state, {"p_channel": channel_id}).one_or_none()
    if setting is None or setting[1]:
        return [], now, Effects()
    lease = None if setting[0] is None else int(setting[0])
    # A channel with limits: its row taken, what fits counted (ops.limits).
    turn = _room.take_turn(conn, now, channel_id, len(delivery_ids)) if setting[2] else None
    if turn is not None:
        if turn.paused:
            return [], now, Effects()
        lease = turn.lease
    until = now + lease if channel_lease and lease is not None else now + lease_us
    params = {"p_ids": list(delivery_ids), "p_channel": channel_id}
    found = conn.execute(_deferred_named, params).all()
    spent = [int(r[0]) for r in found if r[2] >= r[3]]
    live = [r for r in found if r[2] < r[3]]
    # Groups in (group key, id) order, as every writer of groups locks them.
    chosen = [r for r in live if r[4] is None and (turn is None or turn.admit(r[5]))]
    for row in sorted((r for r in live if r[4] is not None), key=lambda r: (str(r[4]), r[0])):
        if turn is not None and turn.room <= 0:
            break
        if _groups.take_turn(conn, dialect, (channel_id, str(row[4]), int(row[0]))):
            chosen.append(row)
            if turn is not None:
                turn.admit(None)
    if turn is not None:
        _room.count_handed_out(conn, channel_id, turn, len(chosen))
    tally = Tally()
    if spent:
        conn.execute(_bury_deferred, {"p_ids": spent, "p_now": now})
        tally.add("dead", now, {channel_id: len(spent)})
    if not chosen:
        return [], now, Effects(tally=tally)
    ids = sorted(int(r[0]) for r in chosen)
    conn.execute(_lease_deferred, {"p_ids": ids, "p_until": until, "p_token": token})
    leased = [just_leased(r, until, lease, r[4]) for r in chosen]
    tally.add("claimed", now, {channel_id: len(chosen)})
    return dialect._with_messages(conn, leased), now, Effects(tally=tally)


def just_leased(
    row: Sequence[Any], until: int, lease: int | None, order_key: str | None
) -> dict[str, Any]:
    """A delivery this transaction leased (``row``: its id, message id, the
    attempts and the budget it had), as ``Dialect._with_messages`` takes it."""
    return {
        "delivery_id": row[0],
        "message_id": row[1],
        "attempts": row[2] + 1,
        "max_attempts": row[3],
        "until": until,
        "channel_lease": lease,
        "order_key": order_key,
    }


def pop(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, channel_id: int, limit: int
) -> tuple[list[dialects.ClaimedRow], int, Effects]:
    """Receive-and-delete: take up to ``limit`` due deliveries of the channel
    (those :func:`claim` would lease) and delete them, their groups moving on
    as at an ack: the rows, ``now``, and the claims and acks to count."""
    rows = dialect.pop(conn, ClaimParams(channel_id, limit, 0, "", now=now))
    return rows, now, popped(conn, dialect, now, channel_id, rows)


def popped(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    channel_id: int,
    rows: Sequence[dialects.ClaimedRow],
) -> Effects:
    """After a pop deleted ``rows``: their groups move on as at an ack; the
    claims and acks to count."""
    heads = [(channel_id, r.order_key, r.delivery_id) for r in rows if r.order_key is not None]
    if heads:
        _groups.leave(conn, dialect, heads, gone=True)
    taken = {channel_id: len(rows)} if rows else {}
    effects = counted("claimed", now, taken)
    effects.tally.add("acked", now, taken)
    return effects


def renew(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, msg: Message, lease_us: int
) -> int | None:
    """Extend ``msg``'s lease to ``lease_us`` from ``now``: the new expiry, or None
    if the lease is no longer current."""
    until = now + lease_us
    result = conn.execute(
        _renew, {"p_id": msg.delivery_id, "p_token": msg.lease_token, "p_until": until}
    )
    return until if result.rowcount else None


def release(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, msgs: Sequence[Message]
) -> int:
    """Make leased, unstarted deliveries due at once without counting their
    attempt; return how many were still leased. An ordered one yields to a
    delivery of its group that came back below it while it was leased."""
    by_token: dict[str, list[int]] = {}
    for msg in msgs:
        by_token.setdefault(msg.lease_token, []).append(msg.delivery_id)
    released = sum(
        conn.execute(_release, {"p_ids": sorted(ids), "p_token": token, "p_now": now}).rowcount
        for token, ids in sorted(by_token.items())
    )
    ordered_ones = [
        (m.channel_id, m.order_key, m.delivery_id) for m in msgs if m.order_key is not None
    ]
    if released and ordered_ones:
        _groups.give_back(conn, dialect, ordered_ones)
    return released
