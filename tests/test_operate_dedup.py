"""dedup_key: one message per key and topic while it lives, decided by the unique
index; the same key with another body, headers or group is a DedupConflict that
writes nothing (DESIGN §9)."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque.schema import deliveries, messages
from novaque.schema import groups as group_rows
from novaque.testing import FakeClock
from tests import _preloaded, _procs
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
    assert client.publish("t", b"one", dedup_key="k") == first
    assert client.publish("other", b"two", dedup_key="k") != first  # keys are per topic
    ids = client.publish_many("t", [b"one", b"2", b"3"], dedup_keys=["k", None, "k2"])
    assert ids[0] == first
    assert client.publish_many("t", [b"3", b"3"], dedup_keys=["k2", "k2"]) == [ids[2]] * 2
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
    ctx = _preloaded.context
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [
        _preloaded.process(_procs.publish_deduplicated, (backend.url, at, keys, barrier, out))
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
                target=lambda: got.append(racer.publish("t", b"one", dedup_key="k"))
            )
            thread.start()
        thread.join(timeout=60)
    assert got == [first]
    assert [m.id for m in holder.list_messages("t")] == [first]


@pytest.mark.sync_only
# Not on SQLite: a transaction that read first cannot take the write lock after
# another writer committed (SQLITE_BUSY_SNAPSHOT); there is no older snapshot case.
@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)
def test_a_caller_transaction_with_an_older_snapshot_still_sees_the_winner(
    backend: Backend,
) -> None:
    client = backend.client()
    client.ensure_channel("t", "a")
    engine = backend.engine()
    with engine.connect() as conn, engine.connect() as late, late.begin():
        # The late transaction reads first: under REPEATABLE READ (MySQL's
        # default) its snapshot predates the other publish's commit.
        late.execute(sa.select(sa.func.count()).select_from(messages)).scalar_one()
        with conn.begin():
            first = client.publish("t", b"one", dedup_key="k", connection=conn)
        assert client.publish("t", b"one", dedup_key="k", connection=late) == first
    assert [m.id for m in client.list_messages("t")] == [first]


# -- conflicts (DESIGN §9) ------------------------------------------------------------------


def snapshot(backend: Backend) -> tuple[int, int]:
    return count(backend, messages), count(backend, deliveries)


def test_another_body_headers_or_group_is_a_conflict_that_writes_nothing(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "a")
    first = client.publish("t", b"one", dedup_key="k", headers={"a": "1", "b": "2"}, group="g")
    before = snapshot(backend)
    for changed in (
        {"body": b"two"},
        {"headers": {"a": "1"}},
        {"headers": {"a": "1", "b": "2", "c": "3"}},
        {"headers": {"a": "1", "b": "B"}},
        {"group": "h"},
        {"group": None},
    ):
        call = {"body": b"one", "headers": {"a": "1", "b": "2"}, "group": "g", **changed}
        with pytest.raises(novaque.DedupConflict) as caught:
            client.publish(
                "t", call["body"], dedup_key="k", headers=call["headers"], group=call["group"]
            )
        assert (caught.value.key, caught.value.message_id) == ("k", first), changed
        assert f"message {first}" in str(caught.value)
    assert snapshot(backend) == before
    # The same content, headers given in another order: the first id, nothing written.
    same = client.publish("t", "one", dedup_key="k", headers={"b": "2", "a": "1"}, group="g")
    assert same == first
    assert snapshot(backend) == before
    client.flush_stats()
    assert client.channel_counters("t", "a").published == 1


def test_a_body_differing_only_in_case_or_trailing_bytes_is_another_body(
    client: novaque.Client,
) -> None:
    first = client.publish("t", b"Body", dedup_key="k")
    for other in (b"body", b"Body ", b"Body\x00", b""):
        with pytest.raises(novaque.DedupConflict):
            client.publish("t", other, dedup_key="k")
    assert client.publish("t", b"Body", dedup_key="k") == first


def test_a_conflict_in_publish_many_writes_nothing_of_the_call(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "a")
    client.ensure_channel("t", "ordered", ordering="group_fifo")
    held = client.publish("t", b"held", dedup_key="held")
    before = snapshot(backend)
    with pytest.raises(novaque.DedupConflict) as caught:
        client.publish_many(
            "t",
            [b"new", b"plain", b"changed", b"late"],
            dedup_keys=["new", None, "held", "late"],
            groups=["g", "g", None, "g"],
        )
    assert (caught.value.key, caught.value.message_id) == ("held", held)
    assert snapshot(backend) == before
    assert count(backend, group_rows) == 0  # no group was started
    assert [m.body for m in client.claim("t", "ordered", max_messages=10)] == [b"held"]
    # The keys the failed call tried are free: another body takes them.
    assert client.publish("t", b"another", dedup_key="new") != held
    client.flush_stats()
    assert client.channel_counters("t", "a").published == 2


def test_a_key_given_twice_in_one_call(backend: Backend, client: novaque.Client) -> None:
    client.ensure_channel("t", "a")
    ids = client.publish_many("t", [b"x", b"y", b"x"], dedup_keys=["k", None, "k"])
    assert ids[0] == ids[2] != ids[1]
    before = snapshot(backend)
    for bodies, groups in (([b"p", b"q"], None), ([b"p", b"p"], ["g", "h"])):
        with pytest.raises(
            novaque.InvalidOption, match="dedup_keys gives 'twice' to bodies 0 and 1"
        ):
            client.publish_many("t", bodies, dedup_keys=["twice", "twice"], groups=groups)
    assert snapshot(backend) == before


def test_a_conflict_leaves_a_callers_transaction_whole(
    backend: Backend, client: novaque.Client, twin: str
) -> None:
    """The caller's transaction goes on after the conflict and commits: it holds
    what it did before and after, and nothing of the failed call."""
    client.ensure_channel("t", "a")
    held = client.publish("t", b"held", dedup_key="held")
    many = {
        "bodies": [b"new", b"plain", b"changed"],
        "dedup_keys": ["new", None, "held"],
    }
    if twin == "sync":
        with backend.engine().connect() as conn, conn.begin():
            before = client.publish("t", b"before", dedup_key="before", connection=conn)
            with pytest.raises(novaque.DedupConflict):
                client.publish_many(
                    "t", many["bodies"], dedup_keys=many["dedup_keys"], connection=conn
                )
            after = client.publish("t", b"after", connection=conn)
    else:
        aclient: Any = client.aio  # type: ignore[attr-defined]

        async def in_transaction() -> tuple[int, int]:
            async with aclient.engine.connect() as conn, conn.begin():
                first = await aclient.publish("t", b"before", dedup_key="before", connection=conn)
                with pytest.raises(novaque.DedupConflict):
                    await aclient.publish_many(
                        "t", many["bodies"], dedup_keys=many["dedup_keys"], connection=conn
                    )
                return first, await aclient.publish("t", b"after", connection=conn)

        before, after = client._loop.run(in_transaction())  # type: ignore[attr-defined]
    stored = {m.id: m.body for m in client.list_messages("t")}
    assert stored == {held: b"held", before: b"before", after: b"after"}
    assert count(backend, deliveries) == 3
    assert client.publish("t", b"new", dedup_key="new") not in stored  # the key is free
    client.flush_stats()
    assert client.channel_counters("t", "a").published == 4


@pytest.mark.sync_only
def test_concurrent_publishers_of_one_key_with_different_bodies(backend: Backend) -> None:
    clients = [backend.client() for _ in range(4)]
    clients[0].ensure_channel("t", "a")
    for made in clients:
        made.ensure_topic("t")  # connected, the topic id cached
    barrier = threading.Barrier(len(clients))
    results: list[tuple[str, int]] = []
    lock = threading.Lock()

    def publish(n: int) -> None:
        barrier.wait(timeout=30)
        try:
            got = ("ok", clients[n].publish("t", f"body {n}".encode(), dedup_key="k"))
        except novaque.DedupConflict as exc:
            got = ("conflict", exc.message_id)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(status for status, _ in results) == ["conflict"] * 3 + ["ok"]
    assert len({message_id for _, message_id in results}) == 1  # all name the winner
    assert count(backend, messages) == 1
    assert count(backend, deliveries) == 1


@pytest.mark.sync_only
def test_concurrent_publish_many_calls_sharing_keys(backend: Backend) -> None:
    """Two calls share key "a" (same body) and "b" (different bodies): one
    writes both messages, the other fails on "b" and writes nothing."""
    clients = [backend.client() for _ in range(2)]
    clients[0].ensure_channel("t", "c")
    for made in clients:
        made.ensure_topic("t")
    barrier = threading.Barrier(2)
    results: list[object] = []

    def publish(n: int) -> None:
        barrier.wait(timeout=30)
        try:
            results.append(
                clients[n].publish_many(
                    "t", [b"a", f"b{n}".encode(), f"own{n}".encode()], dedup_keys=["a", "b", None]
                )
            )
        except novaque.DedupConflict as exc:
            results.append(exc)

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    [ids] = [r for r in results if isinstance(r, list)]
    [conflict] = [r for r in results if isinstance(r, novaque.DedupConflict)]
    assert (conflict.key, conflict.message_id) == ("b", ids[1])
    assert count(backend, messages) == 3
    assert count(backend, deliveries) == 3


@pytest.mark.sync_only
def test_a_publisher_of_a_key_a_failed_call_held_in_an_open_transaction(
    backend: Backend,
) -> None:
    """The failed call inserted key "k" and deleted it again in the caller's
    still open transaction: a racer of "k" (waiting for that transaction or
    not, as the backend decides) stores its own message."""
    client, racer = backend.client(), backend.client()
    client.ensure_channel("t", "a")
    racer.ensure_topic("t")
    held = client.publish("t", b"held", dedup_key="held")
    got: list[int] = []
    with backend.engine().connect() as conn:
        with conn.begin():
            with pytest.raises(novaque.DedupConflict):
                client.publish_many(
                    "t", [b"mine", b"changed"], dedup_keys=["k", "held"], connection=conn
                )
            thread = threading.Thread(
                target=lambda: got.append(racer.publish("t", b"racer", dedup_key="k"))
            )
            thread.start()
        thread.join(timeout=60)
    [racer_id] = got
    assert {m.id: m.body for m in client.list_messages("t")} == {held: b"held", racer_id: b"racer"}
