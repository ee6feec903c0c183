"""Low-level consuming: claim, ack, ack-and-claim, requeue, reject, renew, release.

The settling operations (requeue, reject, renew) execute exactly one
statement, as do claim and ack: a dialect may run them without BEGIN and
COMMIT (``op=`` names in the client's ``_run``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import sqlalchemy as sa

from novaque import _validate, dialects
from novaque._stats import Tally
from novaque._time import from_us
from novaque.models import Message
from novaque.ops import Effects, _groups
from novaque.schema import (
    DEAD_VISIBLE_AT,
    STATE_DEAD,
    STATE_LEASED,
    STATE_READY,
    deliveries,
    messages,
)

d = deliveries

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


def _counted(field: str, now: int, channel_ids: dict[int, int]) -> Effects:
    tally = Tally()
    tally.add(field, now, channel_ids)
    return Effects(tally=tally)


def claim(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    channel_id: int,
    limit: int,
    lease_us: int,
    token: str,
    channel_lease: bool = False,
) -> tuple[list[dialects.ClaimedRow], int, Effects]:
    """Lease up to ``limit`` due deliveries with ``token`` for ``lease_us`` (with
    ``channel_lease``, for the channel's own lease if it has one): the rows,
    ``now``, and the claims to count."""
    rows = dialect.claim(conn, channel_id, limit, now, now + lease_us, token, channel_lease)
    return rows, now, _counted("claimed", now, {channel_id: len(rows)} if rows else {})


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
    left: the pairs deleted. Two statements where the dialect locks the
    groups' rows in its DELETE (PostgreSQL), else the DELETE and
    :func:`_groups.leave`."""
    locked = dialect.delete_leased_pairs_locking_heads(conn, pairs)
    if locked is None:
        done = dialect.delete_leased_pairs(conn, pairs)
        _groups.leave(conn, dialect, _members(msgs, done), gone=True)
        return done
    done, heads = locked
    _groups.move_on(conn, dialect, heads, {delivery_id for delivery_id, _ in done})
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
    return lost, _counted("acked", now, acked)


def ack_and_claim(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    acks: Sequence[Message],
    channel_id: int,
    limit: int,
    lease_us: int,
    token: str,
    channel_lease: bool = False,
) -> tuple[list[Message], list[dialects.ClaimedRow], int, Effects]:
    """:func:`ack` and :func:`claim` in one transaction: the acks whose lease was
    lost, the rows claimed, ``now``, and what to count."""
    pairs = [(msg.delivery_id, msg.lease_token) for msg in acks]
    until = now + lease_us
    if ordered(acks):
        # The acked heads' groups move on first: their next deliveries may
        # be claimed at once.
        done = _delete_ordered(conn, dialect, acks, pairs)
        rows = dialect.claim(conn, channel_id, limit, now, until, token, channel_lease)
    else:
        done, rows = dialect.ack_and_claim(
            conn, pairs, channel_id, limit, now, until, token, channel_lease
        )
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
    """The messages of rows claimed at ``now``."""
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
            lease_expires_at=from_us(row.until),
            channel_id=channel_id,
            group=row.group,
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
) -> tuple[bool, Effects]:
    """Make ``msg``'s delivery due again ``delay_us`` from ``now`` (with
    ``within_ttl``, only if that is before the message expires): whether its
    lease was current, and the requeue to count."""
    result = conn.execute(
        _requeue_before_expiry if within_ttl else _requeue,
        {
            "p_id": msg.delivery_id,
            "p_token": msg.lease_token,
            "p_visible": now + delay_us,
            "p_error": error,
        },
    )
    changed = bool(result.rowcount)
    return changed, _counted("requeued", now, {msg.channel_id: 1} if changed else {})


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
    if changed and msg.order_key is not None:
        member = (msg.channel_id, msg.order_key, msg.delivery_id)
        _groups.leave(conn, dialect, [member], gone=True)
    return changed, _counted("dead", now, {msg.channel_id: 1} if changed else {})


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
    attempt; return how many were still leased."""
    by_token: dict[str, list[int]] = {}
    for msg in msgs:
        by_token.setdefault(msg.lease_token, []).append(msg.delivery_id)
    return sum(
        conn.execute(_release, {"p_ids": sorted(ids), "p_token": token, "p_now": now}).rowcount
        for token, ids in sorted(by_token.items())
    )
