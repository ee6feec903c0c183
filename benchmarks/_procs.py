"""W5: several consumer processes drain one channel (and the cost curves' idle ones).

A pool of worker processes (``spawn``: each a fresh interpreter, nothing
inherited) is started once per backend and reused by every W5 run, so process
start-up and imports stay outside the measurements. For each run the parent
tells ``k`` workers what to consume; each one connects, says it is ready, waits
for the common start signal and consumes until told to stop. Handled messages
are counted in one shared counter, which the parent watches.

The cost curves (``curves.py``) use the same pool for their idle processes
(:meth:`WorkerPool.idle`): each one starts a client with a consumer waiting on
an empty channel and stays idle while the parent counts what they send.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from benchmarks._common import Deadline, Run, Sizes

#: How long a worker may take to connect before the run is abandoned.
READY_TIMEOUT_S = 60.0


def _worker(pipe: Connection, counter: Any, go: Any, stop: Any) -> None:
    while True:
        command = pipe.recv()
        if command[0] == "quit":
            return
        try:
            _, kind, backend, url, sizes = command
            if kind == "floor":
                _floor_worker(pipe, counter, go, stop, backend, url, sizes)
            elif kind == "idle":
                _idle_worker(pipe, go, stop, backend, url)
            else:
                _novaque_worker(pipe, counter, go, stop, backend, url, sizes)
        except BaseException:
            pipe.send(("error", traceback.format_exc()))


def _add(counter: Any, n: int) -> None:
    with counter.get_lock():
        counter.value += n


def _floor_worker(
    pipe: Connection, counter: Any, go: Any, stop: Any, backend: str, url: str, sizes: Sizes
) -> None:
    from benchmarks._databases import Database
    from benchmarks.floor import Floor

    floor = Floor(Database(backend, url))
    conn = floor.connect()
    try:
        pipe.send(("ready",))
        go.wait()
        done = 0
        while not stop.is_set():
            rows = floor.claim(conn, sizes.max_in_flight)
            if not rows:
                time.sleep(0.001)
                continue
            floor.ack(conn, [r[0] for r in rows])
            done += len(rows)
            _add(counter, len(rows))
    finally:
        conn.close()
    pipe.send(("done", done))


def _novaque_worker(
    pipe: Connection, counter: Any, go: Any, stop: Any, backend: str, url: str, sizes: Sizes
) -> None:
    import novaque
    from benchmarks._databases import Database, close_client
    from benchmarks.workloads import CHANNEL, TOPIC, make_client, start_consumer

    client = make_client(Database(backend, url), sizes)
    done = 0

    def handler(msg: novaque.Message) -> None:
        nonlocal done
        done += 1
        _add(counter, 1)

    try:
        client.ensure_channel(TOPIC, CHANNEL)  # warm: schema check, connections
        pipe.send(("ready",))
        go.wait()
        consumer = start_consumer(client, handler, sizes)
        stop.wait()
        consumer.shutdown(timeout=10)
    finally:
        close_client(client)
    pipe.send(("done", done))


def _idle_worker(pipe: Connection, go: Any, stop: Any, backend: str, url: str) -> None:
    """A started client (``novaque.connect`` with its defaults, maintenance
    running) with one consumer waiting on the empty channel ``benchmarks.idle``
    declares; on SQLite it counts the statements of its own connections from
    ``go`` to ``stop`` (``sqlite3``'s trace: another process's statements
    cannot be seen from the parent) and reports them."""
    import novaque
    from benchmarks.idle import CHANNEL, TOPIC, Traced

    traced = Traced() if backend == "sqlite" else None
    counted = 0
    try:
        client = novaque.connect(url)
        try:
            client.start()
            client.subscribe_and_start(TOPIC, CHANNEL, lambda msg: None)
            pipe.send(("ready",))
            go.wait()
            first = traced.counts()[0] if traced is not None else 0
            stop.wait()
            counted = (traced.counts()[0] if traced is not None else 0) - first
        finally:
            client.shutdown()
    finally:
        if traced is not None:
            traced.close()
    pipe.send(("done", counted))


def _counts(pipes: list[Connection], who: str) -> list[int]:
    """What each worker of a run reported at its end (a worker that sends
    nothing within 30 s is left out; one that failed raises)."""
    counts = []
    for pipe in pipes:
        if pipe.poll(30):
            reply = pipe.recv()
            if reply[0] == "error":
                raise RuntimeError(f"{who} failed:\n{reply[1]}")
            if reply[0] == "done":
                counts.append(int(reply[1]))
    return counts


class WorkerPool:
    """``size`` worker processes, reused by every W5 run of one backend."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.counter = ctx.Value("q", 0)
        self.go = ctx.Event()
        self.stop = ctx.Event()
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        for i in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker,
                args=(child, self.counter, self.go, self.stop),
                name=f"novaque-bench-w5-{i}",
                daemon=True,
            )
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)

    def run(
        self,
        kind: str,
        procs: int,
        backend: str,
        url: str,
        sizes: Sizes,
        n: int,
        deadline: Deadline,
    ) -> Run:
        """``procs`` workers of ``kind`` ("floor" or "novaque") drain ``n`` messages."""
        with self.counter.get_lock():
            self.counter.value = 0
        self.go.clear()
        self.stop.clear()
        pipes = self.pipes[:procs]
        for pipe in pipes:
            pipe.send(("run", kind, backend, url, sizes))
        try:
            for pipe in pipes:
                if not pipe.poll(READY_TIMEOUT_S):
                    raise RuntimeError(f"a W5 {kind} worker did not get ready")
                reply = pipe.recv()
                if reply[0] == "error":
                    raise RuntimeError(f"W5 {kind} worker failed:\n{reply[1]}")
            started = time.perf_counter()
            self.go.set()
            while self.counter.value < n and not deadline.passed():
                time.sleep(0.002)
            ended = time.perf_counter()
            done = int(self.counter.value)
        finally:
            self.go.set()
            self.stop.set()
        per_proc = _counts(pipes, f"W5 {kind} worker")
        return Run(min(done, n), n, ended - started, extra={"procs": procs, "per_proc": per_proc})

    def idle(
        self,
        procs: int,
        backend: str,
        url: str,
        settle: float,
        seconds: float,
        sample: Callable[[], float] | None = None,
    ) -> dict[str, Any]:
        """``procs`` idle clients (:func:`_idle_worker`) on ``url``: once all are
        ready and ``settle`` seconds have passed, a window of ``seconds``.
        Returns the window's length, each process's own count (SQLite's
        statements; 0 elsewhere) and how far ``sample`` (a server's counter,
        read before and after) moved."""
        self.go.clear()
        self.stop.clear()
        pipes = self.pipes[:procs]
        for pipe in pipes:
            pipe.send(("run", "idle", backend, url, None))
        try:
            for pipe in pipes:
                if not pipe.poll(READY_TIMEOUT_S):
                    raise RuntimeError("an idle worker did not get ready")
                reply = pipe.recv()
                if reply[0] == "error":
                    raise RuntimeError(f"idle worker failed:\n{reply[1]}")
            time.sleep(settle)
            before = sample() if sample is not None else 0.0
            started = time.perf_counter()
            self.go.set()
            time.sleep(seconds)
            self.stop.set()
            window = time.perf_counter() - started
            after = sample() if sample is not None else 0.0
        finally:
            self.go.set()
            self.stop.set()
        per_proc = _counts(pipes, "idle worker")
        return {"seconds": window, "per_proc": per_proc, "sampled": after - before}

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(("quit",))
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
