"""A delivery that becomes waiting again in its group takes its place back
(DESIGN §8: a delivery is claimable only when no delivery of its group is
leased and none with a lower delivery id in its group is waiting; a requeued
dead letter keeps its place), on group_fifo and strict_fifo, on both twins.

Every way a lower delivery id comes back into a group: a dead letter requeued
(by ids, all, ``limit``, ``died_before``, ``rate``) or moved in from another
channel, a deferred delivery claimed by id, a publish whose delivery id is
lower than the head its group got meanwhile; and what a leased later delivery
does then (it keeps its lease; given back, it yields; expired, it keeps its
turn).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
import sqlalchemy as sa

import novaque
from novaque import dialects
from novaque._time import to_us
from novaque.ops import _groups, _sql, consume
from novaque.schema import PARKED_OFFSET, STATE_LEASED, deliveries, groups
from tests._races import race
from tests.conftest import Backend, FakeClock

pytestmark = pytest.mark.usefixtures("twin")

WAIT = 60.0

d = deliveries

#: (ordering, the groups of a, b and c): one group on group_fifo; on
#: strict_fifo the whole channel is one group, whatever the messages say.
ORDERED = pytest.mark.parametrize(
    ("ordering", "keys"),
    [("group_fifo", ["g1", "g1", "g1"]), ("strict_fifo", ["g1", None, "g2"])],
    ids=["group_fifo", "strict_fifo"],
)


def publish_abc(client: novaque.Client, ordering: str, keys: list[str | None]) -> None:
    client.ensure_channel("t", "c", ordering=ordering)
    client.publish_many("t", [b"a", b"b", b"c"], groups=keys)


def take(client: novaque.Client, channel: str = "c") -> list[bytes]:
    """Claim what is claimable and ack it: the bodies, in delivery id order."""
    got = client.claim("t", channel, max_messages=50)
    client.ack_many(got)
    return [m.body for m in sorted(got, key=lambda m: m.delivery_id)]


def taken_in_turn(client: novaque.Client, channel: str = "c") -> list[list[bytes]]:
    """What successive claims (each acked) hand out, until one gets nothing."""
    turns = []
    while got := take(client, channel):
        turns.append(got)
    return turns


def claim_one(client: novaque.Client, **kw: object) -> novaque.Message:
    [msg] = client.claim("t", "c", max_messages=50, **kw)  # type: ignore[arg-type]
    return msg


# -- dead letters ------------------------------------------------------------------------

REQUEUES: dict[str, Callable[[novaque.Client, novaque.Message, FakeClock], int]] = {
    "ids": lambda client, a, clock: client.requeue_dead("t", "c", [a.delivery_id]),
    "all": lambda client, a, clock: client.requeue_dead("t", "c"),
    "limit": lambda client, a, clock: client.requeue_dead("t", "c", limit=1),
    "died_before": lambda client, a, clock: client.requeue_dead(
        "t", "c", died_before=clock() + timedelta(seconds=1)
    ),
    "rate": lambda client, a, clock: client.requeue_dead("t", "c", rate=1000),
}


@ORDERED
@pytest.mark.parametrize("how", sorted(REQUEUES))
def test_a_requeued_dead_letter_is_handed_out_before_the_later_deliveries(
    client: novaque.Client, clock: FakeClock, ordering: str, keys: list[str | None], how: str
) -> None:
    publish_abc(client, ordering, keys)
    a = claim_one(client)
    assert a.body == b"a"
    client.reject(a)
    assert REQUEUES[how](client, a, clock) == 1
    assert taken_in_turn(client) == [[b"a"], [b"b"], [b"c"]]


@ORDERED
def test_a_dead_letter_requeued_behind_a_delayed_head_goes_first(
    client: novaque.Client, clock: FakeClock, ordering: str, keys: list[str | None]
) -> None:
    """The head it takes the place of was waiting for its retry's backoff: that
    head waits behind it, its due time kept."""
    publish_abc(client, ordering, keys)
    client.reject(claim_one(client))
    b = claim_one(client)
    client.requeue(b, delay=30)
    assert client.claim("t", "c") == []
    assert client.requeue_dead("t", "c") == 1
    assert take(client) == [b"a"]
    assert take(client) == []  # b's backoff still runs
    clock.advance(31)
    assert taken_in_turn(client) == [[b"b"], [b"c"]]


@ORDERED
def test_a_dead_letter_moved_into_an_ordered_channel_keeps_its_place_there(
    client: novaque.Client, ordering: str, keys: list[str | None]
) -> None:
    """A letter moved with ``to_channel`` keeps its delivery id: in the target
    it comes before the deliveries that entered that channel after it."""
    client.ensure_channel("t", "side")
    client.publish("t", b"a", group=keys[0])  # before c exists: side only
    client.ensure_channel("t", "c", ordering=ordering)
    client.publish_many("t", [b"b", b"c"], groups=keys[1:])
    [a] = client.claim("t", "side")
    assert a.body == b"a"
    client.reject(a)
    assert client.requeue_dead("t", "side", to_channel="c") == 1
    assert taken_in_turn(client) == [[b"a"], [b"b"], [b"c"]]


@ORDERED
def test_a_leased_later_delivery_keeps_its_lease_and_the_revived_one_comes_next(
    client: novaque.Client, ordering: str, keys: list[str | None]
) -> None:
    publish_abc(client, ordering, keys)
    client.reject(claim_one(client))
    b = claim_one(client)
    assert client.requeue_dead("t", "c") == 1
    assert client.claim("t", "c", max_messages=50) == []  # one leased per group
    client.ack(b)
    assert taken_in_turn(client) == [[b"a"], [b"c"]]


GIVE_BACKS: dict[str, Callable[[novaque.Client, novaque.Message], object]] = {
    "requeue": lambda client, msg: client.requeue(msg, delay=0),
    "requeue-delayed": lambda client, msg: client.requeue(msg, delay=30),
    "snooze": lambda client, msg: client.snooze(msg, 0),
    "release": lambda client, msg: client.release([msg]),
}


@ORDERED
@pytest.mark.parametrize("how", sorted(GIVE_BACKS))
def test_a_later_delivery_given_back_yields_to_the_revived_one(
    client: novaque.Client, clock: FakeClock, ordering: str, keys: list[str | None], how: str
) -> None:
    """Once the leased later delivery's lease ends by a requeue, a snooze or a
    release, it waits again, behind the lower one revived meanwhile."""
    publish_abc(client, ordering, keys)
    client.reject(claim_one(client))
    b = claim_one(client)
    assert client.requeue_dead("t", "c") == 1
    GIVE_BACKS[how](client, b)
    assert take(client) == [b"a"]
    clock.advance(31)
    assert taken_in_turn(client) == [[b"b"], [b"c"]]


def test_a_release_with_a_lost_lease_leaves_that_group_alone(
    client: novaque.Client, clock: FakeClock
) -> None:
    """A release of a delivery whose lease was lost (claimed again and acked
    meanwhile, its group gone) changes nothing of that group: the next
    publish to it starts it afresh."""
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish_many("t", [b"a", b"x"], groups=["g1", "g2"])
    stale = {m.body: m for m in client.claim("t", "c", max_messages=50, lease=10)}
    clock.advance(11)
    again = {m.body: m for m in client.claim("t", "c", max_messages=50)}
    client.ack(again[b"a"])
    assert client.release([stale[b"a"], again[b"x"]]) == 1
    client.publish("t", b"a2", group="g1")
    assert sorted(take(client)) == [b"a2", b"x"]


@ORDERED
@pytest.mark.parametrize("reaped", [False, True], ids=["claimed-again", "reaped"])
def test_a_later_delivery_whose_lease_expires_keeps_its_turn(
    client: novaque.Client, clock: FakeClock, ordering: str, keys: list[str | None], reaped: bool
) -> None:
    """An expired lease is not given back: the claim that finds it expired
    leases the same delivery again, as its group's head (whether the lease
    reaper ran first or not); the revived one comes after it."""
    publish_abc(client, ordering, keys)
    client.reject(claim_one(client))
    b = claim_one(client, lease=10)
    assert client.requeue_dead("t", "c") == 1
    clock.advance(11)
    if reaped:
        assert client.reap_leases() == 1
    again = claim_one(client)
    assert (again.body, again.attempts) == (b.body, 2)
    client.ack(again)
    assert taken_in_turn(client) == [[b"a"], [b"c"]]


# -- deferred deliveries -----------------------------------------------------------------


@ORDERED
def test_claim_deferred_of_a_lower_delivery_takes_its_place_back(
    client: novaque.Client, ordering: str, keys: list[str | None]
) -> None:
    """A deferred delivery named to ``claim_deferred`` is leased when nothing of
    its group is leased and nothing below it waits: the later deliveries,
    waiting or not yet due, wait for it again."""
    publish_abc(client, ordering, keys)
    a = claim_one(client)
    client.defer(a)
    [again] = client.claim_deferred("t", "c", [a.delivery_id])
    assert (again.body, again.attempts) == (b"a", 2)
    assert client.claim("t", "c", max_messages=50) == []  # b waits for a again
    client.ack(again)
    assert taken_in_turn(client) == [[b"b"], [b"c"]]


@ORDERED
def test_claim_deferred_waits_for_a_leased_later_delivery(
    client: novaque.Client, ordering: str, keys: list[str | None]
) -> None:
    publish_abc(client, ordering, keys)
    a = claim_one(client)
    client.defer(a)
    b = claim_one(client)
    assert client.claim_deferred("t", "c", [a.delivery_id]) == []  # b is leased
    client.ack(b)
    [again] = client.claim_deferred("t", "c", [a.delivery_id])  # c only waits
    assert again.body == b"a"
    assert client.claim("t", "c", max_messages=50) == []
    client.ack(again)
    assert taken_in_turn(client) == [[b"c"]]


@ORDERED
def test_claim_deferred_of_a_delivery_behind_a_lower_waiting_one_leases_nothing(
    client: novaque.Client, ordering: str, keys: list[str | None]
) -> None:
    publish_abc(client, ordering, keys)
    client.reject(claim_one(client))
    b = claim_one(client)
    client.defer(b)
    assert client.requeue_dead("t", "c") == 1  # a, below b, waits again
    assert client.claim_deferred("t", "c", [b.delivery_id]) == []
    assert take(client) == [b"a"]
    [again] = client.claim_deferred("t", "c", [b.delivery_id])  # below c
    client.ack(again)
    assert taken_in_turn(client) == [[b"c"]]


def test_claim_deferred_takes_one_delivery_of_a_group_its_lowest(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish_many("t", [b"a", b"b", b"c"], groups=["g1"] * 3)
    a = claim_one(client)
    client.defer(a)
    b = claim_one(client)
    client.defer(b)
    got = client.claim_deferred("t", "c", [b.delivery_id, a.delivery_id])
    assert [m.body for m in got] == [b"a"]
    client.ack_many(got)
    [again] = client.claim_deferred("t", "c", [b.delivery_id])
    client.ack(again)
    assert taken_in_turn(client) == [[b"c"]]


# -- publishing --------------------------------------------------------------------------


@ORDERED
def test_a_publish_whose_delivery_id_is_lower_than_its_groups_new_head_goes_first(
    backend: Backend, client: novaque.Client, ordering: str, keys: list[str | None]
) -> None:
    """Two publishes of one group at once: the one whose delivery got the lower
    id may lock the group after the other started it. The state between the
    two, made by hand: b heads the group, a is inserted (parked) and joins
    it now; a goes first."""
    publish_abc(client, ordering, keys)
    engine = backend.engine()
    with engine.begin() as conn:
        rows = conn.execute(sa.select(d.c.id, d.c.channel_id, d.c.group_key).order_by(d.c.id)).all()
        (a_id, channel_id, key), (b_id, _, _), _ = rows
        conn.execute(
            sa.update(d).where(d.c.id == a_id).values(visible_at=d.c.visible_at + PARKED_OFFSET)
        )
        conn.execute(
            sa.update(d).where(d.c.id == b_id).values(visible_at=d.c.visible_at - PARKED_OFFSET)
        )
        conn.execute(sa.update(groups).values(head_id=b_id))
    with engine.begin() as conn:
        _groups.enter(conn, dialects.for_engine(engine), [(channel_id, key, a_id)])
    assert taken_in_turn(client) == [[b"a"], [b"b"], [b"c"]]


# -- at the same time --------------------------------------------------------------------


def revive(
    backend: Backend, clock: FakeClock, letter: novaque.Message
) -> Callable[[sa.Connection], None]:
    """What requeue_dead does to one letter, in a transaction of the test's."""

    def run(conn: sa.Connection) -> None:
        params = {"p_ids": [letter.delivery_id], "p_now": to_us(clock())}
        assert conn.execute(_sql._revive, params).rowcount == 1
        members = _groups.members_of(conn, d.c.id == letter.delivery_id)
        _groups.rejoin(conn, dialect_of(backend), members)

    return run


def dialect_of(backend: Backend) -> dialects.Dialect:
    return dialects.for_engine(backend.engine())


@ORDERED
def test_a_dead_letter_requeued_while_the_head_is_acked_comes_next(
    backend: Backend,
    client: novaque.Client,
    clock: FakeClock,
    ordering: str,
    keys: list[str | None],
) -> None:
    """The requeue waits for the ack's lock of the group, then finds c at the
    head (waiting): it takes c's place."""
    publish_abc(client, ordering, keys)
    a = claim_one(client)
    client.reject(a)
    b = claim_one(client)

    def ack(conn: sa.Connection) -> None:
        assert consume.ack(conn, dialect_of(backend), to_us(clock()), [b])[0] == []

    assert race(backend, ack, lambda: client.requeue_dead("t", "c")) == [1]
    assert taken_in_turn(client) == [[b"a"], [b"c"]]


@ORDERED
def test_an_ack_that_waits_for_a_dead_letter_rejoining_hands_the_group_to_it(
    backend: Backend,
    client: novaque.Client,
    clock: FakeClock,
    ordering: str,
    keys: list[str | None],
) -> None:
    publish_abc(client, ordering, keys)
    a = claim_one(client)
    client.reject(a)
    b = claim_one(client)
    assert race(backend, revive(backend, clock, a), lambda: client.ack_many([b])) == [[]]
    assert taken_in_turn(client) == [[b"a"], [b"c"]]


@ORDERED
def test_a_head_given_back_while_a_dead_letter_rejoins_yields_to_it(
    backend: Backend,
    client: novaque.Client,
    clock: FakeClock,
    ordering: str,
    keys: list[str | None],
) -> None:
    """The rejoin finds b leased and parks a; b's requeue waits for the
    group's lock, then finds a below it."""
    publish_abc(client, ordering, keys)
    a = claim_one(client)
    client.reject(a)
    b = claim_one(client)
    assert race(backend, revive(backend, clock, a), lambda: client.requeue(b, delay=0)) == [None]
    assert taken_in_turn(client) == [[b"a"], [b"b"], [b"c"]]


@ORDERED
def test_a_dead_letter_rejoining_while_the_head_is_given_back_takes_its_place(
    backend: Backend,
    client: novaque.Client,
    clock: FakeClock,
    ordering: str,
    keys: list[str | None],
) -> None:
    """b's requeue holds the group's lock; the requeue of a waits for it, then
    finds b waiting again: a takes its place."""
    publish_abc(client, ordering, keys)
    a = claim_one(client)
    client.reject(a)
    b = claim_one(client)

    def give_back(conn: sa.Connection) -> None:
        now = to_us(clock())
        assert consume.requeue(conn, dialect_of(backend), now, b, 0, None, False)[0]

    assert race(backend, give_back, lambda: client.requeue_dead("t", "c")) == [1]
    assert taken_in_turn(client) == [[b"a"], [b"b"], [b"c"]]


def test_revivals_under_load_keep_one_leased_per_group_and_leave_no_group_stuck(
    backend: Backend, client: novaque.Client
) -> None:
    """A consumer of 4 handler workers over 6 groups whose messages die on
    their first go or fail once (retried), while another thread requeues the
    dead letters again and again: never two leased deliveries of a group,
    every message handled, and no group's row left behind."""
    client.ensure_channel("t", "c", ordering="group_fifo")
    keys = [f"g{i}" for i in range(6)]
    bodies = [f"{g}:{n}".encode() for n in range(8) for g in keys]
    client.publish_many("t", bodies, groups=[b.decode().split(":")[0] for b in bodies])
    lock = threading.Lock()
    seen: set[bytes] = set()
    handled: set[bytes] = set()
    done = threading.Event()

    def handler(msg: novaque.Message) -> None:
        n = int(msg.body.decode().split(":")[1])
        with lock:
            first = msg.body not in seen
            seen.add(msg.body)
        if first and n % 3 == 0:
            raise novaque.Reject("dies once")
        if first and n % 3 == 1:
            raise RuntimeError("fails once")
        with lock:
            handled.add(msg.body)
            if len(handled) == len(bodies):
                done.set()

    twice_leased = (
        sa.select(d.c.group_key)
        .where(d.c.state == STATE_LEASED, d.c.group_key.is_not(None))
        .group_by(d.c.channel_id, d.c.group_key)
        .having(sa.func.count() > 1)
    )
    overlaps: list[object] = []
    consumer = client.subscribe_and_start(
        "t", "c", handler, max_in_flight=4, poll_interval=0.02, backoff=novaque.Backoff(base=0)
    )
    try:
        deadline = time.monotonic() + WAIT
        while not done.is_set() and time.monotonic() < deadline:
            client.requeue_dead("t", "c")
            with backend.engine().connect() as conn:
                overlaps += conn.execute(twice_leased).scalars()
        assert done.is_set()
    finally:
        consumer.shutdown(timeout=10)
    assert overlaps == []
    assert handled == set(bodies)
    assert client.channel_backlog("t", "c") == novaque.Backlog()
    with backend.engine().connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(groups)).scalar_one() == 0
