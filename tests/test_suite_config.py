"""The suite itself: a configured but unreachable server fails the run; an
unconfigured one is one skip line saying how to enable it; a serial test
runs alone; the servers' test databases say whose they are and go away with
their process."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import _preloaded, _serial, _testdb
from tests.conftest import Backend, run_pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_run(target: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The suite on ``target`` in a subprocess, as ``make test`` runs it."""
    return run_pytest(ROOT, target, env=env, timeout=120)


def without_topologies() -> dict[str, str]:
    """This environment without PgBouncer's URL (and not CI's, which would fail
    the run for its absence)."""
    return {k: v for k, v in os.environ.items() if k not in ("NOVAQUE_TEST_PGBOUNCER_URL", "CI")}


def test_an_unreachable_configured_server_fails_instead_of_skipping() -> None:
    env = {
        **os.environ,
        "NOVAQUE_TEST_POSTGRES_URL": "postgresql+psycopg://postgres@127.0.0.1:1/postgres",
        "NOVAQUE_TEST_MYSQL_URL": "mysql+pymysql://root@127.0.0.1:1/test",
        "NOVAQUE_TEST_PGBOUNCER_URL": "postgresql+psycopg://postgres@127.0.0.1:1/postgres",
    }
    done = pytest_run("tests/test_publish.py::test_late_channel_does_not_see_earlier_messages", env)
    assert done.returncode != 0
    assert "NOVAQUE_TEST_POSTGRES_URL is set" in done.stdout
    assert "NOVAQUE_TEST_MYSQL_URL is set" in done.stdout
    assert "NOVAQUE_TEST_PGBOUNCER_URL is set" in done.stdout
    assert "2 passed" in done.stdout  # SQLite still ran (on both twins)
    assert " skipped" not in done.stdout.splitlines()[-1]


def test_without_servers_each_backend_is_one_skip_line_saying_how_to_enable_it() -> None:
    env = {k: v for k, v in without_topologies().items() if not k.startswith("NOVAQUE_TEST_")}
    env["DOCKER_HOST"] = "tcp://127.0.0.1:1"  # no Docker engine either
    # Two tests (one on each client): each backend's two skips make one line.
    done = pytest_run("tests/test_publish.py::test_late_channel_does_not_see_earlier_messages", env)
    assert done.returncode == 0, done.stdout
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    # One per server backend, however many tests, and PgBouncer's (the module
    # runs through it too).
    assert len(skipped) == 3, skipped
    assert all(line.startswith("SKIPPED [2] ") for line in skipped), skipped
    pgbouncer = next(line for line in skipped if "pgbouncer not tested" in line)
    assert "tests/topologies/pgbouncer.sh start" in pgbouncer
    assert "NOVAQUE_TEST_PGBOUNCER_URL" in pgbouncer
    skipped.remove(pgbouncer)
    postgres, mysql = sorted(skipped, key=lambda line: "mysql" in line)
    assert "NOVAQUE_TEST_POSTGRES_URL=postgresql+psycopg://" in postgres
    assert "NOVAQUE_TEST_MYSQL_URL=mysql+pymysql://root@127.0.0.1:3306/mysql" in mysql
    assert all("Docker" in line and "testcontainers" in line for line in skipped)


def test_in_ci_a_topology_that_was_not_started_fails_instead_of_skipping() -> None:
    env = {**without_topologies(), "CI": "true"}
    target = "tests/test_groups.py::test_a_group_travels_with_its_message"
    done = pytest_run(target, env)
    assert done.returncode != 0
    assert "CI=true but pgbouncer not tested: set NOVAQUE_TEST_PGBOUNCER_URL" in done.stdout
    # The topology is not skipped (a server without its URL may be, on a
    # developer's machine: CI sets both).
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert not [line for line in skipped if "pgbouncer" in line], skipped
    assert " error" in done.stdout.splitlines()[-1]


def test_a_sqlite_run_says_nothing_of_the_postgres_restart() -> None:
    """The serial test restarts PostgreSQL: without PostgreSQL it is left out
    silently (the postgres line says that backend was not tested)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOVAQUE_TEST_")}
    env["DOCKER_HOST"] = "tcp://127.0.0.1:1"
    done = pytest_run(
        "tests/test_consumer_processes.py::test_consumer_resumes_after_a_postgres_restart", env
    )
    assert done.returncode == 5, done.stdout  # nothing to run
    assert "restart" not in done.stdout.lower()
    assert "skipped" not in done.stdout
    assert "deselected" not in done.stdout


# -- serial tests ---------------------------------------------------------------------------


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll another thread's progress (not a wait for time to pass)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def locked(path: str, how: int) -> bool:
    """Whether ``path`` cannot be locked ``how`` now (probed on a file of its own)."""
    with open(path, "ab") as probe:
        try:
            fcntl.flock(probe, how | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
        return False


def test_a_serial_test_waits_for_running_tests_and_holds_new_ones_off(tmp_path: Path) -> None:
    """Three workers' plugins on one session's lock: a serial test waits for
    the test running, and the test that comes after waits for it."""
    path = str(tmp_path / "serial.lock")
    workers = [_serial.SerialTests({}) for _ in range(3)]
    for worker in workers:
        worker.path = path
    events: list[str] = []
    release = {name: threading.Event() for name in ("running", "serial", "after")}

    def test(worker: _serial.SerialTests, name: str, *, serial: bool) -> threading.Thread:
        def body() -> None:
            with worker._held(exclusive=serial):
                events.append(f"{name} starts")
                release[name].wait(60)
                events.append(f"{name} ends")

        thread = threading.Thread(target=body)
        thread.start()
        return thread

    running = test(workers[0], "running", serial=False)
    wait_until(lambda: events == ["running starts"], "the first test")
    serial = test(workers[1], "serial", serial=True)
    wait_until(lambda: locked(path + ".in", fcntl.LOCK_EX), "the serial test to queue")
    after = test(workers[2], "after", serial=False)
    # Neither gets in while the first test runs (the turnstile is the serial test's).
    wait_until(lambda: locked(path + ".in", fcntl.LOCK_EX), "the serial test to queue")
    assert events == ["running starts"]
    release["running"].set()
    wait_until(lambda: "serial starts" in events, "the serial test")
    assert locked(path, fcntl.LOCK_SH)  # no test can start beside it
    release["serial"].set()
    release["after"].set()
    for thread in (running, serial, after):
        thread.join(60)
    assert events == [
        "running starts",
        "running ends",
        "serial starts",
        "serial ends",
        "after starts",
        "after ends",
    ]
    for worker in workers:
        assert worker.files is not None
        for file in worker.files:
            file.close()


# -- the servers' test databases ------------------------------------------------------------


@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)
def test_a_test_database_is_named_for_its_process(backend: Backend) -> None:
    name = sa.make_url(backend.url).database
    assert name is not None
    found = _testdb.NAME.fullmatch(name)
    assert found is not None, name
    assert int(found.group(1)) == os.getpid()
    start = _testdb.started(os.getpid())
    assert start is not None
    assert found.group(2) == _testdb.stamp(start)
    assert len(name) <= 63  # PostgreSQL's longest name (MySQL's: 64)


def databases(backend: Backend) -> set[str]:
    engine = sa.create_engine(backend.server_url or "", poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            if backend.name == "postgres":
                query = "SELECT datname FROM pg_database"
            else:
                query = "SELECT schema_name FROM information_schema.schemata"
            return {name for (name,) in conn.exec_driver_sql(query)}
    finally:
        engine.dispose()


SIGTERMED = """
import os, sys, signal, sqlalchemy as sa
from tests import _testdb
url, _ = _testdb.create(sys.argv[1], sys.argv[2])
engine = sa.create_engine(url)
conn = engine.connect()
conn.exec_driver_sql("CREATE TABLE t (id INT)")
conn.exec_driver_sql("INSERT INTO t VALUES (1)")  # a transaction left open
with open(sys.argv[3] + ".tmp", "w") as out:
    out.write(sa.make_url(url).database)
os.rename(sys.argv[3] + ".tmp", sys.argv[3])
signal.pause()
"""


@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)
def test_a_test_process_ended_by_sigterm_drops_its_databases(
    backend: Backend, tmp_path: Path
) -> None:
    assert backend.server_url is not None
    named = tmp_path / "name"
    proc = _preloaded.popen(
        ["-c", SIGTERMED, backend.name, backend.server_url, str(named)], cwd=Path.cwd()
    )
    try:
        wait_until(
            lambda: named.exists() or proc.poll() is not None,
            "the database",
        )
        assert proc.poll() is None, "the process ended early"
        name = named.read_text()
        assert name in databases(backend)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM  # it still dies of the signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert name not in databases(backend)


@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)
def test_test_clean_drops_what_ended_processes_left_and_keeps_the_rest(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    assert backend.server_url is not None
    ended = subprocess.Popen(["true"])
    ended.wait()
    gone_pid = ended.pid
    start = _testdb.stamp(time.time())
    gone = f"{_testdb.PREFIX}{gone_pid}_{start}_1"
    # A live process, but not the one that made the database (its pid was reused).
    reused = f"{_testdb.PREFIX}{os.getpid()}_20000101000000_1"
    admin = sa.create_engine(
        backend.server_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool
    )
    quote = '"' if backend.name == "postgres" else "`"
    try:
        with admin.connect() as conn:
            for name in (gone, reused):
                conn.exec_driver_sql(f"CREATE DATABASE {quote}{name}{quote}")
        mine = sa.make_url(backend.url).database
        _testdb.clean(backend.name, backend.server_url)
        out = capsys.readouterr().out
        left = databases(backend)
        assert gone not in left
        assert reused not in left
        assert mine in left  # this run's own
        assert f"{backend.name}: dropped {gone}" in out
        assert f"{backend.name}: kept {mine} (process {os.getpid()} still runs)" in out
    finally:
        with admin.connect() as conn:
            for name in (gone, reused):
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote}{name}{quote}")
        admin.dispose()
