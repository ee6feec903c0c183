"""Topics and channels: lookups, creation, deletion, listing."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from novaque import dialects
from novaque._tables import (
    ORDERINGS,
    channels,
    deliveries,
    groups,
    messages,
    minute_stats,
    stats,
    topics,
)
from novaque.errors import ChannelNotFound, InvalidOption, TopicNotFound
from novaque.models import ChannelSettings, Ordering
from novaque.ops import Effects

d = deliveries

_channel_ids = (
    sa.select(channels.c.id)
    .join_from(channels, topics, channels.c.topic_id == topics.c.id)
    .where(topics.c.name == sa.bindparam("p_topic"), channels.c.name == sa.bindparam("p_channel"))
)
_topic_id = sa.select(topics.c.id).where(topics.c.name == sa.bindparam("p_topic"))


def topic_id_in(conn: sa.Connection, dialect: dialects.Dialect, now: int, topic: str) -> int:
    """The id of ``topic`` as ``conn``'s transaction sees the latest commit,
    creating the topic if it does not exist; held until the transaction ends
    (see :meth:`~novaque.dialects.Dialect.hold_topic`)."""
    lookup = dialect.read_held(_topic_id)
    found = conn.execute(lookup, {"p_topic": topic}).scalar_one_or_none()
    if found is None:
        dialect.insert_ignore(conn, topics, {"name": topic, "created_at": now})
        found = conn.execute(lookup, {"p_topic": topic}).scalar_one()
    return int(found)


def existing_topic_id(conn: sa.Connection, topic: str, *, lock: bool = False) -> int:
    """The id of ``topic`` (``lock``: its row locked FOR UPDATE), or TopicNotFound."""
    lookup = _topic_id.with_for_update() if lock else _topic_id
    found = conn.execute(lookup, {"p_topic": topic}).scalar_one_or_none()
    if found is None:
        raise TopicNotFound(f"topic {topic!r} does not exist")
    return int(found)


def existing_channel_id(conn: sa.Connection, topic: str, channel: str) -> int:
    found = conn.execute(
        _channel_ids, {"p_topic": topic, "p_channel": channel}
    ).scalar_one_or_none()
    if found is None:
        existing_topic_id(conn, topic)
        raise ChannelNotFound(f"channel {channel!r} of topic {topic!r} does not exist")
    return int(found)


def ensure_topic(conn: sa.Connection, dialect: dialects.Dialect, now: int, topic: str) -> None:
    topic_id_in(conn, dialect, now, topic)


#: Each setting of ``ensure_channel`` and the column storing it.
SETTING_COLUMNS = {
    "ordering": "ordering",
    "filter": "filter_expr",
    "lease": "lease",
    "max_attempts": "max_attempts",
    "dead_max_age": "dead_max_age",
    "dead_max_count": "dead_max_count",
    "dead_max_bytes": "dead_max_bytes",
    "dead_letter_expired": "dead_letter_expired",
    "max_leased": "max_leased",
    "rate_limit": "rate_count",
    "group_max_leased": "group_max_leased",
}
#: What a setting returned to the client's default stores.
SETTING_DEFAULTS: dict[str, Any] = {"ordering": ORDERINGS["standard"]}
_ORDERING_NAMES: dict[int, Ordering] = {
    code: name  # type: ignore[misc]
    for name, code in ORDERINGS.items()
}


def ensure_channel(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    now: int,
    topic: str,
    channel: str,
    settings: Mapping[str, Any],
) -> None:
    """Create the channel (and its topic) if missing; store ``settings`` (columns
    and their values as stored) over the existing ones.

    A channel that exists already and gets no settings (a consumer starting)
    is only read, without a lock: on a Galera cluster a lock on its row or
    its topic's, taken by consumers starting on several nodes at once, lets
    the nodes abort each other's transactions."""
    if (
        not settings
        and conn.execute(_channel_ids, {"p_topic": topic, "p_channel": channel}).first()
    ):
        return
    topic_id = topic_id_in(conn, dialect, now, topic)
    dialect.insert_ignore(
        conn,
        channels,
        {"topic_id": topic_id, "name": channel, "created_at": now, **settings},
    )
    if settings:
        conn.execute(
            sa.update(channels)
            .where(channels.c.topic_id == topic_id, channels.c.name == channel)
            .values(dict(settings))
        )
        if "ordering" in settings or "group_max_leased" in settings:
            _check_group_limit(conn, topic_id, topic, channel)


def _check_group_limit(conn: sa.Connection, topic_id: int, topic: str, channel: str) -> None:
    """InvalidOption (and so nothing stored) if the channel as it now stands is
    ordered and has a group limit, which only a standard channel may have."""
    found = conn.execute(
        sa.select(channels.c.ordering, channels.c.group_max_leased).where(
            channels.c.topic_id == topic_id, channels.c.name == channel
        )
    ).one()
    if found[0] != ORDERINGS["standard"] and found[1] is not None:
        raise InvalidOption(
            f"channel {topic}/{channel} would be {_ORDERING_NAMES[int(found[0])]} with "
            f"group_max_leased={found[1]}: group_max_leased applies to standard channels only "
            "(an ordered channel leases one delivery of a group at a time already); "
            'reset it in the same call (reset=("group_max_leased",)) to order the channel'
        )


_settings = sa.select(
    channels.c.ordering,
    channels.c.filter_expr,
    channels.c.lease,
    channels.c.max_attempts,
    channels.c.dead_max_age,
    channels.c.dead_max_count,
    channels.c.dead_max_bytes,
    channels.c.dead_letter_expired,
    channels.c.paused,
    channels.c.max_leased,
    channels.c.rate_count,
    channels.c.rate_period,
    channels.c.group_max_leased,
).where(channels.c.id == sa.bindparam("p_channel"))


def _duration(us: int | None) -> timedelta | None:
    return None if us is None else timedelta(microseconds=int(us))


def channel_settings(
    conn: sa.Connection, dialect: dialects.Dialect, topic: str, channel: str
) -> ChannelSettings:
    row = conn.execute(_settings, {"p_channel": existing_channel_id(conn, topic, channel)}).one()
    return ChannelSettings(
        ordering=_ORDERING_NAMES[int(row[0])],
        filter=row[1],
        lease=_duration(row[2]),
        max_attempts=row[3],
        dead_max_age=_duration(row[4]),
        dead_max_count=row[5],
        dead_max_bytes=None if row[6] is None else int(row[6]),
        dead_letter_expired=None if row[7] is None else bool(row[7]),
        paused=bool(row[8]),
        max_leased=row[9],
        rate_limit=None
        if row[10] is None
        else (int(row[10]), timedelta(microseconds=int(row[11]))),
        group_max_leased=row[12],
    )


def set_paused(
    conn: sa.Connection, dialect: dialects.Dialect, topic: str, channel: str, paused: bool
) -> Effects:
    """Pause or resume a channel; resuming wakes its consumers."""
    channel_id = existing_channel_id(conn, topic, channel)
    conn.execute(sa.update(channels).where(channels.c.id == channel_id).values(paused=paused))
    if paused:
        return Effects()
    dialect.notify(conn, topic)
    return Effects(wake=(topic,))


def lock_topic(conn: sa.Connection, topic: str) -> int:
    """The id of ``topic``, its row locked until the transaction ends: what a
    delete does first, so that a publish or replay holding the topic
    (:meth:`~novaque.dialects.Dialect.hold_topic`) commits before anything is
    deleted, or waits and finds what it wrote to gone."""
    return existing_topic_id(conn, topic, lock=True)


def delete_topic(conn: sa.Connection, dialect: dialects.Dialect, topic: str) -> None:
    topic_id = lock_topic(conn, topic)
    channel_ids = sa.select(channels.c.id).where(channels.c.topic_id == topic_id)
    conn.execute(sa.delete(stats).where(stats.c.channel_id.in_(channel_ids)))
    conn.execute(sa.delete(minute_stats).where(minute_stats.c.channel_id.in_(channel_ids)))
    conn.execute(sa.delete(groups).where(groups.c.channel_id.in_(channel_ids)))
    conn.execute(sa.delete(d).where(d.c.channel_id.in_(channel_ids)))
    conn.execute(sa.delete(messages).where(messages.c.topic_id == topic_id))
    conn.execute(sa.delete(channels).where(channels.c.topic_id == topic_id))
    conn.execute(sa.delete(topics).where(topics.c.id == topic_id))


def delete_channel(
    conn: sa.Connection, dialect: dialects.Dialect, topic: str, channel: str
) -> None:
    lock_topic(conn, topic)
    channel_id = existing_channel_id(conn, topic, channel)
    conn.execute(sa.delete(stats).where(stats.c.channel_id == channel_id))
    conn.execute(sa.delete(minute_stats).where(minute_stats.c.channel_id == channel_id))
    conn.execute(sa.delete(groups).where(groups.c.channel_id == channel_id))
    conn.execute(sa.delete(d).where(d.c.channel_id == channel_id))
    conn.execute(sa.delete(channels).where(channels.c.id == channel_id))


def list_topics(conn: sa.Connection, dialect: dialects.Dialect) -> list[str]:
    return [r[0] for r in conn.execute(sa.select(topics.c.name).order_by(topics.c.name))]


def list_channels(conn: sa.Connection, dialect: dialects.Dialect, topic: str) -> list[str]:
    topic_id = existing_topic_id(conn, topic)
    return [
        r[0]
        for r in conn.execute(
            sa.select(channels.c.name)
            .where(channels.c.topic_id == topic_id)
            .order_by(channels.c.name)
        )
    ]


def channels_under(
    conn: sa.Connection, dialect: dialects.Dialect, prefix: str
) -> dict[str, list[str]]:
    """Every topic whose name starts with ``prefix``, sorted, each with its
    channels' names, sorted (none for a topic without channels)."""
    rows = conn.execute(
        sa.select(topics.c.name, channels.c.name)
        .outerjoin_from(topics, channels, channels.c.topic_id == topics.c.id)
        .where(topics.c.name.startswith(prefix, autoescape=True))
        .order_by(topics.c.name, channels.c.name)
    )
    found: dict[str, list[str]] = {}
    for topic, channel in rows:
        if topic.startswith(prefix):  # SQLite's LIKE ignores the case of ASCII letters
            names = found.setdefault(topic, [])
            if channel is not None:
                names.append(channel)
    return found


def channel_id(conn: sa.Connection, dialect: dialects.Dialect, topic: str, channel: str) -> int:
    return existing_channel_id(conn, topic, channel)
