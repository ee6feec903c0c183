"""Figures of docs/how-to/pgbouncer.md, measured through PgBouncer.

    python tests/topologies/measure.py

reads ``NOVAQUE_TEST_POSTGRES_URL`` (the server) and
``NOVAQUE_TEST_PGBOUNCER_URL`` (PgBouncer in front of it; see pgbouncer.sh),
creates a scratch database, and prints:

- concurrent publishes (32 threads, 1,124 publishes in all) through PgBouncer
  with a plain ``novaque.connect(url)`` and with ``pgbouncer=True``: how many
  failed;
- the wake-up of an idle consumer in another process, publish to handler
  (median and 90th percentile of 40), through PgBouncer (it polls every
  ``poll_interval``) and straight to PostgreSQL (LISTEN);
- what that idle consumer costs: transactions a second on the server.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import statistics
import threading
import time
from typing import Any

import sqlalchemy as sa

import novaque

PUBLISHES = 1124
THREADS = 32
WAKE_UPS = 40


def scratch(server: str) -> tuple[str, sa.Engine]:
    """A new database on ``server``: its name, and an admin engine to drop it."""
    name = f"novaque_measure_{secrets.token_hex(4)}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    return name, admin


def on(url: str, database: str) -> str:
    return sa.make_url(url).set(database=database).render_as_string(hide_password=False)


def concurrent_publishes(url: str, pgbouncer: bool) -> tuple[int, float]:
    """Failures of :data:`PUBLISHES` publishes from :data:`THREADS` threads, and seconds."""
    client = novaque.connect(url, pgbouncer=pgbouncer, max_in_flight=THREADS)
    client.ensure_channel("load", "c")
    failures = 0
    lock = threading.Lock()
    counts = [PUBLISHES // THREADS + (n < PUBLISHES % THREADS) for n in range(THREADS)]
    go = threading.Event()

    def work(n: int) -> None:
        nonlocal failures
        go.wait()
        for i in range(counts[n]):
            try:
                client.publish("load", f"{n}-{i}")
            except Exception:
                with lock:
                    failures += 1

    threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    go.set()
    for thread in threads:
        thread.join()
    took = time.monotonic() - began
    client.shutdown()
    return failures, took


def _consume(url: str, pgbouncer: bool, topic: str, out: Any, ready: Any) -> None:
    """The idle consumer's process: the latency of each message it handles."""
    client = novaque.connect(url, pgbouncer=pgbouncer)

    def handler(msg: novaque.Message) -> None:
        out.put(time.time() - float(msg.body))

    consumer = client.subscribe_and_start(topic, "c", handler)
    time.sleep(1.0)  # LISTEN connected, the first empty claims done
    ready.set()
    while True:
        time.sleep(3600)
    consumer.shutdown()


def wake_ups(url: str, pgbouncer: bool, admin_url: str) -> tuple[float, float, float]:
    """Median and p90 wake-up (ms) of an idle consumer in another process, and
    the server's transactions a second on the database while it idles."""
    topic = f"wake{int(pgbouncer)}"
    producer = novaque.connect(url, pgbouncer=pgbouncer)
    producer.ensure_channel(topic, "c")
    context = multiprocessing.get_context("spawn")
    out, ready = context.Queue(), context.Event()
    process = context.Process(target=_consume, args=(url, pgbouncer, topic, out, ready))
    process.start()
    try:
        assert ready.wait(60), "the consumer did not start"
        time.sleep(12)  # what the servers still count of earlier work is flushed (10 s)
        database = sa.make_url(url).database
        with sa.create_engine(admin_url, poolclass=sa.NullPool).connect() as conn:

            def commits() -> int:
                return int(
                    conn.exec_driver_sql(
                        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                        f"WHERE datname = '{database}'"
                    ).scalar_one()
                )

            conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            before = commits()
            time.sleep(10)
            conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            idle_rate = (commits() - before) / 10
        latencies = []
        for _ in range(WAKE_UPS):
            time.sleep(0.3 + 0.3 * (secrets.randbelow(1000) / 1000))
            producer.publish(topic, repr(time.time()))
            latencies.append(out.get(timeout=30) * 1000)
        latencies.sort()
        return statistics.median(latencies), latencies[int(0.9 * len(latencies))], idle_rate
    finally:
        process.kill()
        process.join()
        producer.shutdown()


def main() -> None:
    server = os.environ["NOVAQUE_TEST_POSTGRES_URL"]
    bouncer = os.environ["NOVAQUE_TEST_PGBOUNCER_URL"]
    name, admin = scratch(server)
    try:
        novaque.connect(on(server, name)).migrate()
        for pgbouncer in (False, True):
            failures, took = concurrent_publishes(on(bouncer, name), pgbouncer)
            print(
                f"through PgBouncer, pgbouncer={pgbouncer}: {failures} of {PUBLISHES} "
                f"concurrent publishes failed ({THREADS} threads, {took:.1f} s)"
            )
        for url, pgbouncer, what in (
            (on(bouncer, name), True, "through PgBouncer (polling)"),
            (on(server, name), False, "straight to PostgreSQL (LISTEN)"),
        ):
            median, p90, idle = wake_ups(url, pgbouncer, on(server, name))
            print(
                f"idle consumer in another process, {what}: wake-up median {median:.1f} ms, "
                f"p90 {p90:.1f} ms; {idle:.1f} transactions a second while idle"
            )
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


if __name__ == "__main__":
    main()
