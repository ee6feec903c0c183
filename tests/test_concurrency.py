"""Many consumers on one channel: a delivery is never leased to two at once."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
from tests import _preloaded
from tests.conftest import Backend

ROOT = Path(__file__).resolve().parent.parent


def test_eight_threads_share_a_channel_without_double_leasing(backend: Backend) -> None:
    client = backend.client()
    client.ensure_channel("load", "workers")
    for start in range(0, 2000, 500):
        client.publish_many("load", [f"m{i}" for i in range(start, start + 500)])
    claimed: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            while got := client.claim("load", "workers", max_messages=10, lease=120):
                with lock:
                    claimed.extend(m.delivery_id for m in got)
                assert client.ack_many(got) == []
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    twice = [d for d, n in Counter(claimed).items() if n > 1]
    assert twice == []
    assert len(claimed) == 2000


def test_publishers_and_consumers_at_once_lose_nothing(backend: Backend) -> None:
    client = backend.client()
    client.ensure_channel("mix", "a")
    client.ensure_channel("mix", "b")
    published: list[int] = []
    consumed: dict[str, list[int]] = {"a": [], "b": []}
    lock = threading.Lock()
    errors: list[BaseException] = []
    producing = threading.Event()
    producing.set()

    def produce(n: int) -> None:
        try:
            for i in range(n):
                ids = (
                    client.publish_many("mix", [b"x"] * 5)
                    if i % 2
                    else [client.publish("mix", b"y")]
                )
                with lock:
                    published.extend(ids)
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    def consume(channel: str) -> None:
        try:
            while True:
                got = client.claim("mix", channel, max_messages=7, lease=120)
                if not got and not producing.is_set():
                    got = client.claim("mix", channel, max_messages=7, lease=120)
                    if not got:
                        return
                with lock:
                    consumed[channel].extend(m.id for m in got)
                assert client.ack_many(got) == []
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    producers = [threading.Thread(target=produce, args=(60,)) for _ in range(4)]
    consumers = [threading.Thread(target=consume, args=(c,)) for c in "aabb"]
    for t in producers + consumers:
        t.start()
    for t in producers:
        t.join(timeout=120)
    producing.clear()
    for t in consumers:
        t.join(timeout=120)
    assert errors == []
    assert len(published) == 4 * 30 * 6
    for channel in "ab":
        assert sorted(consumed[channel]) == sorted(published)


@pytest.mark.slow
def test_three_processes_share_a_channel_without_double_leasing(
    backend: Backend, tmp_path: Path
) -> None:
    client = backend.client()
    client.ensure_channel("load", "workers")
    # Enough work that the others get in: on SQLite a waiting process sleeps
    # in the busy handler while the lock holder may take the lock again.
    total = 4000
    for start in range(0, total, 500):
        client.publish_many("load", [f"m{i}" for i in range(start, start + 500)])
    outs = [tmp_path / f"worker{i}.txt" for i in range(3)]
    procs = [
        _preloaded.popen(
            [
                "-m",
                "tests.workers",
                "claim",
                backend.url,
                "load",
                "workers",
                str(out),
                "connect" if i == 0 else "plain",
            ],
            cwd=ROOT,
        )
        for i, out in enumerate(outs)
    ]
    start_together(procs, outs)
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    claimed = [int(line) for out in outs for line in out.read_text().split()]
    assert [d for d, n in Counter(claimed).items() if n > 1] == []
    assert len(claimed) == total
    # they really competed (SQLite's busy handler may starve one of them)
    assert sum(bool(out.read_text()) for out in outs) >= 2


def start_together(procs: list[subprocess.Popen[bytes]], outs: list[Path]) -> None:
    """Release the worker processes at once, when all of them are ready."""
    deadline = time.monotonic() + 60
    while not all(out.with_suffix(".ready").exists() for out in outs):
        assert all(p.poll() is None for p in procs), "a worker died before starting"
        assert time.monotonic() < deadline, "workers not ready within 60 s"
        time.sleep(0.01)
    (outs[0].parent / "go").touch()


def test_the_applications_sqlite_engine_is_left_as_it_was(tmp_path: Path) -> None:
    """SQLite only: novaque's BEGIN IMMEDIATE set-up stays on its own engine."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    client = novaque.Client(engine)
    client.migrate()
    client.publish("t", b"x")
    assert not sa.event.contains(engine, "begin", novaque.dialects.engines.configure_sqlite)
    with engine.connect() as conn:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        assert dbapi.isolation_level == ""  # the sqlite3 module's default, untouched
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 0
    assert client._context.executor.engine is not engine
