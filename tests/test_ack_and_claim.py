"""Acking one batch and claiming the next in one transaction (what a consumer does)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

import novaque
from novaque.testing import FakeClock

pytestmark = [pytest.mark.usefixtures("twin", "way"), pytest.mark.pooled]


def setup(client: novaque.Client, n: int) -> tuple[list[int], int]:
    client.ensure_channel("t", "c")
    ids = [client.publish("t", f"m{i}") for i in range(n)]
    return ids, client._topology.channel_id("t", "c")


def test_acks_the_batch_and_leases_the_next_in_order(client: novaque.Client) -> None:
    ids, channel_id = setup(client, 7)
    first = client.claim("t", "c", max_messages=3)
    lost, second = client._consuming.ack_and_claim(first, "t", "c", channel_id, 3, 30.0)
    assert lost == []
    assert [m.id for m in second] == ids[3:6]
    assert [m.body for m in second] == [b"m3", b"m4", b"m5"]
    assert {m.lease_token for m in second} != {m.lease_token for m in first}
    assert all(m.attempts == 1 for m in second)
    lost, third = client._consuming.ack_and_claim(second, "t", "c", channel_id, 5, 30.0)
    assert lost == []
    assert [m.id for m in third] == ids[6:]
    client.ack_many(third)
    # Everything was acked exactly once: nothing left, counters agree.
    assert client.claim("t", "c", max_messages=10) == []
    client.flush_stats()
    counters = client.channel_counters("t", "c")
    assert (counters.claimed, counters.acked) == (7, 7)
    backlog = client.channel_backlog("t", "c")
    assert (backlog.ready, backlog.in_flight, backlog.pending) == (0, 0, 0)


def test_a_stale_token_is_reported_lost_and_its_delivery_kept(client: novaque.Client) -> None:
    _, channel_id = setup(client, 3)
    [held] = client.claim("t", "c", max_messages=1)
    stale = replace(held, lease_token="0" * 32)
    lost, got = client._consuming.ack_and_claim([stale], "t", "c", channel_id, 1, 30.0)
    assert lost == [stale]
    assert len(got) == 1
    assert got[0].delivery_id != held.delivery_id
    client.ack(held)  # the real lease was untouched: it still settles
    client.ack(got[0])


def test_an_expired_lease_being_acked_is_not_claimed_again_by_the_same_call(
    client: novaque.Client, clock: FakeClock
) -> None:
    ids, channel_id = setup(client, 2)
    [held] = client.claim("t", "c", max_messages=1, lease=1)
    clock.advance(5)  # expired, not reaped: its token still settles
    lost, got = client._consuming.ack_and_claim([held], "t", "c", channel_id, 10, 30.0)
    assert lost == []
    assert [m.id for m in got] == [ids[1]]
    client.ack(got[0])
    assert client.claim("t", "c", max_messages=10) == []


def test_without_free_slots_it_only_acks(client: novaque.Client) -> None:
    _, channel_id = setup(client, 2)
    first = client.claim("t", "c", max_messages=1)
    lost, got = client._consuming.ack_and_claim(first, "t", "c", channel_id, 0, 30.0)
    assert (lost, got) == ([], [])
    [last] = client.claim("t", "c", max_messages=10)
    client.ack(last)


def test_the_channels_lease_serves_a_consumer_that_names_none(
    client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", lease=600)
    ids, channel_id = setup(client, 3)
    first = client.claim("t", "c", max_messages=1)
    # channel_lease: the consumer named no lease, so the channel's wins over
    # the 30 s passed (what Options.default_lease would be).
    lost, second = client._consuming.ack_and_claim(
        first, "t", "c", channel_id, 1, 30.0, channel_lease=True
    )
    assert lost == []
    assert [m.lease_expires_at for m in second] == [clock() + timedelta(seconds=600)]
    lost, third = client._consuming.ack_and_claim(second, "t", "c", channel_id, 1, 30.0)
    assert [m.lease_expires_at for m in third] == [clock() + timedelta(seconds=30)]
    assert [m.id for m in first + second + third] == ids
    client.ack_many(third)


def test_a_paused_channel_is_acked_but_hands_out_nothing(client: novaque.Client) -> None:
    ids, channel_id = setup(client, 3)
    first = client.claim("t", "c", max_messages=1)
    client.pause_channel("t", "c")
    lost, got = client._consuming.ack_and_claim(first, "t", "c", channel_id, 5, 30.0)
    assert (lost, got) == ([], [])
    client.resume_channel("t", "c")
    assert [m.id for m in client.claim("t", "c", max_messages=5)] == ids[1:]
    assert client.channel_backlog("t", "c").in_flight == 2


def test_the_group_of_a_message_comes_with_it_on_an_unordered_channel(
    client: novaque.Client,
) -> None:
    _, channel_id = setup(client, 1)
    client.publish("t", b"grouped", group="order-7")
    first = client.claim("t", "c", max_messages=1)
    lost, [got] = client._consuming.ack_and_claim(first, "t", "c", channel_id, 5, 30.0)
    assert lost == []
    assert (got.body, got.group, got.order_key) == (b"grouped", "order-7", None)
    client.ack(got)
