"""What an idle client costs its database: statements a second while nothing is published.

    python -m benchmarks.idle [--backend mysql|sqlite|all] [--clients sync,aio]
                              [--settle 3] [--seconds 10]

One client (``novaque.connect``, or ``novaque.aio.connect`` for the twin) is
started (its maintenance runs) with one consumer waiting on an empty channel.
After ``--settle`` seconds, everything the client sends during ``--seconds``
is counted:

- MySQL/MariaDB: the commands of every connection of the client, counted on
  the wire by a relay in front of the server (:mod:`benchmarks._wire`), and
  among them those of the change watcher's connection; next to it the
  server's ``Questions`` status over the same window (every session of the
  server: on a shared server, others' statements too);
- SQLite: the statements every connection of the process runs (``sqlite3``'s
  trace callback), in-process reads of the file, no server.

The server comes from ``NOVAQUE_BENCH_MYSQL_URL`` (default the local one); a
private database is created there and dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import novaque
import novaque.aio
from benchmarks._databases import Database
from benchmarks._wire import CommandCounter

TOPIC, CHANNEL = "idle", "c"


class Traced:
    """Statements run by every SQLite connection opened from now on, by connection."""

    def __init__(self) -> None:
        self.by_connection: list[list[str]] = []
        self._lock = threading.Lock()
        sa.event.listen(sa.engine.Engine, "connect", self._connected)

    def _connected(self, dbapi_conn: Any, _record: Any) -> None:
        if not isinstance(dbapi_conn, sqlite3.Connection):
            return
        seen: list[str] = []
        with self._lock:
            self.by_connection.append(seen)
        dbapi_conn.set_trace_callback(seen.append)

    def counts(self) -> tuple[int, int]:
        """Every statement so far, and those of the change watcher's connection
        (the one that reads ``PRAGMA data_version``)."""
        with self._lock:
            runs = [list(seen) for seen in self.by_connection]
        watchers = [seen for seen in runs if "PRAGMA data_version" in seen]
        return sum(len(seen) for seen in runs), sum(len(seen) for seen in watchers)

    def close(self) -> None:
        sa.event.remove(sa.engine.Engine, "connect", self._connected)


def declare(url: str) -> None:
    client = novaque.connect(url)
    try:
        client.ensure_channel(TOPIC, CHANNEL)
    finally:
        client.shutdown()


def questions(server: sa.Engine) -> int:
    with server.connect() as conn:
        row = conn.exec_driver_sql("SHOW GLOBAL STATUS LIKE 'Questions'").one()
    return int(row[1])


def _window(
    seconds: float,
    counts: Callable[[], tuple[int, int]],
    server: sa.Engine | None,
) -> dict[str, float]:
    """Per second over ``seconds``: everything the client sent, the watcher's
    part, and the server's ``Questions`` (all sessions)."""
    q0 = questions(server) if server is not None else 0
    total0, watcher0 = counts()
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    total1, watcher1 = counts()
    q1 = questions(server) if server is not None else 0
    return {
        "seconds": elapsed,
        "sent": (total1 - total0) / elapsed,
        "watcher": (watcher1 - watcher0) / elapsed,
        "questions": (q1 - q0) / elapsed if server is not None else float("nan"),
    }


def _run_client(
    twin: str, url: str, settle: float, measure: Callable[[], dict[str, float]]
) -> dict[str, float]:
    """Start a client of ``twin`` on ``url`` with one waiting consumer, wait
    ``settle`` seconds, then ``measure``."""

    def handler(msg: novaque.Message) -> None:
        pass

    if twin == "sync":
        client = novaque.connect(url)
        try:
            client.start()
            client.subscribe_and_start(TOPIC, CHANNEL, handler)
            time.sleep(settle)
            return measure()
        finally:
            client.shutdown()

    async def main() -> dict[str, float]:
        async def ahandler(msg: novaque.Message) -> None:
            pass

        # No driver named: novaque.aio picks its asyncio one (asyncmy, aiosqlite).
        bare = sa.make_url(url)
        aclient = novaque.aio.connect(bare.set(drivername=bare.get_backend_name()))
        try:
            await aclient.start()
            await aclient.subscribe_and_start(TOPIC, CHANNEL, ahandler)
            await asyncio.sleep(settle)
            return await asyncio.to_thread(measure)
        finally:
            await aclient.shutdown()

    return asyncio.run(main())


def measure_mysql(twins: list[str], settle: float, seconds: float) -> list[dict[str, Any]]:
    rows = []
    db = Database("mysql")
    try:
        db.migrate()
        declare(db.url)
        target = sa.make_url(db.url)
        server = sa.create_engine(target, poolclass=sa.NullPool)
        try:
            for twin in twins:
                with CommandCounter(target.host or "127.0.0.1", target.port or 3306) as relay:
                    url = target.set(host="127.0.0.1", port=relay.port)

                    def counts(relay: CommandCounter = relay) -> tuple[int, int]:
                        links = list(relay.links)
                        watcher = sum(
                            link.commands for link in links if "MAX(id)" in link.last_query
                        )
                        return relay.commands(), watcher

                    def measure(counts: Callable[[], tuple[int, int]] = counts) -> dict[str, float]:
                        return _window(seconds, counts, server)

                    figures = _run_client(
                        twin, url.render_as_string(hide_password=False), settle, measure
                    )
                rows.append({"backend": "mysql", "client": twin, **figures})
        finally:
            server.dispose()
    finally:
        db.drop()
    return rows


def measure_sqlite(twins: list[str], settle: float, seconds: float) -> list[dict[str, Any]]:
    rows = []
    for twin in twins:
        db = Database("sqlite")
        try:
            db.migrate()
            declare(db.url)
            traced = Traced()
            try:

                def measure(traced: Traced = traced) -> dict[str, float]:
                    return _window(seconds, traced.counts, None)

                figures = _run_client(twin, db.url, settle, measure)
            finally:
                traced.close()
            rows.append({"backend": "sqlite", "client": twin, **figures})
        finally:
            db.drop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="mysql", choices=["mysql", "sqlite", "all"])
    parser.add_argument("--clients", default="sync,aio")
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    twins = [t for t in args.clients.split(",") if t]
    if not set(twins) <= {"sync", "aio"}:
        parser.error("--clients takes sync, aio or both")
    rows: list[dict[str, Any]] = []
    if args.backend in ("mysql", "all"):
        rows += measure_mysql(twins, args.settle, args.seconds)
    if args.backend in ("sqlite", "all"):
        rows += measure_sqlite(twins, args.settle, args.seconds)
    print("| backend | client | window s | sent/s | watcher's/s | server Questions/s |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['backend']} | {row['client']} | {row['seconds']:.1f} | "
            f"{row['sent']:.1f} | {row['watcher']:.1f} | {row['questions']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
