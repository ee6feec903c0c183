"""Two transactions racing for one lock: the one that holds it, and the one
that waits (shared by the tests of publishes, deletes and ordered acks)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Backend


def wait_until_blocked(backend: Backend, engine: sa.Engine, thread: threading.Thread) -> None:
    """Return once ``thread`` waits for a lock (SQLite shows none: a short wait)."""
    queries = {
        "postgres": "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
        "mysql": "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'",
    }
    query = queries.get(backend.name)
    deadline = time.monotonic() + 10
    while thread.is_alive() and time.monotonic() < deadline:
        if query is None:
            time.sleep(0.3)
            return
        with engine.connect() as conn:
            if conn.exec_driver_sql(query).scalar_one():
                return
        time.sleep(0.01)
    pytest.fail("the other transaction did not wait for the lock")


def race(
    backend: Backend, held: Callable[[sa.Connection], Any], waiting: Callable[[], Any]
) -> list[Any]:
    """Run ``held`` in an open transaction, ``waiting`` in a thread until it
    blocks on it, then commit: what ``waiting`` returned (or raised)."""
    engine = backend.engine()
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(waiting())
        except Exception as exc:  # reported by the test
            outcome.append(exc)

    thread = threading.Thread(target=run)
    with engine.connect() as conn, conn.begin():
        held(conn)
        thread.start()
        wait_until_blocked(backend, engine, thread)
    thread.join(30)
    assert not thread.is_alive()
    return outcome
