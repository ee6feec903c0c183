"""Schedules: defining, reading, pausing and firing recurring publishes.

A fire is published by the normal publish operation
(:func:`novaque.ops.publish.publish`) in the same transaction that moves the
schedule's ``next_fire_at`` past it, on the schedule's row locked (skipped
when another transaction holds it; SQLite's write lock serialises instead)
and found due again once locked: a fire is published exactly once across
every process, and a transaction that fails publishes nothing and moves
nothing.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any, cast

import sqlalchemy as sa

from novaque import _fires, _validate, dialects
from novaque._tables import schedules
from novaque._time import from_us
from novaque.errors import ScheduleNotFound
from novaque.models import ScheduleInfo
from novaque.ops import Effects
from novaque.ops import publish as publish_op
from novaque.ops.topology import topic_id_in

__all__ = [
    "FIRE_AT_HEADER",
    "SCHEDULE_HEADER",
    "Definition",
    "define",
    "due_names",
    "fire",
    "get",
    "list_all",
    "set_paused",
    "undefine",
]

#: The headers of a fire's message: the schedule's name, and the fire's
#: scheduled time (aware UTC ``datetime.isoformat()``).
SCHEDULE_HEADER = "novaque-schedule"
FIRE_AT_HEADER = "novaque-fire-at"

s = schedules.c


@dataclasses.dataclass(frozen=True)
class Definition:
    """What ``schedule()`` stores, validated: the row's definition columns."""

    name: str
    topic: str
    body: bytes
    headers: str | None
    timing: _fires.Timing
    ttl_us: int | None
    max_attempts: int | None
    catch_up: str
    priority: int = 0


def fire_headers(headers: str | None, name: str, fire_at: int) -> str | None:
    """The stored headers of a fire's message: the schedule's, with
    :data:`SCHEDULE_HEADER` and :data:`FIRE_AT_HEADER` set (replacing the
    user's of those names)."""
    merged = _validate.decode_headers(headers)
    merged[SCHEDULE_HEADER] = name
    merged[FIRE_AT_HEADER] = from_us(fire_at).isoformat()
    return _validate.headers(merged)


def _info(row: Any) -> ScheduleInfo:
    return ScheduleInfo(
        name=row.name,
        topic=row.topic,
        cron=row.cron,
        every=None if row.every_us is None else timedelta(microseconds=row.every_us),
        timezone=row.timezone,
        next_fire_at=from_us(row.next_fire_at),
        last_fire_at=None if row.last_fire_at is None else from_us(row.last_fire_at),
        paused=bool(row.paused),
        catch_up=row.catch_up,
        priority=int(row.priority),
    )


_INFO_COLUMNS = (
    s.name,
    s.topic,
    s.cron,
    s.every_us,
    s.timezone,
    s.next_fire_at,
    s.last_fire_at,
    s.paused,
    s.catch_up,
    s.priority,
)
_get = sa.select(*_INFO_COLUMNS).where(s.name == sa.bindparam("p_name"))
_list = sa.select(*_INFO_COLUMNS).order_by(s.name)


def define(
    conn: sa.Connection, dialect: dialects.Dialect, now: int, definition: Definition
) -> ScheduleInfo:
    """Create the schedule ``definition.name`` or replace its definition,
    keeping ``paused`` and ``last_fire_at``; its next fire is computed from
    ``now``. The topic is created if missing."""
    topic_id_in(conn, dialect, now, definition.topic)
    timing = definition.timing
    values = {
        "topic": definition.topic,
        "body": definition.body,
        "headers": definition.headers,
        "cron": timing.cron,
        "every_us": timing.every_us,
        "timezone": timing.timezone,
        "ttl_us": definition.ttl_us,
        "max_attempts": definition.max_attempts,
        "catch_up": definition.catch_up,
        "priority": definition.priority,
        "next_fire_at": timing.first_after(now),
    }
    dialect.insert_ignore(
        conn, schedules, {"name": definition.name, **values, "last_fire_at": None, "paused": False}
    )
    conn.execute(schedules.update().where(s.name == definition.name).values(**values))
    return get(conn, dialect, definition.name)


def get(conn: sa.Connection, dialect: dialects.Dialect, name: str) -> ScheduleInfo:
    """The schedule ``name``, or :class:`~novaque.ScheduleNotFound`."""
    row = conn.execute(_get, {"p_name": name}).one_or_none()
    if row is None:
        raise ScheduleNotFound(name)
    return _info(row)


def list_all(conn: sa.Connection, dialect: dialects.Dialect) -> list[ScheduleInfo]:
    """Every schedule, by name."""
    return [_info(row) for row in conn.execute(_list)]


def undefine(conn: sa.Connection, dialect: dialects.Dialect, name: str) -> bool:
    """Delete the schedule ``name``; whether it existed."""
    return conn.execute(schedules.delete().where(s.name == name)).rowcount > 0


def set_paused(
    conn: sa.Connection, dialect: dialects.Dialect, name: str, paused: bool
) -> ScheduleInfo:
    """Pause or resume the schedule ``name`` (:class:`~novaque.ScheduleNotFound`)."""
    conn.execute(schedules.update().where(s.name == name).values(paused=paused))
    return get(conn, dialect, name)


def due_names(conn: sa.Connection, dialect: dialects.Dialect, now: int) -> list[str]:
    """The schedules due at ``now`` and not paused, the most overdue first."""
    query = (
        sa.select(s.name)
        .where(s.next_fire_at <= now, s.paused == sa.false())
        .order_by(s.next_fire_at, s.name)
    )
    return [str(name) for name in conn.execute(query).scalars()]


def earliest_fire(conn: sa.Connection, dialect: dialects.Dialect) -> int | None:
    """The earliest next fire of the schedules not paused (None: none)."""
    query = sa.select(sa.func.min(s.next_fire_at)).where(s.paused == sa.false())
    found = conn.execute(query).scalar_one_or_none()
    return None if found is None else int(found)


_lock_due = (
    sa.select(schedules)
    .where(
        s.name == sa.bindparam("p_name"),
        s.next_fire_at <= sa.bindparam("p_now"),
        s.paused == sa.false(),
    )
    .with_for_update(skip_locked=True)
)


def fire(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    name: str,
    *,
    default_ttl_us: int,
    default_max_attempts: int,
) -> tuple[int, tuple[Effects, ...]]:
    """Publish the due fires of the schedule ``name`` by its catch-up rule and
    move its ``next_fire_at`` past them; how many fires it published, and the
    effects of their publishes. Nothing when another transaction holds the
    schedule or it is no longer due (fired by another process, paused)."""
    row = conn.execute(_lock_due, {"p_name": name, "p_now": now}).one_or_none()
    if row is None:
        return 0, ()
    timing = _fires.Timing(row.cron, row.every_us, row.timezone)
    fires, next_fire_at = _fires.due_fires(timing, row.next_fire_at, now, row.catch_up)
    ttl_us = default_ttl_us if row.ttl_us is None else row.ttl_us
    attempts = default_max_attempts if row.max_attempts is None else row.max_attempts
    effects: list[Effects] = []
    for fire_at in fires:
        done = publish_op.publish(
            conn,
            dialect,
            now,
            topic=row.topic,
            topic_id=None,
            bodies=[bytes(row.body)],
            dedup_keys=[None],
            headers=fire_headers(row.headers, name, fire_at),
            ttl_us=ttl_us,
            delay_us=0,
            max_attempts=attempts,
            groups=[None],
            priority=int(row.priority),
        )
        effects.append(done.effects(cast("str", row.topic)))
    moved: dict[str, Any] = {"next_fire_at": next_fire_at}
    if fires:
        moved["last_fire_at"] = fires[-1]
    conn.execute(schedules.update().where(s.name == name).values(**moved))
    return len(fires), tuple(effects)
