"""What the admin shows, read from the client and shaped as plain JSON-able dicts.

Both the HTML pages and the JSON API are built from these functions, so the
two always agree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, fields
from datetime import date, datetime, timedelta, timezone
from typing import Any, get_args

from novaque._validate import MAX_ID
from novaque.admin._http import HTTPError
from novaque.client import Client
from novaque.errors import ChannelNotFound, TopicNotFound
from novaque.models import (
    Backlog,
    ConsumerInfo,
    Counters,
    DeadLetter,
    DeliveryInfo,
    DeliveryState,
    MessageInfo,
    ScheduleInfo,
)

#: Characters of a body shown in lists; the message page shows more.
PREVIEW_BYTES = 200
DETAIL_PREVIEW_BYTES = 16 * 1024
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
#: Minutes in the live chart ("last hour, per minute"), the current one included.
LIVE_MINUTES = 60

_INT = re.compile(r"[0-9]{1,19}")

#: The states of a live delivery, each a count of ``Backlog``, in the order the
#: admin, the CLI and the metrics list them.
STATES: tuple[DeliveryState, ...] = get_args(DeliveryState)
#: The delivery counters, in ``Counters``' order.
COUNTERS: tuple[str, ...] = tuple(f.name for f in fields(Counters))


def today(client: Client) -> date:
    """Today's UTC date as the client sees it (its injected clock, if any)."""
    return now(client).date()


def now(client: Client) -> datetime:
    """The time as the client sees it (its injected clock, if any), aware UTC."""
    clock = client.options.clock
    moment = clock() if clock is not None else datetime.now(timezone.utc)
    return moment.astimezone(timezone.utc)


def ready_age(b: Backlog, at: datetime) -> float | None:
    """How long the oldest ready delivery has waited at ``at``, in seconds (None:
    nothing is ready)."""
    oldest = b.oldest_ready_at
    return None if oldest is None else max(0.0, (at - oldest).total_seconds())


def retention_start(client: Client) -> date:
    """The first day whose counters are still kept."""
    return today(client) - timedelta(days=client.options.stats_retention_days - 1)


# -- parsing request values ------------------------------------------------------------


def parse_id(text: object, what: str = "id") -> int:
    """A positive integer id from a path segment or JSON value, else 400."""
    if isinstance(text, bool):
        raise HTTPError(400, f"{what} must be a positive integer, got {text!r}")
    if isinstance(text, int):
        value = text
    elif isinstance(text, str) and _INT.fullmatch(text):
        value = int(text)
    else:
        shown = text if not isinstance(text, str) or len(text) <= 40 else text[:37] + "..."
        raise HTTPError(400, f"{what} must be a positive integer, got {shown!r}")
    if value < 1:
        raise HTTPError(400, f"{what} must be a positive integer, got {value}")
    if value > MAX_ID:  # JSON has already refused integers of over 4300 digits
        raise HTTPError(
            400,
            f"{what} must be a positive integer of at most {MAX_ID} (64 bits), "
            f"got one of {len(str(value))} digits",
        )
    return value


def parse_ids(value: object) -> list[int]:
    """A non-empty JSON list of delivery ids, else 400."""
    if not isinstance(value, list) or not value:
        raise HTTPError(400, "ids must be a non-empty list of positive integers")
    return [parse_id(item, "each id") for item in value]


def parse_limit(text: str | None, default: int = PAGE_SIZE) -> int:
    if text in (None, ""):
        return default
    value = parse_id(text, "limit")
    if value > MAX_PAGE_SIZE:
        raise HTTPError(400, f"limit must be at most {MAX_PAGE_SIZE}, got {value}")
    return value


def parse_date(text: str | None, what: str) -> date | None:
    """``YYYY-MM-DD`` (UTC day) or None when empty."""
    if text in (None, ""):
        return None
    assert text is not None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise HTTPError(400, f"{what} must be a date like 2024-05-31, got {text[:40]!r}") from None


def parse_datetime(value: object, what: str) -> datetime | None:
    """An ISO 8601 time (naive means UTC) or None when empty."""
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise HTTPError(400, f"{what} must be an ISO 8601 time string, got {value!r}")
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise HTTPError(
            400, f"{what} must be an ISO 8601 time like 2024-05-31T12:00, got {value[:40]!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def parse_channels(value: object) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise HTTPError(400, "channels must be a list of channel names (or null for all)")
    return list(value)


# -- shaping results ---------------------------------------------------------------------


def iso(moment: datetime | date | None) -> str | None:
    return None if moment is None else moment.isoformat()


def preview(body: bytes, limit: int = PREVIEW_BYTES) -> dict[str, Any]:
    """The first ``limit`` bytes of a body as text (undecodable bytes escaped)."""
    head = body[:limit]
    text = head.decode("utf-8", errors="backslashreplace")
    return {"body_preview": text, "body_len": len(body), "body_truncated": len(body) > limit}


def counters(c: Counters) -> dict[str, int]:
    return asdict(c)


def backlog(b: Backlog) -> dict[str, Any]:
    """A backlog as JSON: its count per state (:data:`STATES`' order), and
    ``oldest_ready_at`` in ISO 8601 (None when nothing is ready)."""
    found: dict[str, Any] = {state: getattr(b, state) for state in STATES}
    found["oldest_ready_at"] = iso(b.oldest_ready_at)
    return found


def count_of(result: object) -> int | None:
    """How many things an operation touched, whatever shape it reports it in."""
    if isinstance(result, bool) or result is None:
        return None
    if isinstance(result, int):
        return result
    if isinstance(result, Sequence) and not isinstance(result, (str, bytes)):
        return len(result)
    return None


def settings(client: Client, topic: str, channel: str) -> dict[str, Any]:
    """A channel's settings as JSON: durations in seconds, None for the defaults
    (for a limit: no limit); ``rate_limit`` as ``{"count", "period"}``."""
    got = client.channel_settings(topic, channel)
    return {
        "ordering": got.ordering,
        "filter": got.filter,
        "paused": got.paused,
        "lease": None if got.lease is None else got.lease.total_seconds(),
        "max_attempts": got.max_attempts,
        "dead_max_age": None if got.dead_max_age is None else got.dead_max_age.total_seconds(),
        "dead_max_count": got.dead_max_count,
        "dead_max_bytes": got.dead_max_bytes,
        "dead_letter_expired": got.dead_letter_expired,
        "max_leased": got.max_leased,
        "rate_limit": None
        if got.rate_limit is None
        else {"count": got.rate_limit[0], "period": got.rate_limit[1].total_seconds()},
        "group_max_leased": got.group_max_leased,
    }


#: The settings that are limits: None is no limit (no client default applies).
LIMITS = ("max_leased", "rate_limit", "group_max_leased")


def defaults(client: Client) -> dict[str, Any]:
    """What a channel's settings that are None fall back to: this client's
    ``Options``, shaped as :func:`settings` (a claim that names its own lease, or
    a publish its own ``max_attempts``, uses that instead)."""
    options = client.options
    age = options.dead_max_age
    return {
        "lease": seconds_of(options.default_lease),
        "max_attempts": options.default_max_attempts,
        "dead_max_age": None if age is None else seconds_of(age),
        "dead_max_count": options.dead_max_count,
        "dead_max_bytes": options.dead_max_bytes,
        "dead_letter_expired": options.dead_letter_expired,
    }


def channel_summary(
    client: Client, topic: str, channel: str, day: date, online: int = 0
) -> dict[str, Any]:
    found = client.channel_backlog(topic, channel)
    return {
        "name": channel,
        "settings": settings(client, topic, channel),
        "backlog": backlog(found),
        "oldest_ready_age": ready_age(found, now(client)),
        "today": counters(client.channel_counters(topic, channel, since=day, until=day)),
        "consumers": online,
    }


def topic_summary(client: Client, topic: str, day: date) -> dict[str, Any]:
    names = client.list_channels(topic)
    online = _online(client.list_consumers(topic))
    channel_rows = [
        channel_summary(client, topic, name, day, online.get(name, 0)) for name in names
    ]
    total = {key: sum(row["today"][key] for row in channel_rows) for key in counters(Counters())}
    return {
        "name": topic,
        "channels": channel_rows,
        "today": total,
        "consumers": sum(online.values()),
    }


def _online(found: list[ConsumerInfo]) -> dict[str, int]:
    """Consumers online per channel name."""
    counts: dict[str, int] = {}
    for info in found:
        counts[info.channel] = counts.get(info.channel, 0) + 1
    return counts


def overview(client: Client) -> dict[str, Any]:
    """Every topic with its channels' backlog, today's counters and consumers online."""
    day = today(client)
    result = []
    for topic in client.list_topics():
        try:
            result.append(topic_summary(client, topic, day))
        except (TopicNotFound, ChannelNotFound):
            continue  # deleted while we were reading
    return {
        "day": day.isoformat(),
        "topics": result,
        "consumers": sum(t["consumers"] for t in result),
    }


def consumer(info: ConsumerInfo) -> dict[str, Any]:
    return {
        "host": info.host,
        "pid": info.pid,
        "topic": info.topic,
        "channel": info.channel,
        "max_in_flight": info.max_in_flight,
        "in_flight": info.in_flight,
        "started_at": iso(info.started_at),
        "heartbeat_at": iso(info.heartbeat_at),
    }


def consumers(client: Client, topic: str | None, channel: str | None) -> dict[str, Any]:
    """The consumers online (of a topic, a channel), as :meth:`Client.list_consumers`."""
    found = client.list_consumers(topic, channel)
    return {
        "topic": topic,
        "channel": channel,
        "heartbeat": seconds_of(client.options.consumer_heartbeat),
        "consumers": [consumer(info) for info in found],
    }


def schedule(info: ScheduleInfo) -> dict[str, Any]:
    """A schedule as JSON (the admin's and ``novaque schedules --json``):
    times ISO 8601 UTC, ``every`` in seconds."""
    return {
        "name": info.name,
        "topic": info.topic,
        "cron": info.cron,
        "every": None if info.every is None else info.every.total_seconds(),
        "timezone": info.timezone,
        "next_fire_at": info.next_fire_at.isoformat(),
        "last_fire_at": None if info.last_fire_at is None else info.last_fire_at.isoformat(),
        "paused": info.paused,
        "catch_up": info.catch_up,
        "priority": info.priority,
    }


def schedules(client: Client) -> dict[str, Any]:
    """Every schedule, by name (:meth:`Client.list_schedules`)."""
    return {"schedules": [schedule(info) for info in client.list_schedules()]}


def seconds_of(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _live_window(client: Client) -> list[datetime]:
    """The minutes of the live chart, oldest first, the current one last."""
    current = now(client).replace(second=0, microsecond=0)
    return [current - timedelta(minutes=n) for n in range(LIVE_MINUTES - 1, -1, -1)]


def _dense(window: list[datetime], rows: dict[datetime, Counters]) -> list[dict[str, Any]]:
    return [{"minute": m.isoformat(), **counters(rows.get(m, Counters()))} for m in window]


def minutes(client: Client, topic: str, channel: str) -> dict[str, Any]:
    """A channel's counters of the last hour, one entry per minute (zeros included)."""
    window = _live_window(client)
    rows = dict(client.minute_counters(topic, channel, since=window[0]))
    return {
        "topic": topic,
        "channel": channel,
        "since": window[0].isoformat(),
        "until": window[-1].isoformat(),
        "minutes": _dense(window, rows),
    }


def all_minutes(client: Client) -> dict[str, Any]:
    """Every channel's counters of the last hour added up, one entry per minute."""
    window = _live_window(client)
    total: dict[datetime, Counters] = {}
    for topic in client.list_topics():
        try:
            names = client.list_channels(topic)
        except TopicNotFound:
            continue
        for name in names:
            try:
                found = client.minute_counters(topic, name, since=window[0])
            except (TopicNotFound, ChannelNotFound):
                continue  # deleted while we were reading
            for minute, counts in found:
                total[minute] = total.get(minute, Counters()) + counts
    return {
        "topic": None,
        "channel": None,
        "since": window[0].isoformat(),
        "until": window[-1].isoformat(),
        "minutes": _dense(window, total),
    }


def channel_detail(client: Client, topic: str, channel: str) -> dict[str, Any]:
    day = today(client)
    start = retention_start(client)
    found = client.channel_backlog(topic, channel)
    return {
        "topic": topic,
        "channel": channel,
        "settings": settings(client, topic, channel),
        "defaults": defaults(client),
        "day": day.isoformat(),
        "consumers": consumers(client, topic, channel)["consumers"],
        "backlog": backlog(found),
        "oldest_ready_age": ready_age(found, now(client)),
        "today": counters(client.channel_counters(topic, channel, since=day, until=day)),
        "window": {
            "since": start.isoformat(),
            "until": day.isoformat(),
            "counters": counters(client.channel_counters(topic, channel, since=start, until=day)),
        },
    }


def daily(
    client: Client, topic: str, channel: str, since: date | None, until: date | None
) -> dict[str, Any]:
    since = since or retention_start(client)
    until = until or today(client)
    if since > until:
        raise HTTPError(400, f"since ({since}) is after until ({until})")
    rows = client.daily_counters(topic, channel, since=since, until=until)
    return {
        "topic": topic,
        "channel": channel,
        "since": since.isoformat(),
        "until": until.isoformat(),
        "days": [{"day": day.isoformat(), **counters(c)} for day, c in rows],
    }


def dead_letter(item: DeadLetter) -> dict[str, Any]:
    row: dict[str, Any] = {
        "delivery_id": item.delivery_id,
        "message_id": item.message_id,
        "attempts": item.attempts,
        "reason": item.reason,
        "last_error": item.last_error,
        "published_at": iso(item.published_at),
        "died_at": iso(item.died_at),
    }
    if item.body is not None:
        row.update(preview(item.body))
    row["body_len"] = item.body_len
    return row


def dead_page(
    client: Client, topic: str, channel: str, *, limit: int, after_id: int | None
) -> dict[str, Any]:
    found = client.list_dead(topic, channel, limit=limit + 1, after_id=after_id, with_body=True)
    items = [dead_letter(item) for item in found[:limit]]
    more = len(found) > limit
    return {
        "topic": topic,
        "channel": channel,
        # where the letters can be moved (requeue_dead(to_channel=))
        "other_channels": [name for name in client.list_channels(topic) if name != channel],
        "items": items,
        "next_after_id": items[-1]["delivery_id"] if more and items else None,
    }


def delivery(info: DeliveryInfo) -> dict[str, Any]:
    return {
        "channel": info.channel,
        "state": info.state,
        "attempts": info.attempts,
        "last_error": info.last_error,
        "visible_at": iso(info.visible_at),
    }


def message(info: MessageInfo, channel_names: list[str], limit: int) -> dict[str, Any]:
    """A message with one state per channel of its topic (``acked`` when gone)."""
    live = {d.channel: d for d in info.deliveries}
    states = [delivery(live[name]) for name in sorted(live)]
    for name in channel_names:
        if name not in live:  # the keys of a live one, as the docs show them
            gone = {"channel": name, "state": "acked", "attempts": None}
            states.append({**gone, "last_error": None, "visible_at": None})
    states.sort(key=lambda s: s["channel"])
    return {
        "id": info.id,
        "topic": info.topic,
        "headers": dict(info.headers),
        "published_at": iso(info.published_at),
        "expires_at": iso(info.expires_at),
        "priority": info.priority,
        **preview(info.body, limit),
        "deliveries": states,
        # whether cancel() would delete something: a delivery never attempted
        "cancellable": any(
            d.state in ("ready", "pending") and d.attempts == 0 for d in info.deliveries
        ),
    }


def message_page(
    client: Client,
    topic: str,
    *,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    after_id: int | None,
) -> dict[str, Any]:
    names = client.list_channels(topic)
    found = client.list_messages(
        topic, since=since, until=until, limit=limit + 1, after_id=after_id
    )
    items = [message(info, names, PREVIEW_BYTES) for info in found[:limit]]
    more = len(found) > limit
    return {
        "topic": topic,
        "channels": names,
        "since": iso(since),
        "until": iso(until),
        "items": items,
        "next_after_id": items[-1]["id"] if more and items else None,
    }


def message_detail(client: Client, message_id: int) -> dict[str, Any]:
    info = client.get_message(message_id)
    try:
        names = client.list_channels(info.topic)
    except TopicNotFound:
        names = []
    return message(info, names, DETAIL_PREVIEW_BYTES)
