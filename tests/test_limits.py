"""Channel limits (DESIGN §12): max_leased, rate_limit and group_max_leased,
through claim, pop, claim_deferred, ack-and-claim and consumers, counted
across clients; their settings, their bad values; on both twins."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

import novaque
from novaque.schema import STATE_LEASED, deliveries
from tests.conftest import Backend, FakeClock

pytestmark = pytest.mark.usefixtures("twin")

#: A moment on every window's edge (a whole day since the epoch).
EDGE = datetime(2030, 1, 1, tzinfo=timezone.utc)


def publish(client: novaque.Client, count: int, **kwargs: object) -> list[int]:
    return [client.publish("t", str(i).encode(), **kwargs) for i in range(count)]  # type: ignore[arg-type]


def leased(backend: Backend) -> int:
    """What the database says is leased now, on every channel."""
    with backend.engine().connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(deliveries.c.state == STATE_LEASED)
            ).scalar_one()
        )


# -- max_leased ----------------------------------------------------------------------


def test_max_leased_caps_what_is_leased_across_clients(
    client: novaque.Client, backend: Backend, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c", max_leased=2)
    publish(client, 5)
    other = backend.client(clock=clock)
    got = client.claim("t", "c", max_messages=5)
    assert len(got) == 2
    assert other.claim("t", "c", max_messages=5) == []
    assert client.claim("t", "c") == []
    client.ack(got[0])
    [more] = other.claim("t", "c", max_messages=5)
    assert other.claim("t", "c") == []
    client.requeue(got[1], delay=0)
    other.reject(more)
    assert len(client.claim("t", "c", max_messages=5)) == 2
