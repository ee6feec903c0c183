"""The executor's asyncio form: novaque's operations, unchanged, run on an
``AsyncEngine`` through SQLAlchemy's greenlet bridge, by concurrent tasks.

The drivers: psycopg's async connections, asyncmy, aiosqlite.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.util import greenlet_spawn

import novaque
from novaque import dialects
from novaque._executor import AsyncExecutor
from novaque.dialects.engines import configure_sqlite
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
        rows, at, _ = consume.claim(conn, dialect, now, cid, 3, LEASE_US, token)
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
    now = client._now()

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


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # a library, not a server
def test_sqlite_transactions_of_the_twin_run_on_one_thread_of_the_clients(
    backend: Backend, client: novaque.Client
) -> None:
    """On SQLite the twin's own transactions run whole on a thread of its own,
    one hop each (not aiosqlite's hops per statement), while the loop runs on."""
    client.ensure_channel("t", "c")
    seen: list[str] = []

    async def main() -> None:
        engine = create_async_engine(_async_url(backend))
        try:
            executor = AsyncExecutor(engine.sync_engine, dialects.for_engine(engine.sync_engine))

            def where(conn: sa.Connection) -> int:
                seen.append(threading.current_thread().name)
                assert conn.dialect.driver == "pysqlite"
                return int(
                    conn.execute(sa.text("SELECT count(*) FROM novaque_topics")).scalar_one()
                )

            ticks = 0

            async def beside() -> None:
                nonlocal ticks
                for _ in range(20):
                    ticks += 1
                    await asyncio.sleep(0)

            counts = await asyncio.gather(
                *(greenlet_spawn(executor.run, where) for _ in range(5)), beside()
            )
            assert counts[:5] == [1] * 5
            assert ticks == 20
            executor.close()
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert len(set(seen)) == 1
    assert seen[0].startswith("novaque-sqlite")
