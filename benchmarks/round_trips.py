"""Count the database round trips of claim + ack, per message, on each backend.

    python -m benchmarks.round_trips [sqlite|postgres|mysql ...]

Counts what the driver sends: every statement SQLAlchemy executes, every
COMMIT, and on PostgreSQL the BEGIN psycopg sends before a transaction's first
statement. URLs come from NOVAQUE_BENCH_POSTGRES_URL / NOVAQUE_BENCH_MYSQL_URL
(default: the local servers); each run uses a private database it drops.
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

import novaque

SERVERS = {
    "postgres": os.environ.get(
        "NOVAQUE_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1/postgres"
    ),
    "mysql": os.environ.get("NOVAQUE_BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1/test"),
}


@contextmanager
def database(backend: str) -> Iterator[str]:
    """A private, empty database of ``backend``; dropped afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/bench.db"
        return
    name = f"novaque_bench_{secrets.token_hex(4)}"
    server = sa.make_url(SERVERS[backend])
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    quote = '"' if backend == "postgres" else "`"
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {quote}{name}{quote}")
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE {quote}{name}{quote}")
        admin.dispose()


class TripCounter:
    """Round trips as the drivers send them.

    Every statement; COMMIT and ROLLBACK unless the connection is in
    autocommit (novaque runs one-statement work that way on PostgreSQL);
    psycopg's BEGIN. On MySQL the ROLLBACKs are counted in PyMySQL itself,
    since the pool may send one when a connection comes back.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        self.name = engine.dialect.name
        sa.event.listen(engine, "before_cursor_execute", self._one)
        sa.event.listen(engine, "commit", self._end)
        sa.event.listen(engine, "begin", self._begin)
        if self.name == "mysql":
            import pymysql.connections

            real = pymysql.connections.Connection.rollback

            def rollback(conn: Any) -> None:
                self.count += 1
                real(conn)

            pymysql.connections.Connection.rollback = rollback  # type: ignore[method-assign]
        else:
            sa.event.listen(engine, "rollback", self._end)

    def _one(self, *args: Any) -> None:
        self.count += 1

    def _end(self, conn: sa.Connection) -> None:
        if not _autocommit(conn):
            self.count += 1

    def _begin(self, conn: sa.Connection) -> None:
        if self.name == "postgresql" and not _autocommit(conn):
            self.count += 1


def _autocommit(conn: sa.Connection) -> bool:
    return conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"


def measure(backend: str, batch: int, rounds: int = 20) -> float:
    with database(backend) as url:
        client = novaque.connect(url)
        client.migrate()
        client.ensure_channel("rt", "c")
        client.publish_many("rt", [b"x" * 200] * (batch * rounds + 1))
        client.ack_many(client.claim("rt", "c"))  # warm caches (schema check, channel id)
        counter = TripCounter(client.own_engine)
        handled = 0
        for _ in range(rounds):
            msgs = client.claim("rt", "c", max_messages=batch)
            client.ack_many(msgs)
            handled += len(msgs)
        trips = counter.count / handled
        client.shutdown()  # its counters flushed while the database still exists
        return trips


def main(argv: list[str]) -> int:
    backends = argv or ["sqlite", "postgres", "mysql"]
    print(f"{'backend':10} {'batch':>5} {'round trips/msg':>16}")
    for backend in backends:
        for batch in (1, 10, 100):
            print(f"{backend:10} {batch:5} {measure(backend, batch):16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
