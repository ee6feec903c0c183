"""Run the benchmarks: the raw floor and novaque, side by side, per backend.

``python -m benchmarks.run [--backend sqlite|postgres|mysql|all]
[--workloads W1a,W1b,...] [--runs 3] [--json PATH]``; ``novaque bench`` calls
:func:`main` with the same arguments. Prints a progress bar on stderr while it
runs, then a table (workload, backend, novaque, floor, ratio, ...) on stdout,
and writes the same as JSON with every run's raw figures.

Each backend gets a private database (created and dropped here; servers from
``NOVAQUE_BENCH_POSTGRES_URL`` / ``NOVAQUE_BENCH_MYSQL_URL``, default the local
ones) or, for SQLite, a WAL file in a temporary directory. For each workload
the floor and novaque alternate run by run on freshly emptied tables, and the
median of the runs is reported. Every workload stops itself after
``--timeout`` seconds (120) and reports the partial counts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, TextIO

from benchmarks import workloads as nq
from benchmarks._common import (
    WORKLOAD_TIMEOUT_S,
    Deadline,
    Run,
    Sizes,
    body,
    latency_summary,
    median,
)
from benchmarks._databases import BACKENDS, Database
from benchmarks._procs import WorkerPool
from benchmarks.floor import Floor

WORKLOADS = ("W1a", "W1b", "W2", "W3", "W4", "W5", "W6", "W7", "W8")
#: Workloads whose figure is measured against another workload's.
NEEDS = {"W4": "W2", "W6": "W1b", "W7": "W2", "W8": "W6"}


@dataclass
class Row:
    """One line of the table: a workload on a backend, both sides' runs."""

    workload: str
    backend: str
    unit: str  # "msg/s" or "ms"
    novaque: list[Run] = field(default_factory=list)
    floor: list[Run] = field(default_factory=list)
    floor_label: str = ""  # what the floor column holds when it is not this workload
    figure: str = ""
    target: str = ""
    met: bool | None = None
    ratio: float | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def rate(self, side: str) -> float:
        runs = self.novaque if side == "novaque" else self.floor
        return median([r.rate for r in runs]) if runs else float("nan")

    def latency(self, side: str) -> dict[str, float]:
        runs = self.novaque if side == "novaque" else self.floor
        return {
            k: median([latency_summary(r.latencies_ms or [])[k] for r in runs])
            for k in ("p50_ms", "p95_ms", "p99_ms")
        }

    @property
    def partial(self) -> bool:
        return any(r.partial for r in [*self.novaque, *self.floor])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workload": self.workload,
            "backend": self.backend,
            "unit": self.unit,
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "figure": self.figure,
            "target": self.target,
            "met": self.met,
            "partial": self.partial,
            "novaque_runs": [r.to_json() for r in self.novaque],
            "floor_runs": [r.to_json() for r in self.floor],
        }
        if self.floor_label:
            out["floor_is"] = self.floor_label
        if self.unit == "ms":
            out["novaque"] = _rounded(self.latency("novaque")) if self.novaque else None
            out["floor"] = _rounded(self.latency("floor")) if self.floor else None
        else:
            out["novaque"] = round(self.rate("novaque"), 1) if self.novaque else None
            out["floor"] = round(self.rate("floor"), 1) if self.floor else None
        if self.notes:
            out["notes"] = self.notes
        if self.error:
            out["error"] = self.error
        return out


def _rounded(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in d.items()}


class Progress:
    """A progress bar on stderr (one line per step when stderr is not a terminal)."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
        self.started = time.monotonic()

    def step(self, label: str, advance: int = 1) -> None:
        self.show(label)
        self.done = min(self.total, self.done + advance)

    def show(self, label: str) -> None:
        width = 30
        filled = int(width * self.done / self.total)
        elapsed = int(time.monotonic() - self.started)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {100 * self.done // self.total:3d}% "
            f"{elapsed // 60:d}:{elapsed % 60:02d} {label}"
        )
        if self.tty:
            self.stream.write("\r" + line[:120].ljust(120))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        self.done = self.total
        self.show("done")
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()


# -- per-backend run ------------------------------------------------------------------


class BackendRun:
    """All selected workloads on one backend."""

    def __init__(
        self,
        backend: str,
        selected: list[str],
        sizes: Sizes,
        runs: int,
        timeout: float,
        progress: Progress,
    ) -> None:
        self.backend = backend
        self.selected = selected
        self.sizes = sizes
        self.runs = runs
        self.timeout = timeout
        self.progress = progress
        self.rows: dict[str, Row] = {}
        self.info: dict[str, Any] = {"backend": backend}

    def steps(self) -> int:
        """How many progress steps :meth:`run` takes."""
        n = 1
        for w in self.selected:
            if w == "W5":
                n += 2 * self.runs * len(self.sizes.w5_procs)
            elif w == "W4":
                n += 1 + 2 * self.runs
            else:
                n += 2 * self.runs
        return n

    def run(self) -> list[Row]:
        self.progress.step(f"{self.backend}: creating database")
        db = Database(self.backend)
        try:
            self.info["server"] = db.migrate()
            self.floor = Floor(db)
            self.floor.create_table()
            self.db = db
            for workload in self.selected:
                try:
                    getattr(self, f"_{workload.lower()}")()
                except Exception as exc:
                    row = self.rows.setdefault(workload, Row(workload, self.backend, "msg/s"))
                    row.error = f"{type(exc).__name__}: {exc}"
                    row.notes.append(traceback.format_exc())
        finally:
            db.drop()
        self._judge()
        return list(self.rows.values())

    # -- helpers ---------------------------------------------------------------------

    def _pairs(
        self,
        row: Row,
        floor_run: Callable[[Deadline], Run] | None,
        novaque_run: Callable[[Deadline], Run],
    ) -> None:
        """Alternate floor and novaque runs on emptied tables until done or timed out."""
        deadline = Deadline(self.timeout)
        for i in range(self.runs):
            if floor_run is not None:
                self.progress.step(f"{self.backend} {row.workload} floor run {i + 1}/{self.runs}")
                if not deadline.passed():
                    self.db.reset()
                    row.floor.append(floor_run(deadline))
            self.progress.step(f"{self.backend} {row.workload} novaque run {i + 1}/{self.runs}")
            if not deadline.passed():
                self.db.reset()
                row.novaque.append(novaque_run(deadline))
        if deadline.passed():
            row.notes.append(f"stopped at the {self.timeout:.0f} s limit: partial counts")

    # -- workloads -------------------------------------------------------------------

    def _interleaved(
        self,
        row: Row,
        n: int,
        slice_size: int,
        floor_step: Callable[[Any, list[bytes]], None],
        novaque_step: Callable[[nq.Publisher, list[bytes]], None],
        *,
        channels: int = 1,
        filtered: int = 0,
    ) -> None:
        """Publishing workloads: floor and novaque alternate slice by slice.

        A shared machine's load changes from second to second; alternating
        short slices (the first side swapping every slice) lets both sides
        meet the same conditions, which run-by-run alternation does not.
        """
        deadline = Deadline(self.timeout)
        slices = [
            [body(i) for i in range(s, min(n, s + slice_size))] for s in range(0, n, slice_size)
        ]
        for i in range(self.runs):
            self.progress.step(f"{self.backend} {row.workload} run {i + 1}/{self.runs}", 2)
            if deadline.passed():
                break
            self.db.reset()
            conn = self.floor.connect()
            pub = nq.Publisher(self.db, self.sizes, channels=channels, filtered=filtered)
            spent = {"floor": 0.0, "novaque": 0.0}
            done = {"floor": 0, "novaque": 0}
            try:
                for k, chunk in enumerate(slices):
                    if deadline.passed():
                        break
                    order = ("floor", "novaque") if k % 2 == 0 else ("novaque", "floor")
                    for side in order:
                        started = time.perf_counter()
                        if side == "floor":
                            floor_step(conn, chunk)
                        else:
                            novaque_step(pub, chunk)
                        spent[side] += time.perf_counter() - started
                        done[side] += len(chunk)
            finally:
                conn.close()
                pub.close()
            row.floor.append(Run(done["floor"], n, spent["floor"]))
            row.novaque.append(Run(done["novaque"], n, spent["novaque"]))
        if deadline.passed():
            row.notes.append(f"stopped at the {self.timeout:.0f} s limit: partial counts")

    def _w1a(self) -> None:
        s = self.sizes
        row = self.rows["W1a"] = Row("W1a", self.backend, "msg/s")
        floor = self.floor

        def floor_step(conn: Any, chunk: list[bytes]) -> None:
            for data in chunk:
                floor.publish_one(conn, data)

        self._interleaved(
            row, s.w1a_messages, 100, floor_step, lambda pub, chunk: pub.one_by_one(chunk)
        )

    def _w1b(self) -> None:
        s = self.sizes
        row = self.rows["W1b"] = Row("W1b", self.backend, "msg/s")
        self._interleaved(
            row,
            s.w1b_messages,
            s.batch,
            self.floor.publish_batch,
            lambda pub, chunk: pub.batch(chunk),
        )

    def _drains(
        self, row: Row, topic: str, *, keep: bool, n: int | None = None, groups: int = 0
    ) -> None:
        """W2 and W4: the floor and a novaque consumer drain alternately, slice by slice.

        Both queues are filled first; then each slice of ``n / 10`` messages
        is drained by one side and then the other (the first side swapping
        every slice), each side's clock running only during its own slices.
        ``keep`` leaves novaque's tables alone between runs (W4's backlog).
        ``n`` messages (W2's count by default), over ``groups`` groups of a
        group FIFO channel when given (W7).
        """
        s = self.sizes
        n = s.w2_messages if n is None else n
        step = max(s.max_in_flight, n // 10)
        deadline = Deadline(self.timeout)
        for i in range(self.runs):
            self.progress.step(f"{self.backend} {row.workload} run {i + 1}/{self.runs}", 2)
            if deadline.passed():
                break
            if keep:
                self.db.reset(floor_only=True)
            else:
                self.db.reset()
            self.floor.fill(n)
            gated = nq.GatedDrain(self.db, s, n, topic=topic, groups=groups)
            conn = self.floor.connect()
            spent = {"floor": 0.0, "novaque": 0.0}
            floor_done = 0
            extra: dict[str, Any] = {}
            try:
                for k, target in enumerate(range(step, n + step, step)):
                    target = min(target, n)
                    order = ("floor", "novaque") if k % 2 == 0 else ("novaque", "floor")
                    for side in order:
                        if deadline.passed():
                            break
                        if side == "floor":
                            started = time.perf_counter()
                            floor_done += self.floor.drain_on(
                                conn, target - floor_done, s.max_in_flight, deadline
                            )
                            spent["floor"] += time.perf_counter() - started
                        else:
                            spent["novaque"] += gated.advance(target, deadline)
            finally:
                conn.close()
                extra = gated.close()
            row.floor.append(Run(floor_done, n, spent["floor"]))
            row.novaque.append(Run(min(gated.handled, n), n, spent["novaque"], extra=extra))
        if deadline.passed():
            row.notes.append(f"stopped at the {self.timeout:.0f} s limit: partial counts")

    def _w2(self) -> None:
        row = self.rows["W2"] = Row("W2", self.backend, "msg/s")
        self._drains(row, nq.TOPIC, keep=False)

    def _w3(self) -> None:
        s = self.sizes
        row = self.rows["W3"] = Row("W3", self.backend, "ms")
        self._pairs(
            row,
            lambda dl: self.floor.latency(s.w3_messages, s.w3_interval_s, s.poll_interval_s, dl),
            lambda dl: nq.latency(self.db, s, dl),
        )

    def _w4(self) -> None:
        s = self.sizes
        row = self.rows["W4"] = Row("W4", self.backend, "msg/s")
        row.floor_label = "the floor's W2 drain (no backlog), interleaved"
        self.progress.step(f"{self.backend} W4 loading {s.w4_backlog:,} dead+delayed rows")
        self.db.reset()
        loaded = nq.load_backlog(self.db, s, "backlog")
        row.notes.append(f"backlog of {s.w4_backlog:,} rows loaded in {loaded:.1f} s")
        self._drains(row, "backlog", keep=True)

    def _w5(self) -> None:
        s = self.sizes
        pools = [WorkerPool(max(s.w5_procs))]
        try:
            for procs in s.w5_procs:
                name = f"W5 x{procs}"
                row = self.rows[name] = Row(name, self.backend, "msg/s")

                def floor_run(dl: Deadline, procs: int = procs) -> Run:
                    self.floor.fill(s.w5_messages)
                    self.db.analyze()
                    return pools[-1].run(
                        "floor", procs, self.backend, self.db.url, s, s.w5_messages, dl
                    )

                def novaque_run(dl: Deadline, procs: int = procs) -> Run:
                    client = nq.make_client(self.db, s, start=False)
                    try:
                        client.ensure_channel(nq.TOPIC, nq.CHANNEL)
                        nq.prefill(client, s.w5_messages)
                    finally:
                        nq.close_client(client)
                    self.db.analyze()
                    return pools[-1].run(
                        "novaque", procs, self.backend, self.db.url, s, s.w5_messages, dl
                    )

                try:
                    self._pairs(row, floor_run, novaque_run)
                except Exception as exc:
                    row.error = f"{type(exc).__name__}: {exc}"
                    pools[-1].close()  # its workers may be out of step: start afresh
                    pools.append(WorkerPool(max(s.w5_procs)))
        finally:
            pools[-1].close()

    def _w6(self) -> None:
        s = self.sizes
        row = self.rows["W6"] = Row("W6", self.backend, "msg/s")
        row.floor_label = "the floor's W1b, interleaved (the floor has no fan-out)"
        self._interleaved(
            row,
            s.w6_messages,
            s.batch,
            self.floor.publish_batch,
            lambda pub, chunk: pub.batch(chunk),
            channels=s.w6_channels,
        )

    def _w7(self) -> None:
        s = self.sizes
        row = self.rows["W7"] = Row("W7", self.backend, "msg/s")
        row.floor_label = "the floor's W2 drain (no groups), interleaved"
        row.notes.append(f"{s.w7_messages:,} messages over {s.w7_groups:,} groups, group_fifo")
        self._drains(row, nq.TOPIC, keep=False, n=s.w7_messages, groups=s.w7_groups)

    def _w8(self) -> None:
        s = self.sizes
        row = self.rows["W8"] = Row("W8", self.backend, "msg/s")
        row.floor_label = "the floor's W1b, interleaved (the floor has no fan-out)"
        row.notes.append(f"{s.w8_filtered} of {s.w6_channels} channels with a CEL filter")
        self._interleaved(
            row,
            s.w6_messages,
            s.batch,
            self.floor.publish_batch,
            lambda pub, chunk: pub.batch(chunk),
            channels=s.w6_channels,
            filtered=s.w8_filtered,
        )

    # -- figures and targets -------------------------------------------------------------

    def _judge(self) -> None:
        rows = self.rows
        s = self.sizes
        for row in rows.values():
            if not row.error and row.novaque and row.floor and row.unit == "msg/s":
                row.ratio = row.rate("novaque") / row.rate("floor")
        for name, row in rows.items():
            if row.error or not row.novaque:
                continue
            if name == "W1a":
                row.target, row.met = "ratio >= 0.7", row.ratio is not None and row.ratio >= 0.7
            elif name in ("W1b", "W2"):
                row.target, row.met = "ratio >= 0.8", row.ratio is not None and row.ratio >= 0.8
            elif name == "W3":
                lat = row.latency("novaque")
                row.figure = f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms"
                if self.backend == "postgres":
                    row.target = "p50 <= 3 ms, p99 <= 10 ms"
                    row.met = lat["p50_ms"] <= 3 and lat["p99_ms"] <= 10
                else:
                    half = s.poll_interval_s * 1000 / 2
                    row.target = f"p50 <= {half:.0f} ms (half the poll interval)"
                    row.met = lat["p50_ms"] <= half
            elif name == "W4":
                w2 = rows.get("W2")
                if w2 is not None and w2.ratio is not None and row.ratio is not None:
                    w4_w2 = row.ratio / w2.ratio
                    row.figure = f"W4/W2 {w4_w2:.2f}"
                    row.target, row.met = "W4/W2 >= 0.9", w4_w2 >= 0.9
            elif name == "W6":
                w1b = rows.get("W1b")
                if w1b is not None and w1b.ratio is not None and row.ratio is not None:
                    per = row.ratio / w1b.ratio
                    row.figure = f"W6/W1b {per:.2f}"
                    row.target, row.met = "W6/W1b >= 0.5", per >= 0.5
            elif name in ("W7", "W8"):
                base, least = ("W2", 0.5) if name == "W7" else ("W6", 0.7)
                other = rows.get(base)
                if other is not None and other.ratio is not None and row.ratio is not None:
                    per = row.ratio / other.ratio
                    row.figure = f"{name}/{base} {per:.2f}"
                    row.target, row.met = f"{name}/{base} >= {least}", per >= least
            elif name.startswith("W5 x"):
                one = rows.get("W5 x1")
                procs = int(name[4:])
                if procs > 1 and one is not None and one.novaque and one.floor:
                    scale = row.rate("novaque") / one.rate("novaque")
                    floor_scale = row.rate("floor") / one.rate("floor") if row.floor else 0.0
                    row.figure = f"x{procs}/x1 {scale:.2f} (floor {floor_scale:.2f})"
                    if procs == 2 and self.backend == "postgres":
                        row.target, row.met = "x2/x1 >= 1.3", scale >= 1.3
            if row.partial:
                row.met = False if row.met is not None else None


# -- output ---------------------------------------------------------------------------


def _fmt_side(row: Row, side: str) -> str:
    runs = row.novaque if side == "novaque" else row.floor
    if not runs:
        return "-"
    if row.unit == "ms":
        lat = row.latency(side)
        return f"{lat['p50_ms']:.1f}/{lat['p95_ms']:.1f}/{lat['p99_ms']:.1f} ms"
    return f"{row.rate(side):,.0f} msg/s"


def table(rows: list[Row]) -> str:
    """The results as a Markdown table (also fine as plain text)."""
    head = ["workload", "backend", "novaque", "floor", "ratio", "figure", "target", "met"]
    lines = []
    for row in rows:
        if row.error:
            lines.append([row.workload, row.backend, "error", "-", "-", row.error[:60], "-", "-"])
            continue
        met = "-" if row.met is None else ("yes" if row.met else "NO")
        if row.partial:
            met += " (partial)"
        lines.append(
            [
                row.workload,
                row.backend,
                _fmt_side(row, "novaque"),
                _fmt_side(row, "floor") + (" *" if row.floor_label else ""),
                "-" if row.ratio is None else f"{row.ratio:.2f}",
                row.figure or "-",
                row.target or "-",
                met,
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in lines)) for i, h in enumerate(head)]

    def fmt(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt(r) for r in lines]
    notes = [
        "",
        "ratio = novaque / floor (medians). W3 columns are p50/p95/p99 latency. "
        "met is judged on unrounded figures (0.798 shows as 0.80 and is not >= 0.8).",
    ]
    if any(r.floor_label for r in rows):
        notes.append(
            "* W6's and W8's floor publishes as in W1b (it has no fan-out), W4's and W7's floor "
            "drains as in W2; W6/W1b, W4/W2, W7/W2 and W8/W6 are ratios of the two ratios to "
            "the floor."
        )
    return "\n".join(out + notes)


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# -- entry point ----------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="novaque bench",
        description="Benchmark novaque against the raw-SQL floor (see benchmarks/README.md).",
    )
    parser.add_argument(
        "--backend",
        default="all",
        choices=[*BACKENDS, "all"],
        help="which database to run on (default: all)",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all)",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per side; the median counts")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument(
        "--timeout",
        type=float,
        default=WORKLOAD_TIMEOUT_S,
        help="seconds after which a workload stops and reports partial counts (default 120)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every message count (default 1: the sizes in benchmarks/README.md)",
    )
    parser.add_argument(
        "--w5-messages",
        type=int,
        default=Sizes.w5_messages,
        metavar="N",
        help="messages W5 drains per run (default 10,000; BENCHMARKS.md says 40,000)",
    )
    args = parser.parse_args(argv)
    wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
    known = {w.lower(): w for w in WORKLOADS}
    unknown = [w for w in wanted if w.lower() not in known]
    if unknown:
        parser.error(
            f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}"
        )
    chosen = {known[w.lower()] for w in wanted}
    for w, needed in NEEDS.items():
        if w in chosen:
            chosen.add(needed)  # its figure is measured against this one
    args.selected = [w for w in WORKLOADS if w in chosen]
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.scale <= 0:
        parser.error("--scale must be positive")
    if args.w5_messages < 1:
        parser.error("--w5-messages must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; 0 when every backend ran, 1 when one failed."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sizes = Sizes(w5_messages=args.w5_messages).scaled(args.scale)
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    started = time.monotonic()
    plans = [
        BackendRun(b, args.selected, sizes, args.runs, args.timeout, Progress(1)) for b in backends
    ]
    progress = Progress(sum(p.steps() for p in plans))
    rows: list[Row] = []
    infos: list[dict[str, Any]] = []
    failed = False
    for plan in plans:
        plan.progress = progress
        try:
            rows += plan.run()
        except Exception as exc:
            failed = True
            plan.info["error"] = f"{type(exc).__name__}: {exc}"
            print(f"novaque bench: {plan.backend}: {type(exc).__name__}: {exc}", file=sys.stderr)
        infos.append(plan.info)
    progress.finish()
    elapsed = time.monotonic() - started
    print(table(rows))
    print(f"\n{len(backends)} backend(s), {args.runs} run(s) per side, {elapsed:.0f} s")
    if args.json:
        report = {
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "elapsed_s": round(elapsed, 1),
            "machine": machine(),
            "runs": args.runs,
            "timeout_s": args.timeout,
            "sizes": asdict(sizes),
            "backends": infos,
            "results": [r.to_json() for r in rows],
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    errors = [r for r in rows if r.error]
    for r in errors:
        print(f"novaque bench: {r.backend} {r.workload}: {r.error}", file=sys.stderr)
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
