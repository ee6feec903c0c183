"""What the floor and the workloads share: sizes, deadlines, bodies, results."""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

#: Every body is this long (BENCHMARKS.md).
BODY_BYTES = 200
#: How a run's clients get their engine (``Sizes.engine``, ``--engine``).
ENGINES = ("connect", "plain")
#: Each workload stops itself after this many seconds and reports what it did.
WORKLOAD_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Sizes:
    """How much work each workload does (the defaults are BENCHMARKS.md's), and
    on which engine."""

    w1a_messages: int = 2_000
    w1b_messages: int = 20_000
    batch: int = 500
    w2_messages: int = 20_000
    max_in_flight: int = 10
    w3_messages: int = 300
    w3_interval_s: float = 0.010
    poll_interval_s: float = 0.2
    w4_backlog: int = 1_000_000
    #: BENCHMARKS.md drains 40,000; 10,000 by default so that ``--backend all``
    #: (18 drains per backend) ends within 10 minutes on a 2-core machine.
    w5_messages: int = 10_000
    w5_procs: tuple[int, ...] = (1, 2, 4)
    w6_messages: int = 20_000
    w6_channels: int = 5
    #: W7: a group FIFO drain (issue 11), W2's consumer over this many groups.
    w7_messages: int = 20_000
    w7_groups: int = 1_000
    #: W8: W6's publish with this many of its channels filtered (CEL).
    w8_filtered: int = 4
    #: W9: steady churn (``churn.py``), not part of the default set: a publish
    #: rate held for minutes while one snapshot stays open, then a settle.
    #: Timed, so ``scaled`` leaves it alone.
    w9_minutes: float = 10.0
    w9_rate: int = 300
    w9_settle_s: float = 60.0
    w9_bucket_s: float = 30.0
    w9_hold: bool = True
    #: The messages' ``ttl`` (0: the client's ``default_ttl``, 7 days).
    w9_ttl_s: float = 0.0
    #: Not a size: the engine every novaque client of the run is built on,
    #: ``"connect"`` (``novaque.connect``: novaque's pool and session set-up)
    #: or ``"plain"`` (``sqlalchemy.create_engine(url)``, an application's own
    #: engine shared with novaque, as ``bench-peers`` drives it). Here because
    #: it travels with the sizes to W5's worker processes.
    engine: str = "connect"

    def scaled(self, factor: float) -> Sizes:
        """The same workloads with every message count multiplied by ``factor``."""
        if factor == 1:
            return self

        def n(value: int, least: int) -> int:
            return max(least, round(value * factor))

        return replace(
            self,
            w1a_messages=n(self.w1a_messages, 10),
            w1b_messages=n(self.w1b_messages, 20),
            batch=min(self.batch, n(self.w1b_messages, 20)),
            w2_messages=n(self.w2_messages, 20),
            w3_messages=n(self.w3_messages, 10),
            w4_backlog=n(self.w4_backlog, 100),
            w5_messages=n(self.w5_messages, 40),
            w6_messages=n(self.w6_messages, 20),
            w7_messages=n(self.w7_messages, 20),
            w7_groups=n(self.w7_groups, 2),
        )


class Deadline:
    """A point in time after which a workload stops and reports partial counts."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.seconds = seconds

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() >= self.at


@dataclass
class Run:
    """One measured run of one side (novaque or floor) of one workload."""

    done: int  # messages published or handled
    expected: int
    seconds: float
    latencies_ms: list[float] | None = None  # W3 only
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return self.done < self.expected

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "done": self.done,
            "expected": self.expected,
            "seconds": round(self.seconds, 4),
            "partial": self.partial,
        }
        if self.latencies_ms is None:
            out["msgs_per_s"] = round(self.rate, 1)
        else:
            out.update({k: round(v, 3) for k, v in latency_summary(self.latencies_ms).items()})
        out.update(self.extra)
        return out


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile ``p`` (0-100) of ``values``."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_summary(latencies_ms: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(latencies_ms, 50),
        "p95_ms": percentile(latencies_ms, 95),
        "p99_ms": percentile(latencies_ms, 99),
    }


_FILL = bytes(range(256)) * 2


def body(i: int = 0) -> bytes:
    """A 200-byte body (its first 8 bytes vary with ``i``)."""
    return struct.pack("<q", i) + _FILL[: BODY_BYTES - 8]


def stamped_body() -> bytes:
    """A 200-byte body carrying the moment it was made (``time.perf_counter``).

    ``perf_counter`` is CLOCK_MONOTONIC on Linux: the same clock in every
    process of the machine, so a consumer in another process can read it.
    """
    return struct.pack("<d", time.perf_counter()) + _FILL[: BODY_BYTES - 8]


def age_ms(stamped: bytes) -> float:
    """Milliseconds since :func:`stamped_body` made ``stamped``."""
    return (time.perf_counter() - struct.unpack_from("<d", stamped)[0]) * 1000.0
