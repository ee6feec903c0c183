"""Consumers on the nodes of a MariaDB Galera Cluster, against a lone server.

    tests/topologies/galera.sh start        # prints the three URLs
    tests/topologies/galera.sh lone start   # prints the lone server's URL
    python -m benchmarks.galera --urls URL1,URL2,URL3 [--lone URL] \
        [--messages 3000] [--runs 3] [--max-in-flight 10] [--no-spread]

Each scenario publishes ``--messages`` messages (200 bytes, batches of 500,
through the first URL), then drains them with one consumer process per URL it
names (``subscribe(max_in_flight=...)``, a handler that does nothing), started
together. It reports the drain's messages/s in all and per process, and how
often a claim transaction (an ack-and-claim, or a claim) met a deadlock, which
is how Galera reports a certification conflict (1213): as a share of the claim
transactions tried, and how many claims failed after the executor's retries
ran out (the consumer then logged an error and waited). Medians of ``--runs``.

Scenarios: the cluster with one consumer per node; the cluster with all three
consumers on the first node; the lone server with one consumer, and with three.
A private database is created for each scenario and dropped after it.
``--no-spread`` makes the cluster's clients claim as a lone server's do (the
oldest due first, without slices: the claim before the spread) for the
figures before and after it.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import secrets
import statistics
import sys
import time
from collections import Counter
from typing import Any

import sqlalchemy as sa

import novaque
from novaque.dialects import mysql as mysql_dialect
from novaque.schema import deliveries

TOPIC, CHANNEL = "bench", "work"
BODY = b"x" * 200
CLAIMS = ("claim", "ack_and_claim")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _count_claims(counts: Counter[str]) -> None:
    """Count, in this process, the claim transactions tried and the driver
    errors they met (by MySQL error code)."""
    cls = mysql_dialect.MySQLDialect
    for name in CLAIMS:
        original = getattr(cls, name)

        def counted(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            counts["claims"] += 1
            try:
                return _original(self, *args, **kwargs)
            except Exception as exc:  # the driver's own on the driver path
                orig = getattr(exc, "orig", exc)
                code = orig.args[0] if orig.args else type(orig).__name__
                counts[f"error {code}"] += 1
                raise

        setattr(cls, name, counted)


class _Levels(logging.Handler):
    def __init__(self, counts: Counter[str]) -> None:
        super().__init__()
        self.counts = counts

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[f"log {record.levelname}"] += 1
        if record.levelno >= logging.ERROR:
            self.counts[f"text {record.getMessage()[:120]}"] += 1


def _consume(url: str, max_in_flight: int, spread: bool, go: Any, stop: Any, out: Any) -> None:
    counts: Counter[str] = Counter()
    _count_claims(counts)
    if not spread:
        mysql_dialect.MySQLDialect.learn_server = lambda self, conn: None  # type: ignore[method-assign]
    logging.getLogger("novaque").addHandler(_Levels(counts))
    handled = 0

    def handler(msg: novaque.Message) -> None:
        nonlocal handled
        handled += 1

    client = novaque.connect(url, max_in_flight=max_in_flight, poll_interval=0.05)
    try:
        consumer = client.subscribe(TOPIC, CHANNEL, handler)
        client.list_topics()  # connected before the start
        go.wait()
        consumer.start()
        stop.wait()
        client.shutdown(timeout=10)
    finally:
        counts["handled"] = handled
        out.put(dict(counts))


def _left(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(deliveries)).scalar_one())


def drain(urls: list[str], messages: int, max_in_flight: int, spread: bool) -> dict[str, Any]:
    """One run: a private database, ``messages`` published, drained by one
    consumer process per URL (same server or nodes of one cluster)."""
    name = f"novaque_galera_{secrets.token_hex(4)}"
    admin = sa.create_engine(urls[0], isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}`")
    db_urls = [
        sa.make_url(u).set(database=name).render_as_string(hide_password=False) for u in urls
    ]
    try:
        client = novaque.connect(db_urls[0])
        client.migrate()
        client.ensure_channel(TOPIC, CHANNEL)
        for start in range(0, messages, 500):
            client.publish_many(TOPIC, [BODY] * min(500, messages - start))
        ctx = multiprocessing.get_context("spawn")
        go, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=_consume, args=(u, max_in_flight, spread, go, stop, out))
            for u in db_urls
        ]
        for proc in procs:
            proc.start()
        time.sleep(3)  # the children import and connect
        began = time.monotonic()
        go.set()
        while _left(client.engine):
            time.sleep(0.02)
        elapsed = time.monotonic() - began
        stop.set()
        results = [out.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(60)
        client.shutdown()
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()
    total: Counter[str] = Counter()
    for found in results:
        total.update(found)
    return {
        "rate": messages / elapsed,
        "per_process": sorted(r.get("handled", 0) / elapsed for r in results),
        "deadlock_share": total["error 1213"] / max(1, total["claims"]),
        "claims": total["claims"],
        "deadlocks": total["error 1213"],
        "other": {k: v for k, v in total.items() if k.startswith(("error", "log", "text"))},
        "claim_failures": total["log ERROR"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--urls", required=True, help="the cluster's node URLs, comma-separated")
    parser.add_argument("--lone", help="a lone server's URL, for the baseline")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-in-flight", type=int, default=10)
    parser.add_argument("--only", help="run only the scenarios whose name contains this")
    parser.add_argument("--no-spread", action="store_true", help="claims without slices")
    args = parser.parse_args()
    nodes = args.urls.split(",")
    scenarios = {
        "cluster, one consumer per node": nodes,
        "cluster, three consumers on node 1": [nodes[0]] * 3,
    }
    if args.lone:
        scenarios["lone server, one consumer"] = [args.lone]
        scenarios["lone server, three consumers"] = [args.lone] * 3
    for title, urls in scenarios.items():
        if args.only and args.only not in title:
            continue
        runs = []
        for n in range(args.runs):
            found = drain(urls, args.messages, args.max_in_flight, not args.no_spread)
            say(f"  {title} run {n + 1}: {found}")
            runs.append(found)
        rate = statistics.median(r["rate"] for r in runs)
        per = [statistics.median(r["per_process"][i] for r in runs) for i in range(len(urls))]
        share = statistics.median(r["deadlock_share"] for r in runs)
        failures = statistics.median(r["claim_failures"] for r in runs)
        print(
            f"{title}: {rate:,.0f} msg/s (per process {', '.join(f'{p:,.0f}' for p in per)}); "
            f"deadlocks {share:.1%} of claim transactions; "
            f"ERROR lines {failures:g} per run",
            flush=True,
        )


if __name__ == "__main__":
    main()
