"""Settling deliveries known only by id and lease token (what the network
broker's callers hold): ``Consuming.leased`` and ``Consuming.ack_named``, on
both twins and every backend."""

from __future__ import annotations

import pytest

import novaque

pytestmark = pytest.mark.usefixtures("twin")


def test_leased_finds_only_the_current_leases_of_the_channel(client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing", lease=45)
    client.ensure_channel("orders", "shipping")
    client.publish_many("orders", [b"a", b"b", b"c"])
    a, b, c = client.claim("orders", "billing", max_messages=3)
    [other] = client.claim("orders", "shipping")
    client.ack(c)
    named = [
        (a.delivery_id, a.lease_token),
        (b.delivery_id, "0" * 32),  # a wrong token
        (c.delivery_id, c.lease_token),  # settled
        (other.delivery_id, other.lease_token),  # another channel's
        (10**12, a.lease_token),  # no such delivery
    ]
    [found] = client._consuming.leased("orders", "billing", named)
    assert (found.delivery_id, found.lease_token) == (a.delivery_id, a.lease_token)
    assert (found.id, found.attempts, found.max_attempts) == (a.id, 1, a.max_attempts)
    assert found.channel_lease_us == 45_000_000
    # What it found settles as the claimed message does.
    client.requeue(found, delay=0, error="retry")
    with pytest.raises(novaque.LeaseLost):
        client.ack(a)
    assert client._consuming.leased("orders", "billing", []) == []


def test_ack_named_acks_in_one_call_and_moves_groups_on(client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing", ordering="group_fifo")
    client.publish_many("orders", [b"g1", b"g2", b"h1"], groups=["g", "g", "h"])
    g1, h1 = client.claim("orders", "billing", max_messages=10)
    assert client.claim("orders", "billing") == []  # g2 waits for its head
    acked = client._consuming.ack_named(
        "orders",
        "billing",
        [(g1.delivery_id, g1.lease_token), (h1.delivery_id, "0" * 32)],
    )
    assert acked == {g1.delivery_id}
    [g2] = client.claim("orders", "billing")
    assert g2.body == b"g2"
    client.ack_many([g2, h1])
    assert client.channel_backlog("orders", "billing") == novaque.Backlog()
    assert client._consuming.ack_named("orders", "billing", []) == set()
    with pytest.raises(novaque.ChannelNotFound):
        client._consuming.ack_named("orders", "nothing", [(1, "x")])
