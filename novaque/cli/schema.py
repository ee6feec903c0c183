"""``novaque migrate`` and ``novaque downgrade``: novaque's Alembic migrations."""

from __future__ import annotations

import argparse
from typing import Any

from novaque import _migrate
from novaque.cli._common import Context


def register(commands: Any) -> None:
    """Add the schema commands to the parser."""
    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade novaque's tables",
        description="Apply novaque's migrations (Alembic upgrade), creating the tables if "
        "needed. Running it again changes nothing.",
    )
    migrate.add_argument("--to", default="head", metavar="REV", help="target revision (head)")
    migrate.set_defaults(run=run_migrate)

    downgrade = commands.add_parser(
        "downgrade",
        help="revert novaque's migrations (base drops every novaque table)",
        description="Revert novaque's migrations down to REV; `--to base` drops every "
        "novaque table (and their data).",
    )
    downgrade.add_argument("--to", required=True, metavar="REV", help="target revision")
    downgrade.set_defaults(run=run_downgrade)


def _revision(context: Context) -> str:
    client = context.client()
    with client.own_engine.connect() as conn:
        return _migrate.current(conn) or "base (no novaque tables)"


def run_migrate(args: argparse.Namespace, context: Context) -> int:
    client = context.client(create=True)
    client.migrate(args.to)
    print(f"{context.shown_url}: novaque schema at revision {_revision(context)}")
    return 0


def run_downgrade(args: argparse.Namespace, context: Context) -> int:
    client = context.client()
    client.downgrade(args.to)
    print(f"{context.shown_url}: novaque schema at revision {_revision(context)}")
    return 0
