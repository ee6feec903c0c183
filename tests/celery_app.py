"""The Celery application of tests/test_kombu.py, and the tasks its workers run.

A worker process is ``celery -A tests.celery_app worker`` with the broker URL,
the lease and a folder in the environment (``NOVAQUE_CELERY_*``). Tasks leave
their traces as files in that folder: one file per event, written whole
(rename), so the test reads a trace or nothing, never half of one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery, Task

import novaque.kombu  # noqa: F401  (registers the transport)


def make_app(broker_url: str, out: str, lease: float = 30.0) -> Celery:
    app = Celery("novaque_tests", broker=broker_url, set_as_current=False)
    app.conf.update(
        broker_transport_options={"lease": lease, "polling_interval": 0.05},
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        task_default_queue="celery",
    )
    folder = Path(out)

    def trace(name: str, text: str = "") -> None:
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        tmp.rename(folder / name)

    @app.task(name="tests.add")
    def add(x: int, y: int, tag: str) -> int:
        trace(f"add-{tag}", f"{x + y} {os.getpid()}")
        return x + y

    @app.task(name="tests.flaky", bind=True, max_retries=5)
    def flaky(self: Task[Any, Any], tag: str, failures: int) -> None:
        trace(f"flaky-{tag}-try{self.request.retries}")
        if self.request.retries < failures:
            raise self.retry(countdown=0.3)
        trace(f"flaky-{tag}-done", str(self.request.retries))

    @app.task(name="tests.stamp")
    def stamp(tag: str) -> None:
        trace(f"stamp-{tag}", repr(time.time()))

    @app.task(name="tests.hang", acks_late=True)
    def hang(tag: str) -> None:
        """Hold the task until ``release`` exists (at most a minute)."""
        trace(f"hang-{tag}-started-{os.getpid()}")
        deadline = time.monotonic() + 60
        while not (folder / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        trace(f"hang-{tag}-done-{os.getpid()}")

    return app


if "NOVAQUE_CELERY_BROKER" in os.environ:
    app = make_app(
        os.environ["NOVAQUE_CELERY_BROKER"],
        os.environ["NOVAQUE_CELERY_OUT"],
        float(os.environ.get("NOVAQUE_CELERY_LEASE", "30")),
    )
