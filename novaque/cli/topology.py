"""``novaque topics`` and ``novaque channels TOPIC``: list, create, delete, show,
pause and resume."""

from __future__ import annotations

import argparse
import json
from typing import Any

from novaque.cli._common import Context, confirm, count


def register(commands: Any) -> None:
    """Add the topology commands to the parser."""
    topics = commands.add_parser(
        "topics",
        help="list topics (or create/delete one)",
        description="List topic names, one a line. --create/--delete change one topic; "
        "deleting a topic deletes its channels, messages and counters (after a "
        "confirmation on the terminal, or with --yes).",
    )
    change = topics.add_mutually_exclusive_group()
    change.add_argument("--create", metavar="TOPIC", help="create TOPIC if missing")
    change.add_argument("--delete", metavar="TOPIC", help="delete TOPIC and everything in it")
    topics.add_argument(
        "--yes", action="store_true", help="do not ask before --delete (needed without a terminal)"
    )
    topics.set_defaults(run=run_topics)

    channels = commands.add_parser(
        "channels",
        help="list the channels of a topic (or create/delete/show/pause/resume one)",
        description="List the channel names of TOPIC, one a line. --create/--delete change "
        "one channel; a new channel receives messages published from then on. --show prints "
        "a channel's settings as JSON; --pause stops handing out its deliveries (it still "
        "receives them) until --resume.",
    )
    channels.add_argument("topic", metavar="TOPIC")
    change = channels.add_mutually_exclusive_group()
    change.add_argument("--create", metavar="CHANNEL", help="create CHANNEL (and TOPIC)")
    change.add_argument("--delete", metavar="CHANNEL", help="delete CHANNEL and its deliveries")
    change.add_argument("--show", metavar="CHANNEL", help="print CHANNEL's settings (JSON)")
    change.add_argument("--pause", metavar="CHANNEL", help="stop handing out CHANNEL's deliveries")
    change.add_argument("--resume", metavar="CHANNEL", help="hand out CHANNEL's deliveries again")
    channels.set_defaults(run=run_channels)


def run_topics(args: argparse.Namespace, context: Context) -> int:
    client = context.client()
    if args.create:
        client.ensure_topic(args.create)
        print(f"topic {args.create} is ready")
    elif args.delete:
        channels = client.list_channels(args.delete)  # TopicNotFound before asking
        its = count(len(channels), "channel", "channels")
        confirm(
            f"Delete topic {args.delete} with its {its} and all its messages, deliveries "
            "and counters?",
            yes=args.yes,
        )
        client.delete_topic(args.delete)
        print(f"deleted topic {args.delete}")
    else:
        for name in client.list_topics():
            print(name)
    return 0


def run_channels(args: argparse.Namespace, context: Context) -> int:
    client = context.client()
    if args.create:
        client.ensure_channel(args.topic, args.create)
        print(f"channel {args.topic}/{args.create} is ready")
    elif args.delete:
        client.delete_channel(args.topic, args.delete)
        print(f"deleted channel {args.topic}/{args.delete}")
    elif args.show:
        from novaque.admin._data import settings  # the admin's, imported only here

        print(json.dumps(settings(client, args.topic, args.show), indent=2))
    elif args.pause:
        client.pause_channel(args.topic, args.pause)
        print(f"paused channel {args.topic}/{args.pause}")
    elif args.resume:
        client.resume_channel(args.topic, args.resume)
        print(f"resumed channel {args.topic}/{args.resume}")
    else:
        for name in client.list_channels(args.topic):
            print(name)
    return 0
