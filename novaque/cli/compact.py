"""``novaque compact [--full]``: give an SQLite file's free space back."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from novaque._operator_calls import byte_size
from novaque.cli._common import Context


def register(commands: Any) -> None:
    """Add ``compact`` to the parser."""
    compact = commands.add_parser(
        "compact",
        help="give the free space of an SQLite database file back to the file system",
        description="Give the free pages that deleted rows left in an SQLite database "
        "file back to the file system, in short transactions (a database novaque "
        "created is in incremental auto-vacuum mode). --full rewrites the whole file "
        "instead (VACUUM), holding the write lock until it ends, and switches an older "
        "database to incremental mode. PostgreSQL and MySQL/MariaDB manage their own "
        "space: nothing to do there.",
    )
    compact.add_argument(
        "--full",
        action="store_true",
        help="rewrite the whole file (VACUUM); writers wait until it ends",
    )
    compact.set_defaults(run=run_compact)


class _Notices(logging.Handler):
    """The client's warnings, on stderr as the command's own lines."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"novaque: warning: {record.getMessage()}", file=sys.stderr, flush=True)


def run_compact(args: argparse.Namespace, context: Context) -> int:
    client = context.client()
    before = client._operations._space()
    if before is None:
        print(f"nothing to compact: {client.database_family} manages its own space")
        return 0
    if args.full:
        print(
            f"rewriting the whole database ({byte_size(before.size)}) without its free "
            "pages; writers wait until it ends",
            file=sys.stderr,
            flush=True,
        )
    notices = _Notices(logging.WARNING)
    if not context.debug:  # --debug logs everything already
        client.log.addHandler(notices)
    try:
        freed = client.compact(full=args.full)
    finally:
        client.log.removeHandler(notices)
    after = client._operations._space()
    assert after is not None
    print(f"freed {byte_size(freed)}; the database file is now {byte_size(after.size)}")
    return 0
