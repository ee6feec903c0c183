"""The executor's asyncio form: novaque's operations, unchanged, run on an
``AsyncEngine`` through SQLAlchemy's greenlet bridge, by concurrent tasks.

The drivers: psycopg's async connections, asyncmy, aiosqlite.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.util import await_only, greenlet_spawn

import novaque
import novaque.aio
from novaque import _executor, dialects
from novaque._executor import AsyncExecutor
from novaque.dialects.engines import configure_sqlite
from novaque.dialects.params import ClaimParams
from novaque.ops import consume, topology
from tests._twin import async_url
from tests.conftest import Backend
from tests.test_ops_contract import LEASE_US


def _async_url(backend: Backend) -> sa.URL:
    return async_url(backend.name, backend.url)


async def _drain(
    executor: AsyncExecutor, dialect: dialects.Dialect, now: int, tasks: int
) -> list[int]:
    """``tasks`` tasks claim and ack until the channel is empty; the ids they acked."""
    acked: list[int] = []

    def claim_and_ack(conn: sa.Connection) -> list[int]:
        cid = topology.existing_channel_id(conn, "t", "c")
        token = secrets.token_hex(16)
        rows, at, _ = consume.claim(conn, dialect, now, ClaimParams(cid, 3, LEASE_US, token))
        msgs = consume.messages_of(rows, "t", "c", cid, token, at)
        lost, _ = consume.ack(conn, dialect, now, msgs)
        assert lost == []
        return [m.id for m in msgs]

    async def worker() -> None:
        while True:
            got = await greenlet_spawn(executor.run, claim_and_ack)
            if not got:
                return
            acked.extend(got)
            await asyncio.sleep(0)  # let the other tasks in

    await asyncio.gather(*(worker() for _ in range(tasks)))
    return acked


def test_concurrent_tasks_share_the_work_through_the_async_executor(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "c")
    ids = client.publish_many("t", [b"%d" % i for i in range(60)])
    now = client._context.now()

    async def main() -> list[int]:
        engine = create_async_engine(_async_url(backend))
        if backend.name == "sqlite":
            configure_sqlite(engine.sync_engine)  # novaque's pragmas and BEGIN IMMEDIATE
        try:
            dialect = dialects.for_engine(engine.sync_engine)
            executor = AsyncExecutor(engine.sync_engine, dialect)
            return await _drain(executor, dialect, now, tasks=4)
        finally:
            await engine.dispose()

    acked = asyncio.run(main())
    assert sorted(acked) == sorted(ids)  # every message once, none twice
    assert client.channel_backlog("t", "c") == novaque.Backlog()


def test_the_async_locks_let_the_loop_run_while_they_are_held(backend: Backend) -> None:
    """The client's schema-check lock, and on SQLite the writers' turn: held across
    statements by one task, they make the other tasks wait, not the loop (a
    thread's lock would let every task of the thread in, or block them all)."""
    order: list[str] = []

    async def main() -> None:
        engine = create_async_engine(_async_url(backend))
        try:
            executor = AsyncExecutor(engine.sync_engine, dialects.for_engine(engine.sync_engine))
            locks: list[Any] = [executor.mutex()]
            if backend.name == "sqlite":
                locks.append(executor._turn)

            def hold(lock: Any, name: str) -> None:
                with lock:
                    order.append(f"{name} in")
                    with engine.sync_engine.connect() as conn:  # I/O while holding it
                        conn.execute(sa.text("SELECT 1"))
                    order.append(f"{name} out")

            async def beside() -> None:
                order.append("loop ran")

            for i, lock in enumerate(locks):
                await asyncio.gather(
                    greenlet_spawn(hold, lock, f"a{i}"),
                    greenlet_spawn(hold, lock, f"b{i}"),
                    beside(),
                )
                assert order.index(f"a{i} out") < order.index(f"b{i} in"), order
        finally:
            await engine.dispose()

    asyncio.run(asyncio.wait_for(main(), timeout=60))
    assert "loop ran" in order


def _where_test(seen: list[str]) -> Any:
    """A transaction that notes the thread it ran on and counts the topics."""

    def where(conn: sa.Connection) -> int:
        seen.append(threading.current_thread().name)
        assert conn.dialect.driver == "pysqlite"
        return int(conn.execute(sa.text("SELECT count(*) FROM novaque_topics")).scalar_one())

    return where


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # a library, not a server
def test_sqlite_transactions_of_the_twin_run_on_the_loop_while_the_lock_is_free(
    backend: Backend, client: novaque.Client
) -> None:
    """On SQLite the twin's own transactions run whole on a sync engine, right on
    the loop's thread when nothing else holds the file's write lock: no hop to
    a thread, and not aiosqlite's hops per statement."""
    client.ensure_channel("t", "c")
    seen: list[str] = []

    async def main() -> list[int]:
        engine = create_async_engine(_async_url(backend))
        executor = AsyncExecutor(engine.sync_engine, dialects.for_engine(engine.sync_engine))
        try:
            where = _where_test(seen)
            return await asyncio.gather(*(greenlet_spawn(executor.run, where) for _ in range(5)))
        finally:
            executor.close()
            await engine.dispose()

    assert asyncio.run(main()) == [1] * 5
    assert seen == [threading.current_thread().name] * 5


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_sqlite_lock_held_by_another_connection_sends_the_transaction_to_a_thread(
    backend: Backend, client: novaque.Client
) -> None:
    """A write lock held elsewhere (another process, the application's own
    connection) is never waited for on the loop: the transaction goes to the
    client's thread and waits there, while the loop's other tasks run on; it
    commits once the lock is free."""
    client.ensure_channel("t", "c")
    seen: list[str] = []
    path = sa.make_url(backend.url).database
    assert path

    async def main() -> None:
        engine = create_async_engine(_async_url(backend))
        executor = AsyncExecutor(engine.sync_engine, dialects.for_engine(engine.sync_engine))
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            holder.execute("BEGIN IMMEDIATE")  # the write lock, held by another connection
            where = _where_test(seen)
            waiting = asyncio.ensure_future(greenlet_spawn(executor.run, where))
            for _ in range(50):  # the loop runs while it waits (on the thread, in SQLite)
                await asyncio.sleep(0)
            assert not waiting.done()
            assert seen == []
            holder.execute("ROLLBACK")
            assert await waiting == 1
            assert seen == ["novaque-sqlite"]
            seen.clear()
            assert await greenlet_spawn(executor.run, where) == 1  # the lock is free again
            assert seen == [threading.current_thread().name]
        finally:
            holder.close()
            executor.close()
            await engine.dispose()

    asyncio.run(asyncio.wait_for(main(), timeout=60))


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_sqlite_turn_held_by_a_thread_of_the_process_sends_the_transaction_to_a_thread(
    backend: Backend, client: novaque.Client
) -> None:
    """novaque's threads in this process (a sync client's consumer) take turns on
    the file before SQLite's lock: a turn held by one of them is not waited for
    on the loop either."""
    client.ensure_channel("t", "c")
    seen: list[str] = []
    taken, done = threading.Event(), threading.Event()

    def hold_the_turn() -> None:
        with _executor._write_lock(client._context.executor.engine):
            taken.set()
            done.wait(30)

    holder = threading.Thread(target=hold_the_turn)
    holder.start()
    taken.wait(30)

    async def main() -> None:
        engine = create_async_engine(_async_url(backend))
        executor = AsyncExecutor(engine.sync_engine, dialects.for_engine(engine.sync_engine))
        try:
            waiting = asyncio.ensure_future(greenlet_spawn(executor.run, _where_test(seen)))
            for _ in range(50):
                await asyncio.sleep(0)
            assert not waiting.done()  # on the client's thread, waiting for the turn
            done.set()
            assert await waiting == 1
        finally:
            executor.close()
            await engine.dispose()

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=60))
    finally:
        done.set()
        holder.join()
    assert seen == ["novaque-sqlite"]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_sqlite_on_loop_off_runs_every_transaction_on_one_thread_of_the_clients(
    backend: Backend, client: novaque.Client
) -> None:
    """``Options(sqlite_on_loop=False)``: the loop never waits for SQLite, not even
    for the disk; each transaction is one hop to the client's thread, while
    the loop runs on."""
    client.ensure_channel("t", "c")
    seen: list[str] = []

    async def main() -> None:
        aio = novaque.aio.connect(backend.url, sqlite_on_loop=False)
        executor = aio._core._context.executor
        try:
            ticks = 0

            async def beside() -> None:
                nonlocal ticks
                for _ in range(20):
                    ticks += 1
                    await asyncio.sleep(0)

            where = _where_test(seen)
            counts = await asyncio.gather(
                *(greenlet_spawn(executor.run, where) for _ in range(5)), beside()
            )
            assert counts[:5] == [1] * 5
            assert ticks == 20
            await aio.publish("t", b"x")  # and the client's own calls
            assert await aio.channel_backlog("t", "c") == novaque.Backlog(ready=1)
        finally:
            await aio.shutdown()
            await aio.engine.dispose()

    asyncio.run(main())
    assert len(set(seen)) == 1
    assert seen[0].startswith("novaque-sqlite")


def test_sqlite_on_loop_must_be_a_bool() -> None:
    with pytest.raises(novaque.InvalidOption, match="Options.sqlite_on_loop must be True or False"):
        novaque.Options(sqlite_on_loop="yes")  # type: ignore[arg-type]


def test_the_loop_turn_passes_first_come_first_served_and_past_cancelled_tasks() -> None:
    """SQLite's turn among the tasks of a loop: taken at once when free; a task
    that waits gets it in arrival order; one cancelled while waiting, or
    cancelled after it was handed the turn, passes it on."""
    order: list[str] = []

    async def main() -> None:
        turn = _executor._LoopTurn("turn-test")
        release = asyncio.Event()

        def hold(name: str) -> None:
            with turn:
                order.append(name)
                if name == "a":
                    await_only(release.wait())
            if name == "a":  # c was handed the turn: cancelled before it runs
                waiting[1].cancel()

        a = asyncio.ensure_future(greenlet_spawn(hold, "a"))
        await asyncio.sleep(0)
        waiting = [asyncio.ensure_future(greenlet_spawn(hold, n)) for n in ("b", "c", "d", "e")]
        for _ in range(3):
            await asyncio.sleep(0)
        assert order == ["a"]
        waiting[0].cancel()  # b: cancelled while it waits
        await asyncio.sleep(0)
        release.set()
        await a
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert [type(r).__name__ for r in results[:2]] == ["CancelledError"] * 2
        assert order == ["a", "d", "e"]
        await greenlet_spawn(hold, "f")  # free again: taken at once
        assert order[-1] == "f"

    asyncio.run(asyncio.wait_for(main(), timeout=10))
