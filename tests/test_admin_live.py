"""The admin's live parts (DESIGN §10): the "last hour, per minute" charts and
the consumers online, on the dashboard and the channel page, and their JSON."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import novaque
from novaque.admin import create_app
from novaque.testing import FakeClock
from tests.wsgi import WSGIClient

NOON = datetime(2026, 6, 1, 12, 30, 20, tzinfo=timezone.utc)
ZERO = {"published": 0, "claimed": 0, "acked": 0, "requeued": 0, "dead": 0, "purged": 0}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOON)


@pytest.fixture
def web(client: novaque.Client) -> WSGIClient:
    return WSGIClient(create_app(client))


def test_the_minutes_api_lists_every_minute_of_the_last_hour(
    web: WSGIClient, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("orders", "billing")
    client.ensure_channel("mail", "send")
    client.publish("orders", b"old")  # 12:30, more than an hour before the read
    clock.advance(minutes=61)  # 13:31
    client.publish_many("orders", [b"1", b"2"])
    client.publish("mail", b"m")
    clock.advance(minutes=2)  # 13:33
    [msg] = client.claim("orders", "billing")
    client.ack(msg)
    client.flush_stats()

    data = web.get("/admin/api/topics/orders/channels/billing/minutes").json()
    assert (data["topic"], data["channel"]) == ("orders", "billing")
    assert data["since"] == "2026-06-01T12:34:00+00:00"
    assert data["until"] == "2026-06-01T13:33:00+00:00"
    rows = data["minutes"]
    assert len(rows) == 60
    assert rows[0] == {"minute": "2026-06-01T12:34:00+00:00", **ZERO}
    assert rows[-3] == {"minute": "2026-06-01T13:31:00+00:00", **ZERO, "published": 2}
    assert rows[-1] == {"minute": "2026-06-01T13:33:00+00:00", **ZERO, "claimed": 1, "acked": 1}
    assert sum(r["published"] for r in rows) == 2  # 12:30 is out of the hour

    every = web.get("/admin/api/minutes").json()
    assert (every["topic"], every["channel"]) == (None, None)
    assert every["minutes"][-3]["published"] == 3  # orders/billing + mail/send
    assert web.get("/admin/api/topics/orders/channels/nope/minutes").status == 404


def test_the_dashboard_chart_says_it_counts_deliveries(
    web: WSGIClient, client: novaque.Client, clock: FakeClock
) -> None:
    """Every channel added up: a message published to a topic with two channels
    is two deliveries, and the chart's title and note say that is what it counts."""
    client.ensure_channel("orders", "billing")
    client.ensure_channel("orders", "shipping")
    client.publish_many("orders", [b"1", b"2", b"3"])
    for channel in ("billing", "shipping"):
        client.ack_many(client.claim("orders", channel, max_messages=3))
    client.flush_stats()
    last = web.get("/admin/api/minutes").json()["minutes"][-1]
    assert (last["published"], last["acked"]) == (6, 6)  # 3 messages, 2 channels
    dashboard = web.get("/admin/").text
    assert '<h2>Last hour <span class="muted">deliveries per minute, every channel added up' in (
        dashboard
    )
    assert 'data-title="Deliveries per minute of the last hour, every channel added up"' in (
        dashboard
    )
    assert "a message published to a topic with two channels is two deliveries" in dashboard
    page = web.get("/admin/topics/orders/channels/billing").text
    assert "deliveries per minute, orders/billing</span>" in page
    assert 'data-title="Deliveries per minute of the last hour, orders/billing"' in page
    billing = web.get("/admin/api/topics/orders/channels/billing/minutes").json()
    assert (billing["minutes"][-1]["published"], billing["minutes"][-1]["acked"]) == (3, 3)


def test_pages_carry_the_live_chart_beside_the_daily_trend(
    web: WSGIClient, client: novaque.Client
) -> None:
    client.ensure_channel("orders", "billing")
    page = web.get("/admin/topics/orders/channels/billing").text
    assert 'id="chart"' in page  # the daily trend stays
    assert 'data-minutes="/admin/api/topics/orders/channels/billing/minutes"' in page
    assert page.index('id="chart"') < page.index('id="live-chart"')
    dashboard = web.get("/admin/").text
    assert 'data-minutes="/admin/api/minutes"' in dashboard


def test_consumers_online_on_the_dashboard_and_the_channel_page(
    web: WSGIClient, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("orders", "audit")
    consumer = client.subscribe_and_start("orders", "billing", lambda m: None, max_in_flight=4)
    try:
        overview = web.get("/admin/api/overview").json()
        assert overview["consumers"] == 1
        [orders] = overview["topics"]
        assert orders["consumers"] == 1
        assert {c["name"]: c["consumers"] for c in orders["channels"]} == {
            "audit": 0,
            "billing": 1,
        }
        dashboard = web.get("/admin/").text
        assert '<strong data-field="consumers">1</strong>' in dashboard
        assert '<td class="num online" data-field="consumers">1</td>' in dashboard

        detail = web.get("/admin/api/topics/orders/channels/billing").json()
        [info] = detail["consumers"]
        assert (info["max_in_flight"], info["in_flight"]) == (4, 0)
        assert info["started_at"] == clock().isoformat()
        page = web.get("/admin/topics/orders/channels/billing").text
        assert 'id="consumers"' in page
        assert "0 / 4" in page
        assert "No consumer runs on this channel." in page  # the note, hidden
        assert 'class="muted empty-note" hidden' in page

        listed = web.get("/admin/api/consumers?topic=orders&channel=billing").json()
        assert listed["heartbeat"] == 10.0
        assert [c["pid"] for c in listed["consumers"]] == [info["pid"]]
        assert web.get("/admin/api/consumers?channel=audit").json()["consumers"] == []
        assert web.get("/admin/api/consumers?topic=bad%20name").status == 400
    finally:
        consumer.shutdown()
    page = web.get("/admin/topics/orders/channels/billing").text
    assert 'class="muted empty-note">' in page  # shown: nobody consumes
    assert web.get("/admin/api/overview").json()["consumers"] == 0


def test_the_live_chart_follows_the_clock(
    web: WSGIClient, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("t", "c")
    client.publish("t", b"x")
    client.flush_stats()
    first = web.get("/admin/api/topics/t/channels/c/minutes").json()["minutes"]
    assert first[-1]["published"] == 1
    clock.advance(timedelta(minutes=59))
    assert web.get("/admin/api/topics/t/channels/c/minutes").json()["minutes"][0]["published"] == 1
    clock.advance(timedelta(minutes=1))
    later = web.get("/admin/api/topics/t/channels/c/minutes").json()["minutes"]
    assert sum(r["published"] for r in later) == 0
