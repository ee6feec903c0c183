"""``novaque schedules [--json]`` and ``novaque schedule add|rm|pause|resume``."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from novaque.cli._common import Context, print_table
from novaque.models import ScheduleInfo

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the schedule commands to the parser."""
    listing = commands.add_parser(
        "schedules",
        help="list schedules (recurring publishes) with their next and last fire",
        description="List every schedule by name: its topic, when it fires, its next and "
        "last fire (UTC), whether it is paused and its catch-up rule. --json prints them "
        "as a JSON list.",
    )
    listing.add_argument("--json", action="store_true", help="print a JSON list")
    listing.set_defaults(run=run_schedules)

    schedule = commands.add_parser(
        "schedule",
        help="add, remove, pause or resume a schedule",
        description="Manage one schedule: add (create, or replace the definition of) NAME, "
        "which publishes BODY to TOPIC on a cron expression or every SECONDS; rm deletes "
        "it; pause stops it firing until resume. Fires are published by maintenance "
        "(started clients, or novaque's run_maintenance).",
    )
    actions = schedule.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="create a schedule or replace its definition")
    add.add_argument("name", metavar="NAME")
    add.add_argument("topic", metavar="TOPIC")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="a 5-field cron expression")
    when.add_argument("--every", metavar="SECONDS", type=float, help="a period, at least 1")
    add.add_argument(
        "--timezone", metavar="TZ", default="UTC", help="IANA time zone of --cron (default UTC)"
    )
    add.add_argument("--body", metavar="TEXT", default="", help="the body of each fire")
    add.add_argument(
        "--catch-up",
        choices=("latest", "none", "all"),
        default="latest",
        help="which missed fires to publish (default latest)",
    )
    add.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="N",
        help="each fire's priority, -100 (first) to 100 (last); default 0",
    )
    add.set_defaults(run=run_add)
    for action, text in (
        ("rm", "delete a schedule"),
        ("pause", "stop a schedule firing"),
        ("resume", "let a paused schedule fire again"),
    ):
        one = actions.add_parser(action, help=text)
        one.add_argument("name", metavar="NAME")
        one.set_defaults(run=run_one)


def _when(info: ScheduleInfo) -> str:
    if info.cron is not None:
        return f"cron {info.cron} {info.timezone}"
    assert info.every is not None
    return f"every {info.every.total_seconds():g}s"


def _short(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def run_schedules(args: argparse.Namespace, context: Context) -> int:
    found = context.client().list_schedules()
    if args.json:
        from novaque.admin._data import schedule  # the admin's JSON, imported only here

        print(json.dumps([schedule(info) for info in found], indent=2))
        return 0
    if not found:
        print("no schedules")
        return 0
    print_table(
        ("NAME", "TOPIC", "WHEN", "NEXT FIRE (UTC)", "LAST FIRE (UTC)", "PAUSED", "CATCH-UP"),
        [
            (
                info.name,
                info.topic,
                _when(info),
                _short(info.next_fire_at),
                _short(info.last_fire_at),
                "yes" if info.paused else "no",
                info.catch_up,
            )
            for info in found
        ],
    )
    return 0


def run_add(args: argparse.Namespace, context: Context) -> int:
    every: float | None = args.every
    if every is not None and every.is_integer():
        every = int(every)
    info = context.client().schedule(
        args.name,
        args.topic,
        args.body,
        cron=args.cron,
        every=every,
        timezone=args.timezone,
        catch_up=args.catch_up,
        priority=args.priority,
    )
    print(f"schedule {info.name} is ready: next fire {info.next_fire_at.isoformat()}")
    return 0


def run_one(args: argparse.Namespace, context: Context) -> int:
    client = context.client()
    if args.action == "rm":
        if client.unschedule(args.name):
            print(f"deleted schedule {args.name}")
        else:
            print(f"no schedule named {args.name!r}: nothing to delete")
    elif args.action == "pause":
        client.pause_schedule(args.name)
        print(f"paused schedule {args.name}")
    else:
        client.resume_schedule(args.name)
        print(f"resumed schedule {args.name}")
    return 0
