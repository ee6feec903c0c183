"""A database that cannot serve now: novaque's own calls raise
``DatabaseUnavailable`` (the driver's error chained), a caller's own connection
keeps the caller's errors, and a transaction that gets no answer is cancelled
after ``Options.transaction_timeout``."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
from novaque import _deadlines, _ledger
from novaque.testing import FakeClock
from tests.conftest import Backend, kill_other_sessions

pytestmark = [pytest.mark.usefixtures("twin"), pytest.mark.pooled]

#: PostgreSQL straight and through PgBouncer: the servers whose sessions can be
#: made read-only, and whose statements novaque can cancel.
POSTGRES = pytest.mark.parametrize("backend", ["postgres", "pgbouncer"], indirect=True)


def unreachable(backend: Backend, tmp_path: Path) -> str:
    """A URL of the backend where no database answers."""
    if backend.name == "sqlite":
        return f"sqlite:///{tmp_path / 'no' / 'such' / 'folder' / 'q.db'}"
    return sa.make_url(backend.url).set(port=1).render_as_string(hide_password=False)


def assert_unavailable(error: pytest.ExceptionInfo[novaque.DatabaseUnavailable]) -> None:
    assert isinstance(error.value, novaque.NovaqueError)
    assert isinstance(error.value.__cause__, sa.exc.DBAPIError), error.value.__cause__
    assert "try again" in str(error.value)  # it says what to do


def test_a_database_that_cannot_be_reached_raises_database_unavailable(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    client = backend.client(url=unreachable(backend, tmp_path), clock=clock)
    # The first call's schema check ...
    with pytest.raises(novaque.DatabaseUnavailable) as first:
        client.publish("t", b"x")
    assert_unavailable(first)
    # ... and, the schema known, each kind of novaque's own transaction; the
    # ids known too, the driver's own path (a raw connection of the pool,
    # whose errors are the driver's).
    client._context._schema_ok.set()
    client._context.topic_ids["t"] = 1
    client._topology._channel_cache[("t", "c")] = (1, time.monotonic())
    for call in (
        lambda: client.publish("t", b"x"),
        lambda: client.publish_many("t", [b"x", b"y"]),
        lambda: client.claim("t", "c"),
        lambda: client.ensure_channel("t", "c"),
        lambda: client.reap_leases(),
        lambda: client.channel_backlog("t", "c"),
    ):
        with pytest.raises(novaque.DatabaseUnavailable) as error:
            call()
        assert_unavailable(error)


@pytest.mark.parametrize("backend", ["postgres", "mysql", "pgbouncer"], indirect=True)
def test_a_connection_lost_under_a_client_raises_database_unavailable_once(
    backend: Backend, clock: FakeClock
) -> None:
    client = backend.client(clock=clock)
    client.ensure_channel("t", "c")
    client.publish("t", b"before")  # a pooled connection now
    kill_other_sessions(backend)
    if backend.pgbouncer:
        # PgBouncer hides a lost server session: the client's next
        # transaction gets another one.
        client.publish("t", b"lost")
    else:
        with pytest.raises(novaque.DatabaseUnavailable) as error:
            client.publish("t", b"lost")
        assert_unavailable(error)
        assert "dedup_key" in str(error.value)  # it may have committed
        assert error.value.__cause__.connection_invalidated  # type: ignore[union-attr]
    client.publish("t", b"after")  # a new connection
    assert [m.body for m in client.claim("t", "c", max_messages=10)][-1] == b"after"


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # PgBouncer: below
def test_a_database_that_takes_no_writes_raises_database_unavailable(
    backend: Backend, clock: FakeClock
) -> None:
    client = backend.client(clock=clock)
    client.ensure_channel("t", "c")
    database = sa.make_url(backend.url).database
    with backend.engine().begin() as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    try:
        kill_other_sessions(backend)  # sessions opened from now on are read-only
        for _ in range(2):  # the pooled connection lost, then a read-only one
            with pytest.raises(novaque.DatabaseUnavailable) as error:
                client.publish("t", b"x")
            assert_unavailable(error)
        assert "ReadOnlySqlTransaction" in str(error.value)
    finally:
        with backend.engine().begin() as conn:
            conn.exec_driver_sql("SET TRANSACTION READ WRITE")
            conn.exec_driver_sql(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
        kill_other_sessions(backend)


@pytest.mark.sync_only  # a caller's sync connection
def test_a_callers_connection_keeps_the_callers_errors(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock)
    client.ensure_channel("t", "c")
    with backend.engine().connect() as conn:
        if backend.name == "mysql":
            conn.exec_driver_sql("SET SESSION TRANSACTION READ ONLY")  # transactions after it
            conn.commit()
        else:
            sqlite = backend.name == "sqlite"
            conn.exec_driver_sql(
                "PRAGMA query_only = ON" if sqlite else "SET TRANSACTION READ ONLY"
            )
        with pytest.raises(sa.exc.DBAPIError):
            client.publish("t", b"x", connection=conn)
        conn.invalidate()  # its session state goes with it
    assert client.publish("t", b"y") > 0  # novaque's own transactions were never read-only


@POSTGRES
def test_a_transaction_without_answer_is_cancelled_after_the_transaction_timeout(
    backend: Backend, clock: FakeClock
) -> None:
    client = backend.client(clock=clock, transaction_timeout=0.3)
    client.ensure_channel("t", "c")
    client.publish("t", b"before")
    held = threading.Event()
    done = threading.Event()

    def hold_topics() -> None:
        # A lock that every publish of the topic waits for, held until the
        # publish below gave up.
        with backend.engine().begin() as conn:
            conn.exec_driver_sql("LOCK TABLE novaque_topics IN ACCESS EXCLUSIVE MODE")
            held.set()
            done.wait(60)

    holder = threading.Thread(target=hold_topics)
    holder.start()
    try:
        assert held.wait(30)
        with pytest.raises(novaque.DatabaseUnavailable) as error:
            client.publish("t", b"stuck")
        assert "transaction_timeout" in str(error.value)
        assert "QueryCanceled" in repr(error.value.__cause__)
    finally:
        done.set()
        holder.join(60)
    client.publish("t", b"after")
    assert [m.body for m in client.claim("t", "c", max_messages=10)] == [b"before", b"after"]


@pytest.mark.sync_only  # no client
def test_the_transaction_timeout_is_checked() -> None:
    for bad in (0, -1, float("nan"), "1"):
        with pytest.raises(novaque.InvalidOption, match="transaction_timeout"):
            novaque.Options(transaction_timeout=bad)  # type: ignore[arg-type]
    assert novaque.Options(transaction_timeout=None).transaction_timeout is None


@pytest.mark.sync_only  # no client
def test_a_consumer_retries_what_it_could_not_settle_while_the_database_was_unavailable() -> None:
    assert _ledger.transient(novaque.DatabaseUnavailable("the database is unavailable"))


@pytest.mark.sync_only  # no client
def test_a_deadline_cancels_once_when_it_passes_and_never_after_its_end() -> None:
    cancelled: list[str] = []
    done = threading.Event()

    def cancel(conn: str) -> None:
        cancelled.append(conn)
        done.set()

    late = _deadlines.watch(0.01, cancel, "late")
    in_time = _deadlines.watch(3600, cancel, "in time")
    assert done.wait(60)
    assert in_time.end() is False  # ended before its deadline: never cancelled
    assert late.end() is True  # its owner closes the connection and raises
    assert cancelled == ["late"]
