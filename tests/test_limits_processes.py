"""Channel limits under four competing consumer processes (DESIGN §12): what
the database says is leased, sampled while they run, never exceeds the limit,
nor do the handlers running at once (their spans, on the machine's one
monotonic clock).

The consumer processes run ``tests/runtime_workers.py``; conditions are
awaited by polling them with a deadline.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import sqlalchemy as sa

from novaque.schema import STATE_LEASED, deliveries, messages
from tests._handshake import go
from tests.conftest import Backend
from tests.test_consumer_processes import Worker, eventually, live_deliveries

pytestmark = pytest.mark.slow

PROCESSES = 4


class Sampler:
    """Samples, on a thread of its own, what is leased: in all, and per group."""

    def __init__(self, backend: Backend) -> None:
        self.engine = sa.create_engine(backend.url, poolclass=sa.NullPool)
        self.most = 0
        self.most_per_group = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        by_group = (
            sa.select(messages.c.group_key, sa.func.count())
            .join_from(deliveries, messages, messages.c.id == deliveries.c.message_id)
            .where(deliveries.c.state == STATE_LEASED)
            .group_by(messages.c.group_key)
        )
        with self.engine.connect() as conn:
            while not self._stop.is_set():
                counts = {key: int(n) for key, n in conn.execute(by_group)}
                conn.rollback()  # a fresh snapshot each time
                self.most = max(self.most, sum(counts.values()))
                grouped = [n for key, n in counts.items() if key is not None]
                self.most_per_group = max([self.most_per_group, *grouped])
                self.samples += 1
                self._stop.wait(0.002)  # (the machine's cores are the consumers')

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.engine.dispose()


def most_at_once(spans: list[tuple[int, int]]) -> int:
    """The most of ``spans`` (start, end) that overlap at one moment."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def run_workers(backend: Backend, tmp_path: Path, workers: list[Worker]) -> Sampler:
    # Two workers each: more than the limit in all, so processes share it.
    workers += [
        Worker(backend, tmp_path / f"worker{i}.txt", max_in_flight=2, handle_ms=3)
        for i in range(PROCESSES)
    ]
    sampler = Sampler(backend)
    try:
        go(workers)
        eventually(lambda: live_deliveries(backend) == 0, "every message to be settled")
    finally:
        sampler.stop()
    for worker in workers:
        worker.stop(signal.SIGTERM)
        assert worker.proc.returncode == 0
    return sampler


def spans_of(workers: list[Worker]) -> tuple[dict[int, tuple[int, int]], Counter[int]]:
    """Each message's handler span, and how many messages each process handled."""
    found: dict[int, dict[str, int]] = defaultdict(dict)
    handled: Counter[int] = Counter()
    for n, worker in enumerate(workers):
        for kind, _delivery, _token, message, at in worker.lines():
            found[int(message)][kind] = int(at)
            handled[n] += kind == "S"
    return {m: (span["S"], span["E"]) for m, span in found.items()}, handled


def test_four_processes_never_lease_more_than_max_leased(
    backend: Backend, tmp_path: Path, workers: list[Worker]
) -> None:
    client = backend.client()
    client.ensure_channel("t", "c", max_leased=3)
    ids = client.publish_many("t", [f"m{i}" for i in range(150)])
    sampler = run_workers(backend, tmp_path, workers)
    spans, handled = spans_of(workers)
    assert sorted(spans) == sorted(ids)  # each handled once: nothing expired
    assert sampler.samples > 10
    assert sampler.most <= 3
    assert most_at_once(list(spans.values())) <= 3
    assert len([n for n in handled.values() if n]) >= 2, handled


def test_four_processes_never_lease_more_than_group_max_leased(
    backend: Backend, tmp_path: Path, workers: list[Worker]
) -> None:
    client = backend.client()
    client.ensure_channel("t", "c", group_max_leased=2)
    groups = [f"g{i % 3}" if i % 4 else None for i in range(120)]
    ids = client.publish_many("t", [b"x"] * len(groups), groups=groups)
    group_of = dict(zip(ids, groups, strict=True))
    sampler = run_workers(backend, tmp_path, workers)
    spans, _ = spans_of(workers)
    assert sorted(spans) == sorted(ids)
    assert sampler.most_per_group <= 2
    per_group: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for message, span in spans.items():
        if group_of[message] is not None:
            per_group[str(group_of[message])].append(span)
    assert max(most_at_once(found) for found in per_group.values()) <= 2
    # The ungrouped ones are not limited: more of them ran at once.
    ungrouped = [span for m, span in spans.items() if group_of[m] is None]
    assert most_at_once(ungrouped) >= 1
