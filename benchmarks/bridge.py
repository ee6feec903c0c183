"""How the asyncio twin reaches the shared operations: the greenlet bridge
against the alternatives, on the hot paths (one publish; one claim and its ack).

``python -m benchmarks.bridge [--backend sqlite|postgres|mysql|all] [--n 1500]``

Per backend, on a private database, in rounds whose order rotates (so every
way meets the same moments of a noisy machine), each way runs ``n / rounds``
publishes one by one, then claims and acks them one at a time:

- ``sync``: :class:`novaque.Client` called directly (the reference);
- ``aio``: :class:`novaque.aio.AsyncClient`: the shared operations inside
  SQLAlchemy's greenlet bridge on the async driver (what novaque does);
- ``to_thread``: the sync client called from a coroutine with
  ``asyncio.to_thread``, the other way to serve asyncio without copying the
  operations (every call hops to a thread and back);
- ``core sync`` / ``core async``: the least SQLAlchemy Core can do for the
  same publish (one message row and one delivery row in one transaction) on
  a sync ``Connection`` and natively on an ``AsyncConnection``: what an
  operations layer rewritten natively for asyncio could reach at best.

Prints operations per second for each way and each one's ratio to ``sync``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import novaque
import novaque.aio
from benchmarks._common import body
from benchmarks._databases import BACKENDS, Database
from novaque import schema

TOPIC, CHANNEL = "bridge", "c"

Step = Callable[[int], Awaitable[None]]


def _asyncio_url(db: Database) -> sa.URL:
    """The database's URL with no driver named: novaque.aio.connect then picks
    its asyncio driver (psycopg, asyncmy, aiosqlite), as the bench's aio side does."""
    url = sa.make_url(db.url)
    return url.set(drivername=url.get_backend_name())


def _core_rows(topic_id: int, channel_id: int, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    now = time.time_ns() // 1000
    message = {
        "topic_id": topic_id,
        "body": body(i),
        "published_at": now,
        "expires_at": now + 86_400_000_000,
        "max_attempts": 5,
    }
    delivery = {
        "channel_id": channel_id,
        "state": schema.STATE_READY,
        "visible_at": now,
        "attempts": 0,
        "max_attempts": 5,
    }
    return message, delivery


async def _ways(db: Database, engines: list[Any]) -> dict[str, tuple[Step, Step]]:
    """Each way's (publish one, claim-and-ack one) step."""
    sync_client = novaque.connect(db.url)
    aio_client = novaque.aio.connect(_asyncio_url(db))
    engines += [sync_client, aio_client]
    sync_client.ensure_channel(TOPIC, CHANNEL)
    await aio_client.publish(TOPIC, b"warm")  # schema check, topic id cached
    sync_client.publish(TOPIC, b"warm")
    for client in (sync_client,):
        for msg in client.claim(TOPIC, CHANNEL, max_messages=10):
            client.ack(msg)

    async def sync_publish(i: int) -> None:
        sync_client.publish(TOPIC, body(i))

    async def sync_consume(i: int) -> None:
        for msg in sync_client.claim(TOPIC, CHANNEL):
            sync_client.ack(msg)

    async def aio_publish(i: int) -> None:
        await aio_client.publish(TOPIC, body(i))

    async def aio_consume(i: int) -> None:
        for msg in await aio_client.claim(TOPIC, CHANNEL):
            await aio_client.ack(msg)

    async def thread_publish(i: int) -> None:
        await asyncio.to_thread(sync_client.publish, TOPIC, body(i))

    async def thread_consume(i: int) -> None:
        for msg in await asyncio.to_thread(sync_client.claim, TOPIC, CHANNEL):
            await asyncio.to_thread(sync_client.ack, msg)

    with sync_client.engine.connect() as conn:
        topic_id = conn.execute(
            sa.select(schema.topics.c.id).where(schema.topics.c.name == TOPIC)
        ).scalar_one()
        channel_id = conn.execute(
            sa.select(schema.channels.c.id).where(schema.channels.c.topic_id == topic_id)
        ).scalar_one()
    core_sync = sa.create_engine(db.url)
    core_async: AsyncEngine = create_async_engine(aio_client.engine.url)  # the same driver
    engines += [core_sync, core_async]
    insert_message = sa.insert(schema.messages)
    insert_delivery = sa.insert(schema.deliveries)

    async def core_sync_publish(i: int) -> None:
        message, delivery = _core_rows(topic_id, channel_id, i)
        with core_sync.begin() as conn:
            mid = conn.execute(insert_message, message).inserted_primary_key[0]
            conn.execute(insert_delivery, {**delivery, "message_id": mid})

    async def core_async_publish(i: int) -> None:
        message, delivery = _core_rows(topic_id, channel_id, i)
        async with core_async.begin() as conn:
            mid = (await conn.execute(insert_message, message)).inserted_primary_key[0]
            await conn.execute(insert_delivery, {**delivery, "message_id": mid})

    async def nothing(i: int) -> None:
        return None

    return {
        "sync": (sync_publish, sync_consume),
        "aio": (aio_publish, aio_consume),
        "to_thread": (thread_publish, thread_consume),
        "core sync": (core_sync_publish, nothing),
        "core async": (core_async_publish, nothing),
    }


async def measure(backend: str, n: int, rounds: int) -> dict[str, dict[str, float]]:
    db = Database(backend)
    opened: list[Any] = []
    try:
        db.migrate()
        ways = await _ways(db, opened)
        spent = {name: [0.0, 0.0] for name in ways}
        per = max(1, n // rounds)
        names = list(ways)
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                publish, consume = ways[name]
                for k, step in enumerate((publish, consume)):
                    started = time.perf_counter()
                    for i in range(per):
                        await step(i)
                    spent[name][k] += time.perf_counter() - started
        done = per * rounds
        return {
            name: {"publish": done / s[0], "claim+ack": (done / s[1]) if s[1] > 1e-3 else 0.0}
            for name, s in spent.items()
        }
    finally:
        for thing in opened:
            if isinstance(thing, novaque.aio.AsyncClient):
                await thing.shutdown()
            elif isinstance(thing, novaque.Client):
                thing.shutdown()
            elif isinstance(thing, AsyncEngine):
                await thing.dispose()
            else:
                thing.dispose()
        db.drop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bridge", description=__doc__)
    parser.add_argument("--backend", default="all", choices=[*BACKENDS, "all"])
    parser.add_argument("--n", type=int, default=1500, help="operations per way (default 1500)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    print("| backend | way | publish/s | ratio | claim+ack/s | ratio |")
    print("|---|---|---|---|---|---|")
    for backend in backends:
        got = asyncio.run(measure(backend, args.n, args.rounds))
        ref = got["sync"]
        for name, figures in got.items():
            pub, cons = figures["publish"], figures["claim+ack"]
            cons_cells = f"{cons:,.0f} | {cons / ref['claim+ack']:.2f}" if cons else "- | -"
            print(
                f"| {backend} | {name} | {pub:,.0f} | {pub / ref['publish']:.2f} | {cons_cells} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
