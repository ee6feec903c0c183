"""``novaque stats [TOPIC [CHANNEL]]``: backlog and counters as a table."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from typing import Any

from novaque.cli._common import Context, parse_day, print_table


def register(commands: Any) -> None:
    """Add ``stats`` to the parser."""
    stats = commands.add_parser(
        "stats",
        help="backlog and counters per channel",
        description="Print one row per channel: the live backlog by state (pending, ready, "
        "in flight, deferred, dead) and when the oldest ready delivery became due, then the "
        "delivery counters summed over UTC days (today unless --since/--until say "
        "otherwise). The columns are the keys of --json, upper-cased.",
    )
    stats.add_argument("topic", nargs="?", metavar="TOPIC", help="only this topic")
    stats.add_argument("channel", nargs="?", metavar="CHANNEL", help="only this channel")
    stats.add_argument("--since", type=parse_day, metavar="DAY", help="first UTC day (today)")
    stats.add_argument("--until", type=parse_day, metavar="DAY", help="last UTC day (today)")
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stats.set_defaults(run=run_stats)


def run_stats(args: argparse.Namespace, context: Context) -> int:
    from novaque.admin import _data  # the admin's JSON shapes, imported only here

    client = context.client()
    clock = client.options.clock
    today = (clock() if clock is not None else datetime.now(timezone.utc)).date()
    since = args.since or (today if args.until is None else None)
    until = args.until or (today if args.since is None else None)
    if since is not None and until is not None and since > until:
        raise ValueError(f"--since {since} is after --until {until}")
    topics = [args.topic] if args.topic else client.list_topics()
    rows: list[dict[str, Any]] = []
    cells: list[list[object]] = []
    for topic in topics:
        channels = [args.channel] if args.channel else client.list_channels(topic)
        for channel in channels:
            backlog = client.channel_backlog(topic, channel)
            counters = client.channel_counters(topic, channel, since=since, until=until)
            states, counts = _data.backlog(backlog), _data.counters(counters)
            rows.append({"topic": topic, "channel": channel, "backlog": states, "counters": counts})
            # The table shows the same values, times as the other tables show them.
            cells.append(
                [topic, channel, *(getattr(backlog, key) for key in states), "|", *counts.values()]
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
    # Each column is named after its key in --json (the Python API's names).
    headers = ["TOPIC", "CHANNEL", *(key.upper() for key in rows[0]["backlog"]), "|"]
    headers += [key.upper() for key in rows[0]["counters"]]
    print_table(
        headers,
        cells,
        numeric=[h for h in headers if h not in ("TOPIC", "CHANNEL", "OLDEST_READY_AT")],
    )
    return 0
