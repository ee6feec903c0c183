"""The ``novaque`` command line.

``novaque [--url URL] [--debug] COMMAND ...``. The database URL comes from
``--url``, else ``NOVAQUE_DATABASE_URL``, else ``sqlite:///novaque.db``.
Errors print one line on stderr and exit 1 (a traceback only with
``--debug``); usage errors exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from novaque import __version__
from novaque.cli import (
    admin,
    bench,
    compact,
    dead,
    demo,
    publish,
    schedules,
    schema,
    serve,
    stats,
    topology,
)
from novaque.cli._common import Context, one_line

__all__ = ["DEFAULT_URL", "build_parser", "main"]

#: The embedded default: an SQLite file in the current directory.
DEFAULT_URL = "sqlite:///novaque.db"

_GROUPS = (
    schema,
    topology,
    stats,
    dead,
    compact,
    publish,
    schedules,
    admin,
    serve,
    demo,
    bench,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(
        prog="novaque",
        description="Operate novaque queues in your database.",
        epilog=f"The database URL defaults to $NOVAQUE_DATABASE_URL, else {DEFAULT_URL}.",
    )
    parser.add_argument(
        "--url",
        metavar="URL",
        help="SQLAlchemy database URL (default: $NOVAQUE_DATABASE_URL or %(default)s)".replace(
            "%(default)s", DEFAULT_URL
        ),
    )
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks and log at DEBUG level"
    )
    parser.add_argument("--version", action="version", version=f"novaque {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in _GROUPS:
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    url = args.url or os.environ.get("NOVAQUE_DATABASE_URL") or DEFAULT_URL
    context = Context(url=url, debug=args.debug)
    if args.debug:
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s")
    try:
        status: int = args.run(args, context)
        return status
    except KeyboardInterrupt:
        print("novaque: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        print(f"novaque: error: {one_line(exc, context)}", file=sys.stderr)
        return 1
    finally:
        context.close()
