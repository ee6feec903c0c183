"""dedup_key: one message per key and topic while it lives, decided by the unique index."""

from __future__ import annotations

import multiprocessing
import threading
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa

import novaque
from novaque.schema import deliveries, messages
from novaque.testing import FakeClock
from tests import _procs
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")


def count(backend: Backend, table: sa.Table) -> int:
    with backend.engine().connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_a_repeated_key_returns_the_first_id_and_writes_nothing(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "a")
    first = client.publish("t", b"one", dedup_key="k")
    assert client.publish("t", b"two", dedup_key="k") == first
    assert client.publish("other", b"two", dedup_key="k") != first  # keys are per topic
    ids = client.publish_many("t", [b"1", b"2", b"3"], dedup_keys=["k", None, "k2"])
    assert ids[0] == first
    assert client.publish_many("t", [b"x", b"y"], dedup_keys=["k2", "k2"]) == [ids[2]] * 2
    assert count(backend, messages) == 4
    assert count(backend, deliveries) == 3  # k, the None one, k2 on channel a
    client.flush_stats()
    assert client.channel_counters("t", "a").published == 3
    assert client.get_message(first).body == b"one"


def test_a_key_is_free_again_once_its_message_is_gone(
    client: novaque.Client, clock: FakeClock
) -> None:
    first = client.publish("t", b"one", dedup_key="k", ttl=60)
    clock.advance(61)
    client.purge_expired()
    second = client.publish("t", b"two", dedup_key="k")
    assert second != first
    clock.advance(1)
    assert client.prune(clock()) == 1
    assert client.publish("t", b"three", dedup_key="k") not in (first, second)


@pytest.mark.sync_only
def test_two_processes_racing_on_keys_store_one_message_each(backend: Backend) -> None:
    setup = backend.client()
    setup.ensure_channel("dedup", "c")
    keys = [f"key-{i}" for i in range(25)]
    at = datetime.now(timezone.utc).isoformat()
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_procs.publish_deduplicated, args=(backend.url, at, keys, barrier, out))
        for _ in range(2)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert [status for status, _ in results] == ["ok", "ok"], results
    assert results[0][1] == results[1][1]  # both got the same id for every key
    assert len(set(results[0][1])) == 2 * len(keys)
    assert count(backend, messages) == 2 * len(keys)
    assert count(backend, deliveries) == 2 * len(keys)
    # Each delivery counted once, by the child that wrote it, flushed as it exited.
    assert setup.channel_counters("dedup", "c").published == 2 * len(keys)


@pytest.mark.sync_only
def test_a_publish_racing_an_uncommitted_holder_of_its_key_gets_its_id(backend: Backend) -> None:
    holder, racer = backend.client(), backend.client()
    holder.ensure_channel("t", "a")
    racer.ensure_topic("t")  # racer's topic id is cached: its publish starts with the insert
    engine = backend.engine()
    got: list[int] = []
    with engine.connect() as conn:
        with conn.begin():
            first = holder.publish("t", b"one", dedup_key="k", connection=conn)
            thread = threading.Thread(
                target=lambda: got.append(racer.publish("t", b"2", dedup_key="k"))
            )
            thread.start()
        thread.join(timeout=60)
    assert got == [first]
    assert [m.id for m in holder.list_messages("t")] == [first]


@pytest.mark.sync_only
def test_a_caller_transaction_with_an_older_snapshot_still_sees_the_winner(
    backend: Backend,
) -> None:
    if backend.name == "sqlite":
        pytest.skip(
            "SQLite: a transaction that read first cannot take the write lock after "
            "another writer committed (SQLITE_BUSY_SNAPSHOT); there is no older snapshot case"
        )
    client = backend.client()
    client.ensure_channel("t", "a")
    engine = backend.engine()
    with engine.connect() as conn, engine.connect() as late, late.begin():
        # The late transaction reads first: under REPEATABLE READ (MySQL's
        # default) its snapshot predates the other publish's commit.
        late.execute(sa.select(sa.func.count()).select_from(messages)).scalar_one()
        with conn.begin():
            first = client.publish("t", b"one", dedup_key="k", connection=conn)
        assert client.publish("t", b"two", dedup_key="k", connection=late) == first
    assert [m.id for m in client.list_messages("t")] == [first]
