"""Engines made by novaque.connect(): checked before use after idling, MySQL settings."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
import novaque.aio
from novaque.dialects import engines
from tests.conftest import Backend, driverless, kill_other_sessions

#: connect()'s server settings: SQLite has no server connection to lose or configure.
SERVERS = pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)


@pytest.fixture
def connected(backend: Backend) -> Iterator[novaque.Client]:
    client = novaque.connect(backend.url)
    yield client
    # Flushes its counters and closes its engine: a bare dispose() left the
    # counters buffered, and their later flush opened a connection that was
    # never closed (a ResourceWarning failing whichever test was running).
    client.shutdown(timeout=10)


@SERVERS
def test_an_idle_pooled_connection_that_died_is_replaced_before_use(
    backend: Backend, connected: novaque.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    connected.ensure_channel("t", "c")
    connected.publish("t", b"before")
    assert kill_other_sessions(backend) >= 1
    monkeypatch.setattr(engines, "PING_IDLE_S", 0.0)  # every pooled connection counts as idle
    connected.publish("t", b"after")  # would fail on the dead connection without the ping
    assert [m.body for m in connected.claim("t", "c", max_messages=5)] == [b"before", b"after"]


@SERVERS
def test_a_connection_returned_with_an_open_transaction_is_rolled_back(
    connected: novaque.Client,
) -> None:
    raw = connected.engine.raw_connection()
    cursor = raw.cursor()
    cursor.execute("INSERT INTO novaque_topics (name, created_at) VALUES ('uncommitted', 0)")
    cursor.close()
    raw.close()  # back to the pool without COMMIT
    assert "uncommitted" not in connected.list_topics()
    connected.ensure_topic("committed")
    with connected.engine.connect() as conn:  # the same pooled connection, most likely
        names = [r[0] for r in conn.exec_driver_sql("SELECT name FROM novaque_topics")]
    assert names == ["committed"]


def test_sqlite_returns_connections_unrolled_after_a_commit_and_rolled_back_when_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On aiosqlite every ROLLBACK is a hop to the driver's thread, sent by the
    pool after each COMMIT: now only an open transaction is rolled back."""
    import aiosqlite

    rollbacks: list[object] = []
    original = aiosqlite.Connection.rollback

    async def counting(self: aiosqlite.Connection) -> None:
        rollbacks.append(self)
        await original(self)

    monkeypatch.setattr(aiosqlite.Connection, "rollback", counting)

    def leave_open(conn: sa.Connection) -> None:
        cursor = conn.connection.cursor()  # the driver's, past SQLAlchemy's transactions
        cursor.execute("BEGIN")
        cursor.execute("INSERT INTO novaque_topics (name, created_at) VALUES ('open', 0)")
        cursor.close()

    async def main() -> list[str]:
        client = novaque.aio.connect(f"sqlite:///{tmp_path / 'q.db'}")
        try:
            await client.migrate()
            await client.publish("rb", b"first")
            rollbacks.clear()
            for _ in range(5):
                await client.publish("rb", b"x")
            assert rollbacks == []
            async with client.engine.connect() as conn:
                await conn.run_sync(leave_open)
            assert len(rollbacks) == 1  # returned with its transaction open: rolled back
            return await client.list_topics()
        finally:
            await client.shutdown(timeout=10)

    assert "open" not in asyncio.run(main())


@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_mysql_connections_run_read_committed_without_a_set_per_transaction(
    backend: Backend, connected: novaque.Client
) -> None:
    with connected.engine.connect() as conn:
        level = conn.get_isolation_level()  # asks the server (MySQL and MariaDB differ)
    assert level == "READ COMMITTED"
    sent: list[str] = []
    sa.event.listen(
        connected.engine,
        "before_cursor_execute",
        lambda conn, cursor, statement, *rest: sent.append(statement),
    )
    connected.ensure_channel("t", "c")
    connected.publish("t", b"x")
    connected.ack_many(connected.claim("t", "c"))
    assert sent
    assert not [s for s in sent if "ISOLATION" in s.upper()]


_ROLLBACKS = (
    "SELECT CONNECTION_ID(), VARIABLE_VALUE FROM information_schema.SESSION_STATUS "
    "WHERE VARIABLE_NAME = 'COM_ROLLBACK'"
)


@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_mysql_sends_no_rollback_after_a_commit_on_either_twin(backend: Backend) -> None:
    """The pool's reset reads the server's in-transaction flag on the driver's
    connection: the twin's DBAPI object is SQLAlchemy's adapter, without the
    flag, and sent a ROLLBACK after every COMMIT (one more round trip)."""
    client = novaque.connect(backend.url)

    def read() -> tuple[int, int]:
        with client.own_engine.connect() as conn:
            session, count = conn.exec_driver_sql(_ROLLBACKS).one()
        return int(session), int(count)

    try:
        client.publish("rb", b"first")  # schema check, topic created
        before = read()
        for _ in range(5):
            client.publish("rb", b"x")
        after = read()
    finally:
        client.shutdown(timeout=10)

    async def twin() -> tuple[tuple[int, int], tuple[int, int]]:
        aclient = novaque.aio.connect(sa.make_url(backend.url).set(drivername="mysql"))

        async def aread() -> tuple[int, int]:
            async with aclient.engine.connect() as conn:
                session, count = (await conn.exec_driver_sql(_ROLLBACKS)).one()
            return int(session), int(count)

        try:
            await aclient.publish("rb", b"first")
            abefore = await aread()
            for _ in range(5):
                await aclient.publish("rb", b"x")
            return abefore, await aread()
        finally:
            await aclient.shutdown(timeout=10)

    abefore, aafter = asyncio.run(twin())
    for first, last in ((before, after), (abefore, aafter)):
        assert first[0] == last[0]  # one pooled connection served it all
        assert last[1] - first[1] <= 1  # the first read's own transaction, no publish's


def test_a_url_without_a_driver_connects_with_novaques_driver(backend: Backend) -> None:
    """``postgres://`` is read as ``postgresql://``; a URL that names no driver
    gets novaque's: psycopg, PyMySQL (asyncmy for the asyncio client), sqlite3
    (aiosqlite), whatever SQLAlchemy's own default for the scheme is."""
    sync_drivers = {"postgresql": "psycopg", "mysql": "pymysql", "sqlite": "pysqlite"}
    aio_drivers = {"postgresql": "psycopg", "mysql": "asyncmy", "sqlite": "aiosqlite"}
    for url in driverless(backend):
        client = novaque.connect(url)
        try:
            assert client.engine.dialect.driver == sync_drivers[client.engine.dialect.name]
            client.ensure_channel("t", "c")
            client.publish("t", url.encode())
            assert [m.body for m in client.claim("t", "c")] == [url.encode()]
        finally:
            client.shutdown(timeout=10)

        async def twin(url: str = url) -> tuple[str, str, list[bytes]]:
            aclient = novaque.aio.connect(url)
            try:
                await aclient.publish("t", url.encode())
                got = [m.body for m in await aclient.claim("t", "c")]
                return aclient.engine.dialect.name, aclient.engine.dialect.driver, got
            finally:
                await aclient.shutdown(timeout=10)

        name, driver, got = asyncio.run(twin())
        assert driver == aio_drivers[name]
        assert got == [url.encode()]


@pytest.mark.parametrize(
    ("given", "sync", "aio"),
    [
        ("postgres://u:pw@h:5433/db?sslmode=require", "postgresql+psycopg", "postgresql+psycopg"),
        ("postgres+psycopg2://u@h/db", "postgresql+psycopg2", "postgresql+psycopg2"),
        ("postgresql://u@h/db", "postgresql+psycopg", "postgresql+psycopg"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg", "postgresql+asyncpg"),
        ("mysql://u@h/db", "mysql+pymysql", "mysql+asyncmy"),
        ("mariadb://u@h/db", "mariadb+pymysql", "mariadb+asyncmy"),
        ("mysql+mysqldb://u@h/db", "mysql+mysqldb", "mysql+mysqldb"),
        ("sqlite:///x.db", "sqlite", "sqlite+aiosqlite"),
        ("nosuchdb://x", "nosuchdb", "nosuchdb"),
    ],
)
def test_urls_are_read_with_novaques_drivers(given: str, sync: str, aio: str) -> None:
    for asynchronous, driver in ((False, sync), (True, aio)):
        url = engines.normalise_url(given, asynchronous=asynchronous)
        assert url.drivername == driver
        # Everything but the scheme is kept as it was, the password too.
        assert url.set(drivername="x") == sa.make_url(given).set(drivername="x")


@pytest.mark.parametrize(
    ("url", "module", "extra", "form"),
    [
        ("mysql+mysqldb://root@127.0.0.1/test", "MySQLdb", "novaque[mysql]", "mysql+pymysql://"),
        (
            "mariadb+mysqldb://root@127.0.0.1/test",
            "MySQLdb",
            "novaque[mysql]",
            "mariadb+pymysql://",
        ),
        (
            "postgresql+psycopg2://u@127.0.0.1/db",
            "psycopg2",
            "novaque[postgres]",
            "postgresql+psycopg://",
        ),
    ],
)
def test_a_url_whose_driver_is_missing_names_the_extra_and_the_url_form(
    url: str, module: str, extra: str, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ModuleNotFoundError) as missing:
        novaque.connect(url)
    text = str(missing.value)
    assert f"pip install '{extra}'" in text
    assert form in text
    assert missing.value.__cause__ is None
    assert missing.value.__suppress_context__


@pytest.mark.parametrize(
    ("url", "module", "extra"),
    [
        ("mysql+pymysql://root@127.0.0.1/test", "pymysql", "novaque[mysql]"),
        ("mysql://root@127.0.0.1/test", "pymysql", "novaque[mysql]"),
        ("postgresql+psycopg://u@127.0.0.1/db", "psycopg", "novaque[postgres]"),
        ("postgres://u@127.0.0.1/db", "psycopg", "novaque[postgres]"),
    ],
)
def test_novaques_own_driver_missing_names_its_extra(
    url: str, module: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ModuleNotFoundError, match=re.escape(f"pip install '{extra}'")):
        novaque.connect(url)


@SERVERS
def test_a_connection_lost_under_the_driver_path_raises_database_unavailable_and_is_replaced(
    backend: Backend,
) -> None:
    # A plain engine (no ping before use): the publish of one message runs
    # on the driver's connection; its loss is DatabaseUnavailable from
    # SQLAlchemy's DBAPIError, the connection leaves the pool, and the next
    # publish gets a new one.
    client = novaque.Client(backend.engine())
    client.ensure_channel("lost", "c")
    client.publish("lost", b"before")
    assert kill_other_sessions(backend) >= 1
    with pytest.raises(novaque.DatabaseUnavailable) as caught:
        client.publish("lost", b"cut")
    assert isinstance(caught.value.__cause__, sa.exc.DBAPIError)
    assert caught.value.__cause__.connection_invalidated
    client.publish("lost", b"after")
    assert [m.body for m in client.claim("lost", "c", max_messages=5)] == [b"before", b"after"]
    client.delete_topic("lost")
    client.shutdown(timeout=10)
