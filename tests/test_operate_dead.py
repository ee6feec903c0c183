"""Backlog by state, and dead letters: list, requeue, delete, retention."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

import novaque
from novaque import Backlog
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")


def bury(client: novaque.Client, topic: str, channel: str, how: list[str]) -> list[int]:
    """Claim len(how) deliveries and kill each: "reject:<reason>" or "fail:<error>"."""
    msgs = client.claim(topic, channel, max_messages=len(how))
    assert len(msgs) == len(how)
    for msg, step in zip(msgs, how, strict=True):
        kind, _, text = step.partition(":")
        if kind == "reject":
            client.reject(msg, text)
        else:
            client.requeue(msg, error=RuntimeError(text))  # max_attempts=1: dead at once
    return [m.delivery_id for m in msgs]


def test_backlog_counts_each_state(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("t", "a")
    client.ensure_channel("t", "b")
    client.publish_many("t", [b"d1", b"d2"], delay=60)
    client.publish_many("t", [b"r1", b"r2", b"r3"])
    client.ensure_channel("t", "idle")
    leased = client.claim("t", "a", max_messages=2)
    client.reject(leased[0])
    assert client.channel_backlog("t", "a") == Backlog(pending=2, ready=1, in_flight=1, dead=1)
    clock.advance(31)  # the lease expired but nobody reaped it: still in flight
    assert client.channel_backlog("t", "a") == Backlog(pending=2, ready=1, in_flight=1, dead=1)
    clock.advance(30)  # the delay is over
    assert client.channel_backlog("t", "a") == Backlog(pending=0, ready=3, in_flight=1, dead=1)
    client.reap_leases()
    per_channel = client.topic_backlog("t")
    assert per_channel == {
        "a": Backlog(ready=4, dead=1),
        "b": Backlog(ready=5),
        "idle": Backlog(),
    }
    total = per_channel["a"] + per_channel["b"] + per_channel["idle"]
    assert total == Backlog(ready=9, dead=1)
    assert total.total == 10


def test_list_dead_pages_by_delivery_id(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("t", "a")
    client.ensure_channel("t", "other")
    bodies = [b"x" * n for n in (0, 1, 10, 100, 1000, 5, 7)]
    ids = client.publish_many("t", bodies, max_attempts=1)
    published = clock()
    clock.advance(5)
    how = ["reject:bad input", "reject:", "fail:boom", "reject:x", "fail:", "reject:y", "fail:z"]
    delivery_ids = bury(client, "t", "a", how)
    bury(client, "t", "other", ["reject:elsewhere"])  # another channel's letter stays out

    first = client.list_dead("t", "a", limit=3)
    second = client.list_dead("t", "a", limit=3, after_id=first[-1].delivery_id)
    third = client.list_dead("t", "a", limit=3, after_id=second[-1].delivery_id)
    assert client.list_dead("t", "a", after_id=third[-1].delivery_id) == []
    letters = first + second + third
    assert [x.delivery_id for x in letters] == delivery_ids
    assert [x.message_id for x in letters] == ids
    assert [x.body_len for x in letters] == [len(b) for b in bodies]
    assert all(x.body is None for x in letters)
    assert [x.reason for x in letters] == [
        "bad input",
        "rejected",
        "max_attempts",
        "x",
        "max_attempts",
        "y",
        "max_attempts",
    ]
    assert [x.last_error for x in letters] == [
        None,
        None,
        "RuntimeError: boom",
        None,
        "RuntimeError",
        None,
        "RuntimeError: z",
    ]
    assert {x.attempts for x in letters} == {1}
    assert {x.published_at for x in letters} == {published}
    assert {x.died_at for x in letters} == {clock()}
    full = client.list_dead("t", "a", limit=100, with_body=True)
    assert [x.body for x in full] == bodies


def test_requeue_dead_gives_a_fresh_budget_and_ttl(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "a")
    client.ensure_channel("t", "b")
    ids = client.publish_many("t", [b"1", b"2", b"3"], max_attempts=1, ttl=120)
    letters = bury(client, "t", "a", ["fail:one", "reject:two", "fail:three"])
    other = client.claim("t", "b")[0]
    client.reject(other)
    client.requeue(client.claim("t", "b")[0], delay=0)  # its only attempt: dead too
    clock.advance(60)
    # Only dead letters of this channel are requeued: b's ids and unknown ids are skipped.
    assert client.requeue_dead("t", "a", [other.delivery_id, 10**12]) == 0
    assert client.requeue_dead("t", "a", []) == 0
    assert client.requeue_dead("t", "a", [letters[0], letters[2], letters[2]]) == 2
    assert client.channel_backlog("t", "a") == Backlog(ready=2, dead=1)

    again = client.claim("t", "a", max_messages=5)
    assert [m.id for m in again] == [ids[0], ids[2]]
    assert [m.attempts for m in again] == [1, 1]  # attempts were reset to 0
    info = client.get_message(ids[0])
    assert info.expires_at >= clock() + timedelta(days=7)
    assert client.get_message(ids[1]).expires_at == info.published_at + timedelta(seconds=120)
    failed = {d.channel: d.last_error for d in info.deliveries}
    assert failed["a"] == "RuntimeError: one"  # the last error is kept for diagnosis


def test_requeue_and_delete_all_work_in_batches(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, maintenance_batch=3)
    client.ensure_channel("t", "a")
    ids = client.publish_many("t", [str(i) for i in range(8)])
    for msg in client.claim("t", "a", max_messages=8):
        client.reject(msg)
    assert client.requeue_dead("t", "a") == 8
    assert client.channel_backlog("t", "a") == Backlog(ready=8)
    for msg in client.claim("t", "a", max_messages=8):
        client.reject(msg)
    some = [x.delivery_id for x in client.list_dead("t", "a", limit=4)]
    assert client.delete_dead("t", "a", some) == 4
    assert client.delete_dead("t", "a", some) == 0
    assert client.delete_dead("t", "a") == 4
    assert client.channel_backlog("t", "a") == Backlog()
    assert [client.get_message(i).deliveries for i in ids] == [[]] * 8  # messages stay


def test_retention_by_age_deletes_only_old_dead_letters(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "a", dead_max_age=3600)
    client.ensure_channel("t", "keep")
    client.publish_many("t", [str(i) for i in range(5)], max_attempts=1)
    client.publish("t", b"later", delay=7200)
    bury(client, "t", "a", ["reject:"])
    clock.advance(1000)
    bury(client, "t", "a", ["reject:", "reject:"])
    bury(client, "t", "keep", ["reject:"])
    clock.advance(2601)  # the first letter is 3601 s old, the others 2601 s
    client.run_maintenance()
    assert client.channel_backlog("t", "a") == Backlog(pending=1, ready=2, dead=2)
    assert client.channel_backlog("t", "keep") == Backlog(pending=1, ready=4, dead=1)
    clock.advance(1000)
    assert client.enforce_dead_retention() == 2
    assert client.channel_backlog("t", "a") == Backlog(pending=1, ready=2)


def test_retention_by_count_keeps_the_newest_by_died_at(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, maintenance_batch=2, dead_max_count=10)
    client.ensure_channel("t", "a", dead_max_count=2)
    client.ensure_channel("t", "default")  # bound by Options.dead_max_count
    client.publish_many("t", [str(i) for i in range(5)])
    msgs = client.claim("t", "a", max_messages=5)
    for i in (4, 2, 0, 3, 1):  # die in an order unlike delivery ids
        client.reject(msgs[i], f"m{i}")
        clock.advance(1)
    assert client.enforce_dead_retention() == 3
    assert [x.reason for x in client.list_dead("t", "a")] == ["m1", "m3"]
    assert client.enforce_dead_retention() == 0
    assert client.channel_backlog("t", "default") == Backlog(ready=5)

    client.ensure_channel("t", "a", dead_max_count=0)
    assert client.enforce_dead_retention() == 2
    assert client.list_dead("t", "a") == []


def test_dead_letter_arguments_are_checked(client: novaque.Client) -> None:
    client.ensure_channel("t", "a")
    with pytest.raises(novaque.InvalidOption, match="limit must be between 1 and 1000, got 0"):
        client.list_dead("t", "a", limit=0)
    with pytest.raises(novaque.InvalidOption, match="limit must be between 1 and 1000, got 1001"):
        client.list_dead("t", "a", limit=1001)
    with pytest.raises(
        novaque.InvalidOption, match="after_id must be between 0 and 9223372036854775807, got -1"
    ):
        client.list_dead("t", "a", after_id=-1)
    with pytest.raises(novaque.InvalidOption, match="ids must be a list of integer ids"):
        client.requeue_dead("t", "a", "12")  # type: ignore[arg-type]
    with pytest.raises(
        novaque.InvalidOption, match="each of ids must be between 1 and 9223372036854775807, got 0"
    ):
        client.delete_dead("t", "a", [0])
    with pytest.raises(novaque.InvalidOption, match="must be an integer, got str"):
        client.delete_dead("t", "a", ["7"])  # type: ignore[list-item]


def test_concurrent_retention_passes_keep_the_bound_and_count_once(
    backend: Backend, clock: FakeClock
) -> None:
    clients = [backend.client(clock=clock, maintenance_batch=3) for _ in range(3)]
    clients[0].ensure_channel("t", "a", dead_max_count=4)
    clients[0].publish_many("t", [str(i) for i in range(20)])
    for msg in clients[0].claim("t", "a", max_messages=20):
        clients[0].reject(msg, msg.body.decode())
        clock.advance(1)
    start = threading.Barrier(len(clients))
    deleted: list[int] = []

    def retain(client: novaque.Client) -> None:
        start.wait(timeout=30)
        deleted.append(client.enforce_dead_retention())

    threads = [threading.Thread(target=retain, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sum(deleted) == 16
    assert [x.reason for x in clients[0].list_dead("t", "a")] == ["16", "17", "18", "19"]
    for client in clients:
        client.flush_stats()
    assert clients[0].channel_counters("t", "a").purged == 16
