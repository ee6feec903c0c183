"""``novaque stats [TOPIC [CHANNEL]]``: backlog and counters as a table."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from typing import Any

from novaque.cli._common import Context, parse_day, print_table

STATES = ("pending", "ready", "in_flight", "dead")
COUNTERS = ("published", "claimed", "acked", "requeued", "dead", "purged")


def register(commands: Any) -> None:
    """Add ``stats`` to the parser."""
    stats = commands.add_parser(
        "stats",
        help="backlog and counters per channel",
        description="Print one row per channel: the live backlog by state (pending, ready, "
        "in flight, dead) and the delivery counters summed over UTC days (today unless "
        "--since/--until say otherwise).",
    )
    stats.add_argument("topic", nargs="?", metavar="TOPIC", help="only this topic")
    stats.add_argument("channel", nargs="?", metavar="CHANNEL", help="only this channel")
    stats.add_argument("--since", type=parse_day, metavar="DAY", help="first UTC day (today)")
    stats.add_argument("--until", type=parse_day, metavar="DAY", help="last UTC day (today)")
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stats.set_defaults(run=run_stats)


def run_stats(args: argparse.Namespace, context: Context) -> int:
    client = context.client()
    clock = client.options.clock
    today = (clock() if clock is not None else datetime.now(timezone.utc)).date()
    since = args.since or (today if args.until is None else None)
    until = args.until or (today if args.since is None else None)
    if since is not None and until is not None and since > until:
        raise ValueError(f"--since {since} is after --until {until}")
    topics = [args.topic] if args.topic else client.list_topics()
    rows: list[dict[str, Any]] = []
    for topic in topics:
        channels = [args.channel] if args.channel else client.list_channels(topic)
        for channel in channels:
            backlog = client.channel_backlog(topic, channel)
            counters = client.channel_counters(topic, channel, since=since, until=until)
            rows.append(
                {
                    "topic": topic,
                    "channel": channel,
                    "backlog": {s: getattr(backlog, s) for s in STATES},
                    "counters": {c: getattr(counters, c) for c in COUNTERS},
                }
            )
    if args.json:
        window = {"since": since and since.isoformat(), "until": until and until.isoformat()}
        print(json.dumps({"days": window, "channels": rows}, indent=2))
        return 0
    if not rows:
        print("no channels" + (f" in topic {args.topic}" if args.topic else ""))
        return 0
    span = f"{since or 'first day'} .. {until or 'today'}"
    print(f"backlog now; counters for UTC days {span}")
    headers = ["TOPIC", "CHANNEL", "PENDING", "READY", "IN_FLIGHT", "DEAD", "|"]
    headers += ["PUBLISHED", "CLAIMED", "ACKED", "REQUEUED", "DIED", "PURGED"]
    print_table(
        headers,
        [
            [row["topic"], row["channel"], *row["backlog"].values(), "|", *row["counters"].values()]
            for row in rows
        ],
        numeric=[h for h in headers if h not in ("TOPIC", "CHANNEL")],
    )
    return 0
