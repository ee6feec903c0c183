"""Consumers online: each running consumer's row in ``novaque_consumers``.

A consumer registers at start (:func:`register`), its client refreshes the
rows of all its running consumers on a timer of its own (:func:`beat`: one
transaction, one UPDATE per consumer), and shutdown deletes the row
(:func:`leave`); maintenance deletes the rows of processes that died
(:func:`forget_stale`). Nothing here runs per claim.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from novaque import dialects
from novaque._tables import consumers
from novaque._time import from_us
from novaque.models import ConsumerInfo

__all__ = ["beat", "forget_stale", "leave", "list_consumers", "register"]

c = consumers

_beat = (
    sa.update(c)
    .where(c.c.id == sa.bindparam("p_id"))
    .values(heartbeat_at=sa.bindparam("p_now"), in_flight=sa.bindparam("p_in_flight"))
)
_leave = sa.delete(c).where(c.c.id == sa.bindparam("p_id"))
_stale = sa.delete(c).where(c.c.heartbeat_at < sa.bindparam("p_before"))
_listed = sa.select(
    c.c.host,
    c.c.pid,
    c.c.topic,
    c.c.channel,
    c.c.max_in_flight,
    c.c.in_flight,
    c.c.started_at,
    c.c.heartbeat_at,
).order_by(c.c.topic, c.c.channel, c.c.started_at, c.c.id)


def register(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    *,
    host: str,
    pid: int,
    topic: str,
    channel: str,
    max_in_flight: int,
    in_flight: int,
) -> int:
    """Insert a consumer's row (started and last seen ``now``); return its id."""
    result = conn.execute(
        sa.insert(c).values(
            host=host,
            pid=pid,
            topic=topic,
            channel=channel,
            max_in_flight=max_in_flight,
            in_flight=in_flight,
            started_at=now,
            heartbeat_at=now,
        )
    )
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def beat(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, rows: Sequence[tuple[int, int]]
) -> list[int]:
    """Mark the consumers of ``rows`` (id, in_flight) seen ``now``; return the
    ids whose row is gone (dropped by maintenance while the process stalled:
    the caller registers them again)."""
    gone = []
    for consumer_id, in_flight in rows:
        params = {"p_id": consumer_id, "p_now": now, "p_in_flight": in_flight}
        if conn.execute(_beat, params).rowcount == 0:
            gone.append(consumer_id)
    return gone


def leave(conn: sa.Connection, dialect: dialects.Dialect, consumer_id: int) -> None:
    """Delete a consumer's row (at its shutdown)."""
    conn.execute(_leave, {"p_id": consumer_id})


def forget_stale(conn: sa.Connection, dialect: dialects.Dialect, before: int) -> int:
    """Delete the rows last seen before ``before`` (a range of
    ``ix_novaque_consumers_heartbeat_at``); return how many."""
    deleted: int = conn.execute(_stale, {"p_before": before}).rowcount
    return deleted


def list_consumers(
    conn: sa.Connection, dialect: dialects.Dialect, topic: str | None, channel: str | None
) -> list[ConsumerInfo]:
    """The rows of running consumers, by topic, channel and start."""
    stmt = _listed
    if topic is not None:
        stmt = stmt.where(c.c.topic == topic)
    if channel is not None:
        stmt = stmt.where(c.c.channel == channel)
    return [
        ConsumerInfo(
            host=str(row[0]),
            pid=int(row[1]),
            topic=str(row[2]),
            channel=str(row[3]),
            max_in_flight=int(row[4]),
            in_flight=int(row[5]),
            started_at=from_us(int(row[6])),
            heartbeat_at=from_us(int(row[7])),
        )
        for row in conn.execute(stmt)
    ]
