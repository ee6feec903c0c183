"""PostgreSQL failover against the real thing: a primary and a synchronous
streaming standby (tests/topologies/pg_pair.sh), the primary SIGKILLed in the
middle of a run and the standby promoted, while a sync client and an asyncio
client publish, claim, ack and consume through a multi-host URL.

Nothing is restarted by hand: the clients reconnect by themselves, calls made
while no primary answers raise ``DatabaseUnavailable``, no publish that
returned is lost, no acked delivery comes back, and the consumers go on.
Then the promoted server is told to wait for a synchronous standby it does not
have: every commit waits forever there, and ``Options.transaction_timeout``
ends the calls instead.

Each run needs a healthy pair, and leaves it failed over: the fixture makes a
fresh one with the script when the last run used it (about 5 s).
"""

from __future__ import annotations

import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
import novaque.aio
from tests import _twin
from tests.conftest import topology_url

SCRIPT = Path(__file__).resolve().parent / "topologies" / "pg_pair.sh"
PAIR_ENV = "NOVAQUE_TEST_PG_PAIR_URL"
WAIT = 60.0
#: Publishes of each client after the promotion before the run ends.
AFTER = 20


def pair(command: str) -> str:
    """Run ``pg_pair.sh command``; its output."""
    done = subprocess.run(
        [str(SCRIPT), command], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"pg_pair.sh {command}: {done.stderr.strip()}"
    return done.stdout.strip()


@pytest.fixture
def pair_url() -> str:
    """A healthy pair's multi-host URL, on a database of this test's own."""
    url = topology_url(
        PAIR_ENV,
        "PostgreSQL failover",
        f"tests/topologies/pg_pair.sh start; then export {PAIR_ENV}=$(tests/topologies/pg_pair.sh "
        "url); the script runs as root or postgres",
    )
    phase("pair wanted")
    pair("ensure")
    phase("pair ready")
    database = f"novaque_failover_{secrets.token_hex(4)}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{database}"')
    admin.dispose()
    return sa.make_url(url).set(database=database).render_as_string(hide_password=False)


@dataclass
class Side:
    """One client's part of the run and what it saw."""

    name: str
    client: novaque.Client
    returned: dict[str, int] = field(default_factory=dict)  # dedup key -> id
    after: set[int] = field(default_factory=set)  # ids of publishes begun after the kill
    first_after: float | None = None  # when the first of them returned
    unavailable: int = 0  # DatabaseUnavailable raised to the publisher
    acked: set[int] = field(default_factory=set)
    claimed: set[int] = field(default_factory=set)
    came_back: list[int] = field(default_factory=list)  # acked, then claimed again
    handled: set[int] = field(default_factory=set)
    other_errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Run:
    """Threads that publish (``publish``) or claim and ack (``claim``) on each side."""

    def __init__(self, sides: list[Side]) -> None:
        self.sides = sides
        self.stop = threading.Event()
        self.killed_at: float | None = None
        self.threads: list[threading.Thread] = []

    def start(self, *loops: Callable[[Side], None]) -> Run:
        for side in self.sides:
            for loop in loops:
                thread = threading.Thread(target=self.guarded, args=(side, loop), daemon=True)
                thread.start()
                self.threads.append(thread)
        return self

    def guarded(self, side: Side, loop: Callable[[Side], None]) -> None:
        try:
            loop(side)
        except BaseException as exc:  # reported by the test
            side.other_errors.append(exc)

    def publish(self, side: Side) -> None:
        i = 0
        while not self.stop.is_set():
            key = f"{side.name}-{i}"
            began = time.monotonic()
            try:
                # A repeat after DatabaseUnavailable is safe with a dedup key:
                # a publish that committed before its answer was lost returns
                # the same id.
                message_id = side.client.publish("t", key, dedup_key=key)
            except novaque.DatabaseUnavailable:
                side.unavailable += 1
                time.sleep(0.02)
                continue
            with side.lock:
                side.returned[key] = message_id
                if self.killed_at is not None and began >= self.killed_at:
                    side.after.add(message_id)
                    if side.first_after is None:
                        side.first_after = time.monotonic()
            i += 1
            time.sleep(0.005)

    def claim(self, side: Side) -> None:
        while not self.stop.is_set():
            try:
                got = side.client.claim("t", "claims", max_messages=10, lease=2.0)
            except novaque.DatabaseUnavailable:
                time.sleep(0.02)
                continue
            for msg in got:
                with side.lock:
                    if msg.id in side.acked:
                        side.came_back.append(msg.id)
                    side.claimed.add(msg.id)
                try:
                    side.client.ack(msg)
                except (novaque.DatabaseUnavailable, novaque.LeaseLost):
                    continue  # it may come back: not acked as far as we know
                with side.lock:
                    side.acked.add(msg.id)
            if not got:
                time.sleep(0.01)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(WAIT)


def eventually(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


T0 = time.monotonic()


def phase(what: str) -> None:
    print(f"{time.monotonic() - T0:7.2f} {what}")


def async_side(url: str, loop: _twin.Loop, **options: object) -> _twin.SyncTwin:
    """An asyncio client of ``novaque.aio.connect`` behind the sync surface."""

    async def build() -> novaque.aio.AsyncClient:
        return novaque.aio.connect(url, **options)

    return _twin.SyncTwin(loop.run(build()), loop, sa.create_engine(url))


def test_a_failover_loses_no_returned_publish_and_brings_back_no_acked_delivery(
    pair_url: str,
) -> None:
    options = {"reap_interval": 0.5, "transaction_timeout": 5.0}
    sync_client = novaque.connect(pair_url, **options)  # type: ignore[arg-type]
    loop = _twin.Loop()
    twin = async_side(pair_url, loop, **options)
    clients: list[novaque.Client] = [sync_client, twin]  # type: ignore[list-item]
    sides = [Side("sync", sync_client), Side("aio", twin)]  # type: ignore[arg-type]
    try:
        sync_client.migrate()
        sync_client.ensure_channel("t", "claims")
        sync_client.ensure_channel("t", "consumer")
        phase("migrated")
        for side in sides:
            side.client.start()  # maintenance
            record = side.handled.add
            side.client.subscribe_and_start(
                "t", "consumer", lambda msg, record=record: record(msg.id), max_in_flight=4
            )
        run = Run(sides)
        run.start(run.publish, run.claim)
        eventually(lambda: all(len(s.returned) >= 30 for s in sides), "publishes before the kill")
        phase("published before the kill")
        for side in sides:
            waited = side.client._runtime.signals.wait("listen_connected", 1, WAIT)
            assert waited, f"{side.name}: the LISTEN connection"
        reaps = [s.client._runtime.signals.count("reap") for s in sides]

        pair("kill-primary")
        run.killed_at = time.monotonic()
        pair("promote")
        promoted_at = time.monotonic()
        phase("killed and promoted")
        eventually(lambda: all(len(s.after) >= AFTER for s in sides), "publishes after it")
        run.stop.set()
        run.join()

        # Every publish that returned is there: claimed on one channel (those
        # claimed but not acked come back after their 2 s lease), handled by
        # the consumers on the other.
        everything = {i for s in sides for i in s.returned.values()}
        drain = Run(sides)
        drain.start(drain.claim)
        eventually(lambda: everything <= sides[0].claimed | sides[1].claimed, "every claim")
        eventually(lambda: everything <= sides[0].handled | sides[1].handled, "every handler")
        drain.stop.set()
        drain.join()
        phase("drained")
        for side in sides:
            assert side.other_errors == [], side.other_errors
            assert side.came_back == [], f"{side.name}: acked deliveries came back"
        # The consumers, the maintenance and the LISTEN connections went on by
        # themselves.
        for side, reaped in zip(sides, reaps, strict=True):
            signals = side.client._runtime.signals
            assert signals.wait("reap", reaped + 2, WAIT), f"{side.name}: maintenance"
            assert signals.wait("listen_connected", 2, WAIT), f"{side.name}: LISTEN again"
        recovery = {
            s.name: round(s.first_after - run.killed_at, 2)
            for s in sides
            if s.first_after is not None
        }
        print(
            f"\nfailover: standby promoted {promoted_at - run.killed_at:.2f} s after the kill; "
            f"first publish returned after the kill (s): {recovery}; DatabaseUnavailable "
            f"raised to the publishers: { {s.name: s.unavailable for s in sides} }; "
            f"publishes returned: { {s.name: len(s.returned) for s in sides} }"
        )

        phase("checked")
        # The promoted server now waits for a synchronous standby it does not
        # have: every commit waits forever, and the timeout ends each call.
        for made in clients:
            made.shutdown(timeout=10)
        with sync_client.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.exec_driver_sql("SELECT pg_reload_conf()")
        short = novaque.connect(pair_url, transaction_timeout=1.0)
        clients.append(short)
        for call in (lambda: short.publish("t", b"stuck"), lambda: short.claim("t", "claims")):
            began = time.monotonic()
            with pytest.raises(novaque.DatabaseUnavailable, match="transaction_timeout"):
                call()
            assert time.monotonic() - began < WAIT
        phase("timed out")
    finally:
        for made in clients:
            made.shutdown(timeout=10)
        loop.close()
        phase("shut down")
