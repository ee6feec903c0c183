"""docs/quickstart.md, path by path, run as a reader runs it.

Each ``## `` section of the page is one path. Its blocks are taken in the
page's order, in a fresh folder:

- ``# file: NAME`` blocks are written to NAME; ``# append: NAME`` blocks are
  added at the end of NAME (a file an earlier command made);
- ``console`` blocks are commands: each ``$`` line runs, and the lines under
  it are its output (``...`` stands for any text, and a line of its own for
  any lines). A command whose comment says "until Ctrl-C" runs in the
  background until the path's work is done, then gets SIGINT and must stop
  cleanly; the lines under it must be among what it printed, in any order.
  Other commands must succeed and print exactly what is shown, if anything
  is. ``pip install`` is not run: its extras must exist, and what it
  installs must cover what the path imports and runs. ``curl`` is sent with
  httpx.

Server paths run on a fresh database of the suite's server (``backend``):
the example URL ``…://app:secret@localhost/app`` is swapped for it, as
tests/test_docs.py swaps it in the guide, and so are the Django settings'
``"NAME": "app", "USER": "app", "PASSWORD": "secret", "HOST": "localhost"``.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import novaque
from tests import _preloaded
from tests.conftest import Backend
from tests.test_docs import EXAMPLE, marker

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "quickstart.md"
WAIT = 60.0
#: The page's paths, in order, and the backend each runs on (None: SQLite, a file).
PATHS = {
    "1. A script on SQLite": None,
    "2. FastAPI on PostgreSQL": "postgres",
    "3. Celery on MySQL or MariaDB": "mysql",
    "4. Django on PostgreSQL": "postgres",
}
BLOCK = re.compile(r"```(python|console)\n(.*?)```", re.S)
#: The example database of the Django settings, on one line.
DJANGO_EXAMPLE = '"NAME": "app", "USER": "app", "PASSWORD": "secret", "HOST": "localhost"'
#: The port ``uvicorn`` serves on by default, as ``curl`` names it.
DEFAULT_ADDRESS = "127.0.0.1:8000"
#: How each program that runs until Ctrl-C stops cleanly on SIGINT: its exit
#: status, and the line it prints. (A Celery worker exits 1 after the warm
#: shutdown of a Ctrl-C, 0 after one of SIGTERM.)
STOPPED = {
    "uvicorn": (0, "INFO:     Application shutdown complete."),
    "celery": (1, "worker: Warm shutdown (MainProcess)"),
    "python": (0, "novaque: stopped"),  # python manage.py novaque run
}
#: What a program on the page is, as ``python ARGS``.
PROGRAMS = {
    "novaque": ["-m", "novaque.cli"],
    "python": [],
    "django-admin": ["-m", "django"],
    "celery": ["-m", "celery"],
    "uvicorn": ["-m", "uvicorn"],
}
#: The distribution that installs each program.
PROGRAM_DISTRIBUTIONS = {"django-admin": "django", "celery": "celery", "uvicorn": "uvicorn"}
#: novaque's modules that need an extra.
MODULE_EXTRAS = {"novaque.aio": "aio", "novaque.kombu": "celery", "novaque.django": "django"}
#: The driver each database of the page needs.
DRIVERS = {
    "postgresql+psycopg://": "psycopg",
    "mysql+pymysql://": "pymysql",
    "django.db.backends.postgresql": "psycopg",
}


def sections() -> dict[str, str]:
    """The page's ``## `` sections: title -> text."""
    parts = re.split(r"^## (.+)$", PAGE.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@dataclass
class Command:
    line: str
    output: list[str] = field(default_factory=list)

    @property
    def args(self) -> list[str]:
        return shlex.split(self.line, comments=True)

    @property
    def background(self) -> bool:
        comment = re.search(r"\s#\s(.*)$", self.line)
        return comment is not None and "until Ctrl-C" in comment[1]


def commands(block: str) -> list[Command]:
    found: list[Command] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            found.append(Command(line[2:]))
        else:
            assert found, f"output before any command: {line!r}"
            found[-1].output.append(line)
    return found


def pattern(line: str) -> re.Pattern[str]:
    """A line of the page's output as a pattern: ``...`` is any text."""
    return re.compile(".*".join(re.escape(part) for part in line.split("...")))


def matches(shown: list[str], printed: list[str]) -> bool:
    """Whether ``printed`` is ``shown``, where a line ``...`` stands for any lines."""
    if not shown:
        return not printed
    if shown[0] == "...":
        return any(matches(shown[1:], printed[i:]) for i in range(len(printed) + 1))
    return (
        bool(printed)
        and pattern(shown[0]).fullmatch(printed[0]) is not None
        and matches(shown[1:], printed[1:])
    )


def eventually(condition: Callable[[], Any], what: str) -> Any:
    """Poll ``condition`` until it is true, at most ``WAIT`` seconds."""
    deadline = time.monotonic() + WAIT
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling other processes, not waiting for time to pass
    return result


@functools.cache
def packages_distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_page_has_the_paths_the_tests_run() -> None:
    """Every path of the page is run below, and nothing else on the page is code."""
    found = sections()
    assert list(found) == list(PATHS)
    intro = PAGE.read_text().partition("\n## ")[0]
    assert "```" not in intro
    for text in found.values():
        every = re.findall(r"^```(\w*)$", text, re.M)[::2]  # the opening fences
        assert set(every) <= {"python", "console"}, every
        assert len(BLOCK.findall(text)) == len(every)


class QuickPath:
    """One path of the page in a fresh folder (and, for a server path, on a
    fresh database of ``backend``): its files written, its commands run."""

    def __init__(self, title: str, tmp_path: Path, backend: Backend | None = None) -> None:
        assert PATHS[title] == (backend and backend.name)
        self.title = title
        self.text = sections()[title]
        self.folder = tmp_path / "project"
        self.folder.mkdir()
        #: The database the example's is swapped for.
        self.url = None if backend is None else backend.scratch_url(tmp_path)
        self.port = free_port()
        # A newcomer's environment: none of this run's settings for pytest,
        # Django, Celery or the novaque command.
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTEST_", "DJANGO_", "CELERY_", "NOVAQUE_DATABASE_URL"))
        }
        self.env["UVICORN_PORT"] = str(self.port)
        self.running: list[tuple[Command, Any, Path]] = []
        self.swapped = 0
        self.blocks = [(kind, text) for kind, text in BLOCK.findall(self.text)]
        self.files = {marker(t).partition(": ")[2]: t for k, t in self.blocks if k == "python"}

    # -- the example database, swapped for the test's -----------------------------

    def swap(self, text: str) -> str:
        if self.url is None:
            return text
        test_url = sa.make_url(self.url)

        def url(found: re.Match[str]) -> str:
            assert sa.make_url(found[0]).get_backend_name() == test_url.get_backend_name()
            self.swapped += 1
            return test_url.render_as_string(hide_password=False)

        text = re.sub(EXAMPLE, url, text)
        if DJANGO_EXAMPLE in text:
            assert test_url.get_backend_name() == "postgresql"
            self.swapped += 1
            text = text.replace(
                DJANGO_EXAMPLE,
                f'"NAME": {test_url.database!r}, "USER": {test_url.username or ""!r}, '
                f'"PASSWORD": {test_url.password or ""!r}, "HOST": {test_url.host!r}, '
                f'"PORT": {str(test_url.port or "")!r}',
            )
        assert "app:secret@localhost" not in text, f"an example database left: {text}"
        return text

    # -- running the page --------------------------------------------------------

    def run(self, until: Callable[[], Any] | None = None) -> None:
        """Every block in the page's order; then, once ``until`` holds (or the
        background commands printed their lines), stop those with SIGINT."""
        try:
            for kind, text in self.blocks:
                if kind == "python":
                    self.write(text)
                else:
                    for command in commands(text):
                        self.command(command)
            if self.url is not None:
                assert self.swapped, f"{self.title}: no example database to swap"
            self.eventually(until or self.printed, "the work of the path to be done")
        except BaseException as exc:
            running = list(self.running)
            self.stop(check=False)
            if not isinstance(exc, AssertionError):
                raise
            logs = [f"--- $ {c.line}\n{log.read_text()[-4000:]}" for c, _, log in running]
            raise AssertionError("\n".join([str(exc), *logs])) from None
        self.stop()

    def eventually(self, condition: Callable[[], Any], what: str) -> Any:
        """``eventually``, failing at once when a background command ended."""

        def check() -> Any:
            for command, proc, _ in self.running:
                assert proc.poll() is None, f"$ {command.line} ended {proc.returncode}"
            return condition()

        return eventually(check, what)

    def write(self, block: str) -> None:
        kind, _, name = marker(block).partition(": ")
        assert kind in ("file", "append"), f"a python block without a file: {block[:80]}"
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "append":
            assert path.exists(), f"{name} is appended to before a command made it"
            path.write_text(path.read_text() + "\n" + self.swap(block))
        else:
            path.write_text(self.swap(block))

    def command(self, command: Command) -> None:
        args = [self.swap(arg) for arg in command.args]
        if args[:2] == ["pip", "install"]:
            assert not command.output
            self.check_install(args[2:])
            return
        if args[0] == "curl":
            self.curl(command, args[1:])
            return
        assert args[0] in PROGRAMS, f"the page runs {args[0]}, which the test cannot"
        python = [*PROGRAMS[args[0]], *args[1:]]
        if command.background:
            log = self.folder.parent / f"{self.folder.name}-{len(self.running)}.log"
            with log.open("wb") as out:
                proc = _preloaded.popen(
                    python, cwd=self.folder, env=self.env, stdout=out, stderr=subprocess.STDOUT
                )
            self.running.append((command, proc, log))
            return
        done = _preloaded.run(python, cwd=self.folder, env=self.env, timeout=WAIT)
        assert done.returncode == 0, f"$ {command.line}\n{done.stdout}{done.stderr}"
        assert done.stderr == "", f"$ {command.line}\n{done.stderr}"
        if command.output:
            assert matches(command.output, done.stdout.splitlines()), (
                f"$ {command.line}\nshown:\n" + "\n".join(command.output) + "\nprinted:\n"
            ) + done.stdout

    def curl(self, command: Command, args: list[str]) -> None:
        import httpx

        method = "GET"
        if args[:1] == ["-X"]:
            method, args = args[1], args[2:]
        assert len(args) == 1, f"curl options the test does not send: {command.line}"
        assert DEFAULT_ADDRESS in args[0]
        url = args[0].replace(DEFAULT_ADDRESS, f"127.0.0.1:{self.port}")

        def answer() -> httpx.Response | None:
            try:
                return httpx.request(method, url, timeout=WAIT)
            except httpx.ConnectError:  # the server is still starting
                return None

        reply = self.eventually(answer, f"{url} to answer")
        assert reply.is_success, reply.text
        assert matches(command.output, reply.text.splitlines()), reply.text

    def printed(self) -> bool:
        """Whether every background command printed the lines under it."""
        return all(self.shows(command, log.read_text()) for command, _, log in self.running)

    @staticmethod
    def shows(command: Command, printed: str) -> bool:
        lines = printed.splitlines()
        return all(
            any(pattern(shown).fullmatch(line) for line in lines)
            for shown in command.output
            if shown != "..."
        )

    def stop(self, *, check: bool = True) -> None:
        """SIGINT to the background commands, last first, as Ctrl-C in their
        terminals; each must stop, having printed the lines under it."""
        failures = []
        for command, proc, log in reversed(self.running):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=WAIT)
            printed = log.read_text()
            status, line = STOPPED[command.args[0]]
            stopped = proc.returncode == status and line in printed.splitlines()
            if not (stopped and self.shows(command, printed)):
                failures.append(f"$ {command.line} ended {proc.returncode}:\n{printed[-4000:]}")
        self.running.clear()
        assert not (check and failures), "\n".join(failures)

    # -- pip install -------------------------------------------------------------

    def check_install(self, names: list[str]) -> None:
        """The extras exist, and what is installed covers what the path imports,
        runs and connects to."""
        provided = set()
        extras: set[str] = set()
        for name in names:
            requirement = Requirement(name)
            provided.add(canonicalize_name(requirement.name))
            if canonicalize_name(requirement.name) == "novaque":
                offered = set(importlib.metadata.metadata("novaque").get_all("Provides-Extra"))
                assert requirement.extras <= offered - {"dev"}, requirement.extras
                extras = set(requirement.extras)
        for line in importlib.metadata.requires("novaque") or []:
            dependency = Requirement(line)
            wanted = dependency.marker is None or any(
                dependency.marker.evaluate({"extra": extra}) for extra in extras
            )
            if wanted:
                provided.add(canonicalize_name(dependency.name))
        needed = {canonicalize_name(d) for d in self.needed_distributions(extras)}
        assert needed <= provided, f"{self.title}: pip install lacks {needed - provided}"

    def needed_distributions(self, extras: set[str]) -> set[str]:
        local = {Path(name).parts[0].removesuffix(".py") for name in self.files}
        distributions = packages_distributions()
        needed = set()
        for text in self.files.values():
            for node in ast.walk(ast.parse(text)):
                modules = []
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules = [node.module]
                for module in modules:
                    if module in MODULE_EXTRAS:
                        assert MODULE_EXTRAS[module] in extras, f"{module} needs its extra"
                    top = module.partition(".")[0]
                    if top not in sys.stdlib_module_names and top not in local:
                        needed.update(distributions[top])
        for kind, text in self.blocks:
            if kind == "console":
                for command in commands(text):
                    program = command.args[0]
                    if program in PROGRAM_DISTRIBUTIONS:
                        needed.add(PROGRAM_DISTRIBUTIONS[program])
        for found, driver in DRIVERS.items():
            if found in self.text:
                needed.update(distributions[driver])
        return needed


# -- the paths ---------------------------------------------------------------------------


def test_the_sqlite_script(tmp_path: Path) -> None:
    path = QuickPath("1. A script on SQLite", tmp_path)
    path.run()
    client = novaque.connect(f"sqlite:///{path.folder / 'novaque.db'}")
    try:
        messages = client.list_messages("orders")
        assert [json.loads(m.body)["id"] for m in messages] == [1, 2, 3]
        assert all(m.deliveries == [] for m in messages)  # every one acked
    finally:
        client.shutdown(timeout=10)


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_the_fastapi_application(backend: Backend, tmp_path: Path) -> None:
    path = QuickPath("2. FastAPI on PostgreSQL", tmp_path, backend)
    client = backend.client(path.url)

    def acked() -> bool:
        messages = client.list_messages("orders")
        return len(messages) == 1 and messages[0].deliveries == []

    # Done once the consumer acked the event. (What it printed reaches the
    # log when uvicorn exits: a terminal shows it at once, a file gets it
    # in blocks.)
    path.run(until=acked)
    (message,) = client.list_messages("orders")
    assert json.loads(message.body) == {"id": 1, "item": "book"}
    # The order and its event, written by one transaction (PostgreSQL's xmin).
    with backend.engine(path.url).connect() as conn:
        order = conn.exec_driver_sql("SELECT id, item, xmin::text FROM orders").all()
        event = conn.exec_driver_sql("SELECT xmin::text FROM novaque_messages").scalar_one()
    assert order == [(1, "book", event)]


@pytest.mark.slow  # a Celery worker takes 4 to 5 s to stop: its loop polls in 2 s turns
@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_the_celery_worker(backend: Backend, tmp_path: Path) -> None:
    path = QuickPath("3. Celery on MySQL or MariaDB", tmp_path, backend)
    path.run()  # until the worker logged the task's success
    # The task went through novaque's tables on the server, and was acked there.
    client = backend.client(path.url)
    (message,) = client.list_messages("kombu::celery")
    assert json.loads(message.body)["headers"]["task"] == "tasks.send_receipt"
    assert message.deliveries == []


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_the_django_project(backend: Backend, tmp_path: Path) -> None:
    path = QuickPath("4. Django on PostgreSQL", tmp_path, backend)
    engine = backend.engine(path.url)

    def confirmed() -> list[Any]:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("shop_order"):
                return []
            return conn.exec_driver_sql("SELECT id, email FROM shop_order WHERE confirmed").all()

    path.run(until=confirmed)  # the handler's print, like uvicorn's, comes at exit
    ((order_id, email),) = confirmed()
    assert email == "ada@example.com"
    client = backend.client(path.url)
    (message,) = client.list_messages("orders")
    assert json.loads(message.body) == {"order": order_id}
    assert message.deliveries == []
