"""Priorities: lower first among a channel's due deliveries, then oldest due
first; kept through retries, snoozes, deferral, dead letters and replays; a
group's own order on group_fifo, none on strict_fifo; bad values refused."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import novaque
from novaque.schema import channels, deliveries, messages, topics
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = [pytest.mark.usefixtures("twin"), pytest.mark.pooled]


def _bodies(msgs: list[novaque.Message]) -> list[bytes]:
    return [m.body for m in msgs]


def _publish_mixed(client: novaque.Client) -> None:
    client.publish("t", b"a0")
    client.publish("t", b"bulk", priority=10)
    client.publish_many("t", [b"b0", b"c0"])
    client.publish("t", b"urgent1", priority=-5)
    client.publish_many("t", [b"urgent2", b"urgent3"], priority=-5)
    client.publish("t", b"top", priority=-100)


MIXED_ORDER = [b"top", b"urgent1", b"urgent2", b"urgent3", b"a0", b"b0", b"c0", b"bulk"]


def test_a_claim_takes_the_lowest_priority_first_then_the_oldest(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    _publish_mixed(client)
    got = client.claim("t", "c", max_messages=100)
    assert _bodies(got) == MIXED_ORDER
    assert [m.priority for m in got] == [-100, -5, -5, -5, 0, 0, 0, 10]


def test_claims_of_one_go_down_the_lanes_in_order(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    _publish_mixed(client)
    got = [m for _ in range(8) for m in client.claim("t", "c", max_messages=1)]
    assert _bodies(got) == MIXED_ORDER
    assert client.claim("t", "c") == []
    # a claim that spans lanes takes what is left of each
    for msg in got:
        client.release([msg])
    assert _bodies(client.claim("t", "c", max_messages=3)) == MIXED_ORDER[:3]
    assert _bodies(client.claim("t", "c", max_messages=3)) == MIXED_ORDER[3:6]
    assert _bodies(client.claim("t", "c", max_messages=3)) == MIXED_ORDER[6:]


def test_pop_follows_priority(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    _publish_mixed(client)
    assert _bodies(client.pop("t", "c", max_messages=5)) == MIXED_ORDER[:5]
    assert _bodies(client.pop("t", "c", max_messages=5)) == MIXED_ORDER[5:]


def test_a_due_delivery_of_a_lower_priority_waits_for_nothing_not_due(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"later-urgent", priority=-50, delay=60)
    client.publish("t", b"now", priority=50)
    (now,) = client.claim("t", "c", max_messages=10)
    assert now.body == b"now"
    client.ack(now)
    clock.advance(61)
    assert _bodies(client.claim("t", "c", max_messages=10)) == [b"later-urgent"]


def test_retries_and_snoozes_keep_the_priority(client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"normal")
    client.publish("t", b"urgent", priority=-1)
    urgent = client.claim("t", "c")[0]
    assert urgent.body == b"urgent"
    client.requeue(urgent, delay=0)
    retried = client.claim("t", "c")[0]
    assert (retried.body, retried.priority, retried.attempts) == (b"urgent", -1, 2)
    client.snooze(retried, 0)
    assert client.claim("t", "c")[0].body == b"urgent"
    # an expired lease comes back in its lane too
    clock.advance(3600)
    again = client.claim("t", "c", max_messages=2)
    assert _bodies(again) == [b"urgent", b"normal"]


def test_deferred_and_dead_letters_keep_the_priority(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"normal")
    client.publish("t", b"deferred", priority=-3)
    client.publish("t", b"dead", priority=-7)
    client.publish("t", b"other")
    got = client.claim("t", "c", max_messages=2)
    assert _bodies(got) == [b"dead", b"deferred"]
    client.reject(got[0], "bad")
    client.defer(got[1])
    (back,) = client.claim_deferred("t", "c", [got[1].delivery_id])
    assert back.priority == -3
    client.release([back])
    assert client.requeue_dead("t", "c") == 1
    assert _bodies(client.claim("t", "c", max_messages=10)) == [
        b"dead",
        b"deferred",
        b"normal",
        b"other",
    ]


def test_a_replay_and_a_moved_dead_letter_keep_the_priority(client: novaque.Client) -> None:
    client.ensure_channel("t", "c")
    client.ensure_channel("t", "d")
    client.publish("t", b"normal")
    urgent_id = client.publish("t", b"urgent", priority=-2)
    for msg in client.claim("t", "c", max_messages=10):
        client.ack(msg)
    assert client.replay(urgent_id, ["c"]) == 1
    client.publish("t", b"after")
    assert _bodies(client.claim("t", "c", max_messages=10)) == [b"urgent", b"after"]
    got = client.claim("t", "d", max_messages=10)
    assert _bodies(got) == [b"urgent", b"normal", b"after"]
    client.reject(got[0], "x")
    client.ack(got[1])
    client.ack(got[2])
    # Channels made after the urgent message was published: its lane reaches
    # them with the letter moved there, and with a replay.
    client.ensure_channel("t", "e")
    assert client.requeue_dead("t", "d", to_channel="e") == 1
    client.publish("t", b"last")
    assert _bodies(client.claim("t", "e", max_messages=10)) == [b"urgent", b"last"]
    client.ensure_channel("t", "f")
    client.publish("t", b"plain")
    assert client.replay(urgent_id, ["f"]) == 1
    assert _bodies(client.claim("t", "f", max_messages=10)) == [b"urgent", b"plain"]


def test_a_channel_keeps_the_lowest_and_highest_lane_it_has_had(
    backend: Backend, client: novaque.Client
) -> None:
    """What MariaDB's claim walks: from the lowest lane up to the highest,
    widened by the publishes that bring another priority and never narrowed
    (a channel of priority 0 alone has the one lane 0)."""
    client.ensure_channel("t", "c")
    client.ensure_channel("other", "c")

    def lanes() -> dict[str, tuple[int, int]]:
        with backend.engine().connect() as conn:
            found = conn.execute(
                sa.select(topics.c.name, channels.c.low_lane, channels.c.high_lane).join(
                    topics, topics.c.id == channels.c.topic_id
                )
            )
            return {name: (low, high) for name, low, high in found}

    client.publish("t", b"plain")
    assert lanes() == {"t": (0, 0), "other": (0, 0)}
    _publish_mixed(client)
    assert lanes() == {"t": (-100, 10), "other": (0, 0)}
    for msg in client.claim("t", "c", max_messages=100):
        client.ack(msg)
    client.publish("t", b"again", priority=-3)
    assert lanes()["t"] == (-100, 10)
    assert _bodies(client.claim("t", "c")) == [b"again"]


def test_message_info_and_routed_channels_carry_the_priority(client: novaque.Client) -> None:
    client.ensure_channel("t", "all")
    client.ensure_channel("t", "vip", filter='headers.tier == "vip"')
    client.publish("t", b"plain", headers={"tier": "vip"})
    mid = client.publish("t", b"urgent", priority=-9, headers={"tier": "vip"})
    assert client.get_message(mid).priority == -9
    assert [m.priority for m in client.list_messages("t")] == [0, -9]
    for channel in ("all", "vip"):
        assert _bodies(client.claim("t", channel, max_messages=10)) == [b"urgent", b"plain"]


@pytest.mark.sync_only  # (the twin's callers hold AsyncConnections: tests/test_aio.py)
def test_a_publish_in_the_callers_transaction_carries_the_priority(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"first")
    with backend.engine().begin() as conn:
        client.publish("t", b"urgent", priority=-1, connection=conn)
    assert _bodies(client.claim("t", "c", max_messages=10)) == [b"urgent", b"first"]


def test_group_fifo_keeps_a_groups_order_and_ranks_heads_by_priority(
    client: novaque.Client,
) -> None:
    client.ensure_channel("t", "c", ordering="group_fifo")
    client.publish("t", b"a1", group="a", priority=5)
    client.publish("t", b"a2", group="a", priority=-5)  # waits behind a1 all the same
    client.publish("t", b"b1", group="b")
    client.publish("t", b"free", priority=-1)  # no group: competes by its own priority
    got = client.claim("t", "c", max_messages=10)
    assert _bodies(got) == [b"free", b"b1", b"a1"]
    for msg in got:
        client.ack(msg)
    assert _bodies(client.claim("t", "c", max_messages=10)) == [b"a2"]


def test_strict_fifo_ignores_priorities(client: novaque.Client) -> None:
    client.ensure_channel("t", "c", ordering="strict_fifo")
    client.publish("t", b"first", priority=50)
    client.publish("t", b"second", priority=-50)
    for expected in (b"first", b"second"):
        got = client.claim("t", "c", max_messages=10)
        assert _bodies(got) == [expected]
        client.ack(got[0])


@pytest.mark.parametrize(
    ("value", "error", "text"),
    [
        (None, TypeError, "priority must be an int from -100 to 100, got NoneType"),
        (True, TypeError, "got bool"),
        (1.0, TypeError, "got float"),
        ("1", TypeError, "got str"),
        (101, novaque.InvalidOption, r"from -100 \(first\) to 100 \(last\), got 101"),
        (-101, novaque.InvalidOption, "got -101"),
    ],
)
def test_a_bad_priority_is_refused_and_writes_nothing(
    backend: Backend, client: novaque.Client, value: object, error: type[Exception], text: str
) -> None:
    client.ensure_channel("t", "c")
    with pytest.raises(error, match=text):
        client.publish("t", b"x", priority=value)  # type: ignore[arg-type]
    with pytest.raises(error, match=text):
        client.publish_many("t", [b"x"], priority=value)  # type: ignore[arg-type]
    with backend.engine().connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(messages)).scalar_one() == 0


def test_dead_and_deferred_deliveries_lie_in_lane_0(
    backend: Backend, client: novaque.Client
) -> None:
    """Dead letters are one range of the claim index whatever their priority
    (the dead-letter listing reads it in id order)."""
    client.ensure_channel("t", "c")
    client.publish_many("t", [b"x", b"y"], priority=-4)
    x, y = client.claim("t", "c", max_messages=2)
    client.reject(x, "r")
    client.defer(y)
    with backend.engine().connect() as conn:
        lanes = conn.execute(sa.select(deliveries.c.priority)).scalars().all()
    assert lanes == [0, 0]
    assert [d.message_id for d in client.list_dead("t", "c")] == [x.id]
