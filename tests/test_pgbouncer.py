"""PostgreSQL through PgBouncer in transaction pooling: ``connect(url,
pgbouncer=True)``, ``Options.listen=False``, and a LISTEN that cannot work there
reported once while consumers poll. The behaviour modules marked ``pooled``
run through PgBouncer too (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

import novaque
import novaque.aio
from tests.conftest import Backend
from tests.test_consumer import WAIT, Recorder, waited

pytestmark = pytest.mark.usefixtures("twin")

THROUGH_PGBOUNCER = pytest.mark.parametrize("backend", ["pgbouncer"], indirect=True)
POSTGRES = pytest.mark.parametrize("backend", ["postgres", "pgbouncer"], indirect=True)


def driver_settings(conn: Any) -> tuple[int | None, str | None]:
    """psycopg's prepare threshold and libpq's connect_timeout of a connection."""
    return conn.prepare_threshold, conn.info.get_parameters().get("connect_timeout")


@pytest.mark.sync_only  # both clients, here
@POSTGRES
def test_connect_for_pgbouncer_turns_prepared_statements_and_listen_off(
    backend: Backend,
) -> None:
    for pgbouncer, threshold, listens in ((True, None, False), (False, 5, True)):
        client = novaque.connect(backend.url, pgbouncer=pgbouncer)
        try:
            assert client.options.listen is listens
            with client.engine.connect() as conn:
                found = driver_settings(conn.connection.driver_connection)
            assert found == (threshold, "10")  # a server that never answers cannot hang it
        finally:
            client.shutdown()

        async def twin(pgbouncer: bool = pgbouncer) -> tuple[bool, tuple[int | None, str | None]]:
            aclient = novaque.aio.connect(backend.url, pgbouncer=pgbouncer)
            try:
                async with aclient.engine.connect() as conn:
                    raw = await conn.get_raw_connection()
                    return aclient.options.listen, driver_settings(raw.driver_connection)
            finally:
                await aclient.shutdown()

        assert asyncio.run(twin()) == (listens, (threshold, "10"))


@pytest.mark.sync_only  # both clients, here
def test_pgbouncer_is_for_postgresql_and_listens_to_nothing(tmp_path: Any) -> None:
    url = "postgresql+psycopg://u@127.0.0.1:1/db"
    for connect in (novaque.connect, novaque.aio.connect):
        with pytest.raises(novaque.InvalidOption, match="pgbouncer=True is for PostgreSQL"):
            connect(f"sqlite:///{tmp_path / 'q.db'}", pgbouncer=True)
        with pytest.raises(novaque.InvalidOption, match="listen=True cannot work"):
            connect(url, pgbouncer=True, listen=True)
        with pytest.raises(novaque.InvalidOption, match="pgbouncer must be True or False"):
            connect(url, pgbouncer="yes")
    with pytest.raises(novaque.InvalidOption, match="Options.listen must be True or False"):
        novaque.Options(listen=1)  # type: ignore[arg-type]


@pytest.mark.sync_only  # both clients, here
@THROUGH_PGBOUNCER
def test_many_publishes_and_claims_at_once_through_pgbouncer_all_succeed(
    backend: Backend,
) -> None:
    # Prepared statements (psycopg prepares a query from its 5th run) broke
    # most of a run like this one through transaction pooling.
    threads, each = 8, 40
    client = novaque.connect(backend.url, pgbouncer=True, max_in_flight=threads)
    client.ensure_channel("t", "c")
    failures: list[BaseException] = []
    published: list[int] = []
    claimed: list[int] = []
    lock = threading.Lock()

    def work(n: int) -> None:
        try:
            for i in range(each):
                ids = [client.publish("t", f"{n}-{i}")]
                got = client.claim("t", "c", max_messages=2)
                for msg in got:
                    client.ack(msg)
                with lock:
                    published.extend(ids)
                    claimed.extend(m.id for m in got)
        except BaseException as exc:
            failures.append(exc)

    try:
        workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(WAIT)
        assert failures == []
        claimed += [m.id for m in client.claim("t", "c", max_messages=threads * each)]
        assert sorted(claimed) == sorted(published)  # each once
    finally:
        client.shutdown()

    async def twin() -> list[int]:
        aclient = novaque.aio.connect(backend.url, pgbouncer=True, max_in_flight=threads)
        try:
            await aclient.ensure_channel("a", "c")

            async def one(n: int) -> list[int]:
                return [await aclient.publish("a", f"{n}-{i}") for i in range(each)]

            done = await asyncio.gather(*(one(n) for n in range(threads)))
            got = await aclient.claim("a", "c", max_messages=threads * each)
            assert sorted(m.id for m in got) == sorted(i for ids in done for i in ids)
            return [m.id for m in got]
        finally:
            await aclient.shutdown()

    assert len(asyncio.run(twin())) == threads * each


@POSTGRES
def test_a_listen_that_pgbouncer_cannot_deliver_is_reported_once_and_consumers_poll(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    # A client on an engine through PgBouncer, built without saying so: it
    # tries LISTEN (straight to PostgreSQL, LISTEN works and is kept).
    consumer_side = backend.client(listen=True)
    producer_side = backend.client()  # its own engine: no local wake-up
    signals = consumer_side._runtime.signals
    handler = Recorder()
    with caplog.at_level(logging.WARNING, logger="novaque"):
        consumer = consumer_side.subscribe_and_start("t", "c", handler, poll_interval=0.05)
        if backend.pgbouncer:
            waited(signals.wait("listen_refused", 1, WAIT), "the LISTEN to be found undelivered")
        else:
            waited(signals.wait("listen_connected", 1, WAIT), "the listener")
        producer_side.publish("t", b"found by polling")
        waited(consumer._signals.wait("acked", 1, WAIT), "the consumer")
        consumer.shutdown()
        # Another consumer of the same client: no second try, no second line.
        again = consumer_side.subscribe_and_start("t", "c", handler, poll_interval=0.05)
        producer_side.publish("t", b"and again")
        waited(again._signals.wait("acked", 1, WAIT), "the second consumer")
        again.shutdown()
    reported = [r for r in caplog.records if "LISTEN does not reach" in r.getMessage()]
    if backend.pgbouncer:
        assert len(reported) == 1, reported
        assert "pgbouncer=True" in reported[0].getMessage()
        assert "Options(listen=False)" in reported[0].getMessage()
        assert signals.count("listen_refused") == 1
        assert signals.count("listen_errors") == 0  # not an error to retry
    else:
        assert reported == []
        assert signals.count("listen_refused") == 0
    assert [m.body for m in handler.calls] == [b"found by polling", b"and again"]


def test_a_client_that_does_not_listen_holds_no_wakeup_connection_and_polls(
    backend: Backend,
) -> None:
    consumer_side = backend.client(listen=False)
    producer_side = backend.client()
    handler = Recorder()
    consumer = consumer_side.subscribe_and_start("t", "c", handler, poll_interval=0.05)
    waited(consumer._signals.wait("polls", 1, WAIT), "the first claim pass")
    producer_side.publish("t", b"found by polling")
    waited(consumer._signals.wait("acked", 1, WAIT), "the consumer")
    consumer.shutdown()
    signals = consumer_side._runtime.signals
    assert signals.count("listen_connected") == 0
    assert consumer_side._runtime.listening is None
