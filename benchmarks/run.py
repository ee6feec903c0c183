"""Run the benchmarks: the raw floor and novaque, side by side, per backend.

``python -m benchmarks.run [--backend sqlite|postgres|mysql|all]
[--workloads W1a,W1b,...] [--runs 3] [--json PATH]``; ``novaque bench`` calls
:func:`main` with the same arguments. Prints a progress bar on stderr while it
runs, then a table (workload, backend, novaque, floor, ratio, ...) on stdout,
and writes the same as JSON with every run's raw figures.

Each backend gets a private database (created and dropped here; servers from
``NOVAQUE_BENCH_POSTGRES_URL`` / ``NOVAQUE_BENCH_MYSQL_URL``, default the local
ones) or, for SQLite, a WAL file in a temporary directory. For each workload
the floor and novaque take turns (slice by slice, or run by run for W3 and
W5), and the median of the runs is reported. W1a, W1b, W2 and W3 run for the
asyncio twin too (``--clients``, default ``sync,aio``): a third side of the
same turns, in a row of its own judged by its ratio to the floor over the
sync client's. Every workload stops itself after ``--timeout`` seconds (120)
and reports the partial counts. W9 (steady churn, ``churn.py``) runs only
when named in ``--workloads``: it takes minutes, set by its ``--w9-*`` options.
"""

from __future__ import annotations

import argparse
import functools
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

from benchmarks import churn
from benchmarks import workloads as nq
from benchmarks._common import (
    ENGINES,
    WORKLOAD_TIMEOUT_S,
    Deadline,
    Run,
    Sizes,
    latency_summary,
    median,
)
from benchmarks._databases import BACKENDS, Database
from benchmarks._procs import WorkerPool
from benchmarks.floor import Floor

#: The default set.
WORKLOADS = ("W1a", "W1b", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W10")
#: Every workload in the order they run: W9 only when asked for (it runs
#: for ten minutes by default).
ALL_WORKLOADS = ("W1a", "W1b", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "W10")
#: Workloads whose figure is measured against another workload's.
NEEDS = {"W4": "W2", "W6": "W1b", "W7": "W2", "W8": "W6", "W10": "W2"}
#: The twins: novaque.Client ("sync") and novaque.aio.AsyncClient ("aio").
CLIENTS = ("sync", "aio")
#: The workloads the asyncio twin runs too (W4-W6 have the sync client only).
TWIN_WORKLOADS = ("W1a", "W1b", "W2", "W3")
#: The twin's least ratio to the floor, as a share of the sync client's.
TWIN_TARGET = 0.9


@dataclass
class Row:
    """One line of the table: a workload on a backend for one twin, with the
    floor's runs it was interleaved with."""

    workload: str
    backend: str
    unit: str  # "msg/s" or "ms"
    client: str = "sync"  # "sync" (novaque.Client) or "aio" (novaque.aio.AsyncClient)
    novaque: list[Run] = field(default_factory=list)
    floor: list[Run] = field(default_factory=list)
    floor_label: str = ""  # what the floor column holds when it is not this workload
    figure: str = ""
    target: str = ""
    met: bool | None = None
    ratio: float | None = None
    vs_sync: float | None = None  # the twin's ratio / the sync client's (aio rows)
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
            "client": self.client,
            "unit": self.unit,
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "figure": self.figure,
            "target": self.target,
            "met": self.met,
            "partial": self.partial,
            "novaque_runs": [r.to_json() for r in self.novaque],
            "floor_runs": [r.to_json() for r in self.floor],
        }
        if self.vs_sync is not None:
            out["twin_vs_sync"] = round(self.vs_sync, 3)
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


def _timed(fn: Callable[..., object], *args: Any) -> float:
    """The seconds ``fn(*args)`` took."""
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def _rotated(sides: list[str], k: int) -> list[str]:
    """The sides in turn for slice ``k``: the first of them changes every slice."""
    k %= len(sides)
    return sides[k:] + sides[:k]


class BackendRun:
    """All selected workloads on one backend, for the selected twins."""

    def __init__(
        self,
        backend: str,
        selected: list[str],
        sizes: Sizes,
        runs: int,
        timeout: float,
        progress: Progress,
        *,
        clients: tuple[str, ...] = ("sync",),
        twin: nq.AioSide | None = None,
    ) -> None:
        self.backend = backend
        self.selected = selected
        self.sizes = sizes
        self.runs = runs
        self.timeout = timeout
        self.progress = progress
        self.clients = clients
        self.twin = twin
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
            elif w == "W3":
                n += (1 + len(self._clients(w))) * self.runs
            elif w == "W9":
                n += 1 + churn.bucket_count(self.sizes)
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
                    failed = [r for r in self.rows.values() if r.workload == workload]
                    if not failed:
                        failed = [self.rows.setdefault(workload, Row(workload, self.backend, "-"))]
                    for row in failed:
                        row.error = f"{type(exc).__name__}: {exc}"
                        row.notes.append(traceback.format_exc())
        finally:
            db.drop()
        self._judge()
        return list(self.rows.values())

    # -- helpers ---------------------------------------------------------------------

    def _clients(self, workload: str) -> tuple[str, ...]:
        return self.clients if workload in TWIN_WORKLOADS else ("sync",)

    def _rows(self, workload: str, unit: str) -> dict[str, Row]:
        """The workload's rows, one per twin it runs for ("W2", "W2 aio")."""
        rows = {}
        for client in self._clients(workload):
            key = workload if client == "sync" else f"{workload} {client}"
            rows[client] = self.rows[key] = Row(workload, self.backend, unit, client=client)
        return rows

    def _side(self, client: str) -> nq.SyncSide:
        if client == "sync":
            return nq.SYNC
        assert self.twin is not None, "the aio twin runs on BackendRun(twin=AioSide())"
        return self.twin

    @staticmethod
    def _add_runs(rows: dict[str, Row], floor: Run | None, runs: dict[str, Run]) -> None:
        """One run of every side: the floor's goes in each twin's row (the same run)."""
        for client, row in rows.items():
            if floor is not None:
                row.floor.append(floor)
            if client in runs:
                row.novaque.append(runs[client])

    def _stopped(self, rows: dict[str, Row], deadline: Deadline) -> None:
        if deadline.passed():
            for row in rows.values():
                row.notes.append(f"stopped at the {self.timeout:.0f} s limit: partial counts")

    def _pairs(
        self,
        rows: dict[str, Row],
        floor_run: Callable[[Deadline], Run] | None,
        novaque_run: Callable[[nq.SyncSide, Deadline], Run],
    ) -> None:
        """Alternate floor and novaque runs on emptied tables until done or timed out.

        Each round runs the floor, then each twin of ``rows`` in turn.
        """
        deadline = Deadline(self.timeout)
        for i in range(self.runs):
            floor = None
            workload = next(iter(rows.values())).workload
            if floor_run is not None:
                self.progress.step(f"{self.backend} {workload} floor run {i + 1}/{self.runs}")
                if not deadline.passed():
                    self.db.reset()
                    floor = floor_run(deadline)
            runs = {}
            for client in rows:
                label = "novaque" if client == "sync" else "novaque.aio"
                self.progress.step(f"{self.backend} {workload} {label} run {i + 1}/{self.runs}")
                if not deadline.passed():
                    self.db.reset()
                    runs[client] = novaque_run(self._side(client), deadline)
            self._add_runs(rows, floor, runs)
        self._stopped(rows, deadline)

    # -- workloads -------------------------------------------------------------------

    def _interleaved(
        self,
        rows: dict[str, Row],
        n: int,
        slice_size: int,
        floor_step: Callable[[Any, list[bytes]], None],
        novaque_step: Callable[[nq.Publisher, list[bytes]], float],
        *,
        channels: int = 1,
        filtered: int = 0,
    ) -> None:
        """Publishing workloads: the floor and each twin take turns slice by slice.

        A shared machine's load changes from second to second; rotating short
        slices (which side goes first changing every slice) lets every side
        meet the same conditions, which run-by-run alternation does not.
        """
        deadline = Deadline(self.timeout)
        slices = list(nq.batches(n, slice_size))
        workload = next(iter(rows.values())).workload
        for i in range(self.runs):
            self.progress.step(f"{self.backend} {workload} run {i + 1}/{self.runs}", 2)
            if deadline.passed():
                break
            self.db.reset()
            conn = self.floor.connect()
            pubs: dict[str, nq.Publisher] = {}
            steps: dict[str, Callable[[list[bytes]], float]] = {
                "floor": functools.partial(_timed, floor_step, conn)
            }
            spent = {"floor": 0.0}
            done = {"floor": 0}
            try:
                for client in rows:
                    pub = pubs[client] = nq.Publisher(
                        self.db,
                        self.sizes,
                        channels=channels,
                        filtered=filtered,
                        side=self._side(client),
                    )
                    steps[client] = functools.partial(novaque_step, pub)
                    spent[client], done[client] = 0.0, 0
                for k, chunk in enumerate(slices):
                    if deadline.passed():
                        break
                    for side in _rotated(list(steps), k):
                        spent[side] += steps[side](chunk)
                        done[side] += len(chunk)
            finally:
                conn.close()
                for pub in pubs.values():
                    pub.close()
            self._add_runs(
                rows,
                Run(done["floor"], n, spent["floor"]),
                {c: Run(done[c], n, spent[c]) for c in rows},
            )
        self._stopped(rows, deadline)

    def _w1a(self) -> None:
        s = self.sizes
        floor = self.floor

        def floor_step(conn: Any, chunk: list[bytes]) -> None:
            for data in chunk:
                floor.publish_one(conn, data)

        self._interleaved(
            self._rows("W1a", "msg/s"),
            s.w1a_messages,
            100,
            floor_step,
            lambda pub, chunk: pub.one_by_one(chunk),
        )

    def _w1b(self) -> None:
        s = self.sizes
        self._interleaved(
            self._rows("W1b", "msg/s"),
            s.w1b_messages,
            s.batch,
            self.floor.publish_batch,
            lambda pub, chunk: pub.batch(chunk),
        )

    def _drains(
        self,
        rows: dict[str, Row],
        topic: str,
        *,
        keep: bool,
        n: int | None = None,
        groups: int = 0,
        urgent: int = 0,
    ) -> None:
        """W2, W4, W7 and W10: the floor and each twin's consumer drain in turns, slice by slice.

        All queues are filled first (each twin on a topic of its own, so the
        sides never share messages); then each slice of ``n / 10`` messages
        is drained by every side in turn (which side goes first changing
        every slice), each side's clock running only during its own slices.
        ``keep`` leaves novaque's tables alone between runs (W4's backlog).
        ``n`` messages (W2's count by default), over ``groups`` groups of a
        group FIFO channel when given (W7); the last ``urgent`` published
        with a priority that puts them first (W10: where the last of them was
        handled, in the row's extra).
        """
        s = self.sizes
        n = s.w2_messages if n is None else n
        step = max(s.max_in_flight, n // 10)
        deadline = Deadline(self.timeout)
        workload = next(iter(rows.values())).workload
        for i in range(self.runs):
            self.progress.step(f"{self.backend} {workload} run {i + 1}/{self.runs}", 2)
            if deadline.passed():
                break
            if keep:
                self.db.reset(floor_only=True)
            else:
                self.db.reset()
            self.floor.fill(n)
            drains: dict[str, nq.GatedDrain] = {}
            conn = None
            spent = {"floor": 0.0}
            floor_done = 0
            extras: dict[str, dict[str, Any]] = {}
            try:
                for client in rows:
                    drains[client] = nq.GatedDrain(
                        self.db,
                        s,
                        n,
                        topic=topic if client == "sync" else f"{topic}-{client}",
                        side=self._side(client),
                        groups=groups,
                        urgent=urgent,
                    )
                    spent[client] = 0.0
                conn = self.floor.connect()
                for k, target in enumerate(range(step, n + step, step)):
                    target = min(target, n)
                    for side in _rotated(list(spent), k):
                        if deadline.passed():
                            break
                        if side == "floor":
                            started = time.perf_counter()
                            floor_done += self.floor.drain_on(
                                conn, target - floor_done, s.max_in_flight, deadline
                            )
                            spent["floor"] += time.perf_counter() - started
                        else:
                            spent[side] += drains[side].advance(target, deadline)
            finally:
                if conn is not None:
                    conn.close()
                extras = {c: drain.close() for c, drain in drains.items()}
                for c, drain in drains.items():
                    if urgent:
                        extras[c]["urgent_left"] = drain.urgent_left
                        extras[c]["last_urgent_at"] = drain.last_urgent_at
            self._add_runs(
                rows,
                Run(floor_done, n, spent["floor"]),
                {
                    c: Run(min(d.handled, n), n, spent[c], extra=extras[c])
                    for c, d in drains.items()
                },
            )
        self._stopped(rows, deadline)

    def _w2(self) -> None:
        self._drains(self._rows("W2", "msg/s"), nq.TOPIC, keep=False)

    def _w3(self) -> None:
        s = self.sizes
        self._pairs(
            self._rows("W3", "ms"),
            lambda dl: self.floor.latency(s.w3_messages, s.w3_interval_s, s.poll_interval_s, dl),
            lambda side, dl: nq.latency(self.db, s, dl, side=side),
        )

    def _w4(self) -> None:
        s = self.sizes
        rows = self._rows("W4", "msg/s")
        row = rows["sync"]
        row.floor_label = "the floor's W2 drain (no backlog), interleaved"
        self.progress.step(f"{self.backend} W4 loading {s.w4_backlog:,} dead+delayed rows")
        self.db.reset()
        loaded = nq.load_backlog(self.db, s, "backlog")
        row.notes.append(f"backlog of {s.w4_backlog:,} rows loaded in {loaded:.1f} s")
        self._drains(rows, "backlog", keep=True)

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

                def novaque_run(_: nq.SyncSide, dl: Deadline, procs: int = procs) -> Run:
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
                    self._pairs({"sync": row}, floor_run, novaque_run)
                except Exception as exc:
                    row.error = f"{type(exc).__name__}: {exc}"
                    pools[-1].close()  # its workers may be out of step: start afresh
                    pools.append(WorkerPool(max(s.w5_procs)))
        finally:
            pools[-1].close()

    def _w6(self) -> None:
        s = self.sizes
        rows = self._rows("W6", "msg/s")
        rows["sync"].floor_label = "the floor's W1b, interleaved (the floor has no fan-out)"
        self._interleaved(
            rows,
            s.w6_messages,
            s.batch,
            self.floor.publish_batch,
            lambda pub, chunk: pub.batch(chunk),
            channels=s.w6_channels,
        )

    def _w7(self) -> None:
        s = self.sizes
        rows = self._rows("W7", "msg/s")
        row = rows["sync"]
        row.floor_label = "the floor's W2 drain (no groups), interleaved"
        row.notes.append(f"{s.w7_messages:,} messages over {s.w7_groups:,} groups, group_fifo")
        self._drains(rows, nq.TOPIC, keep=False, n=s.w7_messages, groups=s.w7_groups)

    def _w9(self) -> None:
        """W9, steady churn (``churn.py``): one run, however many ``--runs``;
        ``--timeout`` bounds only the wait for the last messages after the settle."""
        s = self.sizes
        row = self.rows["W9"] = Row("W9", self.backend, "ms")
        held = "a snapshot held" if s.w9_hold else "no snapshot held"
        row.notes.append(
            f"{s.w9_rate:,} msg/s for {s.w9_minutes:g} min, {held}, then {s.w9_settle_s:g} s "
            "of settle"
        )
        self.progress.step(f"{self.backend} W9 steady churn ({s.w9_minutes:g} min, {held})")
        self.db.reset()
        outcome = churn.churn(
            self.db, s, self.timeout, lambda line: self.progress.step(f"{self.backend} {line}")
        )
        row.novaque.append(outcome.run)
        if s.w9_hold and not outcome.summary["snapshot_kept_to_the_end"]:
            row.notes.append("the held snapshot ended before the publishing did")

    def _w10(self) -> None:
        s = self.sizes
        rows = self._rows("W10", "msg/s")
        row = rows["sync"]
        row.floor_label = "the floor's W2 drain (no priorities), interleaved"
        urgent = s.w2_messages // 10
        row.notes.append(
            f"{s.w2_messages:,} messages, the last {urgent:,} published with priority "
            f"{nq.URGENT}: all of them handled among the first {urgent + 2 * s.max_in_flight:,}"
        )
        self._drains(rows, nq.TOPIC, keep=False, urgent=urgent)

    def _w8(self) -> None:
        s = self.sizes
        rows = self._rows("W8", "msg/s")
        row = rows["sync"]
        row.floor_label = "the floor's W1b, interleaved (the floor has no fan-out)"
        row.notes.append(f"{s.w8_filtered} of {s.w6_channels} channels with a CEL filter")
        self._interleaved(
            rows,
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
        for row in rows.values():
            if not row.error and row.novaque and row.floor and row.unit == "msg/s":
                row.ratio = row.rate("novaque") / row.rate("floor")
        for name, row in rows.items():
            if row.error or not row.novaque:
                continue
            if row.client != "sync":
                self._judge_twin(row, rows.get(row.workload))
            elif name == "W1a":
                row.target, row.met = "ratio >= 0.7", row.ratio is not None and row.ratio >= 0.7
            elif name in ("W1b", "W2"):
                row.target, row.met = "ratio >= 0.8", row.ratio is not None and row.ratio >= 0.8
            elif name == "W3":
                self._judge_latency(row)
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
            elif name == "W10":
                self._judge_urgent(row, rows.get("W2"))
            elif name == "W9":
                self._judge_churn(row)
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

    def _judge_urgent(self, row: Row, w2: Row | None) -> None:
        """W10: at least 0.9 of W2's ratio, and the urgent messages, published
        last, handled first (the last of them within the first tenth plus two
        consumer batches) in every run."""
        if w2 is None or w2.ratio is None or row.ratio is None:
            return
        per = row.ratio / w2.ratio
        urgent = self.sizes.w2_messages // 10
        bound = urgent + 2 * self.sizes.max_in_flight
        runs = row.novaque
        late = [r.extra.get("last_urgent_at", 0) for r in runs if r.extra.get("urgent_left")]
        last = max((r.extra.get("last_urgent_at", 0) for r in runs), default=0)
        first = not late and last <= bound
        row.figure = f"W10/W2 {per:.2f}, last urgent handled {last:,} of {self.sizes.w2_messages:,}"
        row.target, row.met = f"W10/W2 >= 0.9, urgent within {bound:,}", per >= 0.9 and first

    def _judge_churn(self, row: Row) -> None:
        """W9: the last minute's latency against the first minute's, p99 at most
        twice and p50 at most 1.3 times."""
        summary = row.novaque[0].extra["summary"]
        p99, p50 = summary["p99_ratio"], summary["p50_ratio"]
        row.target = "last/first min p99 <= 2, p50 <= 1.3"
        if p99 is None or p50 is None:
            row.figure = "no latency in the first or the last minute"
            row.met = False
            return
        row.figure = f"last/first min p99 {p99:.2f}, p50 {p50:.2f}"
        if not summary["hold"]:
            row.figure += " (no snapshot held)"
        row.met = p99 <= 2 and p50 <= 1.3

    def _judge_latency(self, row: Row) -> None:
        """W3's targets, the same for both twins."""
        lat = row.latency("novaque")
        row.figure = f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms"
        if self.backend == "postgres":
            row.target = "p50 <= 3 ms, p99 <= 10 ms"
            row.met = lat["p50_ms"] <= 3 and lat["p99_ms"] <= 10
        else:
            # Issue 13: woken by the change watcher, SQLite at least as soon as
            # huey (~12 ms), MariaDB within 5 ms.
            bound = 12 if self.backend == "sqlite" else 5
            row.target = f"p50 <= {bound} ms (the change watcher)"
            row.met = lat["p50_ms"] <= bound

    def _judge_twin(self, row: Row, sync: Row | None) -> None:
        """The twin's target: its ratio to the floor at least ``TWIN_TARGET`` of the
        sync client's (W3: the same latency targets, and p50 sync/twin shown)."""
        usable = sync is not None and not sync.error and bool(sync.novaque)
        if row.unit == "ms":
            self._judge_latency(row)
            if usable:
                assert sync is not None
                speed = sync.latency("novaque")["p50_ms"] / row.latency("novaque")["p50_ms"]
                row.figure += f"; p50 sync/twin {speed:.2f}"
            return
        if usable and sync is not None and sync.ratio and row.ratio is not None:
            row.vs_sync = row.ratio / sync.ratio
            row.figure = f"twin/sync {row.vs_sync:.2f}"
            row.target = f"twin/sync >= {TWIN_TARGET}"
            row.met = row.vs_sync >= TWIN_TARGET


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
    head = [
        "workload",
        "backend",
        "client",
        "novaque",
        "floor",
        "ratio",
        "figure",
        "target",
        "met",
    ]
    lines = []
    for row in rows:
        if row.error:
            lines.append(
                [row.workload, row.backend, row.client, "error", "-", "-", row.error[:60], "-", "-"]
            )
            continue
        met = "-" if row.met is None else ("yes" if row.met else "NO")
        if row.partial:
            met += " (partial)"
        lines.append(
            [
                row.workload,
                row.backend,
                row.client,
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
    if any(r.workload == "W9" for r in rows):
        notes.append(
            "W9 columns are p50/p95/p99 latency (publish to handler start) over the whole "
            "publishing, with no floor; its buckets follow."
        )
    if any(r.client == "aio" for r in rows):
        notes.append(
            "client aio = novaque.aio.AsyncClient, interleaved with the same floor runs as "
            "sync (novaque.Client); twin/sync = its ratio / the sync client's ratio."
        )
    if any(r.floor_label for r in rows):
        notes.append(
            "* W6's and W8's floor publishes as in W1b (it has no fan-out), W4's, W7's and "
            "W10's floor drains as in W2; W6/W1b, W4/W2, W7/W2, W8/W6 and W10/W2 are ratios of "
            "the two ratios to the floor."
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
        epilog="novaque bench broker [--help]: the network broker's benchmark. "
        "novaque bench --curves [NAMES] [--help]: cost curves drawn as PNG plots.",
    )
    parser.add_argument(
        "--backend",
        default="all",
        choices=[*BACKENDS, "all"],
        help="which database to run on (default: all)",
    )
    parser.add_argument(
        "--workloads",
        help=f"comma-separated subset of {','.join(ALL_WORKLOADS)} (default: all but W9; "
        f"{','.join(TWIN_WORKLOADS)} with --clients aio)",
    )
    parser.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help="which twins run W1a-W3: sync (novaque.Client), aio (novaque.aio.AsyncClient) "
        "or both (default: sync,aio); W4-W6 have the sync client only",
    )
    parser.add_argument(
        "--engine",
        default="connect",
        choices=ENGINES,
        help="the engine of every novaque client: connect (novaque.connect, novaque's pool "
        "and session set-up; default) or plain (sqlalchemy.create_engine(url), an "
        "application's own engine)",
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
    parser.add_argument(
        "--w9-minutes",
        type=float,
        default=Sizes.w9_minutes,
        metavar="M",
        help="W9: minutes of publishing (default 10)",
    )
    parser.add_argument(
        "--w9-rate",
        type=int,
        default=Sizes.w9_rate,
        metavar="N",
        help="W9: messages published a second, in batches every 0.1 s (default 300)",
    )
    parser.add_argument(
        "--w9-settle",
        type=float,
        default=Sizes.w9_settle_s,
        metavar="S",
        help="W9: seconds the consumer keeps going after the publishing, the snapshot "
        "closed (default 60)",
    )
    parser.add_argument(
        "--w9-bucket",
        type=float,
        default=Sizes.w9_bucket_s,
        metavar="S",
        help="W9: seconds per bucket of the report (default 30)",
    )
    parser.add_argument(
        "--w9-ttl",
        type=float,
        default=Sizes.w9_ttl_s,
        metavar="S",
        help="W9: the messages' ttl in seconds (default 0: the client's default_ttl, 7 days)",
    )
    parser.add_argument(
        "--no-hold",
        dest="hold",
        action="store_false",
        help="W9: hold no snapshot open during the publishing",
    )
    args = parser.parse_args(argv)
    clients = {c.strip().lower() for c in args.clients.split(",") if c.strip()}
    if not clients or clients - set(CLIENTS):
        parser.error(f"--clients takes {', '.join(CLIENTS)} or both, got {args.clients!r}")
    args.clients = tuple(c for c in CLIENTS if c in clients)
    if args.workloads is None:
        args.workloads = ",".join(WORKLOADS if "sync" in clients else TWIN_WORKLOADS)
    wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
    known = {w.lower(): w for w in ALL_WORKLOADS}
    unknown = [w for w in wanted if w.lower() not in known]
    if unknown:
        parser.error(
            f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(ALL_WORKLOADS)}"
        )
    chosen = {known[w.lower()] for w in wanted}
    for w, needed in NEEDS.items():
        if w in chosen:
            chosen.add(needed)  # its figure is measured against this one
    args.selected = [w for w in ALL_WORKLOADS if w in chosen]
    sync_only = [w for w in args.selected if w not in TWIN_WORKLOADS]
    if sync_only and "sync" not in clients:
        parser.error(
            f"{', '.join(sync_only)} run(s) the sync client only: add sync to --clients "
            f"or choose from {', '.join(TWIN_WORKLOADS)}"
        )
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.scale <= 0:
        parser.error("--scale must be positive")
    if args.w5_messages < 1:
        parser.error("--w5-messages must be at least 1")
    if args.w9_minutes <= 0 or args.w9_rate < 1 or args.w9_bucket <= 0:
        parser.error("--w9-minutes, --w9-rate and --w9-bucket must be positive")
    if args.w9_settle < 0 or args.w9_ttl < 0:
        parser.error("--w9-settle and --w9-ttl must not be negative")
    return args


def _curves_args(given: list[str]) -> list[str]:
    """``novaque bench``'s arguments for the cost curves: a bare ``--curves``
    (no names after it) only chose them, and is dropped."""
    out = list(given)
    at = out.index("--curves") if "--curves" in out else -1
    if at >= 0 and (at + 1 == len(out) or out[at + 1].startswith("-")):
        del out[at]
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; 0 when every backend ran, 1 when one failed.

    ``broker`` first runs the network broker's benchmark instead
    (``benchmarks/broker.py``); ``--curves [NAMES]`` anywhere, the cost curves
    (``benchmarks/curves.py``, which takes ``--curves NAMES`` itself as the
    subset to draw)."""
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["broker"]:
        from benchmarks import broker

        return broker.main(given[1:])
    if "--curves" in given or any(a.startswith("--curves=") for a in given):
        from benchmarks import curves

        return curves.main(_curves_args(given))
    args = parse_args(given)
    sizes = Sizes(
        w5_messages=args.w5_messages,
        engine=args.engine,
        w9_minutes=args.w9_minutes,
        w9_rate=args.w9_rate,
        w9_settle_s=args.w9_settle,
        w9_bucket_s=args.w9_bucket,
        w9_hold=args.hold,
        w9_ttl_s=args.w9_ttl,
    ).scaled(args.scale)
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    started = time.monotonic()
    # The twin's one event loop, on a thread of its own, for every backend.
    twin = nq.AioSide() if "aio" in args.clients else None
    plans = [
        BackendRun(
            b,
            args.selected,
            sizes,
            args.runs,
            args.timeout,
            Progress(1),
            clients=args.clients,
            twin=twin,
        )
        for b in backends
    ]
    progress = Progress(sum(p.steps() for p in plans))
    rows: list[Row] = []
    infos: list[dict[str, Any]] = []
    failed = False
    try:
        for plan in plans:
            plan.progress = progress
            try:
                rows += plan.run()
            except Exception as exc:
                failed = True
                plan.info["error"] = f"{type(exc).__name__}: {exc}"
                print(
                    f"novaque bench: {plan.backend}: {type(exc).__name__}: {exc}", file=sys.stderr
                )
            infos.append(plan.info)
    finally:
        if twin is not None:
            twin.stop()
    progress.finish()
    elapsed = time.monotonic() - started
    print(table(rows))
    for row in rows:
        if row.workload == "W9" and row.novaque:
            print("\n" + churn.report(row.backend, row.novaque[0].extra))
    print(
        f"\n{len(backends)} backend(s), {args.runs} run(s) per side, engines by "
        f"{'novaque.connect' if args.engine == 'connect' else 'sqlalchemy.create_engine'}, "
        f"{elapsed:.0f} s"
    )
    if args.json:
        report = {
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "elapsed_s": round(elapsed, 1),
            "machine": machine(),
            "runs": args.runs,
            "clients": list(args.clients),
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
        print(f"novaque bench: {r.backend} {r.workload} {r.client}: {r.error}", file=sys.stderr)
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
