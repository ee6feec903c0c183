"""The raw floor: the least work a queue can do, per backend, with the same driver.

A plain table (id, channel, body, status, visible_at, lease_token, attempts)
reached through the bare DBAPI connection (psycopg 3, PyMySQL, sqlite3) with
no library around it: batch ``INSERT``; claim of up to N rows (PostgreSQL:
one ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``;
MySQL/MariaDB: ``SELECT ... FOR UPDATE SKIP LOCKED`` then ``UPDATE`` under
READ COMMITTED; SQLite: ``BEGIN IMMEDIATE`` then ``UPDATE ... RETURNING``);
ack as one ``DELETE ... WHERE id IN (...)``. Claim and ack are separate
transactions of up to ``max_in_flight`` rows, as a simple queue would do them.

It ignores fan-out, stats, TTL, fencing on ack and everything else a real
queue needs, so novaque can approach it but should not pass it (unless it
settles and claims in fewer, larger transactions).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks._common import Deadline, Run, age_ms, body, stamped_body
from benchmarks._databases import FLOOR_TABLE, Database

T = FLOOR_TABLE
CHANNEL = 1
NOTIFY_CHANNEL = "bench_floor"


def _now_us() -> int:
    return time.time_ns() // 1000


class Floor:
    """The floor's statements for one backend, on raw driver connections."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.backend = db.backend
        self.ph = "?" if self.backend == "sqlite" else "%s"

    def connect(self) -> Any:
        return self.db.dbapi_connect()

    # -- schema ---------------------------------------------------------------------

    def create_table(self) -> None:
        conn = self.connect()
        try:
            if self.backend == "postgres":
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {T} (id BIGSERIAL PRIMARY KEY, "
                    "channel INTEGER NOT NULL, body BYTEA NOT NULL, status SMALLINT NOT NULL, "
                    "visible_at BIGINT NOT NULL, lease_token VARCHAR(32), "
                    "attempts INTEGER NOT NULL)"
                )
                conn.execute(
                    f"CREATE INDEX IF NOT EXISTS {T}_claim ON {T} (channel, status, visible_at, id)"
                )
                conn.commit()
            elif self.backend == "mysql":
                with conn.cursor() as cur:
                    cur.execute(
                        f"CREATE TABLE IF NOT EXISTS {T} (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
                        "channel INT NOT NULL, body LONGBLOB NOT NULL, status SMALLINT NOT NULL, "
                        "visible_at BIGINT NOT NULL, lease_token VARCHAR(32), "
                        "attempts INT NOT NULL, "
                        f"INDEX {T}_claim (channel, status, visible_at, id)) ENGINE=InnoDB"
                    )
                conn.commit()
            else:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {T} (id INTEGER PRIMARY KEY, "
                    "channel INTEGER NOT NULL, body BLOB NOT NULL, status INTEGER NOT NULL, "
                    "visible_at INTEGER NOT NULL, lease_token TEXT, attempts INTEGER NOT NULL)"
                )
                conn.execute(
                    f"CREATE INDEX IF NOT EXISTS {T}_claim ON {T} (channel, status, visible_at, id)"
                )
        finally:
            conn.close()

    # -- operations -----------------------------------------------------------------

    def _begin(self, conn: Any) -> None:
        if self.backend == "sqlite":
            conn.execute("BEGIN IMMEDIATE")

    def _commit(self, conn: Any) -> None:
        if self.backend == "sqlite":
            conn.execute("COMMIT")
        else:
            conn.commit()

    def _execute(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        if self.backend == "mysql":
            cur = conn.cursor()
            cur.execute(sql, params)
            return cur
        return conn.execute(sql, params)

    def publish_one(self, conn: Any, data: bytes, *, notify: bool = False) -> None:
        """Insert one row in its own transaction (with NOTIFY on PostgreSQL if asked)."""
        p = self.ph
        self._begin(conn)
        self._execute(
            conn,
            f"INSERT INTO {T} (channel, body, status, visible_at, attempts) "
            f"VALUES ({p}, {p}, 0, {p}, 0)",
            (CHANNEL, data, _now_us()),
        )
        if notify:
            conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
        self._commit(conn)

    def publish_batch(self, conn: Any, bodies: Sequence[bytes]) -> None:
        """Insert rows with one multi-row INSERT in one transaction."""
        p = self.ph
        now = _now_us()
        self._begin(conn)
        sql = f"INSERT INTO {T} (channel, body, status, visible_at, attempts) VALUES "
        if self.backend == "mysql":
            # PyMySQL's executemany rewrites this into one multi-row INSERT (it
            # only does so when every value is a placeholder).
            with conn.cursor() as cur:
                cur.executemany(
                    sql + "(%s, %s, %s, %s, %s)",
                    [(CHANNEL, b, 0, now, 0) for b in bodies],
                )
        else:
            rows = ", ".join([f"({p}, {p}, 0, {p}, 0)"] * len(bodies))
            params: list[Any] = []
            for b in bodies:
                params += (CHANNEL, b, now)
            conn.execute(sql + rows, params)
        self._commit(conn)

    def claim(self, conn: Any, limit: int, lease_s: float = 30.0) -> list[tuple[int, bytes]]:
        """Lease up to ``limit`` due rows in one transaction; their ids and bodies."""
        p = self.ph
        now = _now_us()
        until = now + int(lease_s * 1_000_000)
        token = secrets.token_hex(16)
        pick = (
            f"SELECT id FROM {T} WHERE channel = {p} AND status = 0 AND visible_at <= {p} "
            f"ORDER BY visible_at, id LIMIT {p}"
        )
        if self.backend == "mysql":
            with conn.cursor() as cur:
                cur.execute(
                    f"SELECT id, body FROM {T} WHERE channel = %s AND status = 0 "
                    "AND visible_at <= %s ORDER BY visible_at, id LIMIT %s "
                    "FOR UPDATE SKIP LOCKED",
                    (CHANNEL, now, limit),
                )
                rows = cur.fetchall()
                if rows:
                    marks = ", ".join(["%s"] * len(rows))
                    cur.execute(
                        f"UPDATE {T} SET status = 1, lease_token = %s, visible_at = %s, "
                        f"attempts = attempts + 1 WHERE id IN ({marks})",
                        (token, until, *[r[0] for r in rows]),
                    )
            conn.commit()
            return [(int(r[0]), bytes(r[1])) for r in rows]
        lock = " FOR UPDATE SKIP LOCKED" if self.backend == "postgres" else ""
        self._begin(conn)
        rows = conn.execute(
            f"UPDATE {T} SET status = 1, lease_token = {p}, visible_at = {p}, "
            f"attempts = attempts + 1 WHERE id IN ({pick}{lock}) RETURNING id, body",
            (token, until, CHANNEL, now, limit),
        ).fetchall()
        self._commit(conn)
        return [(int(r[0]), bytes(r[1])) for r in rows]

    def ack(self, conn: Any, ids: Sequence[int]) -> None:
        """Delete the rows ``ids`` with one DELETE in one transaction."""
        if not ids:
            return
        marks = ", ".join([self.ph] * len(ids))
        self._begin(conn)
        self._execute(conn, f"DELETE FROM {T} WHERE id IN ({marks})", list(ids))
        self._commit(conn)

    def count(self) -> int:
        conn = self.connect()
        try:
            cur = self._execute(conn, f"SELECT count(*) FROM {T}")
            n = int(cur.fetchone()[0])
            if self.backend != "sqlite":
                conn.commit()
            return n
        finally:
            conn.close()

    # -- workloads ------------------------------------------------------------------

    def fill(self, n: int, batch: int = 1000) -> None:
        """Publish ``n`` rows (setup, not timed)."""
        conn = self.connect()
        try:
            for start in range(0, n, batch):
                self.publish_batch(conn, [body(i) for i in range(start, min(n, start + batch))])
        finally:
            conn.close()

    def drain_on(
        self,
        conn: Any,
        n: int,
        limit: int,
        deadline: Deadline,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Claim up to ``limit``, "handle" (nothing), ack; until ``n`` are done.

        Returns how many were done (fewer if ``deadline`` passed first).
        """
        done = 0
        while done < n and not deadline.passed():
            rows = self.claim(conn, min(limit, n - done))
            if not rows:
                time.sleep(0.001)
                continue
            self.ack(conn, [r[0] for r in rows])
            done += len(rows)
            if on_batch is not None:
                on_batch(len(rows))
        return done

    def drain(self, n: int, limit: int, deadline: Deadline) -> Run:
        """Drain ``n`` rows on a connection of its own, timed."""
        conn = self.connect()
        try:
            started = time.perf_counter()
            done = self.drain_on(conn, n, limit, deadline)
            return Run(done, n, time.perf_counter() - started)
        finally:
            conn.close()

    def latency(self, n: int, interval_s: float, poll_s: float, deadline: Deadline) -> Run:
        """W3: an idle consumer; ``n`` single publishes ``interval_s`` apart.

        On PostgreSQL the consumer LISTENs and the publisher NOTIFYs in its
        transaction; elsewhere the consumer polls every ``poll_s`` (fixed).
        """
        latencies: list[float] = []
        stop = threading.Event()
        ready = threading.Event()
        errors: list[BaseException] = []

        def consume() -> None:
            conn = self.connect()
            listener = None
            try:
                if self.backend == "postgres":
                    listener = self.connect()
                    listener.autocommit = True
                    listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
                ready.set()
                while not stop.is_set():
                    rows = self.claim(conn, 10)
                    if rows:
                        for _, data in rows:
                            latencies.append(age_ms(data))
                        self.ack(conn, [r[0] for r in rows])
                        continue
                    if listener is not None:
                        for _ in listener.notifies(timeout=0.2, stop_after=1):
                            pass
                    else:
                        stop.wait(poll_s)
            except BaseException as exc:  # reported by the caller
                errors.append(exc)
                ready.set()
            finally:
                if listener is not None:
                    listener.close()
                conn.close()

        thread = threading.Thread(target=consume, name="floor-w3", daemon=True)
        thread.start()
        ready.wait(30)
        time.sleep(0.3)  # let the consumer go idle
        pub = self.connect()
        sent = 0
        try:
            started = time.perf_counter()
            for i in range(n):
                if deadline.passed() or errors:
                    break
                pause = started + i * interval_s - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                self.publish_one(pub, stamped_body(), notify=self.backend == "postgres")
                sent += 1
            while len(latencies) < sent and not deadline.passed() and not errors:
                time.sleep(0.005)
            elapsed = time.perf_counter() - started
        finally:
            stop.set()
            thread.join(10)
            pub.close()
        if errors:
            raise errors[0]
        return Run(len(latencies), n, elapsed, latencies_ms=list(latencies))
