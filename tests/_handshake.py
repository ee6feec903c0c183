"""How a test starts consumer processes together: each worker, subscribed,
touches ``OUT.ready`` and waits for a ``go`` file beside it; the test, once
every worker is ready, touches ``go``. A worker then runs until SIGTERM."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

#: How long a worker waits for ``go``, and a test for the workers to be ready.
WAIT = 60.0


def ready_then_go(out: Path) -> threading.Event:
    """The worker's side: the event SIGTERM sets, once ``go`` came."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    out.with_suffix(".ready").touch()
    deadline = time.monotonic() + WAIT
    while not (out.parent / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no go signal within {WAIT:g} s")
        time.sleep(0.005)
    return stop


def eventually(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Wait until ``condition()`` holds (polling another process's doing)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Started(Protocol):
    out: Path
    proc: Any


def go(workers: Sequence[Started], *, timeout: float = WAIT) -> None:
    """The test's side: start the workers' consumers together, once every one
    is subscribed (within ``timeout`` seconds)."""
    eventually(
        lambda: all(
            w.out.with_suffix(".ready").exists() or w.proc.poll() is not None for w in workers
        ),
        "the workers to subscribe",
        timeout,
    )
    assert all(w.proc.poll() is None for w in workers), "a worker died before starting"
    (workers[0].out.parent / "go").touch()
