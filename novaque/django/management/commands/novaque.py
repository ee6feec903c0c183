"""``manage.py novaque migrate`` and ``manage.py novaque run``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from novaque import _migrate
from novaque.django._connect import client, database_url, forget
from novaque.django._run import consumer_names, planned_consumers, run_consumers
from novaque.errors import NovaqueError


class Command(BaseCommand):  # type: ignore[misc]  # Django is untyped
    help = (
        "novaque's tables and consumers. `novaque migrate [--to REV]` applies novaque's "
        'migrations and creates the channels of settings.NOVAQUE["CONSUMERS"]; '
        "`novaque run [TOPIC/CHANNEL ...]` runs those consumers (all, or the ones named) "
        "and the background maintenance until SIGINT or SIGTERM. --database goes before "
        "the action."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help="the Django database alias novaque works in (default: %(default)s)",
        )
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
        migrate = actions.add_parser(
            "migrate", help="apply novaque's migrations, create the consumers' channels"
        )
        migrate.add_argument("--to", default="head", help="target revision (default: head)")
        run = actions.add_parser("run", help="run consumers until SIGINT or SIGTERM")
        run.add_argument(
            "consumers",
            nargs="*",
            metavar="TOPIC/CHANNEL",
            help='consumers of settings.NOVAQUE["CONSUMERS"] to run (default: all)',
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        try:
            if options["action"] == "migrate":
                self._migrate(using, options["to"])
            else:
                self._run(using, options["consumers"])
        except NovaqueError as exc:
            raise CommandError(str(exc)) from exc

    def _migrate(self, using: str, to: str) -> None:
        made = client(using)
        made.migrate(to=to)
        with made.own_engine.connect() as conn:
            revision = _migrate.current(conn) or "base (no novaque tables)"
        shown = database_url(using).render_as_string(hide_password=True)
        self.stdout.write(f"{shown}: novaque schema at revision {revision}")
        # The consumers' channels exist from now on: messages published before
        # the first `novaque run` are delivered to them.
        channels = consumer_names()
        for topic, channel in channels:
            made.ensure_channel(topic, channel)
        if channels:
            ready = ", ".join(f"{topic}/{channel}" for topic, channel in channels)
            self.stdout.write(f"channels ready: {ready}")

    def _run(self, using: str, names: list[str]) -> None:
        consumers = planned_consumers(names)
        made = client(using)
        try:
            run_consumers(made, consumers, out=self.stdout)
        finally:
            forget(using, made)  # shut down: a later call builds a new client
