"""What only the asyncio twin has: AsyncSession and AsyncConnection
transactions, async handlers as concurrent tasks, its shutdown, LISTEN on an
async connection, and the type checks that point users to the right twin.

The rest of the behaviour suite runs on both twins (the ``twin`` fixture,
tests/_twin.py); these tests are written as an asyncio application would.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import novaque
import novaque.aio
from novaque.schema import deliveries
from tests._twin import async_url
from tests.conftest import Backend

ROOT = Path(__file__).resolve().parent.parent
WAIT = 10.0


def run(
    backend: Backend,
    body: Callable[[novaque.aio.AsyncClient, AsyncEngine], Awaitable[None]],
    **options: Any,
) -> None:
    """``body(client, engine)`` on a new event loop, then the client shut down."""

    async def main() -> None:
        engine = create_async_engine(async_url(backend.name, backend.url))
        client = novaque.aio.AsyncClient(engine, novaque.Options(**options))
        try:
            await asyncio.wait_for(body(client, engine), 60)
        finally:
            await client.shutdown(timeout=5)
            await engine.dispose()

    asyncio.run(main())


def delivery_rows(backend: Backend) -> list[tuple[int, int]]:
    """(state, attempts) of every delivery, oldest first."""
    with backend.engine().connect() as conn:
        query = sa.select(deliveries.c.state, deliveries.c.attempts).order_by(deliveries.c.id)
        return [(r[0], r[1]) for r in conn.execute(query)]


# -- publishing in the application's transaction -----------------------------------------


def test_a_publish_in_an_async_session_commits_and_rolls_back_with_it(backend: Backend) -> None:
    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        await client.ensure_channel("orders", "mailer")
        async with AsyncSession(engine) as session, session.begin():
            await client.publish("orders", b"rolled back", session=session)
            await session.rollback()  # the order was refused
        async with AsyncSession(engine) as session, session.begin():
            kept = await client.publish("orders", b"committed", session=session)
            [also] = await client.publish_many("orders", [b"too"], session=session)
        got = await client.claim("orders", "mailer", max_messages=10)
        assert [(m.id, m.body) for m in got] == [(kept, b"committed"), (also, b"too")]
        await client.flush_stats()
        counted = await client.channel_counters("orders", "mailer")
        assert counted.published == 2  # the rolled-back one was never counted

    run(backend, body)


def test_a_publish_in_an_async_connection_and_its_savepoints(backend: Backend) -> None:
    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        await client.ensure_channel("orders", "mailer")
        async with engine.connect() as conn:
            async with conn.begin():
                first = await client.publish("orders", b"kept", connection=conn)
                savepoint = await conn.begin_nested()
                await client.publish("orders", b"undone", connection=conn)
                await savepoint.rollback()
            async with conn.begin():
                await client.publish("orders", b"rolled back", connection=conn)
                await conn.rollback()
        got = await client.claim("orders", "mailer", max_messages=10)
        assert [(m.id, m.body) for m in got] == [(first, b"kept")]
        await client.flush_stats()
        assert (await client.channel_counters("orders", "mailer")).published == 1

    run(backend, body)


def test_a_committed_publish_wakes_this_loops_consumer(backend: Backend) -> None:
    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        handled = asyncio.Event()

        async def handler(msg: novaque.Message) -> None:
            handled.set()

        # Idle waits of at least 112 s: only the wake-up after the commit can
        # make the consumer see the message in time.
        consumer = await client.subscribe_and_start("t", "c", handler, poll_interval=3600)
        await asyncio.sleep(0.05)  # its first, empty claim
        async with AsyncSession(engine) as session, session.begin():
            await client.publish("t", b"x", session=session)
        await asyncio.wait_for(handled.wait(), WAIT)
        await consumer.shutdown()

    run(backend, body)


# -- consumers ----------------------------------------------------------------------------


def test_async_handlers_run_concurrently_up_to_max_in_flight(backend: Backend) -> None:
    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        inside = 0
        most = 0
        all_in = asyncio.Event()
        done: list[int] = []

        async def handler(msg: novaque.Message) -> None:
            nonlocal inside, most
            inside += 1
            most = max(most, inside)
            if inside == 4:
                all_in.set()
            # Only four handlers awaiting at once let the first four finish.
            await asyncio.wait_for(all_in.wait(), WAIT)
            inside -= 1
            done.append(msg.id)

        await client.ensure_channel("t", "c")
        ids = await client.publish_many("t", [b"%d" % i for i in range(12)])
        consumer = await client.subscribe_and_start(
            "t", "c", handler, max_in_flight=4, poll_interval=0.02
        )
        while len(done) < 12:
            await asyncio.sleep(0.01)
        await consumer.shutdown()
        assert sorted(done) == sorted(ids)
        assert most == 4  # concurrent, and never more than max_in_flight
        assert consumer.in_flight == 0
        assert await client.channel_backlog("t", "c") == novaque.Backlog()

    run(backend, body)


def test_a_failing_async_handler_is_retried_and_reject_buries(backend: Backend) -> None:
    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        seen: list[tuple[bytes, int]] = []

        async def handler(msg: novaque.Message) -> None:
            seen.append((msg.body, msg.attempts))
            await asyncio.sleep(0)
            if msg.body == b"reject":
                raise novaque.Reject("not for us")
            if msg.attempts == 1:
                raise ValueError("first time fails")

        await client.ensure_channel("t", "c")
        await client.publish_many("t", [b"retry", b"reject"])
        consumer = await client.subscribe_and_start(
            "t", "c", handler, backoff=novaque.Backoff(base=0), poll_interval=0.02
        )
        while len(seen) < 3:
            await asyncio.sleep(0.01)
        await consumer.shutdown()
        assert sorted(seen) == [(b"reject", 1), (b"retry", 1), (b"retry", 2)]
        [dead] = await client.list_dead("t", "c")
        assert dead.reason == "not for us"
        backlog = await client.channel_backlog("t", "c")
        assert (backlog.dead, backlog.ready, backlog.in_flight) == (1, 0, 0)

    run(backend, body)


def test_shutdown_releases_claimed_unstarted_deliveries_without_counting_them(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        started: list[int] = []

        async def handler(msg: novaque.Message) -> None:
            started.append(msg.id)

        await client.ensure_channel("t", "c")
        await client.publish_many("t", [b"a", b"b", b"c"])
        consumer = client.subscribe("t", "c", handler, max_in_flight=3, poll_interval=0.02)
        core, inner = client._core, consumer._consumer
        real_claim = core._consuming.claim_batch
        claimed = asyncio.Event()

        def claim_then_see_shutdown(*args: Any) -> list[novaque.Message]:
            got: list[novaque.Message] = real_claim(*args)
            if got:
                claimed.set()
                # Awaited inside the bridge: shutdown begins while this claim
                # is on its way back.
                assert inner._stop_claiming.wait(WAIT)
            return got

        monkeypatch.setattr(core._consuming, "claim_batch", claim_then_see_shutdown)
        await consumer.start()
        await asyncio.wait_for(claimed.wait(), WAIT)
        await consumer.shutdown()
        assert started == []
        assert inner._signals.count("released") == 3
        monkeypatch.undo()
        got = await client.claim("t", "c", max_messages=10)
        assert [m.attempts for m in got] == [1, 1, 1]  # released: first attempts again

    run(backend, body)


def test_shutdown_waits_for_running_handlers_and_writes_their_acks(backend: Backend) -> None:
    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        go_on = asyncio.Event()
        entered = asyncio.Event()

        async def handler(msg: novaque.Message) -> None:
            entered.set()
            await go_on.wait()

        consumer = await client.subscribe_and_start("t", "c", handler, poll_interval=0.02)
        await client.publish("t", b"x")
        await asyncio.wait_for(entered.wait(), WAIT)
        stopping = asyncio.create_task(consumer.shutdown(timeout=WAIT))
        await asyncio.sleep(0.05)
        assert not stopping.done()  # waiting for the handler
        assert not consumer.running
        go_on.set()
        await asyncio.wait_for(stopping, WAIT)
        assert await client.channel_backlog("t", "c") == novaque.Backlog()

    run(backend, body)


def test_subscribe_does_no_io_and_start_creates_the_channel(backend: Backend) -> None:
    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        async def handler(msg: novaque.Message) -> None:
            pass

        consumer = client.subscribe("new-topic", "c", handler)
        assert not consumer.running
        assert "new-topic" not in await client.list_topics()
        await consumer.start()
        assert consumer.running
        assert await client.list_channels("new-topic") == ["c"]
        await consumer.shutdown()
        assert not consumer.running

    run(backend, body)


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # the server that pushes
def test_a_sync_publisher_wakes_an_async_consumer_through_notify(backend: Backend) -> None:
    publisher = backend.client()  # novaque.Client, its own engine: no local wake-up

    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        handled = asyncio.Event()

        async def handler(msg: novaque.Message) -> None:
            handled.set()

        consumer = await client.subscribe_and_start("t", "c", handler, poll_interval=3600)
        signals = client._core._runtime.signals
        while not signals.count("listen_connected") or not consumer._signals.count("polls"):
            await asyncio.sleep(0.01)
        # From a thread, as another process's sync client would.
        await asyncio.to_thread(publisher.publish, "t", b"over the wire")
        # Idle waits last at least 112 s: only the NOTIFY wakes the consumer in time.
        await asyncio.wait_for(handled.wait(), WAIT)
        assert signals.count("notified") >= 1
        await consumer.shutdown()

    run(backend, body)


# -- the right objects for the right twin ----------------------------------------------------


def test_a_plain_function_is_refused_by_async_subscribe(backend: Backend) -> None:
    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        def plain(msg: novaque.Message) -> None:
            pass

        with pytest.raises(TypeError, match=r"async def handler\(msg\)"):
            client.subscribe("t", "c", plain)  # type: ignore[arg-type]

    run(backend, body)


def test_asyncio_objects_given_to_the_sync_client_name_novaque_aio(backend: Backend) -> None:
    engine = create_async_engine(async_url(backend.name, backend.url))
    with pytest.raises(TypeError, match=r"AsyncEngine.*novaque\.aio\.AsyncClient"):
        novaque.Client(engine)  # type: ignore[arg-type]
    client = backend.client()

    async def handler(msg: novaque.Message) -> None:
        pass

    with pytest.raises(TypeError, match=r"novaque\.aio\.AsyncClient"):
        client.subscribe("t", "c", handler)

    async def main() -> None:
        async with engine.connect() as conn:
            with pytest.raises(TypeError, match=r"AsyncConnection.*novaque\.aio"):
                client.publish("t", b"x", connection=conn)  # type: ignore[arg-type]
        async with AsyncSession(engine) as session:
            with pytest.raises(TypeError, match=r"AsyncSession.*novaque\.aio"):
                client.publish("t", b"x", session=session)  # type: ignore[arg-type]
        await engine.dispose()

    asyncio.run(main())


def test_sync_objects_given_to_the_async_client_are_refused(backend: Backend) -> None:
    sync_engine = backend.engine()
    with pytest.raises(TypeError, match=r"AsyncEngine.*got Engine"):
        novaque.aio.AsyncClient(sync_engine)  # type: ignore[arg-type]

    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        with sync_engine.connect() as conn, pytest.raises(TypeError, match="AsyncConnection"):
            await client.publish("t", b"x", connection=conn)  # type: ignore[arg-type]
        with Session(sync_engine) as session, pytest.raises(TypeError, match="AsyncSession"):
            await client.publish("t", b"x", session=session)  # type: ignore[arg-type]

    run(backend, body)


# -- the surface ---------------------------------------------------------------------------


def test_every_public_client_method_has_a_coroutine_twin_with_its_signature() -> None:
    plain = {"subscribe", "claim_statement"}  # plain calls on both twins
    joined = {"publish", "publish_many"}  # their connection/session are asyncio's
    for name, member in inspect.getmembers(novaque.Client):
        if name.startswith("_") or not callable(member):
            continue
        twin = getattr(novaque.aio.AsyncClient, name)
        assert inspect.iscoroutinefunction(twin) != (name in plain), name
        sync_params = list(inspect.signature(member).parameters.values())
        twin_params = list(inspect.signature(twin).parameters.values())
        assert [(p.name, p.kind, p.default) for p in twin_params] == [
            (p.name, p.kind, p.default) for p in sync_params
        ], name
        if name not in joined | plain | {"subscribe_and_start"}:
            assert twin.__doc__ == member.__doc__, name


def test_connect_picks_asyncio_drivers_and_refuses_sync_ones(tmp_path: Path) -> None:
    client = novaque.aio.connect(f"sqlite:///{tmp_path / 'a.db'}")
    assert client.engine.sync_engine.dialect.driver == "aiosqlite"
    with pytest.raises(novaque.InvalidOption, match="not an asyncio driver"):
        novaque.aio.connect("mysql+pymysql://root@127.0.0.1:1/test")

    async def main() -> None:
        await client.migrate()
        await client.publish("t", b"x")
        assert await client.list_topics() == ["t"]
        await client.shutdown()

    asyncio.run(main())


def test_counters_of_an_async_client_reach_the_database_at_exit(backend: Backend) -> None:
    """A process whose AsyncClient was never shut down: its counters are flushed
    at exit on an event loop of their own."""
    reader = backend.client()
    reader.ensure_channel("web", "c")
    script = "\n".join(
        [
            "import asyncio, sys, novaque.aio",
            "from sqlalchemy.ext.asyncio import create_async_engine",
            "async def main():",
            "    client = novaque.aio.AsyncClient(create_async_engine(sys.argv[1]))",
            "    for _ in range(3):",
            "        await client.publish('web', b'x')",
            "asyncio.run(main())",
        ]
    )
    url = async_url(backend.name, backend.url).render_as_string(hide_password=False)
    subprocess.run([sys.executable, "-c", script, url], check=True, cwd=ROOT, timeout=120)
    assert reader.channel_counters("web", "c").published == 3


def test_a_sync_client_in_a_thread_beside_the_loop_shares_the_database(
    backend: Backend,
) -> None:
    """The twins side by side in one process (a web app's sync code and its
    asyncio consumers): each sees the other's messages."""
    sync_client = backend.client()
    sync_client.ensure_channel("t", "sync-side")

    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        await client.ensure_channel("t", "c")
        published = await client.publish("t", b"from the loop")
        got = await asyncio.to_thread(sync_client.claim, "t", "sync-side")
        assert [m.id for m in got] == [published]
        done = threading.Event()
        await asyncio.to_thread(lambda: (sync_client.ack(got[0]), done.set()))
        assert done.is_set()
        [mine] = await client.claim("t", "c")
        await client.ack(mine)
        assert delivery_rows(backend) == []

    run(backend, body)


def test_an_asyncio_driver_given_to_the_sync_side_names_novaque_aio(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"
    with pytest.raises(novaque.InvalidOption, match=r"asyncio driver: use novaque\.aio\.connect"):
        novaque.connect(url)
    engine = create_async_engine(url)
    with pytest.raises(TypeError, match=r"aiosqlite is asyncio's: use novaque\.aio\.AsyncClient"):
        novaque.Client(engine.sync_engine)  # the sync face of an AsyncEngine
    asyncio.run(engine.dispose())


def test_drain_awaits_an_async_handler_with_the_consumers_rules(backend: Backend) -> None:
    from novaque.testing import drain

    async def body(client: novaque.aio.AsyncClient, engine: AsyncEngine) -> None:
        seen: list[tuple[bytes, int]] = []

        async def handler(msg: novaque.Message) -> None:
            seen.append((msg.body, msg.attempts))
            await asyncio.sleep(0)
            if msg.body == b"bad":
                raise novaque.Reject("no")
            if msg.attempts == 1:
                raise ValueError("once")

        await client.ensure_channel("t", "c")
        await client.publish_many("t", [b"ok", b"bad"])
        assert await drain(client, "t", "c", handler) == 3  # ok twice (retried at once), bad
        assert sorted(seen) == [(b"bad", 1), (b"ok", 1), (b"ok", 2)]
        assert [d.reason for d in await client.list_dead("t", "c")] == ["no"]

        def plain(msg: novaque.Message) -> None:
            pass

        with pytest.raises(TypeError, match="async def"):
            drain(client, "t", "c", plain)  # type: ignore[call-overload]

    run(backend, body, backoff=novaque.Backoff(base=0))


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # psycopg's async autocommit
def test_connect_runs_one_statement_work_on_a_pool_kept_in_autocommit(backend: Backend) -> None:
    """psycopg's async connections switch autocommit with an awaited call: the
    engine novaque.aio.connect builds keeps a pool in autocommit beside it for
    publish, claim and ack, and shutdown closes its connections."""
    from novaque.dialects.engines import autocommit_engine

    client = novaque.aio.connect(async_url(backend.name, backend.url))
    auto = autocommit_engine(client.engine.sync_engine)
    assert auto is not None

    async def main() -> None:
        await client.ensure_channel("t", "c")
        await client.publish("t", b"first")  # learns the topic id (a transaction)
        assert auto.pool.checkedin() == 0
        await client.publish("t", b"second")  # one statement: the autocommit pool
        assert auto.pool.checkedin() == 1
        got = await client.claim("t", "c", max_messages=5)
        await client.ack_many(got)
        assert [m.body for m in got] == [b"first", b"second"]
        assert await client.channel_backlog("t", "c") == novaque.Backlog()
        await client.shutdown()
        assert auto.pool.checkedin() == 0

    asyncio.run(main())
