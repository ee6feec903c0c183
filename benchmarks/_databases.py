"""A private database per backend for one benchmark run, created and dropped here.

PostgreSQL and MySQL/MariaDB get a fresh database on the server named by
``NOVAQUE_BENCH_POSTGRES_URL`` / ``NOVAQUE_BENCH_MYSQL_URL`` (defaults: the
local servers); SQLite gets a WAL file in a temporary directory. Between runs
every table is emptied, so each run starts from the same state.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sqlite3
import tempfile
import time
from typing import Any

import sqlalchemy as sa

import novaque
from novaque import schema

BACKENDS = ("sqlite", "postgres", "mysql")
DEFAULT_URLS = {
    "postgres": "postgresql+psycopg://postgres@127.0.0.1/postgres",
    "mysql": "mysql+pymysql://root@127.0.0.1/test",
}
ENV = {"postgres": "NOVAQUE_BENCH_POSTGRES_URL", "mysql": "NOVAQUE_BENCH_MYSQL_URL"}

FLOOR_TABLE = "bench_floor_queue"


class Database:
    """One backend's private database for the length of a benchmark run."""

    def __init__(self, backend: str, url: str | None = None) -> None:
        """Create a private database for ``backend``, or attach to ``url`` if given."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
        self.backend = backend
        self._tmpdir: str | None = None
        self._admin: sa.Engine | None = None
        self._name = f"novaque_bench_{secrets.token_hex(4)}"
        if url is not None:  # another process's database: use it, never drop it
            self.url = url
            self._owned = False
            return
        self._owned = True
        if backend == "sqlite":
            self._tmpdir = tempfile.mkdtemp(prefix="novaque-bench-")
            self.url = f"sqlite:///{os.path.join(self._tmpdir, 'bench.db')}"
            return
        server = sa.make_url(os.environ.get(ENV[backend]) or DEFAULT_URLS[backend])
        self._admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        quote = '"' if backend == "postgres" else "`"
        for attempt in range(10):
            try:
                with self._admin.connect() as conn:
                    conn.exec_driver_sql(f"CREATE DATABASE {quote}{self._name}{quote}")
                break
            except sa.exc.OperationalError:
                # PostgreSQL refuses while another session (a test run next door
                # creating its own database) uses template1: wait and try again.
                if attempt == 9:
                    raise
                time.sleep(0.5 + attempt * 0.5)
        self.url = server.set(database=self._name).render_as_string(hide_password=False)

    @property
    def label(self) -> str:
        return self.backend

    def migrate(self) -> str:
        """Apply novaque's migrations; return the server's name and version."""
        client = novaque.connect(self.url)
        try:
            client.migrate()
            with client.engine.connect() as conn:
                if self.backend == "sqlite":
                    return f"SQLite {sqlite3.sqlite_version}"
                version = str(conn.exec_driver_sql("SELECT version()").scalar_one())
        finally:
            _close(client)
        return (
            version.split(" on ")[0] if self.backend == "postgres" else f"MariaDB/MySQL {version}"
        )

    def reset(self, *, floor_only: bool = False) -> None:
        """Empty novaque's tables and the floor's table (only the floor's if
        asked). A process still at work on them (a broker's maintenance) may
        deadlock with the TRUNCATE: the server picks one, and the reset is
        tried again."""
        for attempt in range(5):
            try:
                self._reset(floor_only)
                return
            except sa.exc.OperationalError:
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def _reset(self, floor_only: bool) -> None:
        tables = [] if floor_only else [t.name for t in reversed(schema.metadata.sorted_tables)]
        engine = sa.create_engine(self.url, poolclass=sa.NullPool)
        try:
            with engine.begin() as conn:
                existing = set(sa.inspect(conn).get_table_names())
                names = [t for t in [*tables, FLOOR_TABLE] if t in existing]
                if self.backend == "postgres":
                    conn.exec_driver_sql(f"TRUNCATE {', '.join(names)}")
                elif self.backend == "mysql":
                    conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS = 0")
                    for name in names:
                        conn.exec_driver_sql(f"TRUNCATE TABLE {name}")
                    conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS = 1")
                else:
                    for name in names:
                        conn.exec_driver_sql(f"DELETE FROM {name}")
        finally:
            engine.dispose()

    def analyze(self) -> None:
        """Refresh the planner's statistics, as autovacuum does for a queue in steady state.

        Called once the queues are filled: statistics taken on empty tables
        would make PostgreSQL believe a 20,000-row backlog is a handful of
        rows and plan a claim as a bitmap scan plus a sort of every ready row
        (novaque's claim filters on attempts, which its index does not hold;
        the floor's claim is all index conditions and keeps its index scan).
        """
        tables = ["novaque_deliveries", "novaque_messages", FLOOR_TABLE]
        engine = sa.create_engine(self.url, poolclass=sa.NullPool)
        try:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                existing = set(sa.inspect(conn).get_table_names())
                names = ", ".join(t for t in tables if t in existing)
                if self.backend == "mysql":
                    conn.exec_driver_sql(f"ANALYZE TABLE {names}")
                elif self.backend == "postgres":
                    conn.exec_driver_sql(f"ANALYZE {names}")
                else:
                    conn.exec_driver_sql("ANALYZE")
        finally:
            engine.dispose()

    def drop(self) -> None:
        if not self._owned:
            return
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            return
        assert self._admin is not None
        quoted = f'"{self._name}" WITH (FORCE)' if self.backend == "postgres" else f"`{self._name}`"
        try:
            for attempt in range(5):
                try:
                    with self._admin.connect() as conn:
                        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}")
                    return
                except sa.exc.OperationalError:
                    if attempt == 4:
                        raise
                    time.sleep(0.5 + attempt * 0.5)
        finally:
            self._admin.dispose()

    def dbapi_connect(self) -> Any:
        """A raw driver connection (no SQLAlchemy around it), for the floor."""
        url = sa.make_url(self.url)
        if self.backend == "sqlite":
            conn = sqlite3.connect(url.database or "", isolation_level=None, timeout=30)
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            return conn
        if self.backend == "postgres":
            import psycopg

            return psycopg.connect(
                host=url.host or "127.0.0.1",
                port=url.port or 5432,
                user=url.username,
                password=url.password,
                dbname=url.database,
            )
        import pymysql

        return pymysql.connect(
            host=url.host or "127.0.0.1",
            port=url.port or 3306,
            user=url.username,
            password=url.password or "",
            database=url.database,
            autocommit=False,
            init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        )


def _close(client: novaque.Client) -> None:
    shutdown = getattr(client, "shutdown", None)
    if shutdown is not None:
        shutdown(timeout=10)
    own = client.own_engine
    if own is not client.engine:
        own.dispose()
    client.engine.dispose()


close_client = _close
