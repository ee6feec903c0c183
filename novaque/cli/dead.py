"""``novaque dead list|requeue|delete TOPIC CHANNEL``: the dead-letter queue, and
``novaque cancel MESSAGE_ID``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, Literal

from novaque.cli._common import (
    CommandError,
    Context,
    Progress,
    confirm,
    count,
    parse_moment,
    print_table,
)
from novaque.client import operations_of

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
        description="Dead letters are addressed by delivery id (DELIVERY_ID, the first column "
        "of `dead list`).",
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
        action = actions.add_parser(
            name,
            help=f"{verb} dead letters",
            description=f"{verb.capitalize()} the dead letters given by delivery id, or --all "
            "of them; --limit and --died-before narrow (or, alone, choose) the letters.",
        )
        _target(action)
        action.add_argument("ids", nargs="*", type=_positive, metavar="ID", help="delivery ids")
        action.add_argument("--all", action="store_true", help="every dead letter of the channel")
        if name == "requeue":
            action.add_argument(
                "--to-channel",
                metavar="CHANNEL",
                help="move them to this channel of the topic (ready, attempts reset)",
            )
        action.add_argument(
            "--limit", type=_positive, metavar="N", help="at most N, oldest died first"
        )
        action.add_argument(
            "--died-before",
            type=parse_moment,
            metavar="TIME",
            help="only letters that died before TIME (ISO 8601 with its zone, e.g. "
            "2026-11-29T09:00:00Z)",
        )
        if name == "requeue":
            action.add_argument(
                "--rate",
                type=_rate,
                metavar="N",
                help="at most N letters a second, in chunks of one transaction each",
            )
        action.add_argument(
            "--progress",
            action="store_true",
            help="show a progress line on stderr (the default when stderr is a terminal)",
        )
        if name == "delete":
            action.add_argument(
                "--yes",
                action="store_true",
                help="do not ask before deleting every dead letter of the channel",
            )
        action.set_defaults(run=run_requeue if name == "requeue" else run_delete)

    cancel = commands.add_parser(
        "cancel",
        help="delete a message's deliveries that were never attempted",
        description="Delete the deliveries of MESSAGE_ID that were never attempted (ready "
        "or pending, not leased, attempts 0): a scheduled message called off. Attempted, "
        "leased, deferred and dead deliveries stay; the message stays browsable until TTL.",
    )
    cancel.add_argument("message_id", type=_positive, metavar="MESSAGE_ID")
    cancel.set_defaults(run=run_cancel)


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected letters per second > 0, got {text!r}")
    return value


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
    # Named after DeadLetter's fields, as the admin's JSON names them.
    headers = [
        "DELIVERY_ID", "MESSAGE_ID", "ATTEMPTS", "DIED_AT", "BODY_LEN", "REASON", "LAST_ERROR",
    ]  # fmt: skip
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
    print_table(headers, rows, numeric=["DELIVERY_ID", "MESSAGE_ID", "ATTEMPTS", "BODY_LEN"])
    if len(items) == args.limit:
        print(f"(more may follow: --after-id {items[-1].delivery_id})", file=sys.stderr)
    return 0


def _ids(args: argparse.Namespace) -> Sequence[int] | None:
    if args.all and args.ids:
        raise CommandError("give delivery ids or --all, not both")
    chosen = args.limit is not None or args.died_before is not None
    if not args.all and not args.ids and not chosen:
        raise CommandError(
            "give the delivery ids to act on (see `novaque dead list`), --all, "
            "--limit or --died-before"
        )
    return list(args.ids) if args.ids else None


def _chunks(
    args: argparse.Namespace, context: Context, action: Literal["requeue", "delete"]
) -> int:
    """Run the pass chunk by chunk, with a progress line; how many it did."""
    ids = _ids(args)
    client = context.client()
    total: int | None = len(ids) if ids is not None else None
    shown = args.progress or sys.stderr.isatty()
    # How many letters the pass takes, when the backlog says it: not with
    # --died-before (the line then counts without a bar).
    if total is None and args.died_before is None and (shown or action == "delete"):
        dead = client.channel_backlog(args.topic, args.channel).dead
        total = dead if args.limit is None else min(dead, args.limit)
    if action == "delete" and ids is None and args.limit is None and args.died_before is None:
        confirm(
            f"Delete every dead letter of {args.topic}/{args.channel} ({total}) for good?",
            yes=args.yes,
        )
    extra: dict[str, Any] = {}
    if action == "requeue":
        extra = {"to_channel": args.to_channel, "rate": args.rate}
    verb = "requeued" if action == "requeue" else "deleted"
    progress = Progress(verb, total, shown=shown)
    try:
        chunks = operations_of(client).dead_letter_chunks(
            action,
            args.topic,
            args.channel,
            ids,
            limit=args.limit,
            died_before=args.died_before,
            **extra,
        )
        for done in chunks:
            progress.add(done)
    finally:
        progress.close()
    return progress.done


def run_requeue(args: argparse.Namespace, context: Context) -> int:
    done = _chunks(args, context, "requeue")
    where = f" to {args.topic}/{args.to_channel}" if args.to_channel else ""
    letters = count(done, "dead letter", "dead letters")
    print(f"requeued {letters} of {args.topic}/{args.channel}{where}")
    return 0


def run_delete(args: argparse.Namespace, context: Context) -> int:
    done = _chunks(args, context, "delete")
    print(f"deleted {count(done, 'dead letter', 'dead letters')} of {args.topic}/{args.channel}")
    return 0


def run_cancel(args: argparse.Namespace, context: Context) -> int:
    done = context.client().cancel(args.message_id)
    deliveries = count(done, "never-attempted delivery", "never-attempted deliveries")
    print(f"cancelled {deliveries} of message {args.message_id}")
    return 0
