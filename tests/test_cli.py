"""The ``novaque`` command line, run in a process of its own like a user would
(forked from a server that imported novaque already, tests/_preloaded.py; the
tests that signal or read a running command start a fresh interpreter).

Most cases run on SQLite; ``test_server_backends`` walks the main commands
once on each server backend through ``backend.url``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
from novaque.broker import new_token, token_toml
from novaque.cli import main
from novaque.testing import FakeClock
from tests import _preloaded
from tests.conftest import Backend, driverless

ROOT = Path(__file__).resolve().parent.parent


def run(
    *args: str,
    cwd: Path,
    url: str | None = None,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    command = ["-m", "novaque.cli", *(["--url", url] if url else []), *args]
    full_env = {k: v for k, v in os.environ.items() if k != "NOVAQUE_DATABASE_URL"}
    full_env.update(env or {})
    return _preloaded.run(
        command,
        cwd=cwd,
        input=stdin.decode() if stdin is not None else None,
        timeout=120,
        env=full_env,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], status: int = 1) -> str:
    assert result.returncode == status, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("novaque: error: ")
    return lines[0]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A migrated SQLite database at the default location (./novaque.db)."""
    ok(run("migrate", cwd=tmp_path))
    return tmp_path


def test_migrate_uses_the_default_sqlite_file(tmp_path: Path) -> None:
    out = ok(run("migrate", cwd=tmp_path))
    assert out.startswith("sqlite:///novaque.db: novaque schema at revision ")
    assert (tmp_path / "novaque.db").is_file()
    assert ok(run("migrate", cwd=tmp_path)) == out  # again: nothing to do


def test_url_from_environment_and_downgrade(tmp_path: Path) -> None:
    env = {"NOVAQUE_DATABASE_URL": f"sqlite:///{tmp_path / 'env.db'}"}
    ok(run("migrate", cwd=tmp_path, env=env))
    assert (tmp_path / "env.db").is_file()
    assert not (tmp_path / "novaque.db").exists()
    out = ok(run("downgrade", "--to", "base", cwd=tmp_path, env=env))
    assert "revision base" in out
    error = one_line_error(run("topics", cwd=tmp_path, env=env))
    assert "run `novaque migrate`" in error


def test_channels_show_pause_and_resume(db: Path) -> None:
    ok(run("channels", "orders", "--create", "billing", cwd=db))
    shown = json.loads(ok(run("channels", "orders", "--show", "billing", cwd=db)))
    assert (shown["ordering"], shown["filter"], shown["paused"]) == ("standard", None, False)
    assert ok(run("channels", "orders", "--pause", "billing", cwd=db)) == (
        "paused channel orders/billing\n"
    )
    assert json.loads(ok(run("channels", "orders", "--show", "billing", cwd=db)))["paused"]
    ok(run("publish", "orders", "x", cwd=db))
    client = novaque.connect(f"sqlite:///{db / 'novaque.db'}")
    assert client.claim("orders", "billing") == []
    assert ok(run("channels", "orders", "--resume", "billing", cwd=db)) == (
        "resumed channel orders/billing\n"
    )
    assert [m.body for m in client.claim("orders", "billing")] == [b"x"]
    error = one_line_error(run("channels", "orders", "--pause", "nope", cwd=db))
    assert "channel 'nope' of topic 'orders' does not exist" in error


def test_topics_and_channels(db: Path) -> None:
    assert ok(run("topics", cwd=db)) == ""
    assert ok(run("channels", "orders", "--create", "billing", cwd=db)) == (
        "channel orders/billing is ready\n"
    )
    ok(run("channels", "orders", "--create", "shipping", cwd=db))
    ok(run("topics", "--create", "audit", cwd=db))
    assert ok(run("topics", cwd=db)) == "audit\norders\n"
    assert ok(run("channels", "orders", cwd=db)) == "billing\nshipping\n"
    ok(run("channels", "orders", "--delete", "shipping", cwd=db))
    assert ok(run("channels", "orders", cwd=db)) == "billing\n"
    refused = one_line_error(run("topics", "--delete", "orders", cwd=db))
    assert "standard input is not a terminal" in refused
    assert "pass --yes" in refused
    assert ok(run("topics", cwd=db)) == "audit\norders\n"  # nothing deleted
    assert "does not exist" in one_line_error(run("topics", "--delete", "nope", "--yes", cwd=db))
    ok(run("topics", "--delete", "orders", "--yes", cwd=db))
    assert ok(run("topics", cwd=db)) == "audit\n"


def test_publish_body_and_stdin(db: Path) -> None:
    ok(run("channels", "orders", "--create", "billing", cwd=db))
    first = int(ok(run("publish", "orders", '{"id": 1}', "-H", "k=v", cwd=db)))
    second = int(ok(run("publish", "orders", "-", cwd=db, stdin=b"from stdin\n")))
    assert second > first
    client = novaque.connect(f"sqlite:///{db / 'novaque.db'}")
    try:
        got = client.claim("orders", "billing", max_messages=5)
        assert [(m.body, m.headers) for m in got] == [
            (b'{"id": 1}', {"k": "v"}),
            (b"from stdin\n", {}),
        ]
    finally:
        client._context.executor.engine.dispose()


def test_bad_input_is_one_line(db: Path, tmp_path: Path) -> None:
    assert "topic 'nope' does not exist" in one_line_error(run("channels", "nope", cwd=db))
    assert "invalid topic name" in one_line_error(run("channels", "a b", cwd=db))
    assert "delay" in one_line_error(run("publish", "t", "x", "--delay", "-5", cwd=db))


def test_bad_url(tmp_path: Path) -> None:
    error = one_line_error(run("topics", cwd=tmp_path, url="nosuchdb://x"))
    assert "nosuchdb" in error
    error = one_line_error(run("topics", cwd=tmp_path, url="not a url"))
    assert "URL" in error
    unreachable = "postgresql+psycopg://nobody:secret@127.0.0.1:1/none"
    error = one_line_error(run("topics", cwd=tmp_path, url=unreachable))
    assert "database error" in error
    assert "secret" not in error


def test_missing_or_unmigrated_database(tmp_path: Path) -> None:
    error = one_line_error(run("topics", cwd=tmp_path))
    assert "novaque.db does not exist" in error
    assert not (tmp_path / "novaque.db").exists()  # a typo does not leave files behind
    (tmp_path / "empty.db").touch()
    error = one_line_error(run("topics", cwd=tmp_path, url="sqlite:///empty.db"))
    assert "novaque's tables are missing" in error
    assert "novaque migrate" in error


def test_debug_shows_the_traceback(db: Path) -> None:
    result = run("--debug", "channels", "nope", cwd=db)
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    assert "TopicNotFound" in result.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in (["nosuch"], [], ["downgrade"], ["dead", "list", "t"], ["stats", "--since", "x"]):
        result = run(*args, cwd=tmp_path)
        assert result.returncode == 2, args
        assert "usage:" in result.stderr
    assert run("topics", "--bogus", cwd=tmp_path).returncode == 2


def test_version_and_help(tmp_path: Path) -> None:
    assert ok(run("--version", cwd=tmp_path)).strip() == f"novaque {novaque.__version__}"
    out = ok(run("--help", cwd=tmp_path))
    for command in ("migrate", "downgrade", "topics", "channels", "stats", "dead", "publish"):
        assert command in out
    for command in ("admin", "demo", "bench"):
        assert command in out


def test_bench_outside_a_source_checkout(tmp_path: Path) -> None:
    # Copy the package alone (no benchmarks/ beside it), as an installed wheel has it.
    import shutil

    shutil.copytree(ROOT / "novaque", tmp_path / "site" / "novaque")
    result = subprocess.run(
        [sys.executable, "-m", "novaque.cli", "bench"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    error = one_line_error(result)
    assert "benchmarks run from a source checkout" in error


@pytest.mark.skipif(
    not (ROOT / "benchmarks" / "run.py").is_file(), reason="benchmarks/run.py not on this branch"
)
def test_bench_forwards_its_arguments(tmp_path: Path) -> None:
    result = run("bench", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout.lower()


def test_stats_table_and_json(db: Path) -> None:
    ok(run("channels", "orders", "--create", "billing", cwd=db))
    ok(run("channels", "orders", "--create", "shipping", cwd=db))
    # From the day before: the publish is counted if the run crosses midnight.
    since = (datetime.now(timezone.utc) - timedelta(days=1)).date().isoformat()
    ok(run("publish", "orders", "x", cwd=db))
    table = ok(run("stats", "--since", since, cwd=db)).splitlines()
    assert table[0].startswith(f"backlog now; counters for UTC days {since} .. today")
    assert table[1].split()[:7] == [
        "TOPIC", "CHANNEL", "PENDING", "READY", "IN_FLIGHT", "DEFERRED", "DEAD",
    ]  # fmt: skip
    assert table[2].split()[:7] == ["orders", "billing", "0", "1", "0", "0", "0"]
    assert len(table) == 4
    data = json.loads(ok(run("stats", "orders", "billing", "--since", since, "--json", cwd=db)))
    (row,) = data["channels"]
    oldest = row["backlog"].pop("oldest_ready_at")
    assert datetime.fromisoformat(oldest) <= datetime.now(timezone.utc)
    assert row["backlog"] == {"pending": 0, "ready": 1, "in_flight": 0, "deferred": 0, "dead": 0}
    assert row["counters"]["published"] == 1
    assert "does not exist" in one_line_error(run("stats", "orders", "nope", cwd=db))
    assert "does not exist" in one_line_error(run("stats", "nope", cwd=db))


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``novaque ARGS`` run in this process: its status, stdout and stderr."""
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_table_columns_are_named_as_in_python(
    backend: Backend, client: novaque.Client, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """``stats``: one column per key of ``--json``, named after it and in its
    order: every field of ``Backlog`` (``deferred`` and ``oldest_ready_at``
    included), then every field of ``Counters`` (``dead``, as in Python).
    ``dead list``: the fields of ``DeadLetter``."""
    client.ensure_channel("orders", "billing")
    client.publish_many("orders", ["a", "b", "c", "d"])  # due now, by the fake clock
    first, second = client.claim("orders", "billing", max_messages=2)
    client.defer(first)
    client.reject(second, "bad order")
    (in_flight,) = client.claim("orders", "billing")
    client.flush_stats()
    day = clock().date().isoformat()
    window = ["--url", backend.url, "stats", "orders", "--since", day, "--until", day]
    status, out, err = cli(capsys, *window)
    assert status == 0, err
    title, head, row = out.splitlines()
    assert title == f"backlog now; counters for UTC days {day} .. {day}"
    assert head.split() == [
        "TOPIC", "CHANNEL", "PENDING", "READY", "IN_FLIGHT", "DEFERRED", "DEAD",
        "OLDEST_READY_AT", "|", "PUBLISHED", "CLAIMED", "ACKED", "REQUEUED", "DEAD", "PURGED",
    ]  # fmt: skip
    oldest = clock().strftime("%Y-%m-%d %H:%M:%S").split()  # the command's clock is later
    assert row.split() == [
        "orders", "billing", "0", "1", "1", "1", "1", *oldest, "|", "4", "3", "0", "0", "1", "0",
    ]  # fmt: skip
    status, out, err = cli(capsys, *window, "--json")
    assert status == 0, err
    (channel,) = json.loads(out)["channels"]
    backlog, counters = channel["backlog"], channel["counters"]
    assert list(backlog) == [*(s.lower() for s in head.split()[2:7]), "oldest_ready_at"]
    assert sorted(backlog) == sorted(f.name for f in dataclasses.fields(novaque.Backlog))
    assert list(counters) == [f.name for f in dataclasses.fields(novaque.Counters)]
    assert [k.upper() for k in [*backlog, "|", *counters]] == head.split()[2:]
    assert backlog["oldest_ready_at"] == clock().isoformat()
    assert (backlog["deferred"], backlog["in_flight"], counters["dead"]) == (1, 1, 1)
    client.ack(in_flight)
    status, out, err = cli(capsys, "--url", backend.url, "dead", "list", "orders", "billing")
    assert status == 0, err
    head, row = out.splitlines()
    (letter,) = client.list_dead("orders", "billing")
    assert [f.name for f in dataclasses.fields(letter)] == [
        "delivery_id", "message_id", "attempts", "reason", "last_error", "body_len",
        "published_at", "died_at", "body",
    ]  # fmt: skip
    assert head.split() == [  # the fields of DeadLetter that fit a line
        "DELIVERY_ID", "MESSAGE_ID", "ATTEMPTS", "DIED_AT", "BODY_LEN", "REASON", "LAST_ERROR",
    ]  # fmt: skip
    assert row.split() == [
        str(second.delivery_id), str(second.id), "1", *oldest, "1", "bad", "order", "-",
    ]  # fmt: skip


def test_dead_list_requeue_delete(db: Path) -> None:
    url = f"sqlite:///{db / 'novaque.db'}"
    client = novaque.connect(url)
    try:
        client.ensure_channel("orders", "billing")
        client.publish_many("orders", ["a", "b", "c"])
        ids = []
        for _ in range(3):
            (msg,) = client.claim("orders", "billing")
            client.reject(msg, "bad\norder")
            ids.append(msg.delivery_id)
        client.flush_stats()
    finally:
        client._context.executor.engine.dispose()
    listing = ok(run("dead", "list", "orders", "billing", "--body", cwd=db)).splitlines()
    assert listing[0].split() == [  # DeadLetter's fields (the body: a preview of it)
        "DELIVERY_ID",
        "MESSAGE_ID",
        "ATTEMPTS",
        "DIED_AT",
        "BODY_LEN",
        "REASON",
        "LAST_ERROR",
        "BODY",
    ]
    assert [int(line.split()[0]) for line in listing[1:]] == ids
    assert "bad order" in listing[1]
    out = ok(run("dead", "requeue", "orders", "billing", str(ids[0]), cwd=db))
    assert out == "requeued 1 dead letter of orders/billing\n"
    assert "pass --yes" in one_line_error(
        run("dead", "delete", "orders", "billing", "--all", cwd=db)
    )
    out = ok(run("dead", "delete", "orders", "billing", "--all", "--yes", cwd=db))
    assert out == "deleted 2 dead letters of orders/billing\n"
    assert "no dead letters" in ok(run("dead", "list", "orders", "billing", cwd=db))
    error = one_line_error(run("dead", "requeue", "orders", "billing", cwd=db))
    assert "--all" in error
    assert run("dead", "requeue", "orders", "billing", "x", cwd=db).returncode == 2


def dead_letters(db: Path, count: int) -> list[int]:
    """Channel orders/billing with ``count`` dead letters (dying a second apart,
    by a fake clock), and orders/retry created after them; their delivery ids."""
    moment = [datetime(2026, 11, 29, 9, 0, tzinfo=timezone.utc)]
    client = novaque.connect(f"sqlite:///{db / 'novaque.db'}", clock=lambda: moment[0])
    try:
        client.ensure_channel("orders", "billing")
        client.publish_many("orders", [str(i) for i in range(count)])
        ids = []
        for msg in client.claim("orders", "billing", max_messages=count):
            client.reject(msg, "bad")
            ids.append(msg.delivery_id)
            moment[0] += timedelta(seconds=1)
        client.ensure_channel("orders", "retry")
        client.flush_stats()
        return ids
    finally:
        client._context.executor.engine.dispose()


def test_dead_redrive_with_limit_died_before_and_rate(db: Path) -> None:
    ids = dead_letters(db, 5)
    out = ok(
        run("dead", "requeue", "orders", "billing", "--to-channel", "retry", "--limit", "2", cwd=db)
    )
    assert out == "requeued 2 dead letters of orders/billing to orders/retry\n"
    listing = ok(run("dead", "list", "orders", "billing", cwd=db)).splitlines()
    assert [int(line.split()[0]) for line in listing[1:]] == ids[2:]  # the oldest went first
    cut = "2026-11-29T09:00:04Z"  # letters 3 and 4 (0-based 2, 3) died before it
    result = run("dead", "delete", "orders", "billing", "--died-before", cut, "--progress", cwd=db)
    assert ok(result) == "deleted 2 dead letters of orders/billing\n"
    # The progress line, on stderr: a count without a bar, since --died-before
    # leaves unknown how many letters the pass takes (3 are dead in all).
    assert result.stderr.strip() == "deleted 2"
    out = ok(run("dead", "requeue", "orders", "billing", "--all", "--rate", "1000", cwd=db))
    assert out == "requeued 1 dead letter of orders/billing\n"
    assert "no dead letters" in ok(run("dead", "list", "orders", "billing", cwd=db))
    error = one_line_error(
        run("dead", "requeue", "orders", "billing", "--all", "--to-channel", "nope", cwd=db)
    )
    assert "channel 'nope' of topic 'orders' does not exist" in error
    for bad in (
        ["--died-before", "2026-11-29T09:00:00"],  # no zone
        ["--died-before", "soon"],
        ["--rate", "0"],
        ["--rate", "x"],
        ["--limit", "0"],
    ):
        result = run("dead", "requeue", "orders", "billing", *bad, cwd=db)
        assert result.returncode == 2, bad
        assert "usage:" in result.stderr
    assert (
        run("dead", "delete", "orders", "billing", "--to-channel", "retry", cwd=db).returncode == 2
    )
    assert run("dead", "delete", "orders", "billing", "--rate", "5", cwd=db).returncode == 2


def test_counts_of_one_are_singular(db: Path) -> None:
    ids = dead_letters(db, 3)
    out = ok(
        run("dead", "requeue", "orders", "billing", str(ids[0]), "--to-channel", "retry", cwd=db)
    )
    assert out == "requeued 1 dead letter of orders/billing to orders/retry\n"
    out = ok(run("dead", "delete", "orders", "billing", str(ids[1]), cwd=db))
    assert out == "deleted 1 dead letter of orders/billing\n"
    out = ok(run("dead", "delete", "orders", "billing", "--all", "--yes", cwd=db))
    assert out == "deleted 1 dead letter of orders/billing\n"
    out = ok(run("dead", "requeue", "orders", "billing", "--all", cwd=db))
    assert out == "requeued 0 dead letters of orders/billing\n"
    ok(run("channels", "invoices", "--create", "billing", cwd=db))
    message_id = ok(run("publish", "invoices", "later", "--delay", "3600", cwd=db)).strip()
    out = ok(run("cancel", message_id, cwd=db))
    assert out == f"cancelled 1 never-attempted delivery of message {message_id}\n"
    out = ok(run("cancel", message_id, cwd=db))
    assert out == f"cancelled 0 never-attempted deliveries of message {message_id}\n"
    error = one_line_error(run("topics", "--delete", "invoices", cwd=db))
    assert error.startswith(
        "novaque: error: Delete topic invoices with its 1 channel and all its messages, "
        "deliveries and counters: not without a confirmation"
    )


def run_on_a_terminal(args: list[str], cwd: Path, answer: bytes) -> tuple[int, str]:
    """The command with a pseudo-terminal as standard input, answering ``answer``."""
    import pty

    leader, follower = pty.openpty()
    try:
        env = {k: v for k, v in os.environ.items() if k != "NOVAQUE_DATABASE_URL"}
        os.write(leader, answer)
        done = _preloaded.run(
            ["-m", "novaque.cli", *args], cwd=cwd, stdin=os.ttyname(follower), env=env, timeout=120
        )
    finally:
        os.close(follower)
        os.close(leader)
    return done.returncode, done.stdout + done.stderr


def test_deleting_everything_asks_on_a_terminal(db: Path) -> None:
    dead_letters(db, 2)
    status, text = run_on_a_terminal(["dead", "delete", "orders", "billing", "--all"], db, b"n\n")
    assert status == 1
    assert "Delete every dead letter of orders/billing (2) for good? [y/N]" in text
    assert "not confirmed: nothing was changed" in text
    status, text = run_on_a_terminal(["dead", "delete", "orders", "billing", "--all"], db, b"y\n")
    assert status == 0, text
    assert "deleted 2 dead letters of orders/billing" in text
    status, text = run_on_a_terminal(["topics", "--delete", "orders"], db, b"yes\n")
    assert status == 0, text
    assert "Delete topic orders with its 2 channels" in text
    assert ok(run("topics", cwd=db)) == ""


def test_cancel_a_scheduled_message(db: Path) -> None:
    ok(run("channels", "orders", "--create", "billing", cwd=db))
    ok(run("channels", "orders", "--create", "shipping", cwd=db))
    message_id = ok(run("publish", "orders", "later", "--delay", "3600", cwd=db)).strip()
    out = ok(run("cancel", message_id, cwd=db))
    assert out == f"cancelled 2 never-attempted deliveries of message {message_id}\n"
    assert ok(run("cancel", message_id, cwd=db)).startswith("cancelled 0 ")
    assert "message 999999 does not exist" in one_line_error(run("cancel", "999999", cwd=db))
    assert run("cancel", "x", cwd=db).returncode == 2


#: A size as the commands print it: ``0 bytes``, ``124.0 KiB``, ``83.1 MiB``.
SIZE = r"\d+ bytes?|\d+\.\d [KMGT]iB"


def compact_sample() -> list[tuple[str, list[str]]]:
    """The commands of docs/cli.md's ``compact`` transcript (what follows
    ``novaque``, without the comment) and the lines each shows. What it prints
    depends on the database and on the file's layout, so the transcript test
    of docs/cli.md leaves it out: the tests here check each line instead."""
    text = (ROOT / "docs" / "cli.md").read_text()
    block = re.search(r"```console\n(.*?)```", text[text.index("## `compact`") :], re.S)
    assert block is not None
    commands: list[tuple[str, list[str]]] = []
    for line in block[1].splitlines():
        if line.startswith("$ novaque "):
            commands.append((line.removeprefix("$ novaque ").partition("#")[0].strip(), []))
        else:
            commands[-1][1].append(line)
    return commands


def shown_as(sample: list[str], lines: list[str]) -> list[list[str]]:
    """``lines`` read against the ``sample`` lines that show them, sizes
    aside: the sizes of each line (or AssertionError, naming the line)."""
    assert len(lines) == len(sample), (lines, sample)
    sizes = []
    for shown, line in zip(sample, lines, strict=True):
        parts = re.split(f"(?:{SIZE})", shown)
        pattern = f"({SIZE})".join(re.escape(part) for part in parts)
        found = re.fullmatch(pattern, line)
        assert found is not None, f"{line!r} is not shown as {shown!r}"
        sizes.append(list(found.groups()))
    return sizes


def printed(result: subprocess.CompletedProcess[str]) -> list[str]:
    """What a command that succeeded left on a terminal: its notices on stderr
    come before its result on stdout."""
    assert result.returncode == 0, result.stderr
    return result.stderr.splitlines() + result.stdout.splitlines()


def auto_vacuum(path: Path) -> int:
    raw = sqlite3.connect(path)
    try:
        return int(raw.execute("PRAGMA auto_vacuum").fetchone()[0])
    finally:
        raw.close()


def leave_free_pages(path: Path, count: int = 2_000) -> None:
    """Publish ``count`` messages of 4 KiB, pop them and prune them: the pages
    they took stay free in the file."""
    client = novaque.connect(f"sqlite:///{path}")
    try:
        client.ensure_channel("bulk", "drain")
        client.publish_many("bulk", [os.urandom(4096)] * count)
        while client.pop("bulk", "drain", max_messages=1000):
            pass
        assert client.prune(datetime.now(timezone.utc) + timedelta(days=1)) == count
    finally:
        client.shutdown()


def mib(size: str) -> float:
    number, unit = size.split()
    return float(number) / {"bytes": 2**20, "byte": 2**20, "KiB": 1024, "MiB": 1}[unit]


#: At least the bodies of the messages :func:`leave_free_pages` leaves behind.
BODIES_MIB = 2_000 * 4096 / 2**20


def test_compact_gives_the_space_back_as_docs_cli_md_shows(db: Path) -> None:
    (plain, shown), *_ = compact_sample()
    assert plain == "compact"
    path = db / "novaque.db"
    assert auto_vacuum(path) == 2  # `novaque migrate` made it incremental
    leave_free_pages(path)
    ((freed, now),) = shown_as(shown, printed(run(*plain.split(), cwd=db)))
    assert mib(freed) >= BODIES_MIB
    assert mib(now) < 1
    assert path.stat().st_size < 2**20
    assert run("compact", "now", cwd=db).returncode == 2


def test_compact_of_an_older_database_needs_full_as_docs_cli_md_shows(tmp_path: Path) -> None:
    """A file that held a table before novaque's (or an older novaque's) keeps
    SQLite's default mode: compact says so, --full switches it."""
    _, (plain, shown_plain), (full, shown_full), _ = compact_sample()
    assert (plain, full) == ("--url sqlite:///older.db compact", f"{plain} --full")
    path = tmp_path / "older.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE app_things (id INTEGER PRIMARY KEY)")
    raw.close()
    ok(run("--url", "sqlite:///older.db", "migrate", cwd=tmp_path))
    assert auto_vacuum(path) == 0
    leave_free_pages(path)
    (stay,), (freed, size) = shown_as(shown_plain, printed(run(*plain.split(), cwd=tmp_path)))
    assert mib(stay) >= BODIES_MIB
    assert freed == "0 bytes"
    (rewritten,), (freed, now) = shown_as(shown_full, printed(run(*full.split(), cwd=tmp_path)))
    assert rewritten == size
    assert mib(freed) >= BODIES_MIB
    assert mib(now) < 1
    assert auto_vacuum(path) == 2


@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)
def test_compact_leaves_the_servers_alone_as_docs_cli_md_shows(backend: Backend) -> None:
    *_, (command, shown) = compact_sample()
    assert command == "--url postgresql+psycopg://app:secret@db/app compact"
    family = {"postgres": "PostgreSQL", "mysql": "MySQL"}[backend.name]
    for full in ([], ["--full"]):
        lines = printed(run("compact", *full, cwd=Path.cwd(), url=backend.url))
        assert lines == [line.replace("PostgreSQL", family) for line in shown]


@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)  # SQLite: above
def test_server_backends(backend: Backend) -> None:
    """One pass of the main commands on each server backend."""
    cwd = Path.cwd()
    url = backend.url
    ok(run("migrate", cwd=cwd, url=url))
    ok(run("channels", "cli-orders", "--create", "billing", cwd=cwd, url=url))
    assert ok(run("channels", "cli-orders", cwd=cwd, url=url)) == "billing\n"
    message_id = int(ok(run("publish", "cli-orders", "x", cwd=cwd, url=url)))
    assert message_id > 0
    assert "cli-orders" in ok(run("topics", cwd=cwd, url=url)).split()
    assert "does not exist" in one_line_error(run("channels", "nope", cwd=cwd, url=url))
    assert "cli-orders" in ok(run("stats", "cli-orders", cwd=cwd, url=url))
    assert "no dead letters" in ok(run("dead", "list", "cli-orders", "billing", cwd=cwd, url=url))


@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)
def test_urls_that_name_no_driver_are_accepted(backend: Backend) -> None:
    """``postgres://`` (Heroku's and many platforms' form), ``postgresql://`` and
    ``mysql://`` get novaque's driver, as in novaque.connect."""
    cwd = Path.cwd()
    for given in driverless(backend):
        scheme = sa.make_url(given).drivername
        ok(run("migrate", cwd=cwd, url=given))
        ok(run("channels", "cli-plain", "--create", scheme, cwd=cwd, url=given))
        assert scheme in ok(run("channels", "cli-plain", cwd=cwd, url=given)).split()


def test_demo_runs_bounded_and_stops_cleanly(tmp_path: Path) -> None:
    result = run(
        "demo", "--duration", "2", "--port", "0", "--rate", "20", "--seed", "1", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "novaque demo on sqlite:///novaque.db"
    assert re.fullmatch(r"admin UI: http://127\.0\.0\.1:\d+/admin/", lines[1])
    assert any(line.startswith("published ") and "billing: ok" in line for line in lines)
    assert lines[-1].startswith("stopped cleanly")
    assert (tmp_path / "novaque.db").is_file()


def test_demo_stops_on_ctrl_c(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NOVAQUE_DATABASE_URL"}
    process = subprocess.Popen(
        [sys.executable, "-m", "novaque.cli", "demo", "--port", "0", "--rate", "50"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        seen = []
        for line in process.stdout:  # wait until it publishes (bounded by the timeout below)
            seen.append(line)
            if line.startswith("published "):
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    assert out.rstrip().splitlines()[-1].startswith("stopped cleanly")
    client = novaque.connect(f"sqlite:///{tmp_path / 'novaque.db'}")
    try:
        assert client.list_channels("orders") == ["billing", "shipping"]
    finally:
        client._context.executor.engine.dispose()


def test_admin_serves_until_interrupted(db: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NOVAQUE_DATABASE_URL"}
    env["NOVAQUE_ADMIN_PASSWORD"] = "pw"
    process = subprocess.Popen(
        [sys.executable, "-m", "novaque.cli", "admin", "--port", "0", "--user", "ops"],
        cwd=db,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.match(r"novaque admin \((wsgiref|waitress)\) on (http://\S+/admin/) ", line)
        assert found is not None, line
        url = found.group(2)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=30)
        assert refused.value.code == 401
        refused.value.close()
        request = urllib.request.Request(
            url + "api/topics",
            headers={"Authorization": "Basic b3BzOnB3"},  # ops:pw
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert json.loads(reply.read()) == {"topics": []}
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "Traceback" not in err


def test_admin_refuses_bad_options(db: Path) -> None:
    error = one_line_error(run("admin", "--user", "ops", cwd=db))
    assert "NOVAQUE_ADMIN_PASSWORD" in error
    assert run("admin", "--port", "70000", cwd=db).returncode == 2
    (db / "elsewhere").mkdir()
    assert "does not exist" in one_line_error(run("admin", cwd=db / "elsewhere"))


@pytest.mark.parametrize(
    ("url", "module"),
    [
        ("mysql+mysqldb://root@127.0.0.1/test", "MySQLdb"),
        ("mysql://root@127.0.0.1/test", "pymysql"),
    ],
)
def test_a_missing_driver_names_the_right_extra_and_url(
    tmp_path: Path, url: str, module: str
) -> None:
    code = (
        f"import sys; sys.modules[{module!r}] = None; from novaque.cli import main; "
        f"sys.exit(main(['--url', {url!r}, 'topics']))"
    )
    done = _preloaded.run(["-c", code], cwd=tmp_path, timeout=120)
    error = one_line_error(done)
    assert "pip install 'novaque[mysql]'" in error
    if module == "MySQLdb":  # another driver than novaque's: its URL form is named
        assert "mysql+pymysql://" in error
    assert "postgres" not in error


@pytest.mark.parametrize("command", ["admin", "demo", "serve"])
def test_a_port_in_use_is_one_line_naming_it_and_port_0(db: Path, command: str) -> None:
    (db / "tokens.toml").write_text(token_toml(new_token(), ["admin"]))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--port", str(port)] + (["--duration", "1"] if command == "demo" else [])
        args += ["--tokens", "tokens.toml"] if command == "serve" else []
        error = one_line_error(run(command, *args, cwd=db))
    assert f"127.0.0.1:{port}" in error
    assert "already in use" in error
    assert "--port 0" in error
