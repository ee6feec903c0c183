"""Group FIFO bookkeeping: who heads each group of an ordered channel.

A delivery of an ordered channel has a group key there (its message's group on
a ``group_fifo`` channel, ``""`` on a ``strict_fifo`` one). Of the live
deliveries of one (channel, group), only the head is in the claim's range;
the others are *parked*: ready, with :data:`~novaque._tables.PARKED_OFFSET`
added to their ``visible_at``, beyond every claim (the claim stays one index
range, whatever the number of waiting deliveries or blocked groups). The head
is recorded in ``novaque_groups``, whose row every writer of the group locks:

- :func:`enter`, :func:`rejoin`, :func:`take_turn`: a delivery joins its
  group (publish, replay, requeue or move of a dead letter, claim of a
  deferred one): it becomes the head if the group has none, or if it comes
  before the head (a lower delivery id) and the head waits (is not leased):
  that head is parked behind it. Else it is parked;
- :func:`give_back`: a head given back (requeued, snoozed, released) yields to
  the lowest delivery parked below it, one that came back while it was
  leased (a leased head keeps its lease and its turn until then);
- :func:`leave`: deliveries left (acked, dead, deleted): where one was the
  head, the group's lowest parked delivery is unparked and becomes the head
  (or the group's row goes when it has none).

Rows are locked in (channel id, group key) order, so writers of many groups
never deadlock each other. Each function runs in its caller's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from novaque import dialects
from novaque._tables import PARKED_OFFSET, STATE_DEAD, STATE_READY, deliveries, groups

d = deliveries

#: A delivery of an ordered channel: (channel id, group key, delivery id).
Member = tuple[int, str, int]

_parked = sa.and_(d.c.state == STATE_READY, d.c.visible_at >= PARKED_OFFSET)
_unpark = (
    sa.update(d)
    .where(d.c.id == sa.bindparam("p_id"), _parked)
    .values(visible_at=d.c.visible_at - PARKED_OFFSET)
)
_park = (
    sa.update(d)
    .where(
        d.c.id == sa.bindparam("p_id"),
        d.c.state == STATE_READY,
        d.c.visible_at < PARKED_OFFSET,
    )
    .values(visible_at=d.c.visible_at + PARKED_OFFSET)
)
_of_groups = sa.and_(
    groups.c.channel_id == sa.bindparam("p_channel"),
    groups.c.group_key.in_(sa.bindparam("p_keys", expanding=True)),
)
_heads = (
    sa.select(groups.c.group_key, groups.c.head_id)
    .where(_of_groups)
    .order_by(groups.c.group_key)
    .with_for_update()
)
_drop_groups = sa.delete(groups).where(_of_groups)
_g = groups.alias("g")


def _next_in(channel: sa.ColumnElement[Any], key: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """A group's next delivery: its lowest parked one, read in id order on
    ix_novaque_deliveries_group (past the group's dead letters and its head),
    named to MySQL/MariaDB, whose stale statistics would pick the claim index.
    "+ 0" keeps planners off ix_novaque_deliveries_state, whose parked range
    holds every group of the channel."""
    return dialects.on_index(
        sa.select(d.c.id)
        .where(
            d.c.channel_id == channel,
            d.c.group_key == key,
            d.c.state + 0 == STATE_READY,
            d.c.visible_at + 0 >= PARKED_OFFSET,
        )
        .order_by(d.c.id)
        .limit(1),
        d,
        "ix_novaque_deliveries_group",
    )


#: The next delivery of each group named (``p_channel``, ``p_keys``).
_nexts = sa.select(
    _g.c.group_key,
    _next_in(_g.c.channel_id, _g.c.group_key).correlate(_g).scalar_subquery(),
).where(
    _g.c.channel_id == sa.bindparam("p_channel"),
    _g.c.group_key.in_(sa.bindparam("p_keys", expanding=True)),
)
#: Each group named its next delivery as head: one statement whatever the
#: groups (a CASE over their keys was a new statement per batch to build, and
#: to compile for each number of keys). Only for groups that have a next one.
_next_as_head = (
    sa.update(groups)
    .where(_of_groups)
    .values(head_id=_next_in(groups.c.channel_id, groups.c.group_key).scalar_subquery())
)
#: The same for one group, as the plan test reads it.
_next = _next_in(sa.bindparam("p_channel"), sa.bindparam("p_key"))
_unpark_many = (
    sa.update(d)
    .where(d.c.id.in_(sa.bindparam("p_ids", expanding=True)), _parked)
    .values(visible_at=d.c.visible_at - PARKED_OFFSET)
)
_live_ids = sa.select(d.c.id).where(
    d.c.id.in_(sa.bindparam("p_ids", expanding=True)), d.c.state != STATE_DEAD
)
#: A head that waits (ready, in the claim's range): not leased.
_waiting = sa.select(d.c.id).where(
    d.c.id == sa.bindparam("p_id"),
    d.c.state == STATE_READY,
    d.c.visible_at < PARKED_OFFSET,
)
#: The lowest parked delivery of a group below ``p_below``.
_next_below = _next_in(sa.bindparam("p_channel"), sa.bindparam("p_key")).where(
    d.c.id < sa.bindparam("p_below")
)
_new_head = (
    sa.update(groups)
    .where(
        groups.c.channel_id == sa.bindparam("p_channel"),
        groups.c.group_key == sa.bindparam("p_key"),
    )
    .values(head_id=sa.bindparam("p_head"))
)


def park(conn: sa.Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Park the ordered ones of delivery rows about to be inserted (in place)."""
    for row in rows:
        if row.get("group_key") is not None:
            row["visible_at"] += PARKED_OFFSET


def take_turn(conn: sa.Connection, dialect: dialects.Dialect, member: Member) -> bool:
    """Lock the group of ``member``, a delivery that joins it, and say whether
    it heads the group now: it starts the group, or it comes before the head
    (a lower delivery id) and the head waits, which is then parked behind it
    (its due time kept). A leased head keeps its lease and its turn; a lower
    one parked meanwhile follows it (:func:`leave`, :func:`give_back`).

    The caller unparks (or leases) the delivery when it heads the group, and
    else keeps it parked (or out of the claim's range).
    """
    channel_id, key, delivery_id = member
    head = dialect.lock_group(conn, channel_id, key, delivery_id)
    if head <= delivery_id:
        return head == delivery_id
    # A plain read first: a head that a settler holds is leased (its ack or
    # death waits for this group's lock), and waiting for its row would
    # deadlock where the database waits even for a row the update skips.
    if conn.execute(_waiting, {"p_id": head}).first() is None:
        return False
    if not conn.execute(_park, {"p_id": head}).rowcount:
        return False  # leased meanwhile, by a claim that held its row
    conn.execute(_new_head, {"p_channel": channel_id, "p_key": key, "p_head": delivery_id})
    return True


def enter(conn: sa.Connection, dialect: dialects.Dialect, members: Iterable[Member]) -> None:
    """Parked deliveries join their groups: the lowest of each group becomes its
    head (unparked) if the group has none, or if it comes before the head and
    the head waits (:func:`take_turn`: a publish whose delivery got a lower
    id than the one that started the group meanwhile)."""
    lowest: dict[tuple[int, str], int] = {}
    for channel_id, key, delivery_id in members:
        known = lowest.get((channel_id, key))
        if known is None or delivery_id < known:
            lowest[(channel_id, key)] = delivery_id
    for (channel_id, key), delivery_id in sorted(lowest.items()):
        if take_turn(conn, dialect, (channel_id, key, delivery_id)):
            conn.execute(_unpark, {"p_id": delivery_id})


def rejoin(conn: sa.Connection, dialect: dialects.Dialect, members: Iterable[Member]) -> None:
    """Ready deliveries (a requeued or moved dead letter) join their groups at
    their place (their delivery id): each becomes its group's head if the
    group has none, or if it comes before the head and the head waits
    (:func:`take_turn`); else it is parked."""
    for member in sorted(members):
        if not take_turn(conn, dialect, member):
            conn.execute(_park, {"p_id": member[2]})


def give_back(conn: sa.Connection, dialect: dialects.Dialect, members: Iterable[Member]) -> None:
    """Leased deliveries given back (requeued, snoozed, released: ready again,
    still their groups' heads): each yields its turn to the lowest delivery
    of its group parked below it (one that came back while it was leased),
    and waits, parked, behind it. Safe to call for deliveries that were not
    given back (a lease lost meanwhile): only a head that waits moves, and
    no group's row is made."""
    candidates: dict[int, dict[str, set[int]]] = {}
    for channel_id, key, delivery_id in members:
        candidates.setdefault(channel_id, {}).setdefault(key, set()).add(delivery_id)
    for channel_id, by_key in sorted(candidates.items()):
        locked = conn.execute(_heads, {"p_channel": channel_id, "p_keys": sorted(by_key)})
        for key, head in locked.all():
            if int(head) not in by_key[str(key)]:
                continue
            params = {"p_channel": channel_id, "p_key": key, "p_below": head}
            lower = conn.execute(_next_below, params).scalar_one_or_none()
            if lower is None or not conn.execute(_park, {"p_id": head}).rowcount:
                continue
            conn.execute(_unpark, {"p_id": int(lower)})
            conn.execute(_new_head, {"p_channel": channel_id, "p_key": key, "p_head": lower})


def leave(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    members: Iterable[Member],
    *,
    gone: bool = False,
) -> None:
    """Deliveries that may have left (acked, dead, deleted): a group whose head
    is gone gets its next one. Safe to call for deliveries that did not leave;
    ``gone``: this transaction saw them leave (their ack or death changed the
    row), so a head among them is not looked for again.

    A handful of statements per channel, whatever the number of groups: lock
    the groups' rows, read their next deliveries (a statement of its own, so it
    sees what a publisher that held a lock meanwhile committed), then move the
    heads, unpark them and drop the groups left empty.
    """
    candidates: dict[int, dict[str, set[int]]] = {}
    for channel_id, key, delivery_id in members:
        candidates.setdefault(channel_id, {}).setdefault(key, set()).add(delivery_id)
    for channel_id, by_key in sorted(candidates.items()):
        where = {"p_channel": channel_id, "p_keys": sorted(by_key)}
        heads = {
            str(key): int(head)
            for key, head in conn.execute(_heads, where)
            if int(head) in by_key[str(key)]
        }
        if heads and not gone:
            live = {int(r[0]) for r in conn.execute(_live_ids, {"p_ids": sorted(heads.values())})}
            # A head still there (its ack lost its lease, say) stays.
            heads = {key: head for key, head in heads.items() if head not in live}
        if not heads:
            continue
        _move(conn, dialect, channel_id, heads)


def _move(
    conn: sa.Connection, dialect: dialects.Dialect, channel_id: int, heads: dict[str, int]
) -> None:
    """Groups of a channel, their rows locked and their heads gone: each gets its
    next delivery as head (unparked), or its row goes if it has none."""
    if dialect.move_heads(conn, channel_id, sorted(heads)):
        return
    where = {"p_channel": channel_id, "p_keys": sorted(heads)}
    following = {str(key): nxt for key, nxt in conn.execute(_nexts, where)}
    moved = {key: int(nxt) for key, nxt in following.items() if nxt is not None}
    empty = sorted(key for key in heads if key not in moved)
    if moved:
        # The same next ones as just read: the groups' rows are locked, and only
        # a writer holding a group's lock adds to its parked deliveries.
        conn.execute(_next_as_head, {"p_channel": channel_id, "p_keys": sorted(moved)})
        conn.execute(_unpark_many, {"p_ids": sorted(moved.values())})
    if empty:
        conn.execute(_drop_groups, {"p_channel": channel_id, "p_keys": empty})


def members_of(conn: sa.Connection, where: sa.ColumnElement[bool]) -> list[Member]:
    """The ordered, live deliveries matching ``where`` (before they are deleted)."""
    return [
        (int(r[0]), str(r[1]), int(r[2]))
        for r in conn.execute(
            sa.select(d.c.channel_id, d.c.group_key, d.c.id).where(
                where, d.c.group_key.is_not(None), d.c.state != STATE_DEAD
            )
        )
    ]
