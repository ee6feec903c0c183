"""Consumers in several OS processes, killed processes, and a database that goes away.

The consumer processes run ``tests/runtime_workers.py``. Conditions are
awaited by polling them with a deadline, never by sleeping a fixed time.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
from novaque.schema import deliveries
from tests import _preloaded
from tests._handshake import go
from tests.conftest import Backend, kill_other_sessions
from tests.test_consumer import WAIT, Recorder, waited

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def eventually(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def live_deliveries(backend: Backend) -> int:
    engine = sa.create_engine(backend.url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(sa.select(sa.func.count()).select_from(deliveries)).scalar_one()
            )
    finally:
        engine.dispose()


class Worker:
    """One consumer process of ``tests.runtime_workers``."""

    def __init__(self, backend: Backend, out: Path, **flags: object) -> None:
        self.out = out
        args = ["-m", "tests.runtime_workers", backend.url, "t", "c", str(out)]
        for name, value in flags.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        self.proc = _preloaded.popen(args, cwd=ROOT)

    def lines(self) -> list[list[str]]:
        if not self.out.exists():
            return []
        text = self.out.read_text()
        complete = text[: text.rfind("\n") + 1]  # a killed process may leave half a line
        return [line.split() for line in complete.splitlines()]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=WAIT)


def test_sigkill_mid_handler_loses_nothing(
    backend: Backend, tmp_path: Path, workers: list[Worker]
) -> None:
    client = backend.client()
    client.ensure_channel("t", "c")
    # The worker handles the first 30, then its 4 workers hang on the "hang"
    # messages (the 6 after them are handled by whichever workers are free).
    ids = client.publish_many("t", [f"ok {i}" for i in range(30)])
    hung = client.publish_many("t", [f"hang {i}" for i in range(4)])
    ids += hung + client.publish_many("t", [f"ok {i}" for i in range(30, 36)])
    worker = Worker(backend, tmp_path / "killed.txt", max_in_flight=4, lease=1.0)
    workers.append(worker)
    go(workers)

    def hanging() -> set[int]:
        return {int(f[3]) for f in worker.lines() if f[0] == "S" and int(f[3]) in hung}

    eventually(lambda: hanging() == set(hung), "the 4 handlers to hang")
    worker.stop(signal.SIGKILL)
    finished = {int(f[3]) for f in worker.lines() if f[0] == "E"}
    assert not finished & set(hung)

    # A fresh consumer gets what the dead process held, once its leases expire.
    handler = Recorder()
    consumer = client.subscribe_and_start("t", "c", handler, max_in_flight=4, poll_interval=0.05)
    eventually(lambda: live_deliveries(backend) == 0, "every message to be settled")
    consumer.shutdown()
    recovered = set(handler.ids())
    assert set(hung) <= recovered
    assert finished | recovered == set(ids)


def test_three_processes_compete_without_double_leasing(
    backend: Backend, tmp_path: Path, workers: list[Worker]
) -> None:
    client = backend.client()
    client.ensure_channel("t", "c")
    ids: list[int] = []
    for start in range(0, 3000, 500):
        ids += client.publish_many("t", [f"m{i}" for i in range(start, start + 500)])
    workers += [Worker(backend, tmp_path / f"worker{i}.txt", max_in_flight=4) for i in range(3)]
    go(workers)
    eventually(lambda: live_deliveries(backend) == 0, "3,000 messages to be settled")
    for worker in workers:
        worker.stop(signal.SIGTERM)
        assert worker.proc.returncode == 0

    spans: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    handled_by: Counter[int] = Counter()
    message_of: dict[str, int] = {}
    for n, worker in enumerate(workers):
        for kind, delivery, token, message, at in worker.lines():
            spans[(delivery, token)][kind] = int(at)
            message_of[delivery] = int(message)
            if kind == "S":
                handled_by[n] += 1
    assert sorted(message_of.values()) == sorted(ids)
    assert all(set(span) == {"S", "E"} for span in spans.values())
    by_delivery: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (delivery, _token), span in spans.items():
        by_delivery[delivery].append((span["S"], span["E"]))
    overlaps = [
        d
        for d, runs in by_delivery.items()
        if any(a[1] > b[0] for a, b in zip(sorted(runs), sorted(runs)[1:], strict=False))
    ]
    assert overlaps == []
    # With 30 s leases nothing expired: every delivery was handled exactly once.
    assert all(len(runs) == 1 for runs in by_delivery.values())
    assert len([n for n in handled_by.values() if n]) >= 2, handled_by


def test_three_processes_keep_each_group_in_order_one_at_a_time(
    backend: Backend, tmp_path: Path, workers: list[Worker]
) -> None:
    """3 processes x 4 workers over a group FIFO channel of 200 groups x 20
    messages: each group's messages are handled in order, one at a time."""
    client = backend.client()
    client.ensure_channel("t", "c", ordering="group_fifo")
    position: dict[int, tuple[int, int]] = {}  # message id: (group, sequence)
    for first in range(0, 200, 10):
        # Each group's 20 messages side by side: without ordering, free
        # workers would take several of one group at once.
        batch = [(g, seq) for g in range(first, first + 10) for seq in range(20)]
        ids = client.publish_many(
            "t", [f"g{g}:{seq}" for g, seq in batch], groups=[f"g{g}" for g, _ in batch]
        )
        position.update(zip(ids, batch, strict=True))
    workers += [Worker(backend, tmp_path / f"worker{i}.txt", max_in_flight=4) for i in range(3)]
    go(workers)
    eventually(lambda: live_deliveries(backend) == 0, "4,000 messages to be settled", 300)
    for worker in workers:
        worker.stop(signal.SIGTERM)
        assert worker.proc.returncode == 0

    spans: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    message_of: dict[tuple[str, str], int] = {}
    busy: Counter[int] = Counter()
    for n, worker in enumerate(workers):
        for kind, delivery, token, message, at in worker.lines():
            spans[(delivery, token)][kind] = int(at)
            message_of[(delivery, token)] = int(message)
            busy[n] += kind == "S"
    assert all(set(span) == {"S", "E"} for span in spans.values())
    runs: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # group: (start, end, seq)
    for key, span in spans.items():
        group, seq = position[message_of[key]]
        runs[group].append((span["S"], span["E"], seq))
    assert sorted(runs) == list(range(200))
    for group, handled in runs.items():
        handled.sort()
        assert [seq for _, _, seq in handled] == list(range(20)), group
        overlapping = [(a, b) for a, b in itertools.pairwise(handled) if a[1] > b[0]]
        assert overlapping == [], group
    assert len([n for n in busy.values() if n]) >= 2, busy


def _restart_postgres() -> None:
    version = os.listdir("/etc/postgresql")[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        timeout=120,
    )


def _ensure_postgres_up() -> None:
    version = os.listdir("/etc/postgresql")[0]
    up = subprocess.run(["pg_isready", "-h", "127.0.0.1", "-q"], check=False).returncode == 0
    if not up:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
            check=False,
            timeout=120,
        )
    eventually(
        lambda: (
            subprocess.run(["pg_isready", "-h", "127.0.0.1", "-q"], check=False).returncode == 0
        ),
        "PostgreSQL to accept connections",
        timeout=120,
    )


def _consume_through(backend: Backend, disrupt: Callable[[], None]) -> dict[str, int]:
    """Publish 200 messages around ``disrupt()``; every one must be handled."""
    client = backend.client()
    client.ensure_channel("t", "c")
    ids = client.publish_many("t", [f"before {i}" for i in range(100)])
    handler = Recorder(lambda msg: time.sleep(0.002))
    consumer = client.subscribe_and_start(
        "t", "c", handler, max_in_flight=4, lease=2.0, poll_interval=0.05
    )
    waited(consumer._signals.wait("acked", 30, WAIT), "the first acks")
    disrupt()
    # Publish from a fresh engine: the client's own connections died too.
    producer = novaque.Client(sa.create_engine(backend.url, poolclass=sa.NullPool))
    ids += producer.publish_many("t", [f"after {i}" for i in range(100)])
    eventually(lambda: live_deliveries(backend) == 0, "all 200 messages to be settled")
    assert set(handler.ids()) == set(ids)
    consumer.shutdown()
    producer.engine.dispose()
    return consumer._signals.snapshot()


@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)  # servers only
def test_consumer_resumes_after_its_connections_are_dropped(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    dropped = threading.Event()

    def disrupt() -> None:
        assert kill_other_sessions(backend) >= 1
        dropped.set()

    signals = _consume_through(backend, disrupt)
    assert dropped.is_set()
    # The drop was noticed (and survived): by the consumer's threads, or, when
    # the kill caught a connection between two statements, by the pool, whose
    # reset on return failed and replaced it before anyone used it again.
    errors = sum(signals.get(k, 0) for k in ("claim_errors", "settle_errors", "renew_errors"))
    if errors:
        assert "error while claiming" in caplog.text or "could not ack" in caplog.text
    else:
        assert "Exception during reset" in caplog.text, signals


@pytest.mark.serial  # alone: every other test of the session waits (tests/_serial.py)
@pytest.mark.skipif(
    not os.environ.get("NOVAQUE_TEST_PG_RESTART"),
    reason="set NOVAQUE_TEST_PG_RESTART=1 to restart the shared PostgreSQL server (CI does)",
)
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_consumer_resumes_after_a_postgres_restart(backend: Backend) -> None:
    try:
        signals = _consume_through(backend, _restart_postgres)
    finally:
        _ensure_postgres_up()
    assert signals.get("claim_errors", 0) + signals.get("settle_errors", 0) >= 1
