"""Cost of the operator's reads on a channel holding 1,000,000 deliveries (PostgreSQL).

Usage::

    python benchmarks/operate_figures.py [--url postgresql+psycopg://postgres@127.0.0.1/postgres]
                                         [--rows 1000000] [--keep]

Creates a scratch database on the server, migrates it, bulk-loads the rows
with ``INSERT ... SELECT generate_series`` (a mix of ready, delayed, in-flight
and dead deliveries on one channel, plus a second busy channel so the channel
filter matters), runs ``VACUUM ANALYZE``, then times ``channel_backlog``,
``topic_backlog`` and ``list_dead`` through the client (median of several
runs, each including the channel lookup round trip) and prints
``EXPLAIN (ANALYZE, BUFFERS)`` of the statements behind them. The database is
dropped at the end unless ``--keep``.

The URL defaults to ``NOVAQUE_BENCH_POSTGRES_URL``, then
``NOVAQUE_TEST_POSTGRES_URL``, then the local server.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import novaque
from novaque import _operator_calls
from novaque._time import US
from novaque.schema import DEAD_VISIBLE_AT, STATE_DEAD, STATE_LEASED, STATE_READY

RUNS = 9
BODY_BYTES = 200


def median_ms(fn: Callable[[], object], runs: int = RUNS) -> tuple[float, float, float]:
    """(median, min, max) wall time in ms of ``fn`` after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), min(times), max(times)


def load(conn: sa.Connection, topic_id: int, channel_id: int, rows: int, now: int) -> None:
    """``rows`` messages, each with one delivery on ``channel_id``, state by id % 20.

    0-9 ready (50 %), 10-14 delayed by an hour (25 %), 15 leased (5 %),
    16-19 dead (20 %, with a last error and died_at spread over a day).
    """
    conn.exec_driver_sql(
        f"""
        INSERT INTO novaque_messages
            (topic_id, body, headers, published_at, expires_at, max_attempts)
        SELECT {topic_id}, convert_to(repeat('x', {BODY_BYTES}), 'UTF8'), NULL,
               {now} - ({rows} - g)::bigint * 1000, {now + 7 * 86400 * US}, 5
        FROM generate_series(1, {rows}) AS g
        """
    )
    conn.exec_driver_sql(
        f"""
        INSERT INTO novaque_deliveries
            (message_id, channel_id, state, visible_at, attempts, max_attempts,
             lease_token, last_error, dead_reason, died_at)
        SELECT id, {channel_id},
               CASE WHEN mod(id, 20) < 15 THEN {STATE_READY}
                    WHEN mod(id, 20) = 15 THEN {STATE_LEASED} ELSE {STATE_DEAD} END,
               CASE WHEN mod(id, 20) < 10 THEN published_at
                    WHEN mod(id, 20) < 15 THEN {now + 3600 * US}
                    WHEN mod(id, 20) = 15 THEN {now + 30 * US}
                    ELSE {DEAD_VISIBLE_AT} END,
               CASE WHEN mod(id, 20) < 15 THEN 0 ELSE 5 END,
               5,
               CASE WHEN mod(id, 20) = 15 THEN md5(id::text) END,
               CASE WHEN mod(id, 20) > 15 THEN 'RuntimeError: handler failed on ' || id END,
               CASE WHEN mod(id, 20) > 15 THEN 'max_attempts' END,
               CASE WHEN mod(id, 20) > 15 THEN {now} - mod(id * 7919, 86400) * {US}::bigint END
        FROM novaque_messages
        WHERE topic_id = {topic_id}
        """
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url",
        default=os.environ.get("NOVAQUE_BENCH_POSTGRES_URL")
        or os.environ.get("NOVAQUE_TEST_POSTGRES_URL")
        or "postgresql+psycopg://postgres@127.0.0.1/postgres",
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()

    server = sa.make_url(args.url)
    if server.get_backend_name() != "postgresql":
        parser.error("this figure is measured on PostgreSQL")
    db = f"novaque_operate_bench_{secrets.token_hex(4)}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{db}"')
    client = novaque.connect(server.set(database=db))
    try:
        return run(client, args.rows)
    finally:
        client.engine.dispose()
        if not args.keep:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.dispose()


def run(client: novaque.Client, rows: int) -> int:
    client.migrate()
    client.ensure_channel("bench", "big")
    client.ensure_channel("noise", "busy")  # another channel's rows in the same table
    now = time.time_ns() // 1000
    with client.engine.begin() as conn:
        version = conn.exec_driver_sql("SHOW server_version").scalar_one()
        ids = dict(
            conn.exec_driver_sql(
                "SELECT t.name, c.id FROM novaque_channels c "
                "JOIN novaque_topics t ON t.id = c.topic_id"
            ).all()
        )
        topic_ids = dict(conn.exec_driver_sql("SELECT name, id FROM novaque_topics").all())
    big, busy = int(ids["bench"]), int(ids["noise"])

    started = time.perf_counter()
    with client.engine.begin() as conn:
        load(conn, int(topic_ids["bench"]), big, rows, now)
        load(conn, int(topic_ids["noise"]), busy, rows // 5, now)
    loaded = time.perf_counter() - started
    with client.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE novaque_messages")
        conn.exec_driver_sql("VACUUM ANALYZE novaque_deliveries")
        size = conn.exec_driver_sql(
            "SELECT pg_size_pretty(pg_total_relation_size('novaque_deliveries'))"
        ).scalar_one()

    backlog = client.channel_backlog("bench", "big")
    dead = client.list_dead("bench", "big", limit=1)
    middle = dead[0].delivery_id + rows // 2  # halfway through the channel's dead ids
    print(f"novaque operate figures — PostgreSQL {version}, Python {platform.python_version()}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(
        f"loaded {rows:,} + {rows // 5:,} deliveries (+ messages, {BODY_BYTES}-byte bodies) "
        f"in {loaded:.1f} s; novaque_deliveries with indexes: {size}"
    )
    print(f"channel 'bench/big': {backlog}")
    print()
    figures: list[tuple[str, Callable[[], Any]]] = [
        ("channel_backlog(big)", lambda: client.channel_backlog("bench", "big")),
        ("topic_backlog(bench)", lambda: client.topic_backlog("bench")),
        ("list_dead(big) first page of 100", lambda: client.list_dead("bench", "big")),
        (
            "list_dead(big) page of 100 at the middle",
            lambda: client.list_dead("bench", "big", after_id=middle),
        ),
        (
            "list_dead(big, with_body) first 100",
            lambda: client.list_dead("bench", "big", with_body=True),
        ),
        (
            "claim(big) 10 + ack_many (hot path)",
            lambda: client.ack_many(client.claim("bench", "big", max_messages=10)),
        ),
        ("channel_backlog(busy) (200k rows)", lambda: client.channel_backlog("noise", "busy")),
        ("list_messages(bench) first page of 100", lambda: client.list_messages("bench")),
        (
            "list_messages(bench) page of 100 at the middle",
            lambda: client.list_messages("bench", after_id=rows // 2),
        ),
        ("get_message(id)", lambda: client.get_message(rows // 2)),
    ]
    print(f"{'call':<44} {'median ms':>10} {'min':>8} {'max':>8}   ({RUNS} runs)")
    for label, fn in figures:
        med, low, high = median_ms(fn)
        print(f"{label:<44} {med:>10.2f} {low:>8.2f} {high:>8.2f}")
    print()

    now = time.time_ns() // 1000
    plans: list[tuple[str, sa.ClauseElement, dict[str, Any]]] = [
        ("channel_backlog", _operator_calls.BACKLOG, {"p_channel": big, "p_now": now}),
        (
            "list_dead first page",
            _operator_calls.DEAD_PAGE,
            {"p_channel": big, "p_after": 0, "p_limit": 100},
        ),
        (
            "list_dead middle page",
            _operator_calls.DEAD_PAGE,
            {"p_channel": big, "p_after": middle, "p_limit": 100},
        ),
        (
            "claim 10 (rolled back)",
            client.claim_statement(),
            {
                "p_channel": big,
                "p_now": now,
                "p_limit": 10,
                "p_until": now + 30 * US,
                "p_token": "0" * 32,
            },
        ),
    ]
    print("EXPLAIN ANALYZE clocks every row, so its times run above the medians above.")
    print()
    for label, stmt, params in plans:
        # EXPLAIN ANALYZE of the claim really leases rows: explain() rolls back.
        plan = client.explain(stmt, params, analyze=True)
        print(f"--- EXPLAIN (ANALYZE, BUFFERS) {label}")
        print(plan)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
