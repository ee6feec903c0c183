"""The cost curves' drawings (matplotlib, Agg: files only, no display), and
the reader of a W9 result to draw.

matplotlib is in the ``bench`` extra (``pip install -e '.[bench]'``), not a
dependency of novaque: it is imported here only, when a drawing is made.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: How each backend is named and drawn on every plot.
LABELS = {"sqlite": "SQLite", "postgres": "PostgreSQL", "mysql": "MariaDB"}
COLOURS = {"sqlite": "tab:blue", "postgres": "tab:green", "mysql": "tab:orange"}
MARKERS = {"sqlite": "o", "postgres": "s", "mysql": "^"}


@dataclass(frozen=True)
class Stamp:
    """What every drawing says it was measured on, when, and from which commit."""

    host: str
    cores: int
    cpu: str
    date: str  # UTC, minutes
    commit: str  # short hash, "+dirty" when tracked files differ from it
    scale: float = 1.0

    def text(self) -> str:
        cpu = f", {self.cpu}" if self.cpu else ""
        scaled = "" if self.scale == 1 else f" · scale {self.scale:g} (not the full sizes)"
        return (
            f"{self.host}: {self.cores} CPUs{cpu} · {self.date} UTC · novaque {self.commit}{scaled}"
        )


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_curve(
    path: Path,
    *,
    title: str,
    x_label: str,
    y_label: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    stamp: Stamp,
    log_x: int | None = None,
    legend: Mapping[str, str] | None = None,
) -> Path:
    """One curve per backend (``series``: backend -> [(x, y)]), the x values as
    ticks; ``log_x`` the base of a logarithmic x axis (the x values grow by
    factors). ``legend`` may name a backend's line otherwise (what is counted
    on it). Points whose y is NaN (a run that failed) are left out."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    xs: set[float] = set()
    for backend, points in series.items():
        kept = [(x, y) for x, y in points if not math.isnan(y)]
        if not kept:
            continue
        xs.update(x for x, _ in kept)
        ax.plot(
            [x for x, _ in kept],
            [y for _, y in kept],
            marker=MARKERS.get(backend, "o"),
            color=COLOURS.get(backend),
            label=(legend or {}).get(backend, LABELS.get(backend, backend)),
        )
    if log_x:
        ax.set_xscale("log", base=log_x)
    if xs:
        ticks = sorted(xs)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{x:,.0f}" for x in ticks])
        ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    _finish(fig, plt, path, stamp)
    return path


def _finish(fig: Any, plt: Any, path: Path, stamp: Stamp, more: str = "") -> None:
    fig.text(0.01, 0.01, stamp.text() + more, fontsize=7, color="0.35", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


# -- W9 -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    """One bucket of W9: its start (seconds since W9 began) and the latencies
    of the messages published in it."""

    t: float
    p50_ms: float
    p99_ms: float


_SHAPE = (
    'a "novaque bench --workloads W9 --json" report, or an object of backends, each a '
    'list of {"t": seconds, "p50_ms": ..., "p99_ms": ...}'
)


def read_w9(*paths: str | Path) -> dict[str, list[Bucket]]:
    """W9's latency over time, by backend, from one or more JSON files (one
    each when the backends ran apart), each either

    - the report ``novaque bench --workloads W9 --json PATH`` writes: the W9
      rows of its ``results``, their run's ``buckets`` (``t0_s``, ``p50_ms``,
      ``p99_ms``; buckets of the settle, where nothing was published, have no
      latency and are left out); or
    - this shape, optionally inside an object under ``"w9"``::

        {"sqlite":   [{"t": 0, "p50_ms": 3.1, "p99_ms": 9.8},
                      {"t": 30, "p50_ms": 3.0, "p99_ms": 11.2}, ...],
         "postgres": [...],
         "mysql":    [...]}

      ``t`` the bucket's start in seconds since W9 began; other keys of a
      bucket are ignored; a backend may be missing.

    A backend in two files is refused, and so is a file of another shape,
    with a ``ValueError`` that says what is wrong.
    """
    out: dict[str, list[Bucket]] = {}
    for path in paths:
        for backend, buckets in _read_one(Path(path)).items():
            if backend in out:
                raise ValueError(f"{path}: W9 on {backend} is in another file too")
            out[backend] = buckets
    return out


def _read_one(path: Path) -> dict[str, list[Bucket]]:
    raw = json.loads(path.read_text())
    if isinstance(raw, dict) and isinstance(raw.get("results"), list):
        rows = [r for r in raw["results"] if isinstance(r, dict) and r.get("workload") == "W9"]
        if not rows:
            raise ValueError(f"{path}: a benchmark report without W9 in it")
        by_backend = {}
        for row in rows:
            runs = row.get("novaque_runs") or [{}]
            by_backend[str(row.get("backend"))] = runs[0].get("buckets")
        raw = by_backend
    elif isinstance(raw, dict) and isinstance(raw.get("w9"), dict):
        raw = raw["w9"]
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected {_SHAPE}")
    out: dict[str, list[Bucket]] = {}
    for backend, buckets in raw.items():
        if backend not in LABELS:
            raise ValueError(f"{path}: unknown backend {backend!r}; expected {', '.join(LABELS)}")
        if not isinstance(buckets, list):
            raise ValueError(f"{path}: {backend}: expected a list of buckets")
        read = []
        for i, bucket in enumerate(buckets):
            try:
                t = bucket["t"] if "t" in bucket else bucket["t0_s"]
                if bucket["p50_ms"] is None and bucket["p99_ms"] is None:
                    continue  # nothing published in it (W9's settle)
                read.append(Bucket(float(t), float(bucket["p50_ms"]), float(bucket["p99_ms"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(
                    f"{path}: {backend}, bucket {i}: expected numbers t, p50_ms and p99_ms "
                    f"({type(exc).__name__}: {exc})"
                ) from None
        out[backend] = sorted(read, key=lambda b: b.t)
    return out


def draw_w9(path: Path, w9: Mapping[str, Sequence[Bucket]], stamp: Stamp, source: str = "") -> Path:
    """p50 (solid) and p99 (dashed) of each backend against time since W9 began
    (minutes when it ran more than 10 minutes); the y axis logarithmic when
    the values span more than two decades. ``source``, the file W9's figures
    were read from, goes in the footer: the stamp is the drawing's, and W9
    may have run elsewhere."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    longest = max((b.t for buckets in w9.values() for b in buckets), default=0.0)
    minutes = longest > 600
    unit = 60.0 if minutes else 1.0
    values: list[float] = []
    for backend, buckets in w9.items():
        if not buckets:
            continue
        ts = [b.t / unit for b in buckets]
        name = LABELS.get(backend, backend)
        colour = COLOURS.get(backend)
        ax.plot(ts, [b.p50_ms for b in buckets], color=colour, label=f"{name} p50")
        ax.plot(ts, [b.p99_ms for b in buckets], color=colour, linestyle="--", label=f"{name} p99")
        values += [b.p50_ms for b in buckets] + [b.p99_ms for b in buckets]
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 100:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_title("W9: latency over time (publish to handler start)")
    ax.set_xlabel("minutes since the start" if minutes else "seconds since the start")
    ax.set_ylabel("publish to handler, ms")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(ncol=3, fontsize=8)
    _finish(fig, plt, path, stamp, f" · drawn from {source}" if source else "")
    return path
