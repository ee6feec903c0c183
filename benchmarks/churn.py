"""W9, steady churn: does a queue keep its latency while one snapshot stays open?

A queue turns rows over all day: every message is an insert, every delivery an
insert, an update (its lease) and a delete (its ack). The old row versions
stay until nothing can see them any more: PostgreSQL's vacuum and InnoDB's
purge may clear only what is older than the oldest snapshot still open. One
session holding a snapshot (an analytics query, a backup, a forgotten
transaction) therefore lets dead versions pile up for as long as it stays,
and every claim walks past them.

W9 publishes ``Sizes.w9_rate`` messages a second in small batches for
``Sizes.w9_minutes`` to one channel, while a consumer (``subscribe``, in a
process of its own so it does not share the publisher's GIL) handles them.
Each body carries the moment of its publish (``time.time()``, the same clock
in every process); the handler records publish -> handler start. Meanwhile
a third connection holds one snapshot open (``Sizes.w9_hold``): PostgreSQL
``BEGIN ISOLATION LEVEL REPEATABLE READ`` and a read, MariaDB ``START
TRANSACTION WITH CONSISTENT SNAPSHOT`` and a read, SQLite ``BEGIN`` and a
read (a reader on an old snapshot keeps the write-ahead log from being
reset). After the publishing the snapshot is closed and the consumer keeps
going for ``Sizes.w9_settle_s``, so the gauges show whether the tables stop
growing once nothing holds the old versions.

Every ``Sizes.w9_bucket_s`` a bucket reports the messages published and
handled in it, the latency p50/p99 of the messages published in it, and the
churn gauge read at its end (:class:`Gauge`); the gauge is also read when the
publishing ends, when the snapshot closes and at the very end.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import re
import struct
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import sqlalchemy as sa

from benchmarks._common import BODY_BYTES, Run, Sizes, percentile
from benchmarks._databases import Database, close_client

TOPIC = "churn"
CHANNEL = "work"
#: The tables whose dead versions and size the gauge follows.
TABLES = {"deliveries": "novaque_deliveries", "messages": "novaque_messages"}
#: A publish every this many seconds, of ``rate * TICK_S`` messages.
TICK_S = 0.1
#: How long the consumer process may take to connect and handle its first message.
READY_TIMEOUT_S = 60.0
#: The bodies: publish moment (``time.time()``), sequence number, filler.
_STAMP = struct.Struct("<dq")
_FILL = bytes(BODY_BYTES - _STAMP.size)
#: The warm-up message's sequence number: handled before the clock starts.
_WARM = -1
#: The summary's windows: the first and the last minute of the publishing.
WINDOW_S = 60.0


def stamp(seq: int) -> bytes:
    """A 200-byte body carrying ``seq`` and the moment it was made."""
    return _STAMP.pack(time.time(), seq) + _FILL


# -- the consumer, in a process of its own ----------------------------------------------


def _consume(
    pipe: Connection, handled: Any, warm: Any, stop: Any, backend: str, url: str, sizes: Sizes
) -> None:
    """The consumer process: a started client with one ``subscribe``; every
    handler start recorded as (sequence number, publish moment, start moment),
    sent back when ``stop`` is set."""
    try:
        import novaque
        from benchmarks.workloads import make_client

        client = make_client(Database(backend, url), sizes)
        records: list[tuple[int, float, float]] = []

        def handler(msg: novaque.Message) -> None:
            started = time.time()
            published, seq = _STAMP.unpack_from(msg.body)
            if seq == _WARM:
                warm.set()
                return
            records.append((seq, published, started))  # one append: atomic under the GIL
            with handled.get_lock():
                handled.value += 1

        try:
            consumer = client.subscribe(
                TOPIC,
                CHANNEL,
                handler,
                max_in_flight=sizes.max_in_flight,
                poll_interval=sizes.poll_interval_s,
            )
            consumer.start()
            pipe.send(("ready",))
            stop.wait()
            consumer.shutdown(timeout=10)
        finally:
            close_client(client)
        pipe.send(("done", records))
    except BaseException:
        pipe.send(("error", traceback.format_exc()))


class ConsumerProcess:
    """The consumer's process (``spawn``: a fresh interpreter), started and ready."""

    def __init__(self, db: Database, sizes: Sizes) -> None:
        ctx = mp.get_context("spawn")
        self.handled = ctx.Value("q", 0)
        self.warm = ctx.Event()
        self._stop = ctx.Event()
        self._pipe, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_consume,
            args=(child, self.handled, self.warm, self._stop, db.backend, db.url, sizes),
            name="novaque-bench-w9-consumer",
            daemon=True,
        )
        self._proc.start()
        child.close()
        self._reply("ready", READY_TIMEOUT_S)

    def _reply(self, expected: str, timeout: float) -> Any:
        if not self._pipe.poll(timeout):
            raise RuntimeError(f"the W9 consumer process did not answer ({expected})")
        reply = self._pipe.recv()
        if reply[0] == "error":
            raise RuntimeError(f"the W9 consumer process failed:\n{reply[1]}")
        return reply[1] if len(reply) > 1 else None

    def count(self) -> int:
        return int(self.handled.value)

    def finish(self) -> list[tuple[int, float, float]]:
        """Stop the consumer; its records."""
        self._stop.set()
        try:
            records: list[tuple[int, float, float]] = self._reply("done", 60)
            return records
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        self._proc.join(15)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._pipe.close()


# -- the held snapshot ------------------------------------------------------------------


class Holder:
    """One connection holding one snapshot open, on the driver itself."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.conn: Any = None

    def open(self) -> None:
        conn = self.conn = self.db.dbapi_connect()
        backend = self.db.backend
        if backend == "postgres":
            # In autocommit, so that BEGIN is ours and not the driver's (a BEGIN
            # inside the driver's own transaction would be ignored, with its level).
            conn.autocommit = True
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT count(*) FROM novaque_topics").fetchall()
        elif backend == "mysql":
            with conn.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                cur.execute("SELECT count(*) FROM novaque_topics")
                cur.fetchall()
        else:
            conn.execute("BEGIN")
            conn.execute("SELECT count(*) FROM novaque_topics").fetchall()

    def close(self) -> bool:
        """End the snapshot; whether it was still open (the server had not ended it)."""
        if self.conn is None:
            return False
        conn, self.conn = self.conn, None
        try:
            if self.db.backend == "mysql":
                with conn.cursor() as cur:
                    cur.execute("SELECT count(*) FROM novaque_topics")
                    cur.fetchall()
            else:
                conn.execute("SELECT count(*) FROM novaque_topics").fetchall()
            if self.db.backend == "mysql":
                conn.rollback()
            else:  # autocommit mode: the BEGIN was ours, so is the ROLLBACK
                conn.execute("ROLLBACK")
            return True
        except Exception:
            return False
        finally:
            with contextlib.suppress(Exception):
                conn.close()


# -- the churn gauge --------------------------------------------------------------------


_HISTORY = re.compile(r"History list length\s+(\d+)")


class Gauge:
    """What churn leaves behind, read on a connection of its own (autocommit:
    every read sees the server's latest figures).

    - PostgreSQL: dead and live row versions of the two tables
      (``pg_stat_user_tables``: a backend reports its counts at most once a
      second, so they lag by a second or more), their total size with indexes
      and TOAST (``pg_total_relation_size``), how many times they were
      vacuumed, and the age in transactions of the oldest snapshot any session
      of the database holds (``pg_stat_activity.backend_xmin``);
    - MariaDB: InnoDB's history list length (undo logs not yet purged: the
      whole server's, other databases' included) and the two tables'
      ``data_length + index_length`` (InnoDB's estimate, refreshed with its
      statistics) next to their files' size;
    - SQLite: the database file and its write-ahead log.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._lock = threading.Lock()
        self._engine: sa.Engine | None = None
        self._conn: sa.Connection | None = None
        if db.backend != "sqlite":
            self._engine = sa.create_engine(db.url, poolclass=sa.NullPool)
            self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            self._database = sa.make_url(db.url).database

    def read(self) -> dict[str, Any]:
        with self._lock:
            try:
                if self.db.backend == "postgres":
                    return self._postgres()
                if self.db.backend == "mysql":
                    return self._mysql()
                return self._sqlite()
            except Exception as exc:
                return {"gauge_error": f"{type(exc).__name__}: {exc}"[:200]}

    def _postgres(self) -> dict[str, Any]:
        assert self._conn is not None
        out: dict[str, Any] = {}
        rows = self._conn.execute(
            sa.text(
                "SELECT relname, n_dead_tup, n_live_tup, pg_total_relation_size(relid), "
                "autovacuum_count + vacuum_count FROM pg_stat_user_tables "
                "WHERE relname IN :names"
            ).bindparams(sa.bindparam("names", expanding=True)),
            {"names": list(TABLES.values())},
        )
        by_name = {r[0]: r for r in rows}
        for short, name in TABLES.items():
            _, dead, live, size, vacuums = by_name.get(name, (name, 0, 0, 0, 0))
            out[f"{short}_dead"] = int(dead)
            out[f"{short}_live"] = int(live)
            out[f"{short}_bytes"] = int(size)
            out[f"{short}_vacuums"] = int(vacuums)
        age = self._conn.exec_driver_sql(
            "SELECT max(age(backend_xmin)) FROM pg_stat_activity WHERE datname = current_database()"
        ).scalar()
        out["oldest_xmin_age"] = int(age or 0)
        return out

    def _mysql(self) -> dict[str, Any]:
        assert self._conn is not None
        out: dict[str, Any] = {}
        history = self._conn.exec_driver_sql(
            "SELECT `count` FROM information_schema.INNODB_METRICS "
            "WHERE name = 'trx_rseg_history_len'"
        ).scalar()
        if history is None:  # the metric is off: read the monitor's output
            status = str(self._conn.exec_driver_sql("SHOW ENGINE INNODB STATUS").one()[2])
            found = _HISTORY.search(status)
            history = found.group(1) if found else -1
        out["history_len"] = int(history)
        sizes = {
            r[0]: r
            for r in self._conn.exec_driver_sql(
                "SELECT table_name, data_length + index_length, data_free "
                "FROM information_schema.TABLES WHERE table_schema = DATABASE()"
            )
        }
        files = {
            str(r[0]).rsplit("/", 1)[-1]: int(r[1] or 0)
            for r in self._conn.execute(
                sa.text(
                    "SELECT name, file_size FROM information_schema.INNODB_SYS_TABLESPACES "
                    "WHERE name IN :names"
                ).bindparams(sa.bindparam("names", expanding=True)),
                {"names": [f"{self._database}/{name}" for name in TABLES.values()]},
            )
        }
        for short, name in TABLES.items():
            _, size, free = sizes.get(name, (name, 0, 0))
            out[f"{short}_bytes"] = int(size or 0)
            out[f"{short}_free_bytes"] = int(free or 0)
            out[f"{short}_file_bytes"] = files.get(name, 0)
        return out

    def _sqlite(self) -> dict[str, Any]:
        path = sa.make_url(self.db.url).database or ""

        def size(p: str) -> int:
            return os.path.getsize(p) if os.path.exists(p) else 0

        return {"db_bytes": size(path), "wal_bytes": size(path + "-wal")}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            if self._engine is not None:
                self._engine.dispose()


#: Each backend's gauge fields (the smoke test checks they are there).
GAUGE_FIELDS = {
    "postgres": (
        *(f"{t}_{f}" for t in TABLES for f in ("dead", "live", "bytes", "vacuums")),
        "oldest_xmin_age",
    ),
    "mysql": (
        "history_len",
        *(f"{t}_{f}" for t in TABLES for f in ("bytes", "free_bytes", "file_bytes")),
    ),
    "sqlite": ("db_bytes", "wal_bytes"),
}


@dataclass
class Series:
    """The gauge over the run: every bucket's end and the moments that matter."""

    gauge: Gauge
    started: float  # time.time() when the publishing began
    samples: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self, mark: str) -> dict[str, Any]:
        at = time.time()
        reading = self.gauge.read()
        one = {"t_s": round(at - self.started, 2), "mark": mark, **reading}
        with self._lock:
            self.samples.append(one)
        return one


class Sampler:
    """A thread reading the gauge at the end of every bucket, and telling
    ``show`` how the run goes."""

    def __init__(
        self, series: Series, bucket_s: float, show: Callable[[dict[str, Any]], None]
    ) -> None:
        self.series = series
        self.bucket_s = bucket_s
        self._show = show
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-w9-gauge", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        k = 1
        while True:
            due = self.series.started + k * self.bucket_s
            if self._stop.wait(max(0.0, due - time.time())):
                return
            self._show(self.series.sample("bucket"))
            k += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


# -- the run ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What W9 measured: the run and its series (for the table and the JSON)."""

    run: Run
    buckets: list[dict[str, Any]]
    series: list[dict[str, Any]]
    summary: dict[str, Any]


def churn(
    db: Database,
    sizes: Sizes,
    drain_timeout: float,
    show: Callable[[str], None],
) -> Outcome:
    """W9 once, on the already migrated and emptied ``db``; ``show`` gets a
    line of progress at the end of every bucket (:func:`bucket_count` of them)."""
    from benchmarks.workloads import make_client

    publish_s = sizes.w9_minutes * 60.0
    per_tick = max(1, round(sizes.w9_rate * TICK_S))
    tick = per_tick / sizes.w9_rate
    ticks = max(1, round(publish_s / tick))
    ttl = sizes.w9_ttl_s or None
    publisher = make_client(db, sizes)
    consumer: ConsumerProcess | None = None
    holder = Holder(db)
    gauge = Gauge(db)
    sampler: Sampler | None = None
    try:
        publisher.ensure_channel(TOPIC, CHANNEL)
        consumer = ConsumerProcess(db, sizes)
        publisher.publish(TOPIC, stamp(_WARM))  # warm: schema, topic id, the consumer's wake-up
        if not consumer.warm.wait(READY_TIMEOUT_S):
            raise RuntimeError("the W9 consumer did not handle its warm-up message")
        if sizes.w9_hold:
            holder.open()
        published_at: list[tuple[float, int]] = []  # (publish moment, messages)
        seq = 0
        lag = 0.0
        series = Series(gauge, time.time())
        series.sample("start")
        total_s = publish_s + sizes.w9_settle_s
        live = consumer

        def progress(sample: dict[str, Any]) -> None:
            show(
                f"W9 {_clock(sample['t_s'])}/{_clock(total_s)} published {seq:,} "
                f"handled {live.count():,} {_short(sample)}"
            )

        # Both clocks from one moment: the schedule's (monotonic) and the
        # bodies' and buckets' (time.time(), the same in every process).
        started, clock = time.time(), time.monotonic()
        series.started = started
        sampler = Sampler(series, sizes.w9_bucket_s, progress)
        for i in range(ticks):
            pause = clock + i * tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                lag = max(lag, -pause)
            bodies = [stamp(seq + j) for j in range(per_tick)]
            publisher.publish_many(TOPIC, bodies, ttl=ttl)
            published_at.append((_STAMP.unpack_from(bodies[0])[0], per_tick))
            seq += per_tick
        # The publishing spans its whole schedule: the last batch's tick included.
        time.sleep(max(0.0, clock + ticks * tick - time.monotonic()))
        publish_end = time.time()
        series.sample("publish end")
        kept = holder.close() if sizes.w9_hold else None
        series.sample("snapshot closed" if sizes.w9_hold else "settle start")
        time.sleep(max(0.0, publish_end + sizes.w9_settle_s - time.time()))
        waited_until = time.monotonic() + drain_timeout
        while consumer.count() < seq and time.monotonic() < waited_until:
            time.sleep(0.05)
        sampler.stop()
        sampler = None
        series.sample("end")
        ended = time.time()
        records = consumer.finish()
        consumer = None
    finally:
        if sampler is not None:
            sampler.stop()
        if consumer is not None:
            consumer.close()
        holder.close()
        gauge.close()
        close_client(publisher)
    first: dict[int, tuple[float, float]] = {}
    duplicates = 0
    for number, at, began in records:
        if number in first:
            duplicates += 1
            first[number] = min(first[number], (at, began), key=lambda r: r[1])
        else:
            first[number] = (at, began)
    handled = len(first)
    buckets = _buckets(
        sizes.w9_bucket_s, started, publish_end, ended, published_at, first, series.samples
    )
    latencies = [(at, (began - at) * 1000.0) for at, began in first.values()]
    window = min(WINDOW_S, (publish_end - started) / 2)
    head = _window(latencies, started, started + window)
    tail = _window(latencies, publish_end - window, publish_end)
    summary: dict[str, Any] = {
        "published": seq,
        "handled": handled,
        "duplicates": duplicates,
        "publish_s": round(publish_end - started, 2),
        "rate_msg_s": round(seq / (publish_end - started), 1),
        "publish_lag_max_s": round(lag, 3),
        "hold": sizes.w9_hold,
        "snapshot_kept_to_the_end": kept,
        "window_s": round(window, 1),
        "first_minute": head,
        "last_minute": tail,
        "p99_ratio": _ratio(tail, head, "p99_ms"),
        "p50_ratio": _ratio(tail, head, "p50_ms"),
    }
    run = Run(
        handled,
        seq,
        publish_end - started,
        latencies_ms=[ms for _, ms in latencies],
        extra={"summary": summary, "buckets": buckets, "series": series.samples},
    )
    return Outcome(run, buckets, series.samples, summary)


def bucket_count(sizes: Sizes) -> int:
    """How many buckets W9's publishing and settle make."""
    return max(1, math.ceil((sizes.w9_minutes * 60 + sizes.w9_settle_s) / sizes.w9_bucket_s))


def _buckets(
    bucket_s: float,
    started: float,
    publish_end: float,
    ended: float,
    published_at: list[tuple[float, int]],
    first: dict[int, tuple[float, float]],
    samples: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """One entry per ``bucket_s`` from the first publish to the end."""
    count = max(1, math.ceil((ended - started) / bucket_s - 1e-9))
    published = [0] * count
    handled = [0] * count
    latencies: list[list[float]] = [[] for _ in range(count)]

    def index(moment: float) -> int:
        return min(count - 1, max(0, int((moment - started) // bucket_s)))

    for at, n in published_at:
        published[index(at)] += n
    for at, began in first.values():
        handled[index(began)] += 1
        latencies[index(at)].append((began - at) * 1000.0)
    ordered = sorted(samples, key=lambda s: float(s["t_s"]))
    out = []
    for b in range(count):
        lo, hi = b * bucket_s, (b + 1) * bucket_s
        lat = latencies[b]
        at_end = [s for s in ordered if s["t_s"] <= hi + 0.5 and s["mark"] in ("bucket", "end")]
        gauge = {k: v for k, v in at_end[-1].items() if k not in ("t_s", "mark")} if at_end else {}
        out.append(
            {
                "t0_s": round(lo, 1),
                "phase": "publish" if started + lo + 0.05 < publish_end else "settle",
                "published": published[b],
                "handled": handled[b],
                "p50_ms": round(percentile(lat, 50), 2) if lat else None,
                "p99_ms": round(percentile(lat, 99), 2) if lat else None,
                "max_ms": round(max(lat), 2) if lat else None,
                "gauge": gauge,
            }
        )
    return out


def _window(latencies: list[tuple[float, float]], lo: float, hi: float) -> dict[str, Any] | None:
    """Latency of the messages published in [lo, hi)."""
    lat = [ms for at, ms in latencies if lo <= at < hi]
    if not lat:
        return None
    return {
        "n": len(lat),
        "p50_ms": round(percentile(lat, 50), 3),
        "p99_ms": round(percentile(lat, 99), 3),
    }


def _ratio(tail: dict[str, Any] | None, head: dict[str, Any] | None, key: str) -> float | None:
    if not tail or not head or not head[key]:
        return None
    return round(float(tail[key]) / float(head[key]), 3)


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60:d}:{s % 60:02d}"


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f}"


def _short(sample: dict[str, Any]) -> str:
    """The gauge in a few words, for the progress line."""
    if "gauge_error" in sample:
        return "gauge: " + str(sample["gauge_error"])[:40]
    if "deliveries_dead" in sample:
        return (
            f"dead {sample['deliveries_dead']:,}+{sample['messages_dead']:,} "
            f"{_mb(sample['deliveries_bytes'] + sample['messages_bytes'])} MB"
        )
    if "history_len" in sample:
        return (
            f"history {sample['history_len']:,} "
            f"{_mb(sample['deliveries_bytes'] + sample['messages_bytes'])} MB"
        )
    return f"db {_mb(sample['db_bytes'])} MB wal {_mb(sample['wal_bytes'])} MB"


# -- the report -------------------------------------------------------------------------

#: The gauge's columns in the bucket table, per backend: (heading, field, as MB).
_COLUMNS = {
    "postgres": [
        ("del dead", "deliveries_dead", False),
        ("msg dead", "messages_dead", False),
        ("del MB", "deliveries_bytes", True),
        ("msg MB", "messages_bytes", True),
        ("xmin age", "oldest_xmin_age", False),
    ],
    "mysql": [
        ("history", "history_len", False),
        ("del MB", "deliveries_bytes", True),
        ("msg MB", "messages_bytes", True),
        ("del file MB", "deliveries_file_bytes", True),
        ("msg file MB", "messages_file_bytes", True),
    ],
    "sqlite": [("db MB", "db_bytes", True), ("WAL MB", "wal_bytes", True)],
}


def _cell(values: dict[str, Any], key: str, mb: bool) -> str:
    value = values.get(key)
    if value is None:
        return "-"
    return _mb(value) if mb else f"{value:,}"


def report(backend: str, extra: dict[str, Any]) -> str:
    """W9's buckets and the gauge's marks as Markdown tables."""
    columns = _COLUMNS[backend]
    head = ["t", "phase", "published", "handled", "p50 ms", "p99 ms", *(c[0] for c in columns)]
    lines = [
        f"W9 on {backend}: every bucket (latency of the messages published in it; "
        "gauge at its end)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for b in extra["buckets"]:
        cells = [
            _clock(b["t0_s"]),
            b["phase"],
            f"{b['published']:,}",
            f"{b['handled']:,}",
            "-" if b["p50_ms"] is None else f"{b['p50_ms']:.1f}",
            "-" if b["p99_ms"] is None else f"{b['p99_ms']:.1f}",
            *(_cell(b["gauge"], key, mb) for _, key, mb in columns),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    marks = [s for s in extra["series"] if s["mark"] != "bucket"]
    lines += ["", "| at | mark | " + " | ".join(c[0] for c in columns) + " |"]
    lines.append("|" + "---|" * (2 + len(columns)))
    for s in marks:
        cells = [_clock(s["t_s"]), s["mark"], *(_cell(s, key, mb) for _, key, mb in columns)]
        if "gauge_error" in s:
            cells.append(str(s["gauge_error"]))
        lines.append("| " + " | ".join(cells) + " |")
    summary = extra["summary"]
    lines += [
        "",
        f"published {summary['published']:,}, handled {summary['handled']:,} "
        f"({summary['duplicates']:,} twice), {summary['rate_msg_s']:,} msg/s over "
        f"{summary['publish_s']:.0f} s (the publisher at most "
        f"{summary['publish_lag_max_s']:.2f} s behind); snapshot held: "
        + (
            "no"
            if not summary["hold"]
            else "yes" + ("" if summary["snapshot_kept_to_the_end"] else " (lost before the end)")
        ),
        f"first {summary['window_s']:.0f} s: {_latency(summary['first_minute'])}; "
        f"last {summary['window_s']:.0f} s: {_latency(summary['last_minute'])}",
    ]
    return "\n".join(lines)


def _latency(window: dict[str, Any] | None) -> str:
    if not window:
        return "no messages"
    return f"p50 {window['p50_ms']:.1f} ms, p99 {window['p99_ms']:.1f} ms ({window['n']:,})"
