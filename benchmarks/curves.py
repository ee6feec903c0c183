"""Cost curves: how one of novaque's costs moves as one size grows, drawn as PNG plots.

    python -m benchmarks.curves [--backend sqlite|postgres|mysql|all]
                                [--curves backlog,channels,procs,idle,w9]
                                [--scale F] [--runs N] [--out DIR] [--json PATH]
                                [--w9-json PATH] [--procs 1,2,4,8] [--idle-procs 1,4,16]
    novaque bench --curves [NAMES] [the same options]

Each curve is measured on every backend asked for, each backend on a private
database (``benchmarks/_databases.py``), and drawn as one PNG per curve with a
line per backend (``benchmarks/_plot.py``; matplotlib, the ``bench`` extra):

- ``backlog``: drain rate against the ready backlog behind the drained
  messages (10,000, 100,000, 1,000,000 deliveries);
- ``channels``: ``publish_many`` rate against the channels of the topic (1, 10, 100);
- ``procs``: drain rate against consumer processes (1, 2, 4, 8);
- ``idle``: what idle consumer processes (1, 4, 16) send their database a second;
- ``w9``: W9's latency over time, read from ``--w9-json`` (not measured here).

``benchmarks/README.md`` ("Cost curves") says how each is measured. A progress
bar goes to stderr, a table of the points to stdout; ``--json`` writes every
point with its runs' raw figures. These are absolute figures of one machine,
not ratios to a floor: every plot's footer names the machine, the date and
the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import novaque
from benchmarks import idle
from benchmarks import workloads as nq
from benchmarks._common import WORKLOAD_TIMEOUT_S, Deadline, Run, Sizes, median
from benchmarks._databases import BACKENDS, DEFAULT_URLS, ENV, Database, close_client
from benchmarks._plot import LABELS, Stamp, draw_curve, draw_w9, read_w9
from benchmarks._procs import WorkerPool
from benchmarks._wire import CommandCounter
from benchmarks.run import Progress, machine
from novaque import schema

#: Measured curves, then the one drawn from a file.
MEASURED = ("backlog", "channels", "procs", "idle")
CURVES = (*MEASURED, "w9")
DEFAULT_OUT = Path(__file__).resolve().parent / "curves"

#: What the idle curve counts on each backend (its legend).
IDLE_COUNTED = {
    "sqlite": "SQLite: statements (sqlite3 trace)",
    "postgres": "PostgreSQL: transactions (pg_stat_database)",
    "mysql": "MariaDB: commands on the wire (relay)",
}


@dataclass(frozen=True)
class CurveSizes:
    """The x values of each curve and the work behind each point."""

    #: backlog: ready deliveries left behind the drained ones.
    depths: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    #: backlog: messages drained at each depth (loaded on top of the depth).
    drained: int = 20_000
    channels: tuple[int, ...] = (1, 10, 100)
    #: channels: messages published at each count, in ``publish_many`` batches.
    published: int = 20_000
    batch: int = 500
    procs: tuple[int, ...] = (1, 2, 4, 8)
    #: procs: messages the processes drain together.
    procs_drained: int = 10_000
    idle_procs: tuple[int, ...] = (1, 4, 16)
    #: idle: seconds after every process is ready, then the counting window.
    idle_settle_s: float = 3.0
    idle_seconds: float = 10.0

    def scaled(self, factor: float) -> CurveSizes:
        """Every message count and the idle times multiplied by ``factor`` (the
        idle times no shorter than 0.5 s to settle and 1 s to count); process
        and channel counts stay."""
        if factor == 1:
            return self

        def n(value: int, least: int) -> int:
            return max(least, round(value * factor))

        return replace(
            self,
            depths=tuple(n(d, 10) for d in self.depths),
            drained=n(self.drained, 20),
            published=n(self.published, 20),
            batch=min(self.batch, n(self.published, 20)),
            procs_drained=n(self.procs_drained, 40),
            idle_settle_s=max(0.5, self.idle_settle_s * factor),
            idle_seconds=max(1.0, self.idle_seconds * factor),
        )


@dataclass(frozen=True)
class Spec:
    """How a curve is labelled and drawn."""

    title: str
    x_label: str
    y_label: str
    log_x: int


SPECS = {
    "backlog": Spec(
        "Drain rate against the ready backlog",
        "ready deliveries behind the drained ones",
        "messages handled / s (one consumer)",
        10,
    ),
    "channels": Spec(
        "publish_many rate against channels per topic",
        "channels of the topic",
        "messages published / s",
        10,
    ),
    "procs": Spec(
        "Drain rate against consumer processes",
        "consumer processes",
        "messages handled / s (all processes)",
        2,
    ),
    "idle": Spec(
        "What idle consumer processes send their database",
        "idle consumer processes",
        "per second, all processes together",
        2,
    ),
}


@dataclass
class Point:
    """One x value of one curve on one backend: every run's raw figures and
    their median."""

    x: int
    runs: list[dict[str, Any]] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    @property
    def y(self) -> float:
        return median(self.values)

    def to_json(self) -> dict[str, Any]:
        return {"x": self.x, "y": round(self.y, 2), "runs": self.runs}


@dataclass
class Series:
    """One curve on one backend."""

    points: dict[int, Point] = field(default_factory=dict)
    error: str | None = None
    trace: str | None = None

    def add(self, x: int, value: float, raw: dict[str, Any]) -> None:
        point = self.points.setdefault(x, Point(x))
        point.values.append(value)
        point.runs.append(raw)

    def fail(self, exc: Exception) -> None:
        """Called in the ``except`` block: the error and its traceback."""
        self.error, self.trace = f"{type(exc).__name__}: {exc}", traceback.format_exc()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"points": [p.to_json() for p in self.points.values()]}
        if self.error:
            out["error"] = self.error
            out["trace"] = self.trace
        return out


class Pools:
    """One pool of worker processes for every backend (spawned when first
    needed, replaced after a failure: its workers may be out of step)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._pool: WorkerPool | None = None

    def get(self) -> WorkerPool:
        if self._pool is None:
            self._pool = WorkerPool(self.size)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


# -- measuring ----------------------------------------------------------------------


def load_ready(db: Database, sizes: Sizes, topic: str, total: int) -> float:
    """``total`` ready messages on ``topic``'s channel, one delivery each,
    loaded in bulk; returns the seconds it took.

    Up to 1,000 messages are published (``publish_many``) as templates; the
    rest are copies of them made by ``INSERT ... SELECT`` over a number
    table (as W4's backlog loader does), 100,000 rows a statement, and each
    copy gets its ready delivery the same way. Statistics are refreshed at
    the end (PostgreSQL: ``VACUUM ANALYZE``).
    """
    started = time.perf_counter()
    client = nq.make_client(db, sizes, start=False)
    try:
        client.ensure_channel(topic, nq.CHANNEL)
        templates = min(1000, total)
        copies = -(-total // templates)  # templates * copies >= total
        topic_id, channel_id, ids = nq.begin_bulk_load(client, topic, templates, range(1, copies))
        m = schema.messages
        last_template = ids[-1]
        step = max(1, 100_000 // max(1, copies - 1))  # templates per statement
        for first in range(0, templates if copies > 1 else 0, step):
            with client.engine.begin() as conn:
                conn.exec_driver_sql(
                    "INSERT INTO novaque_messages (topic_id, body, headers, published_at, "
                    "expires_at, max_attempts, priority) "
                    "SELECT m.topic_id, m.body, m.headers, m.published_at, m.expires_at, "
                    "m.max_attempts, m.priority "
                    "FROM bench_msg bm JOIN novaque_messages m ON m.id = bm.id "
                    "CROSS JOIN bench_seq b "
                    f"WHERE bm.k >= {first} AND bm.k < {first + step} "
                    f"AND b.n * {templates} + bm.k < {total}"
                )
        with client.engine.begin() as conn:
            top = conn.execute(sa.select(sa.func.max(m.c.id))).scalar_one()
        for low in range(last_template, top, 100_000):
            with client.engine.begin() as conn:
                conn.exec_driver_sql(
                    "INSERT INTO novaque_deliveries (message_id, channel_id, state, "
                    "visible_at, attempts, max_attempts, priority) "
                    f"SELECT m.id, {channel_id}, {schema.STATE_READY}, m.published_at, 0, "
                    "m.max_attempts, m.priority FROM novaque_messages m "
                    f"WHERE m.topic_id = {topic_id} AND m.id > {low} AND m.id <= {low + 100_000}"
                )
        nq.end_bulk_load(client.engine, db.backend)
    finally:
        close_client(client)
    return time.perf_counter() - started


class BackendCurves:
    """The measured curves asked for, on one backend."""

    def __init__(
        self,
        backend: str,
        selected: list[str],
        sizes: Sizes,
        cs: CurveSizes,
        runs: int,
        timeout: float,
        progress: Progress,
        pools: Pools,
    ) -> None:
        self.backend = backend
        self.selected = selected
        self.sizes = sizes
        self.cs = cs
        self.runs = runs
        self.timeout = timeout
        self.progress = progress
        self.pools = pools
        self.series = {name: Series() for name in selected}
        self.info: dict[str, Any] = {"backend": backend}

    def steps(self) -> int:
        per_run = {
            "backlog": 2 * len(self.cs.depths),
            "channels": len(self.cs.channels),
            "procs": len(self.cs.procs),
            "idle": len(self.cs.idle_procs),
        }
        return 1 + self.runs * sum(per_run[name] for name in self.selected)

    def run(self) -> dict[str, Series]:
        self.progress.step(f"{self.backend}: creating database")
        try:
            db = Database(self.backend)
        except Exception as exc:
            for series in self.series.values():
                series.fail(exc)
            return self.series
        try:
            self.info["server"] = db.migrate()
            self.db = db
            for name in self.selected:
                try:
                    getattr(self, f"_{name}")(self.series[name])
                except Exception as exc:
                    self.series[name].fail(exc)
                    if name in ("procs", "idle"):
                        self.pools.close()  # its workers may be out of step: start afresh
        finally:
            db.drop()
        return self.series

    def _label(self, name: str, x: int, i: int) -> str:
        return f"{self.backend} {name} {x:,} (run {i + 1}/{self.runs})"

    def _backlog(self, series: Series) -> None:
        cs = self.cs
        drained = replace(self.sizes, w2_messages=cs.drained)
        for i in range(self.runs):
            for depth in cs.depths:
                self.progress.step(
                    f"{self._label('backlog', depth, i)}: loading {depth + cs.drained:,}"
                )
                self.db.reset()
                loaded = load_ready(self.db, self.sizes, nq.TOPIC, depth + cs.drained)
                self.progress.step(f"{self._label('backlog', depth, i)}: draining {cs.drained:,}")
                run = nq.drain(self.db, drained, Deadline(self.timeout), prefilled=True)
                run.extra.update(depth=depth, load_s=round(loaded, 2))
                series.add(depth, run.rate, run.to_json())

    def _channels(self, series: Series) -> None:
        cs = self.cs
        for i in range(self.runs):
            for channels in cs.channels:
                self.progress.step(self._label("channels", channels, i))
                self.db.reset()
                deadline = Deadline(self.timeout)
                publisher = nq.Publisher(self.db, self.sizes, channels=channels)
                spent, done = 0.0, 0
                try:
                    for chunk in nq.batches(cs.published, cs.batch):
                        if deadline.passed():
                            break
                        spent += publisher.batch(chunk)
                        done += len(chunk)
                finally:
                    publisher.close()
                run = Run(done, cs.published, spent)
                run.extra.update(
                    channels=channels,
                    batch=cs.batch,
                    deliveries_per_s=round(done * channels / spent, 1) if spent else 0.0,
                )
                series.add(channels, run.rate, run.to_json())

    def _procs(self, series: Series) -> None:
        n = self.cs.procs_drained
        for i in range(self.runs):
            for procs in self.cs.procs:
                self.progress.step(self._label("procs", procs, i))
                self.db.reset()
                client = nq.make_client(self.db, self.sizes, start=False)
                try:
                    client.ensure_channel(nq.TOPIC, nq.CHANNEL)
                    nq.prefill(client, n)
                finally:
                    close_client(client)
                self.db.analyze()
                pool = self.pools.get()
                run = pool.run(
                    "novaque",
                    procs,
                    self.backend,
                    self.db.url,
                    self.sizes,
                    n,
                    Deadline(self.timeout),
                )
                series.add(procs, run.rate, run.to_json())

    def _idle(self, series: Series) -> None:
        cs = self.cs
        self.db.reset()
        # A database at rest: on SQLite the rows the other curves left behind
        # free pages that a started client's maintenance would otherwise
        # return a few at a time while the idle processes are counted.
        client = novaque.connect(self.db.url)
        try:
            client.compact(full=True)
        finally:
            client.shutdown()
        idle.declare(self.db.url)
        url = sa.make_url(self.db.url)
        with IdleCounter(self.backend, url) as (client_url, sample, questions):
            for i in range(self.runs):
                for procs in cs.idle_procs:
                    self.progress.step(self._label("idle", procs, i))
                    got = self.pools.get().idle(
                        procs,
                        self.backend,
                        client_url,
                        cs.idle_settle_s,
                        cs.idle_seconds,
                        sample,
                    )
                    seconds = got["seconds"]
                    count = got["sampled"] if sample is not None else sum(got["per_proc"])
                    raw: dict[str, Any] = {
                        "procs": procs,
                        "seconds": round(seconds, 3),
                        "counted": IDLE_COUNTED[self.backend],
                        "count": count,
                        "per_s": round(count / seconds, 2),
                    }
                    if self.backend == "sqlite":
                        raw["per_proc"] = got["per_proc"]
                    if len(questions) >= 2:
                        raw["server_questions_per_s"] = round(
                            (questions[-1] - questions[-2]) / seconds, 2
                        )
                    series.add(procs, count / seconds, raw)


class IdleCounter:
    """Where the idle processes connect and how their database counts them:
    ``(url, sample, questions)``. MariaDB: through a relay that counts every
    command of their connections (``sample``), the server's ``Questions`` read
    at each sample into ``questions`` (every session of the server).
    PostgreSQL: the private database's ``xact_commit + xact_rollback``, read
    from the server's administrative database (the reads are not counted).
    SQLite: no sample; each process counts its own statements."""

    def __init__(self, backend: str, url: sa.URL) -> None:
        self.backend = backend
        self.url = url
        self.relay: CommandCounter | None = None
        self.server: sa.Engine | None = None

    def __enter__(self) -> tuple[str, Callable[[], float] | None, list[int]]:
        questions: list[int] = []
        plain = self.url.render_as_string(hide_password=False)
        if self.backend == "sqlite":
            return plain, None, questions
        if self.backend == "mysql":
            self.relay = CommandCounter(self.url.host or "127.0.0.1", self.url.port or 3306)
            self.server = sa.create_engine(self.url, poolclass=sa.NullPool)
            relay, server = self.relay, self.server

            def commands() -> float:
                questions.append(idle.questions(server))
                return float(relay.commands())

            relayed = self.url.set(host="127.0.0.1", port=relay.port)
            return relayed.render_as_string(hide_password=False), commands, questions
        admin = sa.make_url(os.environ.get(ENV["postgres"]) or DEFAULT_URLS["postgres"])
        self.server = sa.create_engine(admin, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
        server, name = self.server, self.url.database

        def transactions() -> float:
            with server.connect() as conn:
                return float(
                    conn.execute(
                        sa.text(
                            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                            "WHERE datname = :name"
                        ),
                        {"name": name},
                    ).scalar_one()
                )

        return plain, transactions, questions

    def __exit__(self, *exc: object) -> None:
        if self.relay is not None:
            self.relay.close()
        if self.server is not None:
            self.server.dispose()


# -- the run's stamp ----------------------------------------------------------------


def commit() -> str:
    """The checkout's commit (short), "+dirty" when a tracked file differs from it."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "(not a git checkout)"
    return head + ("+dirty" if dirty else "")


def stamp(scale: float) -> Stamp:
    info = machine()
    return Stamp(
        host=socket.gethostname(),
        cores=int(info["cores"] or 0),
        cpu=str(info["cpu"]),
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
        commit=commit(),
        scale=scale,
    )


# -- drawing and output -------------------------------------------------------------


def draw(
    out: Path,
    results: dict[str, dict[str, Series]],
    w9: dict[str, Any] | None,
    the_stamp: Stamp,
    w9_source: str = "",
) -> list[Path]:
    """One PNG per curve in ``out`` (a curve with no point at all is not drawn)."""
    written = []
    for name, by_backend in results.items():
        series = {
            backend: [(float(p.x), p.y) for p in s.points.values()]
            for backend, s in by_backend.items()
        }
        if not any(series.values()):
            continue
        spec = SPECS[name]
        written.append(
            draw_curve(
                out / f"{name}.png",
                title=spec.title,
                x_label=spec.x_label,
                y_label=spec.y_label,
                series=series,
                stamp=the_stamp,
                log_x=spec.log_x,
                legend=IDLE_COUNTED if name == "idle" else None,
            )
        )
    if w9 is not None:
        written.append(draw_w9(out / "w9.png", w9, the_stamp, w9_source))
    return written


def table(results: dict[str, dict[str, Series]]) -> str:
    lines = ["| curve | backend | points (x: y) |", "|---|---|---|"]
    for name, by_backend in results.items():
        unit = "/s" if name == "idle" else " msg/s"
        for backend, series in by_backend.items():
            if series.error:
                cells = f"error: {series.error[:80]}"
            else:
                cells = " · ".join(
                    f"{p.x:,}: {p.y:,.1f}" if name == "idle" else f"{p.x:,}: {p.y:,.0f}"
                    for p in series.points.values()
                )
                cells += unit
            lines.append(f"| {name} | {backend} | {cells} |")
    return "\n".join(lines)


# -- entry point --------------------------------------------------------------------


def _counts(text: str, option: str, parser: argparse.ArgumentParser) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        parser.error(f"{option} takes positive whole numbers separated by commas, got {text!r}")
    return values


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.curves",
        description="Cost curves of novaque on each backend, drawn as PNG plots "
        "(see benchmarks/README.md, 'Cost curves').",
    )
    parser.add_argument("--backend", default="all", choices=[*BACKENDS, "all"])
    parser.add_argument(
        "--curves",
        help=f"comma-separated subset of {','.join(CURVES)} (default: every measured one, "
        "and w9 when --w9-json is given)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every message count and the idle windows (0.01 for a quick look; "
        "the plots say so)",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs per point; the median counts")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"where the PNGs go (default {DEFAULT_OUT})"
    )
    parser.add_argument("--json", metavar="PATH", help="also write every point as JSON here")
    parser.add_argument(
        "--w9-json",
        metavar="PATH",
        action="append",
        help="draw W9's latency over time from this file (a 'novaque bench --workloads W9 "
        "--json' report, or the shape benchmarks/README.md shows); once per file",
    )
    parser.add_argument(
        "--procs",
        default=",".join(map(str, CurveSizes.procs)),
        help="consumer processes of the procs curve (default 1,2,4,8)",
    )
    parser.add_argument(
        "--idle-procs",
        default=",".join(map(str, CurveSizes.idle_procs)),
        help="idle consumer processes of the idle curve (default 1,4,16)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=WORKLOAD_TIMEOUT_S,
        help="seconds after which a measurement stops and reports what it reached (default 120)",
    )
    args = parser.parse_args(argv)
    if args.curves is None:
        wanted = list(MEASURED) + (["w9"] if args.w9_json else [])
    else:
        wanted = [c.strip().lower() for c in args.curves.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in CURVES]
    if unknown or not wanted:
        parser.error(f"unknown curve(s) {', '.join(unknown)}; choose from {', '.join(CURVES)}")
    args.selected = [c for c in CURVES if c in wanted]
    if "w9" in args.selected:
        if not args.w9_json:
            parser.error("the w9 curve is drawn from a file: give --w9-json PATH")
        try:
            args.w9 = read_w9(*args.w9_json)
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
    else:
        args.w9 = None
    args.procs = _counts(args.procs, "--procs", parser)
    args.idle_procs = _counts(args.idle_procs, "--idle-procs", parser)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.scale <= 0:
        parser.error("--scale must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure and draw the curves; 0 when every point was measured, 1 otherwise."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    the_stamp = stamp(args.scale)
    cs = CurveSizes(procs=args.procs, idle_procs=args.idle_procs).scaled(args.scale)
    sizes = Sizes(batch=cs.batch)
    measured = [c for c in args.selected if c in MEASURED]
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    w9 = args.w9
    if w9 is not None and args.backend != "all":
        w9 = {b: buckets for b, buckets in w9.items() if b == args.backend}
    started = time.monotonic()
    processes = [
        *(cs.procs if "procs" in measured else ()),
        *(cs.idle_procs if "idle" in measured else ()),
    ]
    pools = Pools(max(processes, default=1))
    plans = [
        BackendCurves(b, measured, sizes, cs, args.runs, args.timeout, Progress(1), pools)
        for b in backends
    ]
    results: dict[str, dict[str, Series]] = {name: {} for name in measured}
    if measured:
        progress = Progress(sum(p.steps() for p in plans))
        try:
            for plan in plans:
                plan.progress = progress
                for name, series in plan.run().items():
                    results[name][plan.backend] = series
        finally:
            pools.close()
        progress.finish()
    source = ", ".join(Path(p).name for p in args.w9_json or [])
    written = draw(args.out, results, w9, the_stamp, source)
    elapsed = time.monotonic() - started
    if measured:
        print(table(results))
    print(f"\n{the_stamp.text()}; {elapsed:.0f} s")
    for path in written:
        print(f"wrote {path}")
    if args.json:
        report = {
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "elapsed_s": round(elapsed, 1),
            "machine": {**machine(), "host": the_stamp.host},
            "commit": the_stamp.commit,
            "scale": args.scale,
            "runs": args.runs,
            "sizes": asdict(cs),
            "backends": [p.info for p in plans] if measured else [],
            "curves": {
                name: {
                    **asdict(SPECS[name]),
                    "x": list(_xs(cs, name)),
                    "backends": {b: s.to_json() for b, s in by_backend.items()},
                }
                for name, by_backend in results.items()
            },
            "pngs": [str(p) for p in written],
        }
        if w9 is not None:
            report["w9"] = {b: [asdict(x) for x in buckets] for b, buckets in w9.items()}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    failed = [
        (name, backend, s.error)
        for name, by_backend in results.items()
        for backend, s in by_backend.items()
        if s.error
    ]
    for name, backend, error in failed:
        print(f"novaque bench --curves: {LABELS[backend]} {name}: {error}", file=sys.stderr)
    partial = [
        (name, backend, p.x)
        for name, by_backend in results.items()
        for backend, s in by_backend.items()
        for p in s.points.values()
        if any(run.get("partial") for run in p.runs)
    ]
    for name, backend, x in partial:
        print(
            f"novaque bench --curves: {LABELS[backend]} {name} {x:,}: stopped at the "
            f"{args.timeout:.0f} s limit (partial counts)",
            file=sys.stderr,
        )
    return 1 if failed or partial else 0


def _xs(cs: CurveSizes, name: str) -> tuple[int, ...]:
    return {
        "backlog": cs.depths,
        "channels": cs.channels,
        "procs": cs.procs,
        "idle": cs.idle_procs,
    }[name]


if __name__ == "__main__":
    sys.exit(main())
