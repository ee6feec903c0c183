"""Consumers online (DESIGN §10): each started consumer is listed with its
process and load, refreshed every heartbeat, removed at shutdown, and dropped
by maintenance three heartbeats after its process died."""

from __future__ import annotations

import os
import signal
import socket
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque.testing import FakeClock
from tests.conftest import Backend
from tests.test_consumer import WAIT, Recorder, waited

pytestmark = pytest.mark.usefixtures("twin")


def test_a_started_consumer_is_listed_until_it_shuts_down(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    consumer = client.subscribe("orders", "billing", Recorder(), max_in_flight=3)
    assert client.list_consumers() == []  # subscribed, not started
    consumer.start()
    [info] = client.list_consumers()
    assert info == novaque.ConsumerInfo(
        host=socket.gethostname(),
        pid=os.getpid(),
        topic="orders",
        channel="billing",
        max_in_flight=3,
        in_flight=0,
        started_at=clock(),
        heartbeat_at=clock(),
    )
    # Seen from another client (another process would see the same).
    assert backend.client().list_consumers("orders", "billing") == [info]
    consumer.shutdown()
    assert client.list_consumers() == []


def test_list_consumers_filters_by_topic_and_channel(client: novaque.Client) -> None:
    a = client.subscribe_and_start("orders", "billing", Recorder())
    b = client.subscribe_and_start("orders", "audit", Recorder())
    c = client.subscribe_and_start("mail", "billing", Recorder(), max_in_flight=2)
    try:
        everyone = client.list_consumers()
        # by topic, channel and start
        assert [(i.topic, i.channel) for i in everyone] == [
            ("mail", "billing"),
            ("orders", "audit"),
            ("orders", "billing"),
        ]
        assert [i.channel for i in client.list_consumers("orders")] == ["audit", "billing"]
        assert [i.topic for i in client.list_consumers(channel="billing")] == ["mail", "orders"]
        assert [i.max_in_flight for i in client.list_consumers("mail", "billing")] == [2]
        assert client.list_consumers("nobody") == []  # no TopicNotFound: about processes
        with pytest.raises(novaque.InvalidName):
            client.list_consumers("bad name")
        with pytest.raises(novaque.InvalidName):
            client.list_consumers(channel="")
    finally:
        for consumer in (a, b, c):
            consumer.shutdown()
    assert client.list_consumers() == []


def test_the_heartbeat_refreshes_the_row_with_the_load(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, consumer_heartbeat=0.05)
    release = threading.Event()
    started = threading.Event()

    def hold(msg: novaque.Message) -> None:
        started.set()
        release.wait(WAIT)

    consumer = client.subscribe_and_start("t", "c", Recorder(hold), max_in_flight=2)
    try:
        [before] = client.list_consumers()
        client.publish("t", b"x")
        waited(started.wait(WAIT), "the handler to start")
        clock.advance(7)
        beats = client._runtime.presence.signals.count("beats")
        waited(client._runtime.presence.signals.wait("beats", beats + 2, WAIT), "two heartbeats")
        [after] = client.list_consumers()
        assert after.in_flight == 1
        assert after.started_at == before.started_at
        assert after.heartbeat_at == before.heartbeat_at + timedelta(seconds=7)
    finally:
        release.set()
        consumer.shutdown()


def test_maintenance_drops_consumers_not_seen_for_three_heartbeats(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    consumer = client.subscribe_and_start("t", "c", Recorder())
    try:
        clock.advance(30)  # three heartbeats of 10 s: not older than that yet
        client.run_maintenance()
        assert len(client.list_consumers()) == 1
        clock.advance(1)
        assert client.forget_stale_consumers() == 1
        assert client.list_consumers() == []
        # A consumer that was only stalled registers again at its next beat.
        client._runtime.beat_consumers()
        [again] = client.list_consumers()
        assert again.started_at == clock()
    finally:
        consumer.shutdown()
    assert client.list_consumers() == []


def test_a_consumer_that_cannot_register_at_start_registers_at_its_next_beat(
    backend: Backend, client: novaque.Client
) -> None:
    with backend.engine().begin() as conn:  # as if novaque_consumers were unreachable
        conn.execute(sa.text("ALTER TABLE novaque_consumers RENAME TO novaque_consumers_away"))
    try:
        consumer = client.subscribe_and_start("t", "c", Recorder())
    finally:
        with backend.engine().begin() as conn:
            conn.execute(sa.text("ALTER TABLE novaque_consumers_away RENAME TO novaque_consumers"))
    try:
        assert consumer.running
        assert client.list_consumers() == []
        assert client._runtime.presence.signals.count("errors") == 1
        client._runtime.beat_consumers()
        assert len(client.list_consumers()) == 1
    finally:
        consumer.shutdown()
    assert client.list_consumers() == []


def test_consumer_heartbeat_is_validated() -> None:
    with pytest.raises(novaque.InvalidOption, match="Options.consumer_heartbeat must be > 0"):
        novaque.Options(consumer_heartbeat=0)
    with pytest.raises(novaque.InvalidOption, match="consumer_heartbeat must be a timedelta"):
        novaque.Options(consumer_heartbeat="10")  # type: ignore[arg-type]
    assert novaque.Options(consumer_heartbeat=timedelta(seconds=3)).consumer_heartbeat


@pytest.mark.slow
@pytest.mark.sync_only
def test_a_consumer_process_killed_with_sigkill_disappears_after_maintenance(
    backend: Backend, tmp_path: Path, workers: list[Any]
) -> None:
    from tests.test_consumer_processes import Worker, eventually, go

    watcher = backend.client()
    watcher.ensure_channel("t", "c")
    worker = Worker(backend, tmp_path / "killed.txt", max_in_flight=3)
    workers.append(worker)
    go(workers)
    eventually(lambda: len(watcher.list_consumers("t", "c")) == 1, "the consumer online")
    [info] = watcher.list_consumers()
    assert (info.pid, info.max_in_flight) == (worker.proc.pid, 3)
    worker.stop(signal.SIGKILL)

    # Nobody removed its row: it stays until three heartbeats (10 s) passed.
    watcher.run_maintenance()
    assert [i.pid for i in watcher.list_consumers()] == [worker.proc.pid]
    later = datetime.now(timezone.utc) + timedelta(seconds=31)  # its last beat was before now
    maintainer = backend.client(clock=lambda: later)
    maintainer.run_maintenance()
    assert watcher.list_consumers() == []


@pytest.mark.sync_only
def test_a_forked_child_forgets_its_parents_consumers(client: novaque.Client) -> None:
    from novaque import _consumers_online

    consumer = client.subscribe_and_start("t", "c", Recorder())
    presence = client._runtime.presence
    loop = presence._loop
    assert loop is not None
    _consumers_online._forget_in_child()  # what os.fork runs in the child
    try:
        assert (presence._rows, presence._loop) == ({}, None)
        # The child's own consumer gets a row and a loop of its own.
        other = client.subscribe_and_start("t", "d", Recorder())
        assert presence._loop is not None
        assert [i.channel for i in client.list_consumers()] == ["c", "d"]
        other.shutdown()
    finally:
        loop[1].set()  # the "parent's" loop, which only the parent would stop
        loop[0].join(10)
        consumer.shutdown()
