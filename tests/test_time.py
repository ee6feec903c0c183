"""Without an injected clock, novaque follows the database server's clock."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from novaque._time import Clock, day_of, from_us, start_of_day, to_us
from tests.conftest import Backend


@pytest.mark.usefixtures("twin")
def test_default_clock_agrees_with_the_server(backend: Backend) -> None:
    client = backend.client()
    client.list_topics()  # first call: schema check and clock sample
    with backend.engine().connect() as conn:
        server = client._context.dialect.db_now_us(conn)
    ours = client._context.now()
    reference = server if server is not None else time.time_ns() // 1000  # SQLite: the host
    assert abs(ours - reference) < 2_000_000


def test_a_skewed_host_follows_the_server() -> None:
    clock = Clock(None)
    server_ahead = 3_600_000_000  # the server is an hour ahead of this host
    clock.sample(lambda: time.time_ns() // 1000 + server_ahead)
    drift = clock.now_us() - (time.time_ns() // 1000 + server_ahead)
    assert abs(drift) < 1_000_000
    clock.sample(lambda: None)  # a server without a clock keeps the last sample
    assert abs(clock.now_us() - (time.time_ns() // 1000 + server_ahead)) < 1_000_000


def test_microsecond_conversions_are_exact_and_aware() -> None:
    moment = datetime(2026, 11, 29, 23, 59, 59, 999_999, tzinfo=timezone.utc)
    assert from_us(to_us(moment)) == moment
    assert from_us(0).tzinfo is timezone.utc
    assert day_of(to_us(moment)).isoformat() == "2026-11-29"
    assert day_of(to_us(moment) + 1).isoformat() == "2026-11-30"
    assert start_of_day(day_of(to_us(moment))) == to_us(moment) + 1 - 86_400_000_000
