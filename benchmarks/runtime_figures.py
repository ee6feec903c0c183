"""Consumer runtime figures: drain rate and publish -> handler-start latency.

    python benchmarks/runtime_figures.py [--backends sqlite,postgres,mysql]
        [--messages 20000] [--runs 3]

Server URLs come from ``NOVAQUE_TEST_POSTGRES_URL`` / ``NOVAQUE_TEST_MYSQL_URL``
(as for the tests); a private database is created on each server for the run
and dropped at the end. SQLite is a WAL file in a temporary folder.

Figures (handler does nothing, body 200 bytes):

- **drain**: one process drains N pre-published messages with
  ``subscribe(max_in_flight=10)``; messages/s from ``consumer.start()`` to the
  last ack (median of ``--runs``), as W2 of docs BENCHMARKS.md.
- **latency**: an idle consumer (default ``poll_interval`` 200 ms) and a
  producer on a *second client with its own engine* in the same process, so
  the in-process wake-up does not apply: PostgreSQL wakes the consumer with
  NOTIFY, the others poll. Latency is from just before ``publish()`` to the
  start of the handler. Two rhythms: 300 messages one every 10 ms (W3), and
  40 messages one every 250 ms (the consumer has backed off to its full poll
  interval before each one). The time of the ``publish()`` call itself (its
  commit included) is shown beside: the handler cannot start before the
  commit.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

import novaque

ENV = {"postgres": "NOVAQUE_TEST_POSTGRES_URL", "mysql": "NOVAQUE_TEST_MYSQL_URL"}
BODY = b"x" * 200


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextmanager
def database(backend: str) -> Iterator[str]:
    """A fresh database URL for ``backend``, removed afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{Path(folder) / 'figures.db'}"
        return
    server = os.environ.get(ENV[backend])
    if not server:
        raise SystemExit(f"set {ENV[backend]} to measure {backend}")
    name = f"novaque_fig_{secrets.token_hex(4)}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    quote = '"' if backend == "postgres" else "`"
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {quote}{name}{quote}")
    try:
        yield sa.make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            force = " WITH (FORCE)" if backend == "postgres" else ""
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}")
        admin.dispose()


def drain_rate(url: str, count: int) -> float:
    client = novaque.connect(url, max_in_flight=10)
    try:
        topic = f"drain{secrets.token_hex(3)}"
        consumer = client.subscribe(topic, "c", lambda msg: None, max_in_flight=10)
        for start in range(0, count, 500):
            client.publish_many(topic, [BODY] * min(500, count - start))
        began = time.perf_counter()
        consumer.start()
        if not consumer._signals.wait("acked", count, timeout=600):
            raise RuntimeError("drain did not finish within 10 minutes")
        took = time.perf_counter() - began
        consumer.shutdown()
        return count / took
    finally:
        client.shutdown()


def latencies(url: str, count: int, every: float) -> tuple[list[float], list[float]]:
    """Milliseconds from publish() to handler start, and of publish() itself."""
    consumer_side = novaque.connect(url)
    producer_side = novaque.connect(url)  # its own engine: no in-process wake-up
    seen: list[float] = []
    lock = threading.Lock()
    done = threading.Event()

    def handler(msg: novaque.Message) -> None:
        started = time.perf_counter_ns()
        with lock:
            seen.append((started - int(msg.headers["t0"])) / 1e6)
            if len(seen) == count:
                done.set()

    try:
        topic = f"lat{secrets.token_hex(3)}"
        consumer = consumer_side.subscribe_and_start(topic, "c", handler)
        producer_side.publish(topic, BODY, headers={"t0": str(time.perf_counter_ns())})
        time.sleep(1.0)  # warm-up: connections open, listener up, consumer idle
        with lock:
            seen.clear()
        nxt = time.perf_counter()
        calls: list[float] = []
        for _ in range(count):
            t0 = time.perf_counter_ns()
            producer_side.publish(topic, BODY, headers={"t0": str(t0)})
            calls.append((time.perf_counter_ns() - t0) / 1e6)
            nxt += every
            time.sleep(max(0.0, nxt - time.perf_counter()))
        if not done.wait(timeout=60):
            raise RuntimeError("not every message reached the handler within 60 s")
        consumer.shutdown()
        return seen, calls
    finally:
        consumer_side.shutdown()
        producer_side.shutdown()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = ",".join(["sqlite", *(b for b, v in ENV.items() if os.environ.get(v))])
    parser.add_argument("--backends", default=default)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]

    rows: list[tuple[str, ...]] = []
    for backend in backends:
        with database(backend) as url:
            setup = novaque.connect(url)
            setup.migrate()
            version = setup.engine.dialect.server_version_info
            setup.shutdown()
            runs = []
            for run in range(args.runs):
                say(f"{backend}: drain {args.messages} messages, run {run + 1}/{args.runs}")
                runs.append(drain_rate(url, args.messages))
            rate = statistics.median(runs)
            runs_text = " / ".join(f"{r:,.0f}" for r in runs)
            rows.append(
                (backend, "drain, max_in_flight=10", f"{rate:,.0f} msg/s", f"runs: {runs_text}")
            )
            wake = "NOTIFY" if backend == "postgres" else "poll"
            measure: list[tuple[int, float, str]] = [
                (300, 0.010, "every 10 ms"),
                (40, 0.250, "every 250 ms"),
            ]
            for count, every, rhythm in measure:
                say(f"{backend}: latency, {count} messages {rhythm}")
                lat, calls = latencies(url, count, every)
                rows.append(
                    (
                        backend,
                        f"latency ({wake}), {count} msgs {rhythm}",
                        f"p50 {pct(lat, 50):.1f} ms",
                        f"p95 {pct(lat, 95):.1f} ms, p99 {pct(lat, 99):.1f} ms, "
                        f"max {max(lat):.1f} ms (publish() itself: p50 {pct(calls, 50):.1f} ms)",
                    )
                )
            say(f"{backend}: server version {version}")

    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print(f"novaque runtime figures (python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


if __name__ == "__main__":
    main()
