"""The sample outputs of docs/cli.md and docs/admin.md are what the code prints.

docs/cli.md: every ```console block is a transcript, run command by command
(``novaque.cli.main`` in this process) on a database prepared by
:func:`prepare`, and the text each command leaves on the terminal (stdout and
stderr as they interleave, ``\\r`` redraws rendered, trailing spaces dropped)
must equal the lines the block shows under it. The blocks run in the order
of the page, on one database, each starting where the one before left it,
except the ``migrate`` block, which runs last (its ``downgrade --to base``
drops every table). How the transcript is read:

- ``$ `` starts a command; a ``# comment`` after it is the shell's;
  ``VAR=value`` before ``novaque`` sets an environment variable; the left
  side of a ``|`` is not run: the command reads a few fixed bytes instead
  (what it prints does not depend on them).
- Standard input, output and error are a terminal, as for the reader. A line
  ending in ``[y/N] y`` is a question the command asks: what follows
  ``[y/N] `` is the reader's answer, typed (and echoed) there.
- ``^C`` on a line of its own is where the reader presses Ctrl-C: the test
  raises ``KeyboardInterrupt`` in the command as soon as the lines above it
  are on the screen (a line drawn in place with ``\\r`` counts), and expects
  no ``^C`` line.

What legitimately varies, and how it is compared:

- The database: every URL a command names (the default
  ``sqlite:///novaque.db`` too) reaches the prepared database of the
  test's backend (``novaque.cli._common.connect`` swapped), so what the
  command prints about the URL is the URL as given. Ids are those of a fresh
  database on every backend, so they are compared as they are.
- Time: the commands' clients run on the preparation's fake clock
  (2026-11-29, UTC), so days and times are compared as they are.
- Ports: ``admin``, ``demo`` and ``serve`` listen on a free port (``--port
  0``); the port they print reads as the one the block shows (8080 by
  default, 8090 for ``serve``, which serves the backend's database through
  its asyncio driver, with a tokens file written for it).
- ``token new``: the token and its digest are new each time; any token and
  any digest match the ones the block shows. Which server
  they name, ``(wsgiref)`` or ``(waitress)``, depends on what is installed: the
  test reads ``(waitress)`` as ``(wsgiref)``.
- ``demo``: its counts depend on timing, so in its progress line (``published
  …``) every number matches any number, and its ``Prometheus metrics:`` line is
  expected only where ``prometheus_client`` is installed. It runs alone, on
  SQLite in a folder of its own, on the real clock.
- ``bench`` is not run: it would run the benchmarks (test_cli.py checks that
  it hands its arguments on).
- ``compact`` is not run here: what it prints depends on the database (the
  servers manage their own space) and on how SQLite laid the file out; the
  tests of test_cli.py run each of its commands on the database it needs and
  read every line it prints against the block's, sizes aside.

docs/admin.md: every JSON shape it shows (the API table's answers, the
``Backlog``/``Counters``/``DeadLetter``/``Message``/``Consumer`` objects and
the ``curl`` comment) is compared with what the app answers on a prepared
database (the backend's, its tables emptied): the same keys in the same
order, nested objects and list items too (a list of objects that every answer
leaves empty fails the test: the data must exercise the shape), ``…`` and
bare lowercase words (``n``) standing for any value; every route the app
serves is in the tables and every route of the tables is served.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shlex
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
import novaque.aio
from novaque.broker import new_token, token_toml
from novaque.cli import _common, main
from novaque.testing import FakeClock
from tests._twin import async_url
from tests.conftest import Backend

ROOT = Path(__file__).resolve().parent.parent
CONSOLE = re.compile(r"```console\n(.*?)```", re.S)
QUESTION = re.compile(r"\[y/N\] (\S+)$")
START = datetime(2026, 11, 29, 9, 0, tzinfo=timezone.utc)
#: When the commands run, by the fake clock.
NOW = datetime(2026, 11, 29, 10, 30, tzinfo=timezone.utc)
#: What a command with a ``|`` before it reads from standard input.
PIPED = b"day,orders\n2026-11-29,678\n"
NOT_RUN = {"bench", "compact"}
#: The commands that listen, and their default port.
LISTENING = {"admin": 8080, "demo": 8080, "serve": 8090}
#: What ``token new`` makes afresh each time: the token, and its digest.
FRESH_TOKEN = (re.compile(r"^nvq_[A-Za-z0-9_-]{43}$"), re.compile(r'^sha256 = "[0-9a-f]{64}"$'))


# -- the transcripts -------------------------------------------------------------------------


@dataclasses.dataclass
class Command:
    line: str
    argv: list[str]
    env: dict[str, str]
    piped: bool
    expected: list[str]
    #: The reader's answer to the command's question, if it asks one.
    answer: str | None
    #: How many lines are on the screen when the reader presses Ctrl-C (None: never).
    interrupt_after: int | None

    @property
    def name(self) -> str:
        """The command's name (``migrate``, ``dead``, ...), after the global options."""
        words = iter(self.argv)
        for word in words:
            if word == "--url":
                next(words)
            elif not word.startswith("-"):
                return word
        return ""


def parse(block: str) -> list[Command]:
    commands: list[Command] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            words = shlex.split(line[2:], comments=True)
            piped = "|" in words
            if piped:
                words = words[words.index("|") + 1 :]
            env = {}
            while "=" in words[0]:
                key, _, value = words.pop(0).partition("=")
                env[key] = value
            assert words[0] == "novaque", line
            commands.append(Command(line, words[1:], env, piped, [], None, None))
            continue
        assert commands, f"output before any command: {line}"
        current = commands[-1]
        if line == "^C":
            current.interrupt_after = len(current.expected)
            continue
        asked = QUESTION.search(line)
        if asked is not None:
            current.answer = asked.group(1)
        current.expected.append(line)
    return commands


def transcripts() -> list[Command]:
    text = (ROOT / "docs" / "cli.md").read_text()
    return [command for block in CONSOLE.findall(text) for command in parse(block)]


class Screen:
    """What a terminal shows of what is written to it: newlines, and ``\\r``
    going back to the start of the line to draw it again."""

    def __init__(self) -> None:
        self.lines: list[list[str]] = [[]]
        self.column = 0
        self.redrawn = False

    def write(self, text: str) -> None:
        for char in text:
            if char == "\n":
                self.lines.append([])
                self.column, self.redrawn = 0, False
            elif char == "\r":
                self.column, self.redrawn = 0, True
            else:
                line = self.lines[-1]
                if self.column < len(line):
                    line[self.column] = char
                else:
                    line.append(char)
                self.column += 1

    def shown(self) -> int:
        """Lines on the screen: ended ones, and one drawn in place."""
        return len(self.lines) - 1 + (1 if self.redrawn and self.lines[-1] else 0)

    def text(self) -> list[str]:
        lines = ["".join(line).rstrip() for line in self.lines]
        return lines[:-1] if lines and not lines[-1] else lines


class Terminal:
    """Standard output or error on the screen; the reader presses Ctrl-C once
    ``interrupt_after`` lines are shown."""

    encoding = "utf-8"
    errors = "strict"

    def __init__(self, screen: Screen, interrupt: Callable[[], None]) -> None:
        self.screen = screen
        self.interrupt = interrupt

    def write(self, text: str) -> int:
        self.screen.write(text)
        self.interrupt()
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


class Keyboard:
    """Standard input: the terminal, where the reader types ``answer`` (echoed),
    or a pipe."""

    encoding = "utf-8"

    def __init__(self, screen: Screen, answer: str | None, piped: bool) -> None:
        self.screen = screen
        self.answer = answer
        self.piped = piped
        self.buffer = io.BytesIO(PIPED if piped else b"")

    def readline(self) -> str:
        if self.answer is None:
            return ""
        typed, self.answer = self.answer + "\n", None
        self.screen.write(typed)
        return typed

    def isatty(self) -> bool:
        return not self.piped


def listen_anywhere(command: Command) -> int | None:
    """For a command that listens: ask for a free port; the port the block shows."""
    if command.name not in LISTENING:
        return None
    assert command.interrupt_after is not None, f"{command.line}: runs until ^C, shows none"
    if "--port" in command.argv:
        at = command.argv.index("--port") + 1
        shown = int(command.argv[at])
        command.argv[at] = "0"
        return shown
    command.argv += ["--port", "0"]
    return LISTENING[command.name]


def run(command: Command, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The lines ``command`` leaves on the terminal."""
    port = listen_anywhere(command)
    screen = Screen()
    pressed = []

    def interrupt() -> None:
        if (
            command.interrupt_after is not None
            and not pressed
            and screen.shown() >= command.interrupt_after
            and threading.current_thread() is threading.main_thread()
        ):
            pressed.append(True)
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        for key, value in command.env.items():
            patch.setenv(key, value)
        patch.setattr(sys, "stdout", Terminal(screen, interrupt))
        patch.setattr(sys, "stderr", Terminal(screen, interrupt))
        patch.setattr(sys, "stdin", Keyboard(screen, command.answer, command.piped))
        with contextlib.suppress(SystemExit):  # argparse's usage errors
            main(command.argv)
    assert command.interrupt_after is None or pressed, f"{command.line}: never interrupted"
    text = "\n".join(screen.text()).replace("(waitress)", "(wsgiref)")
    if port is not None:
        text = re.sub(r"(http://[^\s/]+):\d+/", rf"\g<1>:{port}/", text)
    return text.splitlines()


def compared(command: Command, lines: list[str]) -> list[str]:
    """``lines`` with what varies by rule made equal (demo's counts, a new token)."""
    if command.name == "token":
        return [next((p.pattern for p in FRESH_TOKEN if p.fullmatch(line)), line) for line in lines]
    if command.name != "demo":
        return lines
    return [re.sub(r"\d+", "#", line) if line.startswith("published ") else line for line in lines]


def check(commands: list[Command], monkeypatch: pytest.MonkeyPatch) -> None:
    for command in commands:
        got = run(command, monkeypatch)
        assert compared(command, got) == compared(command, command.expected), command.line


# -- the prepared database -------------------------------------------------------------------


def prepare(url: str, clock: FakeClock) -> None:
    """A shop's queues on 2026-11-29, at 10:30 UTC: topic ``audit`` with one
    channel; topic ``orders`` with ``billing`` (lease 60 s) and ``shipping``
    (one attempt a delivery), orders since 09:00, some acked, retried,
    deferred or dead; shipping's dead letters died every 10 minutes from 09:10."""
    client = novaque.connect(url, clock=clock)
    try:
        client.migrate()
        client.ensure_channel("audit", "archive")
        client.ensure_channel("orders", "billing", lease=60)
        client.ensure_channel("orders", "shipping", max_attempts=1)
        client.publish("audit", b'{"user": "ada", "action": "login"}')
        bodies = [f'{{"order": {n}, "total": {n * 7 % 300}.50}}' for n in range(1001, 1013)]
        client.publish_many("orders", bodies)
        billing = client.claim("orders", "billing", max_messages=10)
        client.ack_many(billing[:7])
        client.requeue(billing[7], delay=60, error="payment gateway answered 503")
        client.defer(billing[8])
        client.reject(billing[9], "order failed validation: unknown address")
        shipping = client.claim("orders", "shipping", max_messages=10)
        client.ack_many(shipping[:2])
        for n, msg in enumerate(shipping[2:]):
            clock.advance(minutes=10)
            if n % 3 == 1:
                client.reject(msg, "order failed validation: unknown address")
            else:  # its one attempt failed
                client.requeue(msg, error="carrier API timed out after 5s")
        client.publish_many("orders", [b'{"order": 1013}', b'{"order": 1014}'])
        client.flush_stats()
    finally:
        client.shutdown()
    clock.set(NOW)


@pytest.fixture
def database(backend: Backend, tmp_path: Path) -> tuple[str, FakeClock]:
    """A fresh database of the backend (fresh ids), prepared, and its clock."""
    url = backend.scratch_url(tmp_path)
    clock = FakeClock(START)
    prepare(url, clock)
    return url, clock


def test_cli_md_transcripts(
    database: tuple[str, FakeClock], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, clock = database
    real = _common.connect

    def connect(given: str, **options: Any) -> novaque.Client:
        return real(url, clock=clock, **options)

    monkeypatch.setattr(_common, "connect", connect)
    real_aio = novaque.aio.connect
    name = {"postgresql": "postgres"}.get(sa.make_url(url).get_backend_name(), "")
    aio_url = async_url(name or sa.make_url(url).get_backend_name(), url)

    def connect_aio(given: str, **options: Any) -> novaque.aio.AsyncClient:
        return real_aio(aio_url, clock=clock, **options)

    monkeypatch.setattr(novaque.aio, "connect", connect_aio)
    monkeypatch.setattr(_common.Context, "_require_existing_sqlite_file", lambda self: None)
    # The tokens file of `serve` (what `token new` prints goes in it).
    (tmp_path / "tokens.toml").write_text(token_toml(new_token(), ["admin"]))
    monkeypatch.delenv("NOVAQUE_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    commands = [c for c in transcripts() if c.name not in NOT_RUN | {"demo"}]
    schema = [c for c in commands if c.name in ("migrate", "downgrade")]
    assert [c.name for c in schema] == ["migrate", "migrate", "downgrade"]
    check([c for c in commands if c not in schema] + schema, monkeypatch)


def test_cli_md_demo_transcript(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (demo,) = [c for c in transcripts() if c.name == "demo"]
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        demo.expected = [line for line in demo.expected if not line.startswith("Prometheus")]
    monkeypatch.delenv("NOVAQUE_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    check([demo], monkeypatch)


def test_every_command_has_a_transcript() -> None:
    """Each command of ``novaque --help`` is shown at work in docs/cli.md."""
    import argparse

    from novaque.cli import build_parser

    (commands,) = [
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    assert set(commands.choices) == {c.name for c in transcripts()}


# -- docs/admin.md: the JSON shapes ----------------------------------------------------------

ADMIN_MD = ROOT / "docs" / "admin.md"
TOKEN = re.compile(r'"[^"]*"|…|\w+|[{}\[\]:,]')


@dataclasses.dataclass
class Shape:
    """``{"a", "b": X}``: ``keys``; ``[X]``: ``item``; ``Backlog``: ``ref``; else any value."""

    keys: list[tuple[str, Shape | None]] | None = None
    item: Shape | None = None
    ref: str | None = None
    is_list: bool = False


def parse_shape(text: str) -> Shape:
    tokens = TOKEN.findall(text)
    shape, rest = _value(tokens)
    assert not rest, f"{text}: {rest} left over"
    return shape


def _value(tokens: list[str]) -> tuple[Shape, list[str]]:
    first, rest = tokens[0], tokens[1:]
    if first == "{":
        keys: list[tuple[str, Shape | None]] = []
        while rest[0] != "}":
            assert rest[0].startswith('"'), rest
            key, rest = rest[0].strip('"'), rest[1:]
            value = None
            if rest[0] == ":":
                value, rest = _value(rest[1:])
            keys.append((key, value))
            if rest[0] == ",":
                rest = rest[1:]
        return Shape(keys=keys), rest[1:]
    if first == "[":
        item = None
        if rest[0] != "]":
            item, rest = _value(rest)
            while rest[0] == ",":  # ["name", …]: more of the same
                _, rest = _value(rest[1:])
        return Shape(item=item, is_list=True), rest[1:]
    if first[0].isupper():
        return Shape(ref=first), rest
    return Shape(), rest  # "text", …, n, true, 400: any value


class Matcher:
    """Compares answers with shapes; remembers the lists whose items it has
    seen, so that a shape no answer exercised is found (:meth:`unseen`)."""

    def __init__(self, types: dict[str, Shape]) -> None:
        self.types = types
        self.lists: set[str] = set()
        self.seen: set[str] = set()

    def __call__(self, shape: Shape, value: Any, where: str) -> None:
        if shape.ref is not None:
            self(self.types[shape.ref], value, f"{where} ({shape.ref})")
        elif shape.keys is not None:
            assert isinstance(value, dict), f"{where}: {value!r} is not an object"
            assert list(value) == [key for key, _ in shape.keys], where
            for key, sub in shape.keys:
                if sub is not None:
                    self(sub, value[key], f"{where}.{key}")
        elif shape.is_list:
            assert isinstance(value, list), f"{where}: {value!r} is not a list"
            if shape.item is not None and (shape.item.keys is not None or shape.item.ref):
                self.lists.add(where)
                self.seen.update([where] if value else [])
                for item in value:
                    self(shape.item, item, f"{where}[]")

    def unseen(self) -> set[str]:
        """Lists of objects that were empty in every answer."""
        return self.lists - self.seen


def admin_md() -> str:
    return ADMIN_MD.read_text()


def types_shown(text: str) -> dict[str, Shape]:
    found = re.findall(r"`([A-Z]\w+)` is\s+`(\{[^`]*\})`", text)
    return {name: parse_shape(shape) for name, shape in found}


def table(text: str, heading: str) -> list[list[str]]:
    """The rows of the first table under ``heading``, as lists of cells."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip().strip("|").split(" | ")] for row in rows[1:]]


@dataclasses.dataclass
class Endpoint:
    method: str
    path: str  # as shown, with {topic}, {channel}, {id}
    status: int
    shape: Shape | None


def endpoints(text: str) -> list[Endpoint]:
    found = []
    for first, answer in table(text, "JSON API"):
        method, _, path = first.split("`")[1].partition(" ")
        status = 200
        if re.match(r"\d{3} ", answer):
            status, answer = int(answer[:3]), answer[4:]
        if answer.startswith("`"):
            shape = parse_shape(answer.split("`")[1])
        else:
            name = answer.split()[0]
            assert name[0].isupper(), f"{first}: the answer does not start with its shape"
            shape = Shape(ref=name)
        found.append(Endpoint(method, path.split("?")[0], status, shape))
    return found


#: What each POST of the table sends, and the names it acts on (the others:
#: topic orders, channel billing, the first message).
POSTS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "topics": ({"name": "invoices"}, {}),
    "topics/{topic}/delete": ({}, {"topic": "doomed"}),
    "topics/{topic}/channels": ({"name": "audit"}, {}),
    "topics/{topic}/publish": ({"body": "hello"}, {}),
    "topics/{topic}/replay": ({"since": START.isoformat(), "until": NOW.isoformat()}, {}),
    "topics/{topic}/channels/{channel}/pause": ({}, {"channel": "shipping"}),
    "topics/{topic}/channels/{channel}/resume": ({}, {"channel": "shipping"}),
    "topics/{topic}/channels/{channel}/delete": ({}, {"channel": "doomed"}),
    "topics/{topic}/channels/{channel}/dead/requeue": ({"limit": 1}, {}),
    "topics/{topic}/channels/{channel}/dead/delete": ({"all": True}, {}),
    "messages/{id}/replay": ({}, {}),
    "messages/{id}/cancel": ({}, {"id": "scheduled"}),
}


def test_admin_md_json_shapes_are_the_answers(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    from novaque.admin import create_app
    from tests.wsgi import WSGIClient

    text = admin_md()
    types = types_shown(text)
    assert sorted(types) == [
        "Backlog",
        "Consumer",
        "Counters",
        "DeadLetter",
        "Message",
        "Schedule",
    ]
    match = Matcher(types)
    client = backend.client(clock=clock)
    for channel in ("billing", "shipping", "doomed"):
        client.ensure_channel("orders", channel)
    client.ensure_topic("doomed")
    first, _ = client.publish_many("orders", [b'{"order": 1}', b'{"order": 2}'])
    scheduled = client.publish("orders", b'{"order": 3}', delay=3600)
    (msg,) = client.claim("orders", "billing")
    client.reject(msg, "order failed validation")
    client.ack_many(client.claim("orders", "shipping"))
    client.flush_stats()
    client.pause_channel("orders", "billing")  # its consumer takes nothing
    client.schedule("nightly", "orders", b"{}", cron="0 2 * * *", timezone="Europe/Paris")
    consumer = client.subscribe_and_start("orders", "billing", lambda m: None)
    app = create_app(client, metrics=True)
    web = WSGIClient(app)
    names = {"topic": "orders", "channel": "billing", "id": str(first), "name": "nightly"}
    try:
        web.login()
        shown = endpoints(text)
        for endpoint in [e for e in shown if e.method == "GET"] + [
            e for e in shown if e.method == "POST"
        ]:
            body, acting = POSTS.get(endpoint.path, ({}, {}))
            given = {**names, **acting}
            given["id"] = str(scheduled) if given["id"] == "scheduled" else given["id"]
            path = re.sub(r"\{(\w+)\}", lambda m, given=given: given[m.group(1)], endpoint.path)
            reply = web.request(endpoint.method, f"/admin/api/{path}", json_body=body)
            assert reply.status == endpoint.status, (endpoint, reply.text)
            assert endpoint.shape is not None
            match(endpoint.shape, reply.json(), f"{endpoint.method} {endpoint.path}")
        error = re.search(r"errors are\s+`(\{[^`]*\})`", text)
        assert error is not None
        match(parse_shape(error.group(1)), web.get("/admin/api/nope").json(), "error")
        curl = re.search(r"/admin/api/(\w+)\s+# (\{.*\})", text)
        assert curl is not None
        match(parse_shape(curl.group(2)), web.get(f"/admin/api/{curl.group(1)}").json(), "curl")
    finally:
        consumer.shutdown()
    assert match.unseen() == set(), "lists the prepared data leaves empty in every answer"
    # Every route the app serves is in the tables, and every route there is served.
    api = {(e.method, e.path) for e in shown}
    assert len(api) == len(shown)
    served = {(method, pattern.pattern) for method, pattern, _ in app._api}
    pages = [row[0].split("`")[1].split("?")[0] for row in table(text, "Pages")]
    if "`GET {prefix}/metrics`" in text:
        pages.append("/metrics")
    served_pages = {pattern.pattern for _, pattern, _ in app._pages}
    sample = {"topic": "t", "channel": "c", "id": "1", "name": "s"}

    def routes(paths: Iterator[str], patterns: set[str]) -> set[str]:
        found = set()
        for path in paths:
            concrete = re.sub(r"\{(\w+)\}", lambda m: sample[m.group(1)], path)
            (hit,) = [p for p in patterns if re.fullmatch(p.removesuffix(r"\Z"), concrete)]
            found.add(hit)
        return found

    for method in ("GET", "POST"):
        wanted = {p for m, p in served if m == method}
        documented = routes((f"/{p}" for m, p in api if m == method), wanted)
        assert documented == wanted, method
    assert routes(iter(pages), served_pages) == served_pages


def test_readme_says_where_the_command_is_before_using_it() -> None:
    text = (ROOT / "README.md").read_text()
    inline = [m.start() for m in re.finditer(r"`novaque [a-z]", text)]
    shell = [m.start() for m in re.finditer(r"```(?:sh|bash|console)\n(?:\$ )?novaque ", text)]
    first = min(inline + shell)
    before = text[:first]
    assert ".venv/bin/novaque" in before
    assert "pip install novaque" in before
