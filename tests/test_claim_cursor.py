"""The claim cursor: a client's claims of a channel read its due deliveries
from where nothing due is left for them, so the dead row versions before it
(kept while some session holds a snapshot open) are never walked. A delivery
that becomes claimable behind it (a publish that commits late, here one from
a client whose clock runs behind) is claimed within the rescan period; one
that becomes due by the clock is claimed at once; channels of several
priorities and ordered channels are read from the first, so their claims
never wait."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

import novaque
from novaque._claim_cursors import LOOK_BEHIND_US, MARGIN_US, REAP_RESCAN_US, RESCAN_US
from novaque._time import US
from novaque.schema import STATE_DEAD, deliveries
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = [pytest.mark.usefixtures("twin"), pytest.mark.pooled]

#: Longer than the cursor's margin: what a client this far behind publishes
#: is written behind the cursor of one that has claimed.
BEHIND_S = 2 * MARGIN_US / US


def _late_publisher(backend: Backend, clock: FakeClock) -> novaque.Client:
    """A client whose clock runs BEHIND_S behind ``clock`` (as a publish that
    commits that long after it began)."""
    return backend.client(clock=FakeClock(clock() - timedelta(seconds=BEHIND_S)))


def test_a_delivery_written_behind_the_cursor_waits_at_most_the_rescan_period(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    assert client.claim("t", "c") == []  # the first claim reads from the first entry
    clock.advance(1)
    assert client.claim("t", "c") == []  # this one from the cursor
    late = _late_publisher(backend, clock).publish("t", b"late")
    assert client.claim("t", "c") == []  # behind the cursor: not read yet
    clock.advance(RESCAN_US / US - 1)
    [msg] = client.claim("t", "c")  # the rescan reads from the first entry
    assert msg.id == late
    client.ack(msg)


def test_a_client_that_has_not_claimed_reads_from_the_first_entry(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    assert client.claim("t", "c") == []
    late = _late_publisher(backend, clock).publish("t", b"late")
    other = backend.client(clock=clock)
    assert [m.id for m in other.claim("t", "c")] == [late]


def test_a_delivery_due_by_the_clock_is_claimed_at_once(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"later", delay=30)
    client.publish("t", b"now")
    [now] = client.claim("t", "c", max_messages=5, lease=20)
    assert now.body == b"now"
    bodies = []
    for _ in range(30):  # a claim every second moves the cursor along
        clock.advance(1)
        bodies.append([m.body for m in client.claim("t", "c", max_messages=5, lease=100)])
    # The lease expired at 20 s, the delayed publish came due at 30 s.
    assert bodies == [[]] * 19 + [[b"now"]] + [[]] * 9 + [[b"later"]]


def test_a_full_claim_moves_the_cursor_no_further_than_what_it_took(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    ids = client.publish_many("t", [b"%d" % i for i in range(10)])
    clock.advance(60)
    taken = []
    while got := client.claim("t", "c", max_messages=3):
        taken += [m.id for m in got]
    assert taken == ids


def test_a_channel_of_several_priorities_is_read_from_the_first_entry(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"low", priority=5)
    [low] = client.claim("t", "c")
    clock.advance(1)
    assert client.claim("t", "c") == []
    late = _late_publisher(backend, clock).publish("t", b"late")
    assert [m.id for m in client.claim("t", "c")] == [late]
    client.ack(low)


def test_an_ordered_channel_is_read_from_the_first_entry(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    first, second = client.publish_many("t", [b"1", b"2"], groups=["g", "g"])
    clock.advance(60)
    [head] = client.claim("t", "c", max_messages=5)
    assert head.id == first
    client.ack(head)  # the group's next delivery, due since 60 s, is free now
    [nxt] = client.claim("t", "c", max_messages=5)
    assert nxt.id == second


def _dead(backend: Backend) -> int:
    with backend.engine().connect() as conn:
        return conn.execute(
            sa.select(sa.func.count()).where(deliveries.c.state == STATE_DEAD)
        ).scalar_one()


def test_the_loops_reaper_reads_from_its_last_pass_and_misses_no_expiry(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    """The maintenance loop's lease reaper (here one pass a second) reads the
    leases expired since its last pass: each is reaped at the first pass after
    it expires, and one written behind that point (by a client whose clock
    runs behind) at the next pass that reads from the first, within
    REAP_RESCAN_US."""
    jobs = client._maintenance
    client.ensure_channel("t", "c")
    client.publish_many("t", [b"a", b"b"], max_attempts=1)
    client.claim("t", "c", lease=5)
    dead = []
    for _ in range(8):
        clock.advance(1)
        jobs.reap_since_last_pass()
        dead.append(_dead(backend))
    assert dead == [0, 0, 0, 0, 1, 1, 1, 1]  # out of attempts at 5 s: dead letter
    _late_publisher(backend, clock).claim("t", "c", lease=1)  # expired behind the reaper
    passes = 0
    while _dead(backend) < 2:
        passes += 1
        assert passes <= REAP_RESCAN_US / US, "the rescan never came"
        clock.advance(1)
        jobs.reap_since_last_pass()
    assert passes > 1  # not at the next pass: it was behind


def test_the_loops_look_behind_a_cursor_sends_the_next_claim_to_the_first_entry(
    backend: Backend, client: novaque.Client, clock: FakeClock
) -> None:
    """A started client's maintenance loop looks behind each cursor every
    LOOK_BEHIND_US: a delivery there is claimed by the next claim, before the
    claims' own rescan; when nothing is there, the claims' rescan waits."""
    jobs = client._maintenance
    client.ensure_channel("t", "c")
    assert client.claim("t", "c") == []
    clock.advance(1)
    late = _late_publisher(backend, clock).publish("t", b"late")
    assert client.claim("t", "c") == []  # behind the cursor
    assert jobs.look_behind_claim_cursors() == 0  # not due yet: nothing read
    clock.advance(LOOK_BEHIND_US / US - 1)
    assert jobs.look_behind_claim_cursors() == 1
    assert [m.id for m in client.claim("t", "c")] == [late]
    # Nothing behind: the look lets the claims go on from the cursor.
    assert client.claim("t", "c") == []
    clock.advance(LOOK_BEHIND_US / US)
    assert jobs.look_behind_claim_cursors() == 0
    assert client.claim("t", "c") == []
    clock.advance(1)
    second = _late_publisher(backend, clock).publish("t", b"second")
    clock.advance(RESCAN_US / US - LOOK_BEHIND_US / US)  # past the claims' own rescan, had
    assert client.claim("t", "c") == []  # the look not counted as one
    clock.advance(LOOK_BEHIND_US / US)
    assert jobs.look_behind_claim_cursors() == 1
    assert [m.id for m in client.claim("t", "c")] == [second]
