"""The suite itself: a configured but unreachable server fails the run; an
unconfigured one is one skip line saying how to enable it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import run_pytest

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
    assert " skipped" not in done.stdout.splitlines()[-1]
