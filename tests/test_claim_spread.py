"""The spread claim of a Galera cluster's nodes, on a lone MariaDB/MySQL server.

On a Galera cluster (found at the client's first use: ``wsrep_on`` with a
provider) each claim looks first in one slice of the due deliveries, picked
at random, so that claims on different nodes mostly lease different rows
(tests/test_galera.py runs it on a real cluster). Here the spread is switched
on by hand on a lone server, with the slice chosen by the test, to check what
it takes: the oldest due of that slice, the oldest due of all when the slice
has none, nothing from a paused channel; and that a lone server keeps the
plain claim, oldest due first.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable

import pytest
import sqlalchemy as sa

import novaque
from novaque.dialects import mysql
from novaque.schema import deliveries
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")

SLICES = mysql.CLAIM_SLICES


def slice_of(delivery_id: int) -> int:
    """The slice of a delivery, as the server computes it (CRC32 of the id's text)."""
    return zlib.crc32(str(delivery_id).encode()) % SLICES


@pytest.fixture
def spread(
    backend: Backend, client: novaque.Client, monkeypatch: pytest.MonkeyPatch
) -> Callable[[int], list[int]]:
    """The channel ``t``/``c`` with 60 messages, the client's claims spread;
    returns a function that fixes the slice of the next claims and gives the
    ids of the deliveries due, oldest first (all published at one time)."""
    client.ensure_channel("t", "c")
    client.publish_many("t", [f"m{i}".encode() for i in range(60)])
    client._context.dialect.slices = SLICES  # type: ignore[attr-defined]  # as on a cluster

    def choose(slice_: int) -> list[int]:
        monkeypatch.setattr(
            mysql, "_slice_params", lambda slices: {"p_slices": slices, "p_slice": slice_}
        )
        with backend.engine().connect() as conn:
            due = sa.select(deliveries.c.id).where(deliveries.c.state == 0)
            return [int(i) for i in conn.execute(due.order_by(deliveries.c.id)).scalars()]

    return choose


def delivery_ids(msgs: list[novaque.Message]) -> list[int]:
    return [m.delivery_id for m in msgs]


@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_a_spread_claim_takes_the_oldest_due_of_its_slice(
    backend: Backend, client: novaque.Client, spread: Callable[[int], list[int]]
) -> None:
    due = spread(0)
    crowded = max(range(SLICES), key=lambda s: sum(slice_of(i) == s for i in due))
    due = spread(crowded)
    in_slice = [i for i in due if slice_of(i) == crowded]
    assert len(in_slice) >= 3
    assert delivery_ids(client.claim("t", "c", max_messages=2)) == in_slice[:2]
    # The SQLAlchemy path (an attempt id) and receive-and-delete take the same.
    assert delivery_ids(client.claim("t", "c", attempt_id="a1")) == in_slice[2:3]
    assert delivery_ids(client.pop("t", "c")) == in_slice[3:4]


@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_a_spread_claim_whose_slice_has_none_due_takes_the_oldest_due(
    backend: Backend, client: novaque.Client, spread: Callable[[int], list[int]]
) -> None:
    empty = slice_of(spread(0)[0])
    with backend.engine().begin() as conn:  # the slice of the oldest, emptied
        conn.execute(deliveries.delete().where(sa.func.crc32(deliveries.c.id) % SLICES == empty))
    due = spread(empty)
    assert due
    assert all(slice_of(i) != empty for i in due)
    assert delivery_ids(client.claim("t", "c", max_messages=2)) == due[:2]
    assert delivery_ids(client.claim("t", "c", attempt_id="a1")) == due[2:3]
    assert delivery_ids(client.pop("t", "c")) == due[3:4]


@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_a_spread_claim_takes_its_slice_of_the_lowest_priority_first(
    backend: Backend, client: novaque.Client, spread: Callable[[int], list[int]]
) -> None:
    """Urgent deliveries go first whatever the slice: the claim looks in its
    slice of the lowest priority, then in all of that priority, then in the
    next priority."""
    spread(0)
    urgent = client.publish_many("t", [f"u{i}".encode() for i in range(20)], priority=-1)
    due = spread(0)
    urgent_due = [i for i in due if i > max(due) - 20]
    crowded = max(range(SLICES), key=lambda s: sum(slice_of(i) == s for i in urgent_due))
    spread(crowded)
    in_slice = [i for i in urgent_due if slice_of(i) == crowded]
    got = client.claim("t", "c", max_messages=len(in_slice))
    assert delivery_ids(got) == in_slice
    assert {m.id for m in got} <= set(urgent)
    # The slice has no urgent one left: every urgent one, then the slice's others.
    rest = client.claim("t", "c", max_messages=100)
    left = 20 - len(in_slice)
    assert [m.priority for m in rest[:left]] == [-1] * left
    later = rest[left:]
    assert later
    assert all(m.priority == 0 and slice_of(m.delivery_id) == crowded for m in later)


@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_a_spread_claim_of_a_paused_channel_takes_nothing(
    backend: Backend, client: novaque.Client, spread: Callable[[int], list[int]]
) -> None:
    due = spread(slice_of(spread(0)[0]))
    client.pause_channel("t", "c")
    assert client.claim("t", "c", max_messages=5) == []
    assert client.claim("t", "c", attempt_id="a1") == []
    assert client.pop("t", "c") == []
    client.resume_channel("t", "c")
    assert delivery_ids(client.claim("t", "c")) == due[:1]


@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_a_spread_consumer_handles_every_message_once(
    backend: Backend, client: novaque.Client, spread: Callable[[int], list[int]]
) -> None:
    due = spread(3)  # the slice's deliveries first, then the oldest of the others
    seen: list[int] = []
    done = threading.Event()

    def handler(msg: novaque.Message) -> None:
        seen.append(msg.delivery_id)
        if len(seen) == len(due):
            done.set()

    consumer = client.subscribe_and_start("t", "c", handler, max_in_flight=4)
    assert done.wait(60), f"{len(seen)} of {len(due)} handled"
    consumer.shutdown()
    assert sorted(seen) == due


def test_a_lone_server_claims_the_oldest_due_first(
    backend: Backend, client: novaque.Client
) -> None:
    client.ensure_channel("t", "c")
    ids = client.publish_many("t", [f"m{i}".encode() for i in range(40)])
    assert [m.id for m in client.claim("t", "c", max_messages=3)] == ids[:3]
    assert [m.id for m in client.claim("t", "c", attempt_id="a1")] == ids[3:4]
    assert getattr(client._context.dialect, "slices", 0) == 0
