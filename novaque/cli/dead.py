"""``novaque dead list|requeue|delete TOPIC CHANNEL``: the dead-letter queue."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from novaque.cli._common import Context, print_table

ERROR_WIDTH = 60


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def register(commands: Any) -> None:
    """Add ``dead list|requeue|delete`` to the parser."""
    dead = commands.add_parser(
        "dead",
        help="list, requeue or delete dead letters of a channel",
        description="Dead letters are addressed by delivery id (the first column of `dead list`).",
    )
    actions = dead.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="list dead letters, oldest first")
    _target(listing)
    listing.add_argument("--limit", type=_positive, default=100, help="at most N rows (100)")
    listing.add_argument(
        "--after-id", type=_positive, metavar="ID", help="start after this delivery id"
    )
    listing.add_argument("--body", action="store_true", help="show a body preview column")
    listing.set_defaults(run=run_list)

    for name, verb in (("requeue", "requeue (fresh TTL, attempts reset)"), ("delete", "delete")):
        action = actions.add_parser(name, help=f"{verb} dead letters")
        _target(action)
        action.add_argument("ids", nargs="*", type=_positive, metavar="ID", help="delivery ids")
        action.add_argument("--all", action="store_true", help="every dead letter of the channel")
        action.set_defaults(run=run_requeue if name == "requeue" else run_delete)


def _target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("channel", metavar="CHANNEL")


def _short(text: str | None, width: int) -> str:
    if not text:
        return "-"
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def run_list(args: argparse.Namespace, context: Context) -> int:
    client = context.client()
    items = client.list_dead(
        args.topic, args.channel, limit=args.limit, after_id=args.after_id, with_body=args.body
    )
    if not items:
        print(f"no dead letters in {args.topic}/{args.channel}")
        return 0
    headers = ["DELIVERY", "MESSAGE", "ATTEMPTS", "DIED_AT", "BYTES", "REASON", "LAST_ERROR"]
    rows: list[list[object]] = []
    for item in items:
        row: list[object] = [
            item.delivery_id,
            item.message_id,
            item.attempts,
            item.died_at,
            item.body_len,
            _short(item.reason, 24),
            _short(item.last_error, ERROR_WIDTH),
        ]
        if args.body:
            body = (item.body or b"")[:200].decode("utf-8", errors="backslashreplace")
            row.append(_short(body, ERROR_WIDTH))
        rows.append(row)
    if args.body:
        headers.append("BODY")
    print_table(headers, rows, numeric=["DELIVERY", "MESSAGE", "ATTEMPTS", "BYTES"])
    if len(items) == args.limit:
        print(f"(more may follow: --after-id {items[-1].delivery_id})", file=sys.stderr)
    return 0


def _ids(args: argparse.Namespace) -> Sequence[int] | None:
    if args.all and args.ids:
        raise ValueError("give delivery ids or --all, not both")
    if not args.all and not args.ids:
        raise ValueError("give the delivery ids to act on (see `novaque dead list`) or --all")
    return None if args.all else list(args.ids)


def _count(result: object, ids: Sequence[int] | None) -> str:
    if isinstance(result, int) and not isinstance(result, bool):
        return str(result)
    if isinstance(result, Sequence):
        return str(len(result))
    return str(len(ids)) if ids is not None else "all"


def run_requeue(args: argparse.Namespace, context: Context) -> int:
    ids = _ids(args)
    client = context.client()
    result = client.requeue_dead(args.topic, args.channel, ids=ids)
    print(f"requeued {_count(result, ids)} dead letters of {args.topic}/{args.channel}")
    return 0


def run_delete(args: argparse.Namespace, context: Context) -> int:
    ids = _ids(args)
    client = context.client()
    result = client.delete_dead(args.topic, args.channel, ids=ids)
    print(f"deleted {_count(result, ids)} dead letters of {args.topic}/{args.channel}")
    return 0
