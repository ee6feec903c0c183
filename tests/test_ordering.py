"""Ordered channels (DESIGN §8): group_fifo and strict_fifo, on both twins."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

import novaque
from tests._races import race
from tests.conftest import Backend, FakeClock

pytestmark = pytest.mark.usefixtures("twin")

WAIT = 30.0


def claim_bodies(client: novaque.Client, channel: str = "c", **kw: object) -> list[bytes]:
    return [m.body for m in client.claim("t", channel, max_messages=50, **kw)]  # type: ignore[arg-type]


def ack_all(client: novaque.Client, channel: str = "c") -> list[bytes]:
    got = client.claim("t", channel, max_messages=50)
    client.ack_many(got)
    return [m.body for m in got]


def test_group_fifo_hands_out_one_delivery_per_group_in_order(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.ensure_channel("t", "plain")
    client.publish("t", b"a1", group="a")
    client.publish_many("t", [b"a2", b"b1", b"x", b"a3"], groups=["a", "b", None, "a"])
    got = client.claim("t", "c", max_messages=50)
    # The heads of a and b, and the delivery of no group, which waits for no one.
    assert sorted(m.body for m in got) == [b"a1", b"b1", b"x"]
    assert claim_bodies(client) == []  # the others wait behind their heads
    assert client.channel_backlog("t", "c") == novaque.Backlog(ready=2, in_flight=3)
    by_body = {m.body: m for m in got}
    client.ack(by_body[b"a1"])
    [a2] = client.claim("t", "c", max_messages=50)
    assert (a2.body, a2.group) == (b"a2", "a")
    client.ack_many([a2, by_body[b"b1"], by_body[b"x"]])
    assert ack_all(client) == [b"a3"]
    assert ack_all(client) == []
    # A standard channel of the topic has no ordering promise to keep.
    assert len(claim_bodies(client, "plain")) == 5


def test_group_keys_are_kept_exactly_whatever_they_hold(client: novaque.Client) -> None:
    # Keys a database's quoting must carry through untouched (PostgreSQL's
    # routed deliveries travel as arrays in their text form).
    keys = ['a"b', "back\\slash", "x,y", "{}", "NULL", " ", "ü€", 'q"\\,{NULL}']
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish_many(
        "t", [f"{i}-{n}".encode() for n in (1, 2) for i in range(len(keys))], groups=keys * 2
    )
    got = client.claim("t", "c", max_messages=50)
    assert sorted((m.group, m.body) for m in got) == sorted(
        (key, f"{i}-1".encode()) for i, key in enumerate(keys)
    )
    client.ack_many(got)
    got = client.claim("t", "c", max_messages=50)
    assert sorted((m.group, m.body) for m in got) == sorted(
        (key, f"{i}-2".encode()) for i, key in enumerate(keys)
    )


def test_a_retry_or_a_delayed_head_keeps_its_group_waiting(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish("t", b"a1", group="a")
    client.publish("t", b"a2", group="a")
    [a1] = client.claim("t", "c")
    client.requeue(a1, delay=30)
    assert claim_bodies(client) == []
    clock.advance(31)
    [again] = client.claim("t", "c")
    assert (again.body, again.attempts) == (b"a1", 2)
    client.ack(again)
    client.publish("t", b"b1", group="b", delay=60)
    client.publish("t", b"b2", group="b")
    assert ack_all(client) == [b"a2"]
    assert claim_bodies(client) == []  # b1, the head of b, is not due
    clock.advance(61)
    assert ack_all(client) == [b"b1"]
    assert ack_all(client) == [b"b2"]


def test_an_expired_lease_gives_the_head_again_not_the_next(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish_many("t", [b"a1", b"a2"], groups=["a", "a"])
    [first] = client.claim("t", "c", lease=10)
    clock.advance(11)
    [second] = client.claim("t", "c")
    assert (second.body, second.attempts) == (b"a1", 2)
    with pytest.raises(novaque.LeaseLost):
        client.ack(first)  # the lost lease moves nothing on
    assert claim_bodies(client) == []
    client.ack(second)
    assert claim_bodies(client) == [b"a2"]


def test_strict_fifo_is_one_group_for_the_whole_channel(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", ordering="strict_fifo")
    client.publish_many("t", [b"1", b"2", b"3"], groups=["a", None, "b"])
    for expected in (b"1", b"2", b"3"):
        assert ack_all(client) == [expected]
    assert ack_all(client) == []


def test_a_poisoned_head_dies_after_max_attempts_and_its_group_moves_on(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo", max_attempts=2)
    client.publish_many("t", [b"poison", b"next", b"last"], groups=["g", "g", "g"])
    seen: list[tuple[bytes, int]] = []
    done = threading.Event()

    def handler(msg: novaque.Message) -> None:
        seen.append((msg.body, msg.attempts))
        if msg.body == b"poison":
            raise RuntimeError("cannot handle it")
        if msg.body == b"last":
            done.set()

    consumer = client.subscribe_and_start(
        "t", "c", handler, backoff=novaque.Backoff(base=0), poll_interval=0.02
    )
    try:
        assert done.wait(WAIT)
    finally:
        consumer.shutdown(timeout=10)
    assert seen == [(b"poison", 1), (b"poison", 2), (b"next", 1), (b"last", 1)]
    [dead] = client.list_dead("t", "c")
    assert dead.reason == "max_attempts"


def test_rejected_reaped_and_purged_heads_move_their_groups_on(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo", max_attempts=1)
    client.publish_many("t", [b"r1", b"r2"], groups=["r", "r"])
    client.publish_many("t", [b"e1", b"e2"], groups=["e", "e"])
    client.publish("t", b"p1", group="p", ttl=5)
    client.publish("t", b"p2", group="p")
    got = {m.body: m for m in client.claim("t", "c", max_messages=10, lease=100)}
    assert sorted(got) == [b"e1", b"p1", b"r1"]
    client.reject(got[b"r1"])
    assert claim_bodies(client, lease=100) == [b"r2"]
    clock.advance(101)  # e1's lease expires with its one attempt spent
    assert client.reap_leases() >= 1
    client.purge_expired()  # p1 (leased, expired at 5 s) goes with its message
    assert sorted(claim_bodies(client)) == [b"e2", b"p2"]


def test_a_requeued_dead_letter_rejoins_its_group(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish_many("t", [b"a1", b"a2", b"a3"], groups=["a", "a", "a"])
    [a1] = client.claim("t", "c")
    client.reject(a1)
    [a2] = client.claim("t", "c")
    assert a2.body == b"a2"
    assert client.requeue_dead("t", "c") == 1  # a2 heads the group: a1 waits
    assert claim_bodies(client) == []
    info = client.get_message(a1.id)
    assert [(d.channel, d.state) for d in info.deliveries] == [("c", "ready")]
    client.ack(a2)
    assert ack_all(client) == [b"a1"]  # its delivery id comes before a3's
    assert ack_all(client) == [b"a3"]
    # A dead letter of a group with no head heads it at once.
    client.publish("t", b"b1", group="b")
    [b1] = client.claim("t", "c")
    client.reject(b1)
    assert client.requeue_dead("t", "c") == 1
    assert ack_all(client) == [b"b1"]


def test_replays_and_dedup_keys_join_the_end_of_their_group(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    first = client.publish("t", b"a1", group="a", dedup_key="k1")
    assert client.publish("t", b"a1", group="a", dedup_key="k1") == first
    client.publish("t", b"a2", group="a", dedup_key="k2")
    assert ack_all(client) == [b"a1"]
    assert client.replay(first) == 1  # after a2, which is waiting already
    assert ack_all(client) == [b"a2"]
    assert ack_all(client) == [b"a1"]
    assert ack_all(client) == []


def test_waiting_deliveries_show_as_ready(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish("t", b"a1", group="a")
    second = client.publish("t", b"a2", group="a", delay=10)
    client.publish("t", b"b1", group="b", delay=10)
    assert client.channel_backlog("t", "c") == novaque.Backlog(pending=1, ready=2)
    [info] = client.get_message(second).deliveries
    assert info.state == "ready"
    assert info.visible_at == clock() + timedelta(seconds=10)


def test_a_consumer_works_on_many_groups_at_once_each_in_order(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    groups = [f"g{i}" for i in range(8)]
    client.publish_many(
        "t", [f"{g}:{n}".encode() for n in range(5) for g in groups], groups=groups * 5
    )
    lock = threading.Lock()
    running: set[str] = set()
    order: dict[str, list[int]] = {g: [] for g in groups}
    overlap: list[str] = []
    done = threading.Event()
    count = [0]

    def handler(msg: novaque.Message) -> None:
        group, n = msg.body.decode().split(":")
        with lock:
            if group in running:
                overlap.append(group)
            running.add(group)
        with lock:
            order[group].append(int(n))
            running.discard(group)
            count[0] += 1
            if count[0] == 40:
                done.set()

    consumer = client.subscribe_and_start("t", "c", handler, max_in_flight=8, poll_interval=0.02)
    try:
        assert done.wait(WAIT)
    finally:
        consumer.shutdown(timeout=10)
    assert overlap == []
    assert order == {g: [0, 1, 2, 3, 4] for g in groups}


def test_an_ack_that_waits_for_a_publisher_of_its_group_hands_the_group_on(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    """The head's ack waits for the lock of a publisher adding to its group;
    once that commits, what it published is the group's next delivery (read
    after the lock, not before: else the group would be dropped and the new
    delivery stay parked for ever)."""
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish("t", b"first", group="g")
    [head] = client.claim("t", "c", max_messages=10)
    # The publisher: an application's own transaction, with the sync client.
    publisher = novaque.Client(backend.engine(), novaque.Options(clock=clock))

    def publish(conn: sa.Connection) -> None:
        publisher.publish("t", b"second", group="g", connection=conn)

    assert race(backend, publish, lambda: client.ack_many([head])) == [[]]
    assert claim_bodies(client) == [b"second"]


@pytest.mark.sync_only
@pytest.mark.parametrize("watched", [False, True], ids=["driver-path", "cursor-events"])
def test_an_ordered_ack_and_claim_hands_out_the_next_deliveries_of_the_groups_it_acked(
    backend: Backend, client: novaque.Client, watched: bool
) -> None:
    """What a consumer does between batches, on an ordered channel: the acks
    move their groups on before the claim looks. On PostgreSQL's driver path
    the two go in one pipeline; an engine with cursor events takes
    SQLAlchemy's path (one transaction)."""

    def watch(*args: object) -> None:
        pass

    if watched:
        sa.event.listen(client.engine, "before_cursor_execute", watch)
    try:
        assert client._context.executor.drives("ack_ordered_claim") is (
            backend.name == "postgres" and not watched
        )
        client.ensure_channel("t", "c", ordering="group_fifo")
        client.publish_many("t", [b"a0", b"a1", b"b0", b"b1"], groups=["a", "a", "b", "b"])
        heads = client.claim("t", "c", max_messages=10)
        assert [m.body for m in heads] == [b"a0", b"b0"]
        lost, got = client._consuming.ack_and_claim(heads, "t", "c", heads[0].channel_id, 10, 30.0)
        assert (lost, [m.body for m in got]) == ([], [b"a1", b"b1"])
        lost, got = client._consuming.ack_and_claim(got, "t", "c", heads[0].channel_id, 10, 30.0)
        assert (lost, got) == ([], [])
    finally:
        if watched:
            sa.event.remove(client.engine, "before_cursor_execute", watch)


@pytest.mark.sync_only
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # the pipeline's own
def test_a_claim_that_fails_undoes_the_ordered_ack_pipelined_with_it(
    backend: Backend, client: novaque.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ordered ack and the claim after it commit together or not at all."""
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish_many("t", [b"a0", b"a1"], groups=["a", "a"])
    [head] = client.claim("t", "c", max_messages=10)
    failing = "SELECT 1 / (%(p_limit)s - %(p_limit)s)"
    monkeypatch.setattr(type(client._context.dialect), "_ack_and_claim_driver", failing)
    with pytest.raises(sa.exc.DBAPIError, match="division by zero"):
        client._consuming.ack_and_claim([head], "t", "c", head.channel_id, 10, 30.0)
    monkeypatch.undo()
    assert client.ack_many([head]) == []  # still leased: the ack was undone
    assert claim_bodies(client) == [b"a1"]
