"""The workloads W1a-W8 on novaque (the floor's side lives in ``floor.py``).

Each function measures one run and returns a :class:`Run`; setup (publishing
the messages a drain will consume, loading W4's backlog) happens before the
clock starts. Every run stops at its :class:`Deadline` and then reports how
far it got.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import novaque
import novaque.aio
from benchmarks._common import Deadline, Run, Sizes, age_ms, body, stamped_body
from benchmarks._databases import Database, close_client
from novaque import schema
from novaque.dialects import normalise_url, pool_size_for

T = TypeVar("T")

TOPIC = "bench"
CHANNEL = "work"


def client_options(sizes: Sizes, **options: Any) -> dict[str, Any]:
    """``connect()``'s options for both twins: the workloads' in-flight limit and poll."""
    options.setdefault("max_in_flight", sizes.max_in_flight)
    options.setdefault("poll_interval", sizes.poll_interval_s)
    return options


def make_client(
    db: Database, sizes: Sizes, *, start: bool = True, **options: Any
) -> novaque.Client:
    """A client as an application would make one, started: ``novaque.connect``,
    or ``novaque.Client`` on ``sqlalchemy.create_engine(url)`` with a pool as
    large as ``connect`` would make (``Sizes.engine``)."""
    fields = client_options(sizes, **options)
    if sizes.engine == "plain":
        engine = sa.create_engine(db.url, pool_size=pool_size_for(fields["max_in_flight"]))
        client = novaque.Client(engine, novaque.Options(**fields))
    else:
        client = novaque.connect(db.url, **fields)
    if start and hasattr(client, "start"):
        client.start()
    return client


def consumer_kind(client: novaque.Client) -> str:
    return "subscribe" if hasattr(client, "subscribe") else "claim-loop (temporary stand-in)"


class _ClaimLoop:
    """Temporary stand-in for ``Client.subscribe`` until the runtime lands on main.

    Claims up to ``max_in_flight``, runs the handler on each, acks the batch.
    Only for developing the harness: reported figures use ``subscribe``.
    """

    def __init__(
        self,
        client: novaque.Client,
        topic: str,
        channel: str,
        handler: Callable[[novaque.Message], None],
        max_in_flight: int,
        poll_interval: float,
    ) -> None:
        self._stop = threading.Event()

        def loop() -> None:
            idle = 0.001
            while not self._stop.is_set():
                msgs = client.claim(topic, channel, max_messages=max_in_flight)
                if not msgs:
                    self._stop.wait(idle)
                    idle = min(poll_interval, idle * 2)
                    continue
                idle = 0.001
                for msg in msgs:
                    handler(msg)
                client.ack_many(msgs)

        self._thread = threading.Thread(target=loop, name="bench-claim-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 10) -> None:
        self._stop.set()
        self._thread.join(timeout)


def start_consumer(
    client: novaque.Client,
    handler: Callable[[novaque.Message], None],
    sizes: Sizes,
    *,
    topic: str = TOPIC,
    channel: str = CHANNEL,
) -> Any:
    """A started consumer of ``topic``/``channel`` with ``max_in_flight`` workers."""
    subscribe = getattr(client, "subscribe", None)
    if subscribe is not None:
        consumer = subscribe(
            topic,
            channel,
            handler,
            max_in_flight=sizes.max_in_flight,
            poll_interval=sizes.poll_interval_s,
        )
    else:
        consumer = _ClaimLoop(
            client, topic, channel, handler, sizes.max_in_flight, sizes.poll_interval_s
        )
    consumer.start()
    return consumer


def batches(n: int, size: int) -> Iterator[list[bytes]]:
    """``n`` bodies in lists of ``size``."""
    for start in range(0, n, size):
        yield [body(i) for i in range(start, min(n, start + size))]


#: W10's urgent messages' priority.
URGENT = -10


def prefill(
    client: Any,
    n: int,
    *,
    topic: str = TOPIC,
    batch: int = 1000,
    side: SyncSide | None = None,
    groups: int = 0,
    urgent: int = 0,
) -> None:
    """Publish ``n`` messages with ``publish_many`` (setup, not timed), on either
    twin; with ``groups``, message ``i`` in group ``i % groups``; the last
    ``urgent`` of them with priority :data:`URGENT` (W10's)."""
    side = side or SYNC
    plain = n - urgent
    for first, last, priority in ((0, plain, 0), (plain, n, URGENT)):
        for start in range(first, last, batch):
            numbers = range(start, min(last, start + batch))
            keys = [f"g{i % groups}" for i in numbers] if groups else None
            side.call(
                client,
                "publish_many",
                topic,
                [body(i) for i in numbers],
                groups=keys,
                priority=priority,
            )


# -- the two twins: how a workload drives each -----------------------------------------


class Gate:
    """Where a drain's handlers wait while the other sides run.

    ``is_open`` is a plain flag the handlers read first (ten workers must not
    contend for a lock); only when it is down do they wait on ``event``.
    Opening and closing run through ``where``: on the handlers' own thread
    of control (directly for threads, ``call_soon_threadsafe`` for the event
    loop), so :attr:`opened_at` is read on the same clock, in the same
    thread, as the handlers' own moments, without the hop between threads.
    """

    def __init__(self, event: Any, where: Callable[[Callable[[], None]], object]) -> None:
        self.event = event
        self.is_open = False
        self.opened_at = 0.0
        self._where = where

    def open(self) -> None:
        self._where(self._opened)

    def close(self) -> None:
        self._where(self._closed)

    def _opened(self) -> None:
        self.opened_at = time.perf_counter()
        self.is_open = True
        self.event.set()

    def _closed(self) -> None:
        self.is_open = False
        self.event.clear()


class SyncSide:
    """How the workloads drive :class:`novaque.Client`: from the benchmark's thread."""

    name = "sync"

    def connect(self, db: Database, sizes: Sizes, *, start: bool = True) -> Any:
        return make_client(db, sizes, start=start)

    def call(self, client: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        """``client.method(*args, **kwargs)``, awaited on the twin (setup, not timed)."""
        return getattr(client, method)(*args, **kwargs)

    def publish_each(self, client: novaque.Client, bodies: list[bytes]) -> float:
        """W1a's slice: ``publish`` one by one, a transaction each; the seconds it took."""
        started = time.perf_counter()
        for data in bodies:
            client.publish(TOPIC, data)
        return time.perf_counter() - started

    def publish_batch(
        self, client: novaque.Client, bodies: list[bytes], headers: dict[str, str] | None = None
    ) -> float:
        """W1b's, W6's and W8's slice: one ``publish_many``; the seconds it took."""
        started = time.perf_counter()
        client.publish_many(TOPIC, bodies, headers=headers)
        return time.perf_counter() - started

    def gate(self) -> Gate:
        return Gate(threading.Event(), lambda fn: fn())

    def handler(
        self, record: Callable[[novaque.Message], None], gate: Gate | None = None
    ) -> Callable[[novaque.Message], None]:
        """A handler that passes ``gate`` (if any), then calls ``record``."""
        if gate is None:
            return record

        def handle(msg: novaque.Message) -> None:
            if not gate.is_open:
                gate.event.wait()
            record(msg)

        return handle

    def subscribe(self, client: Any, handler: Any, sizes: Sizes, topic: str) -> Any:
        return start_consumer(client, handler, sizes, topic=topic)

    def shutdown(self, consumer: Any) -> None:
        consumer.shutdown(timeout=10)

    def close(self, client: Any) -> None:
        close_client(client)


SYNC = SyncSide()


class AioSide(SyncSide):
    """How the workloads drive :class:`novaque.aio.AsyncClient`: on one event
    loop, on a background thread, for the whole benchmark.

    The benchmark's thread hands the loop whole slices, never one message: a
    coroutine publishing a W1a slice of 100 with ``await client.publish``, one
    ``await client.publish_many``, a drain's gate opening. Each slice is timed
    on the loop itself, so the hop between the threads is in no figure.
    """

    name = "aio"

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="bench-aio-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (one hop each way)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def connect(self, db: Database, sizes: Sizes, *, start: bool = True) -> Any:
        return self.run(_aio_connect(db, sizes, start))

    def call(self, client: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.run(getattr(client, method)(*args, **kwargs))

    def publish_each(self, client: Any, bodies: list[bytes]) -> float:
        return self.run(_aio_publish_each(client, bodies))

    def publish_batch(
        self, client: Any, bodies: list[bytes], headers: dict[str, str] | None = None
    ) -> float:
        return self.run(_aio_publish_batch(client, bodies, headers))

    def gate(self) -> Gate:
        return Gate(asyncio.Event(), self.loop.call_soon_threadsafe)

    def handler(  # type: ignore[override]
        self, record: Callable[[novaque.Message], None], gate: Gate | None = None
    ) -> novaque.aio.AsyncHandler:
        async def handle(msg: novaque.Message) -> None:
            if gate is not None and not gate.is_open:
                await gate.event.wait()
            record(msg)

        return handle

    def subscribe(self, client: Any, handler: Any, sizes: Sizes, topic: str) -> Any:
        consumer = client.subscribe(
            topic,
            CHANNEL,
            handler,
            max_in_flight=sizes.max_in_flight,
            poll_interval=sizes.poll_interval_s,
        )
        return self.run(consumer.start())

    def shutdown(self, consumer: Any) -> None:
        self.run(consumer.shutdown(timeout=10))

    def close(self, client: Any) -> None:
        self.run(_aio_close(client))

    def stop(self) -> None:
        """Stop the loop and its thread (the benchmark's end)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


async def _aio_connect(db: Database, sizes: Sizes, start: bool) -> novaque.aio.AsyncClient:
    # Without the sync driver's name, the asyncio one novaque.aio.connect
    # picks (psycopg's async mode, asyncmy, aiosqlite).
    url = sa.make_url(db.url)
    url = normalise_url(url.set(drivername=url.get_backend_name()), asynchronous=True)
    fields = client_options(sizes)
    if sizes.engine == "plain":
        engine = create_async_engine(url, pool_size=pool_size_for(fields["max_in_flight"]))
        client = novaque.aio.AsyncClient(engine, novaque.Options(**fields))
    else:
        client = novaque.aio.connect(url, **fields)
    if start:
        await client.start()
    return client


async def _aio_close(client: novaque.aio.AsyncClient) -> None:
    await client.shutdown(timeout=10)
    await client.engine.dispose()


async def _aio_publish_each(client: novaque.aio.AsyncClient, bodies: list[bytes]) -> float:
    started = time.perf_counter()
    for data in bodies:
        await client.publish(TOPIC, data)
    return time.perf_counter() - started


async def _aio_publish_batch(
    client: novaque.aio.AsyncClient, bodies: list[bytes], headers: dict[str, str] | None
) -> float:
    started = time.perf_counter()
    await client.publish_many(TOPIC, bodies, headers=headers)
    return time.perf_counter() - started


# -- W1a / W1b / W6: publishing -------------------------------------------------------


#: W8's filters: three take every message it publishes, one none.
FILTERS = (
    'headers["region"] == "eu"',
    'headers["tier"] == "gold" && topic == "bench"',
    'headers["region"] == "us"',
    'headers["tier"] in ["gold", "silver"]',
)


class Publisher:
    """One twin's side of the publishing workloads, one slice at a time.

    W1a and W1b interleave the floor and the twins slice by slice (see
    ``run.py``), so all meet the same moments of a noisy machine. Each slice
    returns the seconds it took.
    """

    def __init__(
        self,
        db: Database,
        sizes: Sizes,
        *,
        channels: int = 1,
        filtered: int = 0,
        side: SyncSide = SYNC,
    ) -> None:
        self.side = side
        self.client = side.connect(db, sizes)
        self.headers: dict[str, str] | None = None
        for c in range(channels):
            name = f"{CHANNEL}{c}" if channels > 1 else CHANNEL
            # W8: the last ``filtered`` channels take a CEL filter each.
            expression = FILTERS[c % len(FILTERS)] if c >= channels - filtered else None
            side.call(self.client, "ensure_channel", TOPIC, name, filter=expression)
        if filtered:
            self.headers = {"region": "eu", "tier": "gold"}
        side.call(self.client, "publish", TOPIC, body(0))  # first use: schema check, topic id

    def one_by_one(self, bodies: list[bytes]) -> float:
        """W1a: ``publish``, one transaction per message."""
        return self.side.publish_each(self.client, bodies)

    def batch(self, bodies: list[bytes]) -> float:
        """W1b / W6 / W8: one ``publish_many``."""
        return self.side.publish_batch(self.client, bodies, self.headers)

    def close(self) -> None:
        self.side.close(self.client)


# -- W2 / W4: draining ----------------------------------------------------------------


class GatedDrain:
    """One consumer (``subscribe``, ``max_in_flight``) of either twin draining
    pre-published messages, in timed slices.

    The handler passes a gate: while it is closed the consumer stalls (its
    workers wait, so it claims nothing more), which lets the other sides run
    in between on a quiet machine. :meth:`advance` opens the gate until the
    consumer has handled ``target`` messages in all and returns the seconds
    that took, from the gate's opening to the handler that reached the
    target, both read where the handlers run. A slice may leave up to
    ``max_in_flight`` handlers past the gate and one claim or ack batch in
    flight when it closes; that work is counted in the next slice (at most
    one batch in 100 for slices of 1,000).
    """

    def __init__(
        self,
        db: Database,
        sizes: Sizes,
        n: int,
        *,
        topic: str = TOPIC,
        prefilled: bool = False,
        side: SyncSide = SYNC,
        groups: int = 0,
        urgent: int = 0,
    ) -> None:
        self.n = n
        #: W10: how many messages were handled before the last urgent one.
        self.urgent_left = urgent
        self.last_urgent_at = 0
        self.topic = topic
        self.db = db
        self.side = side
        self.client = side.connect(db, sizes)
        self.handled = 0
        self._counter = itertools.count(1)
        self._gate = side.gate()
        self._reached = threading.Event()
        self._target = 0
        self._at = 0.0
        # W7: a group FIFO channel, messages spread over ``groups`` groups.
        ordering = "group_fifo" if groups else None
        side.call(self.client, "ensure_channel", topic, CHANNEL, ordering=ordering)
        if not prefilled:
            prefill(self.client, n, topic=topic, side=side, groups=groups, urgent=urgent)
        db.analyze()
        handler = side.handler(self._count, self._gate)
        self.consumer = side.subscribe(self.client, handler, sizes, topic)

    def _count(self, msg: novaque.Message) -> None:
        self.handled = next(self._counter)
        if msg.priority == URGENT:
            self.urgent_left -= 1
            self.last_urgent_at = self.handled
        if self.handled >= self._target and not self._reached.is_set():
            self._at = time.perf_counter()
            self._reached.set()

    def advance(self, target: int, deadline: Deadline) -> float:
        """Let the consumer run until ``target`` messages are handled; the seconds taken."""
        self._target = min(target, self.n)
        self._reached.clear()
        if self.handled >= self._target:
            return 0.0
        self._gate.open()
        reached = self._reached.wait(deadline.left())
        self._gate.close()
        return (self._at if reached else time.perf_counter()) - self._gate.opened_at

    def close(self) -> dict[str, Any]:
        """Stop the consumer (flushing its acks); what is left to check the run."""
        self._gate.open()
        try:
            started = time.perf_counter()
            self.side.shutdown(self.consumer)
            shutdown_s = time.perf_counter() - started
            return {
                "shutdown_s": round(shutdown_s, 4),
                "left_after": _ready_left(self.db, self.topic),
                "consumer": consumer_kind(self.client),
            }
        finally:
            self.side.close(self.client)


def drain(
    db: Database,
    sizes: Sizes,
    deadline: Deadline,
    *,
    topic: str = TOPIC,
    prefilled: bool = False,
    groups: int = 0,
) -> Run:
    """One process drains ``w2_messages`` in one go (for profiling); with
    ``groups``, of a ``group_fifo`` channel (W7's)."""
    n = sizes.w2_messages
    gated = GatedDrain(db, sizes, n, topic=topic, prefilled=prefilled, groups=groups)
    try:
        seconds = gated.advance(n, deadline)
        done = min(gated.handled, n)
    finally:
        extra = gated.close()
    return Run(done, n, seconds, extra=extra)


def _ready_left(db: Database, topic: str) -> int:
    """Deliveries of ``topic`` still ready or leased (W4's dead and delayed rows excluded)."""
    d, c, t = schema.deliveries, schema.channels, schema.topics
    soon = time.time_ns() // 1000 + 86_400_000_000  # W4's delayed rows are 30 days out
    engine = sa.create_engine(db.url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count())
                    .select_from(d)
                    .join(c, c.c.id == d.c.channel_id)
                    .join(t, t.c.id == c.c.topic_id)
                    .where(
                        t.c.name == topic, d.c.state != schema.STATE_DEAD, d.c.visible_at <= soon
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def begin_bulk_load(
    client: Any, topic: str, templates: int, numbers: range
) -> tuple[int, int, list[int]]:
    """Before a bulk copy of deliveries on ``topic``'s one channel: publish
    ``templates`` messages (each with its ready delivery) and write the
    loader's tables, ``bench_msg`` (``k``: 0, 1, ... and the templates' ids)
    and ``bench_seq`` (``n``: ``numbers``) to cross-join them. Returns the
    topic's and the channel's ids and the templates' ids, ascending
    (:func:`end_bulk_load` drops the tables)."""
    prefill(client, templates, topic=topic)
    m, t, c = schema.messages, schema.topics, schema.channels
    with client.engine.begin() as conn:
        topic_id = conn.execute(sa.select(t.c.id).where(t.c.name == topic)).scalar_one()
        channel_id = conn.execute(sa.select(c.c.id).where(c.c.topic_id == topic_id)).scalar_one()
        of_topic = sa.select(m.c.id).where(m.c.topic_id == topic_id).order_by(m.c.id)
        ids = [r[0] for r in conn.execute(of_topic)]
        conn.exec_driver_sql("CREATE TABLE bench_seq (n INTEGER PRIMARY KEY)")
        if numbers:
            conn.execute(
                sa.text("INSERT INTO bench_seq (n) VALUES (:n)"), [{"n": n} for n in numbers]
            )
        conn.exec_driver_sql("CREATE TABLE bench_msg (k INTEGER PRIMARY KEY, id BIGINT)")
        conn.execute(
            sa.text("INSERT INTO bench_msg (k, id) VALUES (:k, :id)"),
            [{"k": k, "id": i} for k, i in enumerate(ids)],
        )
    return int(topic_id), int(channel_id), ids


def end_bulk_load(engine: sa.Engine, backend: str) -> None:
    """After a bulk copy of deliveries (``bench_seq`` and ``bench_msg``, the
    loader's tables): drop those and gather the queue tables' statistics
    (on PostgreSQL with a VACUUM, which sets the visibility map the backlog
    counts read)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE bench_seq")
        conn.exec_driver_sql("DROP TABLE bench_msg")
    if backend == "postgres":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    else:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "ANALYZE TABLE novaque_deliveries, novaque_messages"
                if backend == "mysql"
                else "ANALYZE"
            )


def load_backlog(db: Database, sizes: Sizes, topic: str) -> float:
    """W4 setup: ``w4_backlog`` dead and delayed deliveries on ``topic``'s channel.

    Bulk ``INSERT ... SELECT`` of a 1,000-row number table cross-joined with
    1,000 real messages, in chunks of 100,000 rows, so a million rows load in
    seconds. Half the rows are dead (``visible_at = DEAD_VISIBLE_AT``), half
    delayed by 30 days. Each of the 1,000 messages carries up to 1,000 of
    these deliveries: the claim path reads deliveries through their index and
    joins messages by primary key, so what a backlog could cost lies in
    ``novaque_deliveries``, which holds every one of the rows. Returns the
    seconds the load took.
    """
    started = time.perf_counter()
    client = make_client(db, sizes, start=False)
    try:
        client.ensure_channel(topic, CHANNEL)
        n_msgs = min(1000, sizes.w4_backlog)
        per = min(1000, -(-sizes.w4_backlog // n_msgs))
        _, channel_id, _ = begin_bulk_load(client, topic, n_msgs, range(per))
        d = schema.deliveries
        with client.engine.begin() as conn:
            # prefill made one ready delivery per message: not part of the backlog.
            conn.execute(sa.delete(d).where(d.c.channel_id == channel_id))
        now_us = time.time_ns() // 1000
        delayed_at = now_us + 30 * 86_400 * 1_000_000
        odd = "(b.n + bm.k) % 2 = 1"
        step = max(1, 100_000 // per)  # messages per chunk
        for first in range(0, n_msgs, step):
            with client.engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "INSERT INTO novaque_deliveries (message_id, channel_id, state, "
                        "visible_at, attempts, max_attempts, dead_reason, died_at) "
                        f"SELECT bm.id, {channel_id}, "
                        f"CASE WHEN {odd} THEN {schema.STATE_DEAD} ELSE {schema.STATE_READY} END, "
                        f"CASE WHEN {odd} THEN {schema.DEAD_VISIBLE_AT} ELSE {delayed_at} END, "
                        f"CASE WHEN {odd} THEN 5 ELSE 0 END, 5, "
                        f"CASE WHEN {odd} THEN 'max_attempts' ELSE NULL END, "
                        f"CASE WHEN {odd} THEN {now_us} ELSE NULL END "
                        "FROM bench_msg bm CROSS JOIN bench_seq b "
                        f"WHERE bm.k >= {first} AND bm.k < {first + step}"
                    )
                )
        end_bulk_load(client.engine, db.backend)
    finally:
        close_client(client)
    return time.perf_counter() - started


# -- W3: latency ----------------------------------------------------------------------


def latency(db: Database, sizes: Sizes, deadline: Deadline, *, side: SyncSide = SYNC) -> Run:
    """W3: an idle consumer of either twin; ``w3_messages`` publishes ``w3_interval_s`` apart.

    The publisher is a second, sync client (its own engine), so the consumer
    learns of each message as one in another process would: by NOTIFY on
    PostgreSQL, by the change watcher elsewhere (a publish through the consumer's own
    client would wake it directly, in-process). Latency runs from the
    moment stamped in the body, just before ``publish()``, to the handler.
    """
    n = sizes.w3_messages
    client = side.connect(db, sizes)
    publisher = make_client(db, sizes, start=False)
    latencies: list[float] = []
    lock = threading.Lock()
    try:
        side.call(client, "ensure_channel", TOPIC, CHANNEL)
        publisher.publish(TOPIC, body(0))
        # warm: schema, channel id
        for msg in side.call(client, "claim", TOPIC, CHANNEL, max_messages=10):
            side.call(client, "ack", msg)

        def record(msg: novaque.Message) -> None:
            ms = age_ms(msg.body)
            with lock:
                latencies.append(ms)

        consumer = side.subscribe(client, side.handler(record), sizes, TOPIC)
        with lock:
            latencies.clear()  # the warm-up message, if the claim above missed it
        time.sleep(max(0.3, 2 * sizes.poll_interval_s))  # let the consumer go idle
        with lock:
            latencies.clear()
        sent = 0
        started = time.perf_counter()
        for i in range(n):
            if deadline.passed():
                break
            pause = started + i * sizes.w3_interval_s - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            publisher.publish(TOPIC, stamped_body())
            sent += 1
        while len(latencies) < sent and not deadline.passed():
            time.sleep(0.005)
        elapsed = time.perf_counter() - started
        side.shutdown(consumer)
        with lock:
            got = list(latencies)
        return Run(
            len(got), n, elapsed, latencies_ms=got, extra={"consumer": consumer_kind(client)}
        )
    finally:
        close_client(publisher)
        side.close(client)
