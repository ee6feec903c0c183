"""``novaque publish TOPIC BODY|-``: publish one message."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from novaque.cli._common import Context


def _header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None


def register(commands: Any) -> None:
    """Add ``publish`` to the parser."""
    publish = commands.add_parser(
        "publish",
        help="publish one message (BODY, or - to read it from stdin)",
        description="Publish one message to TOPIC (created if missing) and print its id. "
        "BODY is sent UTF-8 encoded; `-` reads the body bytes from standard input.",
    )
    publish.add_argument("topic", metavar="TOPIC")
    publish.add_argument("body", metavar="BODY", help="the body, or - for standard input")
    publish.add_argument(
        "--header",
        "-H",
        action="append",
        type=_header,
        default=[],
        metavar="KEY=VALUE",
        help="a header (repeatable)",
    )
    publish.add_argument("--delay", type=_seconds, metavar="SECONDS", help="deliver later")
    publish.add_argument("--ttl", type=_seconds, metavar="SECONDS", help="time to live")
    publish.add_argument("--max-attempts", type=int, metavar="N", help="attempts before dead")
    publish.add_argument("--dedup-key", metavar="KEY", help="publish once per key")
    publish.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="N",
        help="-100 (first) to 100 (last); default 0",
    )
    publish.set_defaults(run=run_publish)


def run_publish(args: argparse.Namespace, context: Context) -> int:
    body: bytes | str = sys.stdin.buffer.read() if args.body == "-" else args.body
    client = context.client()
    message_id = client.publish(
        args.topic,
        body,
        delay=args.delay,
        ttl=args.ttl,
        max_attempts=args.max_attempts,
        headers=dict(args.header) or None,
        dedup_key=args.dedup_key,
        priority=args.priority,
    )
    print(message_id)
    return 0
