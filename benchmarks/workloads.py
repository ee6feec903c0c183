"""The workloads W1a-W8 on novaque (the floor's side lives in ``floor.py``).

Each function measures one run and returns a :class:`Run`; setup (publishing
the messages a drain will consume, loading W4's backlog) happens before the
clock starts. Every run stops at its :class:`Deadline` and then reports how
far it got.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import novaque
from benchmarks._common import Deadline, Run, Sizes, age_ms, body, stamped_body
from benchmarks._databases import Database, close_client
from novaque import schema

TOPIC = "bench"
CHANNEL = "work"


def make_client(
    db: Database, sizes: Sizes, *, start: bool = True, **options: Any
) -> novaque.Client:
    """A client as an application would make one (``novaque.connect``), started."""
    options.setdefault("max_in_flight", sizes.max_in_flight)
    options.setdefault("poll_interval", sizes.poll_interval_s)
    client = novaque.connect(db.url, **options)
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


def prefill(
    client: novaque.Client, n: int, *, topic: str = TOPIC, batch: int = 1000, groups: int = 0
) -> None:
    """Publish ``n`` messages with ``publish_many`` (setup, not timed); with
    ``groups``, message ``i`` in group ``i % groups``."""
    for start in range(0, n, batch):
        numbers = range(start, min(n, start + batch))
        keys = [f"g{i % groups}" for i in numbers] if groups else None
        client.publish_many(topic, [body(i) for i in numbers], groups=keys)


# -- W1a / W1b / W6: publishing -------------------------------------------------------


#: W8's filters: three take every message it publishes, one none.
FILTERS = (
    'headers["region"] == "eu"',
    'headers["tier"] == "gold" && topic == "bench"',
    'headers["region"] == "us"',
    'headers["tier"] in ["gold", "silver"]',
)


class Publisher:
    """novaque's side of the publishing workloads, one slice at a time.

    W1a and W1b interleave the floor and novaque slice by slice (see
    ``run.py``), so both meet the same moments of a noisy machine.
    """

    def __init__(self, db: Database, sizes: Sizes, *, channels: int = 1, filtered: int = 0) -> None:
        self.client = make_client(db, sizes)
        self.headers: dict[str, str] | None = None
        for c in range(channels):
            name = f"{CHANNEL}{c}" if channels > 1 else CHANNEL
            # W8: the last ``filtered`` channels take a CEL filter each.
            expression = FILTERS[c % len(FILTERS)] if c >= channels - filtered else None
            self.client.ensure_channel(TOPIC, name, filter=expression)
        if filtered:
            self.headers = {"region": "eu", "tier": "gold"}
        self.client.publish(TOPIC, body(0))  # first use: schema check, topic id cached

    def one_by_one(self, bodies: list[bytes]) -> None:
        """W1a: ``publish``, one transaction per message."""
        for data in bodies:
            self.client.publish(TOPIC, data)

    def batch(self, bodies: list[bytes]) -> None:
        """W1b / W6 / W8: one ``publish_many``."""
        self.client.publish_many(TOPIC, bodies, headers=self.headers)

    def close(self) -> None:
        close_client(self.client)


# -- W2 / W4: draining ----------------------------------------------------------------


class GatedDrain:
    """One consumer (``subscribe``, ``max_in_flight``) draining pre-published messages,
    in timed slices.

    The handler passes a gate: while it is closed the consumer stalls (its
    workers wait, so it claims nothing more), which lets the floor run in
    between on a quiet machine. :meth:`advance` opens the gate until the
    consumer has handled ``target`` messages in all and returns the seconds
    that took. A slice may leave up to ``max_in_flight`` handlers past the
    gate and one claim or ack batch in flight when it closes; that work is
    counted in the next slice (at most one batch in 100 for slices of 1,000).
    """

    def __init__(
        self,
        db: Database,
        sizes: Sizes,
        n: int,
        *,
        topic: str = TOPIC,
        prefilled: bool = False,
        groups: int = 0,
    ) -> None:
        self.n = n
        self.topic = topic
        self.client = make_client(db, sizes)
        self.handled = 0
        self._counter = itertools.count(1)
        self._gate = threading.Event()
        self._open = False
        self._reached = threading.Event()
        self._target = 0
        self._at = 0.0
        # W7: a group FIFO channel, messages spread over ``groups`` groups.
        self.client.ensure_channel(topic, CHANNEL, ordering="group_fifo" if groups else None)
        if not prefilled:
            prefill(self.client, n, topic=topic, groups=groups)
        db.analyze()
        self.consumer = start_consumer(self.client, self._handle, sizes, topic=topic)

    def _handle(self, msg: novaque.Message) -> None:
        if not self._open:  # a plain flag: ten workers must not contend for a lock
            self._gate.wait()
        self.handled = next(self._counter)
        if self.handled >= self._target and not self._reached.is_set():
            self._at = time.perf_counter()
            self._reached.set()

    def advance(self, target: int, deadline: Deadline) -> float:
        """Let the consumer run until ``target`` messages are handled; the seconds taken."""
        self._target = min(target, self.n)
        self._reached.clear()
        started = time.perf_counter()
        if self.handled >= self._target:
            return 0.0
        self._open = True
        self._gate.set()
        reached = self._reached.wait(deadline.left())
        self._open = False
        self._gate.clear()
        return (self._at if reached else time.perf_counter()) - started

    def close(self) -> dict[str, Any]:
        """Stop the consumer (flushing its acks); what is left to check the run."""
        self._open = True
        self._gate.set()
        try:
            started = time.perf_counter()
            self.consumer.shutdown(timeout=10)
            shutdown_s = time.perf_counter() - started
            return {
                "shutdown_s": round(shutdown_s, 4),
                "left_after": _ready_left(self.client, self.topic),
                "consumer": consumer_kind(self.client),
            }
        finally:
            close_client(self.client)


def drain(
    db: Database, sizes: Sizes, deadline: Deadline, *, topic: str = TOPIC, prefilled: bool = False
) -> Run:
    """One process drains ``w2_messages`` in one go (for profiling)."""
    n = sizes.w2_messages
    gated = GatedDrain(db, sizes, n, topic=topic, prefilled=prefilled)
    try:
        seconds = gated.advance(n, deadline)
        done = min(gated.handled, n)
    finally:
        extra = gated.close()
    return Run(done, n, seconds, extra=extra)


def _ready_left(client: novaque.Client, topic: str) -> int:
    """Deliveries of ``topic`` still ready or leased (W4's dead and delayed rows excluded)."""
    d, c, t = schema.deliveries, schema.channels, schema.topics
    soon = time.time_ns() // 1000 + 86_400_000_000  # W4's delayed rows are 30 days out
    with client.engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(d)
                .join(c, c.c.id == d.c.channel_id)
                .join(t, t.c.id == c.c.topic_id)
                .where(t.c.name == topic, d.c.state != schema.STATE_DEAD, d.c.visible_at <= soon)
            ).scalar_one()
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
        prefill(client, n_msgs, topic=topic)
        d, m, t, c = schema.deliveries, schema.messages, schema.topics, schema.channels
        with client.engine.begin() as conn:
            topic_id = conn.execute(sa.select(t.c.id).where(t.c.name == topic)).scalar_one()
            channel_id = conn.execute(
                sa.select(c.c.id).where(c.c.topic_id == topic_id)
            ).scalar_one()
            msg_ids = [
                r[0] for r in conn.execute(sa.select(m.c.id).where(m.c.topic_id == topic_id))
            ]
            # prefill made one ready delivery per message: not part of the backlog.
            conn.execute(sa.delete(d).where(d.c.channel_id == channel_id))
            conn.exec_driver_sql("CREATE TABLE bench_seq (n INTEGER PRIMARY KEY)")
            conn.execute(
                sa.text("INSERT INTO bench_seq (n) VALUES (:n)"), [{"n": i} for i in range(per)]
            )
            conn.exec_driver_sql("CREATE TABLE bench_msg (k INTEGER PRIMARY KEY, id BIGINT)")
            conn.execute(
                sa.text("INSERT INTO bench_msg (k, id) VALUES (:k, :id)"),
                [{"k": k, "id": i} for k, i in enumerate(msg_ids)],
            )
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
        with client.engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE bench_seq")
            conn.exec_driver_sql("DROP TABLE bench_msg")
        if db.backend == "postgres":
            with client.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE")
        else:
            with client.engine.begin() as conn:
                conn.exec_driver_sql(
                    "ANALYZE TABLE novaque_deliveries" if db.backend == "mysql" else "ANALYZE"
                )
    finally:
        close_client(client)
    return time.perf_counter() - started


# -- W3: latency ----------------------------------------------------------------------


def latency(db: Database, sizes: Sizes, deadline: Deadline) -> Run:
    """W3: an idle consumer; ``w3_messages`` publishes ``w3_interval_s`` apart.

    The publisher is a second client (its own engine), so the consumer learns
    of each message as one in another process would: by NOTIFY on PostgreSQL,
    by polling elsewhere (a publish through the consumer's own client would
    wake it directly, in-process).
    """
    n = sizes.w3_messages
    client = make_client(db, sizes)
    publisher = make_client(db, sizes, start=False)
    latencies: list[float] = []
    lock = threading.Lock()
    try:
        client.ensure_channel(TOPIC, CHANNEL)
        publisher.publish(TOPIC, body(0))
        for msg in client.claim(TOPIC, CHANNEL, max_messages=10):  # warm: schema, channel id
            client.ack(msg)

        def handler(msg: novaque.Message) -> None:
            ms = age_ms(msg.body)
            with lock:
                latencies.append(ms)

        consumer = start_consumer(client, handler, sizes)
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
        consumer.shutdown(timeout=10)
        with lock:
            got = list(latencies)
        return Run(
            len(got), n, elapsed, latencies_ms=got, extra={"consumer": consumer_kind(client)}
        )
    finally:
        close_client(publisher)
        close_client(client)
