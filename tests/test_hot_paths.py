"""The hot operations (publish of one message, claim, ack with the next
claim, ordered or not) run both ways on every backend: in the driver's own SQL
where the dialect writes them so, and through SQLAlchemy Core, which an
engine with cursor events or SQL logging always takes. Both give the same
results; which way ran is checked from the links the dialect was handed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import novaque
from novaque.dialects.params import Driver
from tests.conftest import Backend

pytestmark = [pytest.mark.usefixtures("twin"), pytest.mark.pooled]

#: The operations each backend's dialect writes for its driver (a MariaDB
#: server here; MySQL proper has none: no INSERT ... RETURNING).
DRIVEN = {
    "sqlite": {"publish_plain", "ack_and_claim"},
    "postgres": {"publish_plain", "claim", "ack_and_claim"},
    "pgbouncer": {"publish_plain", "claim", "ack_and_claim"},
    "mysql": {"publish_plain", "claim", "ack_and_claim"},
}


def watch_links(client: novaque.Client, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often each hot method of the client's dialect was handed a Driver."""
    driven: Counter[str] = Counter()
    dialect = client._context.dialect
    for name in ("publish_plain", "claim", "ack_and_claim"):
        method: Callable[..., Any] = getattr(dialect, name)

        def spy(link: Any, *args: Any, _name: str = name, _method: Any = method) -> Any:
            if isinstance(link, Driver):
                driven[_name] += 1
            return _method(link, *args)

        monkeypatch.setattr(dialect, name, spy)
    return driven


def test_publish_claim_and_ack_and_claim_agree_both_ways(
    client: novaque.Client, backend: Backend, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.ensure_channel("t", "a")
    client.ensure_channel("t", "b", max_attempts=3)
    client.publish("t", b"warm")  # the topic id is cached from here on
    [warm] = client.claim("t", "a")
    client.ack(warm)
    driven = watch_links(client, monkeypatch)
    ids = [client.publish("t", f"m{i}".encode(), headers={"n": str(i)}) for i in range(5)]
    first = client.claim("t", "a", max_messages=2)
    assert [m.id for m in first] == ids[:2]
    assert [(m.body, m.headers, m.attempts) for m in first] == [
        (b"m0", {"n": "0"}, 1),
        (b"m1", {"n": "1"}, 1),
    ]
    channel_id = first[0].channel_id
    lost, second = client._consuming.ack_and_claim(first, "t", "a", channel_id, 10, 30.0)
    assert lost == []
    assert [m.id for m in second] == ids[2:]
    assert all(m.lease_token == second[0].lease_token for m in second)
    lost, third = client._consuming.ack_and_claim(second, "t", "a", channel_id, 10, 30.0)
    assert (lost, third) == ([], [])
    # The other channel's deliveries, with its own max_attempts, untouched.
    other = client.claim("t", "b", max_messages=10)
    assert [(m.id, m.max_attempts) for m in other] == [(warm.id, 3), *[(i, 3) for i in ids]]
    client.ack_many(other)
    client.flush_stats()
    counters = client.channel_counters("t", "a")
    assert (counters.published, counters.claimed, counters.acked) == (6, 6, 6)
    expected = DRIVEN[backend.name] if way == "driver" else set()
    assert set(driven) == expected


def test_an_ordered_ack_and_claim_moves_groups_on_both_ways(
    client: novaque.Client, backend: Backend, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.ensure_channel("o", "c", ordering="group_fifo")
    client.publish_many("o", [b"a0", b"a1", b"b0", b"b1"], groups=["a", "a", "b", "b"])
    driven = watch_links(client, monkeypatch)
    heads = client.claim("o", "c", max_messages=10)
    assert [(m.body, m.group) for m in heads] == [(b"a0", "a"), (b"b0", "b")]
    lost, nexts = client._consuming.ack_and_claim(heads, "o", "c", heads[0].channel_id, 10, 30.0)
    assert (lost, [m.body for m in nexts]) == ([], [b"a1", b"b1"])
    lost, none = client._consuming.ack_and_claim(nexts, "o", "c", heads[0].channel_id, 10, 30.0)
    assert (lost, none) == ([], [])
    # Ordered acks go the driver's way where the dialect pipelines them
    # (PostgreSQL); elsewhere the groups move on in SQLAlchemy's transaction.
    pipelined = way == "driver" and backend.name in ("postgres", "pgbouncer")
    assert driven["ack_and_claim"] == (2 if pipelined else 0)


def test_a_publish_that_meets_routed_channels_is_written_in_full_both_ways(
    client: novaque.Client, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-message publish expects plain channels only; a topic that gained
    a filtered channel since is published again in a transaction that writes
    the routed deliveries too."""
    client.ensure_channel("r", "all")
    client.publish("r", b"before")
    client.ensure_channel("r", "eu", filter='headers["region"] == "eu"')
    eu = client.publish("r", b"eu", headers={"region": "eu"})
    us = client.publish("r", b"us", headers={"region": "us"})
    assert [m.body for m in client.claim("r", "all", max_messages=10)] == [b"before", b"eu", b"us"]
    assert [m.id for m in client.claim("r", "eu", max_messages=10)] == [eu]
    assert us > eu


def test_claims_go_down_the_priority_lanes_both_ways(
    client: novaque.Client, backend: Backend, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.ensure_channel("p", "c")
    client.publish("p", b"warm")
    client.ack(client.claim("p", "c")[0])
    driven = watch_links(client, monkeypatch)
    client.publish("p", b"n0")
    client.publish("p", b"bulk", priority=7)
    client.publish("p", b"n1")
    client.publish_many("p", [b"u0", b"u1"], priority=-3)
    first = client.claim("p", "c", max_messages=3)  # two lanes in one claim
    assert [(m.body, m.priority) for m in first] == [(b"u0", -3), (b"u1", -3), (b"n0", 0)]
    channel_id = first[0].channel_id
    lost, rest = client._consuming.ack_and_claim(first, "p", "c", channel_id, 10, 30.0)
    assert (lost, [m.body for m in rest]) == ([], [b"n1", b"bulk"])
    lost, none = client._consuming.ack_and_claim(rest, "p", "c", channel_id, 10, 30.0)
    assert (lost, none) == ([], [])
    expected = DRIVEN[backend.name] - {"publish_plain"} if way == "driver" else set()
    assert set(driven) - {"publish_plain"} == expected
