"""Dead-letter bytes (DESIGN §9): ``dead_max_bytes`` bounds the total body bytes
of a channel's dead letters; the oldest died go first."""

from __future__ import annotations

import pytest

import novaque
from novaque import Backlog
from novaque.testing import FakeClock
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")


def bury(client: novaque.Client, clock: FakeClock, channel: str, sizes: list[int]) -> list[int]:
    """Publish one message per size to topic t and kill its deliveries in
    ``channel``, the last published first, a second apart: their message ids in
    publish order (died_at then runs against delivery-id order)."""
    ids = client.publish_many("t", [b"x" * n for n in sizes])
    claimed = {m.id: m for m in client.claim("t", channel, max_messages=len(sizes))}
    for message_id in reversed(ids):
        clock.advance(1)
        client.reject(claimed[message_id])
    return ids


def letters(client: novaque.Client, channel: str) -> list[int]:
    return [x.message_id for x in client.list_dead("t", channel)]


def test_the_oldest_died_go_first_until_the_rest_fit(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", dead_max_bytes=250)
    ids = bury(client, clock, "c", [100, 100, 100, 100])  # ids[3] died first
    assert client.enforce_dead_retention() == 2
    assert letters(client, "c") == ids[:2]  # the two that died last
    assert client.enforce_dead_retention() == 0  # within bounds: nothing more
    client.flush_stats()
    assert client.channel_counters("t", "c").purged == 2


def test_a_bound_met_exactly_keeps_them_and_a_newest_too_big_keeps_none(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", dead_max_bytes=300)
    ids = bury(client, clock, "c", [100, 100, 100])
    assert client.enforce_dead_retention() == 0  # 300 bytes fit 300
    assert letters(client, "c") == ids
    bury(client, clock, "c", [301])  # the newest alone is over the bound
    assert client.enforce_dead_retention() == 4
    assert letters(client, "c") == []


def test_the_channel_setting_and_the_options_default(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, dead_max_bytes=150)
    client.ensure_channel("t", "own", dead_max_bytes=1000)
    client.ensure_channel("t", "default")  # bounded by Options.dead_max_bytes
    ids = client.publish_many("t", [b"x" * 100] * 3)
    for channel in ("own", "default"):
        for msg in client.claim("t", channel, max_messages=3):
            clock.advance(1)
            client.reject(msg)
    assert client.enforce_dead_retention() == 2
    assert letters(client, "own") == ids
    assert letters(client, "default") == ids[2:]  # died last
    client.ensure_channel("t", "own", reset=("dead_max_bytes",))  # back to the default
    client.run_maintenance()  # retention is part of every maintenance pass
    assert letters(client, "own") == ids[2:]


def test_a_zero_bound_deletes_every_letter_and_nothing_else(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", dead_max_bytes=0)
    client.ensure_channel("t", "free")
    ids = client.publish_many("t", [b"a", b"bb", b"ccc", b"dddd"])
    for channel in ("c", "free"):
        for msg in client.claim("t", channel, max_messages=3):
            client.reject(msg)
    assert client.enforce_dead_retention() == 3
    assert letters(client, "c") == []
    assert letters(client, "free") == ids[:3]
    assert client.channel_backlog("t", "c") == Backlog(ready=1)  # only dead rows go


def test_every_bound_applies_in_turn(backend: Backend, clock: FakeClock) -> None:
    client = backend.client(clock=clock, maintenance_batch=2)
    client.ensure_channel("t", "c", dead_max_count=4, dead_max_bytes=250)
    ids = bury(client, clock, "c", [10, 200, 100, 10, 10, 10])
    # The count keeps ids[:4] (died last); their bytes, newest died first: 10,
    # 200, then 100 is over 250: ids[0] and ids[1] stay (in batches of two).
    assert client.enforce_dead_retention() == 4
    assert letters(client, "c") == ids[:2]
