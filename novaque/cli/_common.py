"""What every command shares: the client, error lines and table printing."""

from __future__ import annotations

import argparse
import contextlib
import errno
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any, TextIO

import sqlalchemy as sa

from novaque.client import Client, connect
from novaque.errors import DatabaseUnavailable, NovaqueError

__all__ = [
    "CommandError",
    "Context",
    "Progress",
    "confirm",
    "count",
    "listening",
    "one_line",
    "parse_day",
    "parse_moment",
    "print_table",
]

MAX_ERROR_CHARS = 500


class CommandError(Exception):
    """A user error the command reports as one line (exit status 1)."""


@dataclass
class Context:
    """The global options and the client, created on first use."""

    url: str
    debug: bool = False
    _client: Client | None = field(default=None, repr=False)

    @property
    def shown_url(self) -> str:
        """The URL with any password hidden."""
        try:
            return sa.make_url(self.url).render_as_string(hide_password=True)
        except sa.exc.ArgumentError:
            return self.url

    def client(self, *, create: bool = False, **options: Any) -> Client:
        """A client on the URL; ``create`` allows making a new SQLite file."""
        if self._client is None:
            if not create:
                self._require_existing_sqlite_file()
            self._client = connect(self.url, **options)
        return self._client

    def _require_existing_sqlite_file(self) -> None:
        try:
            url = sa.make_url(self.url)
        except sa.exc.ArgumentError:
            return  # connect() reports it
        if url.get_backend_name() != "sqlite":
            return
        database = url.database or ""
        if database in ("", ":memory:") or database.startswith("file:"):
            return
        if not Path(database).exists():
            raise CommandError(
                f"database file {database} does not exist: run `novaque migrate` to create it "
                "(or pass --url / set NOVAQUE_DATABASE_URL)"
            )

    def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        try:
            client.shutdown(timeout=10)  # stops consumers and loops, flushes counters
        except Exception:
            if self.debug:
                raise
        finally:
            if client.own_engine is not client.engine:
                client.own_engine.dispose()
            client.engine.dispose()


def one_line(exc: BaseException, context: Context) -> str:
    """An error as one line a person can act on."""
    if isinstance(exc, DatabaseUnavailable):
        text = f"database error on {context.shown_url}: {exc}"
    elif isinstance(exc, (NovaqueError, CommandError)):
        text = str(exc)
    elif isinstance(exc, sa.exc.NoSuchModuleError):
        text = f"unsupported database URL {context.shown_url!r}: {exc}"
    elif isinstance(exc, sa.exc.ArgumentError):
        text = f"bad database URL {context.shown_url!r}: {exc}"
    elif isinstance(exc, sa.exc.DBAPIError):
        original = exc.orig if exc.orig is not None else exc
        text = f"database error on {context.shown_url}: {original}"
    elif isinstance(exc, ModuleNotFoundError):
        text = str(exc)  # connect() names the extra and the URL form for the backend
    elif isinstance(exc, (OSError, ValueError, TypeError)):
        text = str(exc) or type(exc).__name__
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return text


def port_number(text: str) -> int:
    """argparse type of a TCP port (0 lets the system pick one)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}")
    return value


@contextlib.contextmanager
def listening(host: str, port: int) -> Iterator[None]:
    """Report a port that cannot be bound as one line naming it and ``--port 0``."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        reason = (
            "is already in use" if exc.errno == errno.EADDRINUSE else f"refused: {exc.strerror}"
        )
        raise CommandError(
            f"cannot listen on {where}: the address {reason}; pass --port 0 (any free port) "
            "or another --port"
        ) from None


def parse_day(text: str) -> date:
    """argparse type for ``YYYY-MM-DD``."""
    import argparse

    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date like 2024-05-31, got {text!r}") from None


def parse_moment(text: str) -> datetime:
    """argparse type for an ISO 8601 time with its zone (``Z`` for UTC)."""
    import argparse

    shown = text if len(text) <= 40 else text[:37] + "..."
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time like 2026-11-29T09:00:00Z, got {shown!r}"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"give the time zone too (2026-11-29T09:00:00Z, or +02:00), got {shown!r}"
        )
    return moment


def count(number: int, one: str, many: str) -> str:
    """``number`` and the noun that goes with it: ``1 dead letter``, ``2 dead letters``."""
    return f"{number} {one if number == 1 else many}"


def confirm(question: str, *, yes: bool) -> None:
    """Ask ``question`` on the terminal before something that cannot be undone.

    ``yes`` (the command's ``--yes``) skips it. Without a terminal on standard
    input nobody can answer: the command refuses, saying to pass ``--yes``.
    Anything but y/yes is a no (:class:`CommandError`, nothing done).
    """
    if yes:
        return
    if not sys.stdin.isatty():
        raise CommandError(
            f"{question.rstrip('?')}: not without a confirmation, and standard input is "
            "not a terminal to ask on; pass --yes to go ahead"
        )
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise CommandError("not confirmed: nothing was changed")


class Progress:
    """A progress line on stderr (``done/total``, a bar, a percentage), redrawn
    in place; silent unless ``shown``."""

    WIDTH = 30

    def __init__(self, verb: str, total: int | None, *, shown: bool) -> None:
        self.verb = verb
        self.total = total
        self.shown = shown
        self.done = 0
        self._drawn = False

    def add(self, n: int) -> None:
        self.done += n
        if self.shown:
            self._draw()

    def _draw(self) -> None:
        if self.total:
            part = min(1.0, self.done / self.total)
            filled = int(part * self.WIDTH)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            line = f"{self.verb} {self.done}/{self.total} [{bar}] {part:4.0%}"
        else:
            line = f"{self.verb} {self.done}"
        print("\r" + line, end="", file=sys.stderr, flush=True)
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            print(file=sys.stderr, flush=True)


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    numeric: Sequence[str] = (),
    out: TextIO | None = None,
) -> None:
    """Print rows as an aligned text table (numbers right-aligned)."""
    stream = out or sys.stdout
    text_rows = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if headers[i] in numeric else v.ljust(widths[i])
            for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    print(line(list(headers)), file=stream)
    for row in text_rows:
        print(line(row), file=stream)
