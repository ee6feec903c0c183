"""The admin WSGI app, request by request: pages, JSON API, guards, escaping."""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
from novaque.admin import create_app
from novaque.schema import DEFERRED_VISIBLE_AT, STATE_DEFERRED, deliveries
from novaque.testing import FakeClock
from tests.conftest import Backend
from tests.wsgi import WSGIClient

XSS_BODY = '<img src=x onerror="alert(1)">&'
XSS_ERROR = "<script>alert('e')</script>"


@pytest.fixture
def web(client: novaque.Client) -> WSGIClient:
    return WSGIClient(create_app(client))


def kill(client: novaque.Client, topic: str, channel: str, error: str) -> int:
    """Make the oldest ready delivery of a channel dead; return its delivery id."""
    (msg,) = client.claim(topic, channel)
    client.reject(msg, error)
    return msg.delivery_id


def dead_by_requeue(client: novaque.Client, topic: str, channel: str, error: str) -> int:
    """Exhaust the attempts of one delivery with ``error`` as its last error."""
    while True:
        (msg,) = client.claim(topic, channel)
        client.requeue(msg, delay=0, error=error)
        if msg.attempts >= msg.max_attempts:
            return msg.delivery_id


# -- routing, assets, guards ---------------------------------------------------------------


def test_prefix_without_slash_redirects_and_other_paths_are_not_ours(web: WSGIClient) -> None:
    reply = web.get("/admin")
    assert reply.status == 308
    assert reply.headers["Location"] == "/admin/"
    assert web.get("/elsewhere").status == 404
    assert web.get("/administrator").status == 404


def test_unknown_page_and_unknown_api_are_404(web: WSGIClient) -> None:
    page = web.get("/admin/nope")
    assert page.status == 404
    assert page.headers["Content-Type"].startswith("text/html")
    api = web.get("/admin/api/nope")
    assert api.status == 404
    assert api.json() == {"error": "no such page: /nope", "status": 404}


def test_assets_are_embedded(web: WSGIClient) -> None:
    js = web.get("/admin/static/admin.js")
    assert js.status == 200
    assert js.headers["Content-Type"].startswith("text/javascript")
    assert b"X-CSRF-Token" in js.body
    css = web.get("/admin/static/admin.css")
    assert css.status == 200
    assert css.headers["Content-Type"].startswith("text/css")
    assert web.get("/admin/static/nope.js").status == 404
    assert web.get("/admin/static/../_app.py").status == 404


def test_pages_send_security_headers_and_a_csrf_cookie(web: WSGIClient) -> None:
    reply = web.get("/admin/")
    assert reply.status == 200
    assert "script-src 'self'" in reply.headers["Content-Security-Policy"]
    assert reply.headers["X-Frame-Options"] == "DENY"
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    (cookie,) = reply.set_cookies
    assert cookie.startswith("novaque_csrf=")
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert "Path=/admin/" in cookie
    token = re.search(r'<meta name="novaque-csrf" content="([^"]+)">', reply.text)
    assert token is not None
    assert token.group(1) == web.cookies["novaque_csrf"]
    # Once the browser has the cookie, it is not set again.
    assert web.get("/admin/").set_cookies == []


def test_head_answers_without_a_body(web: WSGIClient) -> None:
    reply = web.request("HEAD", "/admin/api/topics")
    assert reply.status == 200
    assert reply.body == b""


def test_post_needs_the_csrf_token(web: WSGIClient) -> None:
    reply = web.post("/admin/api/topics", {"name": "t"})  # no cookie yet
    assert reply.status == 403
    assert "CSRF token missing" in reply.json()["error"]
    web.login()
    assert web.post("/admin/api/topics", {"name": "t"}, csrf=False).status == 403
    wrong = web.post("/admin/api/topics", {"name": "t"}, headers={"X-CSRF-Token": "x" * 43})
    assert wrong.status == 403
    assert "mismatch" in wrong.json()["error"]
    assert web.get("/admin/api/topics").json() == {"topics": []}
    assert web.post("/admin/api/topics", {"name": "t"}).status == 201


def test_cross_origin_posts_are_refused(web: WSGIClient) -> None:
    web.login()
    evil = web.post("/admin/api/topics", {"name": "t"}, origin="http://evil.example")
    assert evil.status == 403
    assert "cross-origin" in evil.json()["error"]
    assert web.post("/admin/api/topics", {"name": "t"}, origin="null").status == 403
    referer = web.post(
        "/admin/api/topics",
        {"name": "t"},
        origin=None,
        headers={"Referer": "http://evil.example/page"},
    )
    assert referer.status == 403
    same_referer = web.post(
        "/admin/api/topics",
        {"name": "t"},
        origin=None,
        headers={"Referer": "http://testserver/admin/"},
    )
    assert same_referer.status == 201
    # A script (no Origin, no Referer) with cookie and token is fine.
    assert web.post("/admin/api/topics", {"name": "u"}, origin=None).status == 201


def test_mutations_are_post_only(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_topic("t")
    reply = web.get("/admin/api/topics/t/delete")
    assert reply.status == 405
    assert reply.headers["Allow"] == "POST"
    assert client.list_topics() == ["t"]
    assert web.request("DELETE", "/admin/api/topics").status == 405


def test_basic_auth(client: novaque.Client) -> None:
    web = WSGIClient(create_app(client, basic_auth=("ops", "pa:ss")))
    for path in ("/admin/", "/admin/api/topics", "/admin/static/admin.js"):
        reply = web.get(path)
        assert reply.status == 401
        assert reply.headers["WWW-Authenticate"].startswith('Basic realm="novaque admin"')
    web.auth = ("ops", "wrong")
    assert web.get("/admin/").status == 401
    web.auth = ("ops", "pa:ss")
    assert web.get("/admin/").status == 200
    web.login()
    assert web.post("/admin/api/topics", {"name": "t"}).status == 201


def test_create_app_checks_its_arguments(client: novaque.Client) -> None:
    with pytest.raises(novaque.InvalidOption, match="prefix"):
        create_app(client, prefix="admin")
    with pytest.raises(novaque.InvalidOption, match="basic_auth"):
        create_app(client, basic_auth=("", "x"))
    with pytest.raises(novaque.InvalidOption, match="basic_auth"):
        create_app(client, basic_auth="ops:pw")  # type: ignore[arg-type]


def test_links_honour_script_name_when_mounted_with_empty_prefix(client: novaque.Client) -> None:
    client.ensure_topic("t")
    web = WSGIClient(create_app(client, prefix=""), script_name="/ops/queue")
    reply = web.get("/")
    assert reply.status == 200
    assert 'href="/ops/queue/static/admin.css"' in reply.text
    assert 'content="/ops/queue"' in reply.text
    assert "Path=/ops/queue/" in reply.set_cookies[0]
    assert web.get("/api/topics").json() == {"topics": ["t"]}
    redirect = WSGIClient(create_app(client), script_name="/app").get("/admin")
    assert redirect.headers["Location"] == "/app/admin/"


def test_unmigrated_database_answers_503(backend: Backend, tmp_path: Path) -> None:
    client = novaque.Client(backend.engine(backend.scratch_url(tmp_path)))
    backend.clients.append(client)
    web = WSGIClient(create_app(client))
    reply = web.get("/admin/api/topics")
    assert reply.status == 503
    assert "novaque migrate" in reply.json()["error"]
    assert web.get("/admin/").status == 503


# -- topology and publishing ----------------------------------------------------------------


def test_create_and_delete_topics_and_channels(web: WSGIClient, client: novaque.Client) -> None:
    web.login()
    created = web.post("/admin/api/topics", {"name": "orders"})
    assert created.status == 201
    assert created.json() == {"topic": "orders", "url": "/admin/topics/orders"}
    channel = web.post("/admin/api/topics/orders/channels", {"name": "billing"})
    assert channel.status == 201
    assert channel.json()["url"] == "/admin/topics/orders/channels/billing"
    assert client.list_channels("orders") == ["billing"]
    assert web.get("/admin/api/topics").json() == {"topics": ["orders"]}

    assert web.post("/admin/api/topics/orders/channels/billing/delete").json() == {
        "deleted": {"topic": "orders", "channel": "billing"}
    }
    assert client.list_channels("orders") == []
    assert web.post("/admin/api/topics/orders/channels/billing/delete").status == 404
    assert web.post("/admin/api/topics/orders/delete").json() == {"deleted": {"topic": "orders"}}
    assert client.list_topics() == []
    missing = web.post("/admin/api/topics/orders/delete")
    assert missing.status == 404
    assert missing.json()["error"] == "topic 'orders' does not exist"


def test_bad_names_and_bodies_are_400_with_a_message(web: WSGIClient) -> None:
    web.login()
    bad = web.post("/admin/api/topics", {"name": "<b>x"})
    assert bad.status == 400
    assert "invalid topic name" in bad.json()["error"]
    assert web.post("/admin/api/topics", {}).status == 400
    assert web.post("/admin/api/topics", {"name": 5}).status == 400
    not_json = web.request("POST", "/admin/api/topics", raw=b"{nope")
    assert not_json.status == 400
    assert "not valid JSON" in not_json.json()["error"]
    assert web.request("POST", "/admin/api/topics", raw=b"[1]").status == 400
    assert web.post("/admin/api/topics/t/channels", {"name": "a b"}).status == 400


def test_publish_through_the_api(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing")
    web.login()
    reply = web.post("/admin/api/topics/orders/publish", {"body": "héllo", "headers": {"k": "v"}})
    assert reply.status == 201
    message_id = reply.json()["id"]
    assert reply.json()["url"] == f"/admin/messages/{message_id}"
    (msg,) = client.claim("orders", "billing")
    assert (msg.id, msg.body, msg.headers) == (message_id, "héllo".encode(), {"k": "v"})
    assert web.post("/admin/api/topics/orders/publish", {"body": 3}).status == 400
    assert web.post("/admin/api/topics/orders/publish", {"body": "x", "delay": "1"}).status == 400
    delayed = web.post("/admin/api/topics/orders/publish", {"body": "x", "delay": -1})
    assert delayed.status == 400
    assert "delay" in delayed.json()["error"]
    headers = web.post("/admin/api/topics/orders/publish", {"body": "x", "headers": {"k": 1}})
    assert headers.status == 400
    too_big = "x" * (client.options.max_body_bytes + 1)
    assert web.post("/admin/api/topics/orders/publish", {"body": too_big}).status == 400


def test_topic_page_escapes_and_links(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing")
    reply = web.get("/admin/topics/orders")
    assert reply.status == 200
    assert 'href="/admin/topics/orders/channels/billing"' in reply.text
    missing = web.get("/admin/topics/nope")
    assert missing.status == 404
    assert "topic &#x27;nope&#x27; does not exist" in missing.text


def test_error_pages_escape_what_the_request_sent(web: WSGIClient) -> None:
    reply = web.get("/admin/topics/<script>alert(1)<%2Fscript>")
    assert reply.status in (400, 404)
    assert "<script>alert(1)" not in reply.text
    assert "&lt;script&gt;" in reply.text
    api = web.get("/admin/api/messages/<b>")
    assert api.status == 400
    assert api.json()["error"] == "message id must be a positive integer, got '<b>'"


@pytest.mark.parametrize("bad", ["abc", "0", "-1", "1.5", "99999999999999999999"])
def test_bad_message_ids_are_400(web: WSGIClient, bad: str) -> None:
    for path in (f"/admin/api/messages/{bad}", f"/admin/messages/{bad}"):
        assert web.get(path).status == 400, path
    web.login()
    reply = web.post(f"/admin/api/messages/{bad}/replay")
    assert reply.status == 400
    assert "message id must be a positive integer" in reply.json()["error"]


# -- what needs the operator's calls ---------------------------------------------------------


def test_overview_shape(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing")
    client.ensure_channel("orders", "shipping")
    client.ensure_topic("empty")
    client.publish_many("orders", ["a", "b", "c"])
    (msg,) = client.claim("orders", "billing")
    client.ack(msg)
    client.flush_stats()
    data = web.get("/admin/api/overview").json()
    assert set(data) == {"day", "topics", "consumers"}
    assert data["consumers"] == 0
    assert [t["name"] for t in data["topics"]] == ["empty", "orders"]
    orders = data["topics"][1]
    assert orders["today"]["published"] == 6
    billing, shipping = orders["channels"]
    oldest = billing["backlog"].pop("oldest_ready_at")
    assert datetime.fromisoformat(oldest) <= datetime.now(timezone.utc)
    assert billing.pop("oldest_ready_age") == 0.0  # published now, by the fake clock
    assert billing == {
        "name": "billing",
        "settings": {
            "ordering": "standard",
            "filter": None,
            "paused": False,
            "lease": None,
            "max_attempts": None,
            "dead_max_age": None,
            "dead_max_count": None,
            "dead_max_bytes": None,
            "dead_letter_expired": None,
            "max_leased": None,
            "rate_limit": None,
            "group_max_leased": None,
        },
        "backlog": {"pending": 0, "ready": 2, "in_flight": 0, "dead": 0, "deferred": 0},
        "today": {
            "published": 3,
            "claimed": 1,
            "acked": 1,
            "requeued": 0,
            "dead": 0,
            "purged": 0,
        },
        "consumers": 0,
    }
    assert shipping["backlog"]["ready"] == 3
    assert data["topics"][0] == {
        "name": "empty",
        "channels": [],
        "today": orders["today"] | dict.fromkeys(orders["today"], 0),
        "consumers": 0,
    }


def test_dashboard_renders_backlog_cells(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing")
    client.publish("orders", "x")
    text = web.get("/admin/").text
    assert '<section class="card topic" data-topic="orders">' in text
    row = re.search(r'<tr data-channel="billing">.*?</tr>', text, re.S)
    assert row is not None
    assert '<td class="num s-ready" data-field="backlog.ready">1</td>' in row.group(0)


def test_channel_settings_show_and_pause_resume_buttons(
    web: WSGIClient, client: novaque.Client
) -> None:
    client.ensure_channel("orders", "billing", ordering="group_fifo", lease=90)
    client.ensure_channel("orders", "audit")
    page = web.get("/admin/topics/orders/channels/billing")
    assert "<code>group_fifo</code>" in page.text
    assert "<code>90 s</code>" in page.text
    assert 'data-post="/admin/api/topics/orders/channels/billing/pause"' in page.text
    detail = web.get("/admin/api/topics/orders/channels/billing").json()
    assert detail["settings"] == {
        "ordering": "group_fifo",
        "filter": None,
        "paused": False,
        "lease": 90.0,
        "max_attempts": None,
        "dead_max_age": None,
        "dead_max_count": None,
        "dead_max_bytes": None,
        "dead_letter_expired": None,
        "max_leased": None,
        "rate_limit": None,
        "group_max_leased": None,
    }
    assert web.post("/admin/api/topics/orders/channels/billing/pause").json() == {
        "paused": {"topic": "orders", "channel": "billing"}
    }
    assert client.channel_settings("orders", "billing").paused
    page = web.get("/admin/topics/orders/channels/billing")
    assert 'data-post="/admin/api/topics/orders/channels/billing/resume"' in page.text
    topic_page = web.get("/admin/topics/orders").text
    billing_row = topic_page[topic_page.index('data-channel="billing"') :]
    assert "paused" in billing_row[: billing_row.index("</tr>")]
    audit_row = topic_page[topic_page.index('data-channel="audit"') :]
    assert "paused" not in audit_row[: audit_row.index("</tr>")]
    assert web.post("/admin/api/topics/orders/channels/billing/resume").json() == {
        "resumed": {"topic": "orders", "channel": "billing"}
    }
    assert not client.channel_settings("orders", "billing").paused
    assert web.post("/admin/api/topics/orders/channels/nope/pause").status == 404


def test_schedules_page_lists_them_and_pauses_and_resumes(
    web: WSGIClient, client: novaque.Client, clock: FakeClock
) -> None:
    assert "No schedules yet" in web.get("/admin/schedules").text
    assert 'href="/admin/schedules"' in web.get("/admin/").text
    client.schedule("nightly", "reports", cron="0 2 * * *", timezone="Europe/Paris")
    tick = client.schedule("tick", "reports", every=90)
    clock.advance(90)
    client.run_maintenance()
    page = web.get("/admin/schedules").text
    assert "<code>cron 0 2 * * * (Europe/Paris)</code>" in page
    assert "<code>every 90 s</code>" in page
    assert html.escape(tick.next_fire_at.isoformat()) in page  # the fire before it
    assert 'data-post="/admin/api/schedules/nightly/pause"' in page
    listed = web.get("/admin/api/schedules").json()["schedules"]
    assert [s["name"] for s in listed] == ["nightly", "tick"]
    assert listed[1]["last_fire_at"] == tick.next_fire_at.isoformat()
    assert listed[1]["every"] == 90.0
    assert web.post("/admin/api/schedules/tick/pause").json() == {"paused": {"schedule": "tick"}}
    assert client.get_schedule("tick").paused
    page = web.get("/admin/schedules").text
    tick_row = page[page.index("<code>tick</code>") :]
    assert 'data-post="/admin/api/schedules/tick/resume"' in tick_row[: tick_row.index("</tr>")]
    assert web.post("/admin/api/schedules/tick/resume").json() == {"resumed": {"schedule": "tick"}}
    assert not client.get_schedule("tick").paused
    missing = web.post("/admin/api/schedules/nope/pause")
    assert missing.status == 404
    assert missing.json()["error"] == "no schedule named 'nope'"


def settings_table(page: str) -> dict[str, str]:
    """The channel page's settings, label -> value as the reader sees them."""
    rows = re.findall(r"<tr><th>([^<]*)</th><td><code>([^<]*)</code></td></tr>", page)
    return {html.unescape(label): html.unescape(value) for label, value in rows}


def test_channel_page_shows_the_defaults_a_channel_falls_back_to(
    backend: Backend, clock: FakeClock
) -> None:
    client = backend.client(
        clock=clock, default_lease=45, default_max_attempts=7, dead_max_count=1000
    )
    web = WSGIClient(create_app(client))
    client.ensure_channel("orders", "billing", max_attempts=3, dead_max_age=timedelta(days=30))
    client.ensure_channel("orders", "audit", lease=1.5, dead_letter_expired=True)
    billing = settings_table(web.get("/admin/topics/orders/channels/billing").text)
    assert billing == {
        "State": "running",
        "Ordering": "standard",
        "Filter": "none (every message)",
        "Lease": "45 s (the client's default)",
        "Max attempts": "3",
        "Dead letters kept for": "2592000 s",
        "Dead letters kept, at most": "1000 (the client's default)",
        "Dead-letter bytes, at most": "no limit (the client's default)",
        "Expired deliveries become dead letters": "no (the client's default)",
        "Leased at once, at most": "no limit",
        "Handed out, at most": "no limit",
        "Leased at once per group, at most": "no limit",
    }
    audit = settings_table(web.get("/admin/topics/orders/channels/audit").text)
    assert audit["Lease"] == "1.5 s"
    assert audit["Max attempts"] == "7 (the client's default)"
    assert audit["Dead letters kept for"] == "until their message's TTL (the client's default)"
    assert audit["Expired deliveries become dead letters"] == "yes"
    detail = web.get("/admin/api/topics/orders/channels/billing").json()
    assert detail["defaults"] == {
        "lease": 45.0,
        "max_attempts": 7,
        "dead_max_age": None,
        "dead_max_count": 1000,
        "dead_max_bytes": None,
        "dead_letter_expired": False,
    }
    assert set(detail["defaults"]) == set(detail["settings"]) - {
        "ordering",
        "filter",
        "paused",
        "max_leased",
        "rate_limit",
        "group_max_leased",
    }


def test_channel_page_shows_the_limits(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing", max_leased=8, rate_limit=(100, timedelta(minutes=1)))
    client.ensure_channel("orders", "fair", group_max_leased=2, rate_limit=(5, 1.5))
    client.ensure_channel("orders", "audit")
    billing = settings_table(web.get("/admin/topics/orders/channels/billing").text)
    assert billing["Leased at once, at most"] == "8"
    assert billing["Handed out, at most"] == "100 per 60 s"
    assert billing["Leased at once per group, at most"] == "no limit"
    fair = settings_table(web.get("/admin/topics/orders/channels/fair").text)
    assert fair["Leased at once per group, at most"] == "2"
    assert fair["Handed out, at most"] == "5 per 1.5 s"
    detail = web.get("/admin/api/topics/orders/channels/billing").json()
    assert (
        detail["settings"]["max_leased"],
        detail["settings"]["rate_limit"],
        detail["settings"]["group_max_leased"],
    ) == (8, {"count": 100, "period": 60.0}, None)
    topic_page = web.get("/admin/topics/orders").text
    rows = {
        name: topic_page[topic_page.index(f'data-channel="{name}"') :]
        for name in ("billing", "fair", "audit")
    }
    for name, row in rows.items():
        assert ("limited" in row[: row.index("</tr>")]) == (name != "audit")


def test_channel_page_and_api(web: WSGIClient, client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("orders", "billing")
    client.publish("orders", "x")
    client.flush_stats()
    page = web.get("/admin/topics/orders/channels/billing")
    assert page.status == 200
    assert 'id="chart"' in page.text
    assert 'data-daily="/admin/api/topics/orders/channels/billing/daily"' in page.text
    detail = web.get("/admin/api/topics/orders/channels/billing").json()
    assert detail["backlog"] == {
        "pending": 0,
        "ready": 1,
        "in_flight": 0,
        "dead": 0,
        "deferred": 0,
        "oldest_ready_at": clock().isoformat(),
    }
    assert detail["today"]["published"] == 1
    assert detail["window"]["counters"]["published"] == 1
    daily = web.get("/admin/api/topics/orders/channels/billing/daily").json()
    assert daily["days"] == [
        {
            "day": clock().date().isoformat(),
            "published": 1,
            "claimed": 0,
            "acked": 0,
            "requeued": 0,
            "dead": 0,
            "purged": 0,
        }
    ]
    assert web.get("/admin/api/topics/orders/channels/nope").status == 404
    assert web.get("/admin/api/topics/nope/channels/billing").status == 404
    bad_day = web.get("/admin/api/topics/orders/channels/billing/daily?since=yesterday")
    assert bad_day.status == 400
    assert "since must be a date" in bad_day.json()["error"]
    backwards = "/admin/api/topics/orders/channels/billing/daily?since=2024-02-02&until=2024-02-01"
    assert web.get(backwards).status == 400


def test_dead_letters_page_escapes_bodies_and_errors(
    web: WSGIClient, client: novaque.Client
) -> None:
    client.ensure_channel("orders", "billing")
    client.publish("orders", XSS_BODY)
    delivery_id = dead_by_requeue(client, "orders", "billing", XSS_ERROR)
    page = web.get("/admin/topics/orders/channels/billing/dead")
    assert page.status == 200
    assert XSS_BODY not in page.text
    assert XSS_ERROR not in page.text
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;" in page.text
    assert "&lt;script&gt;alert(&#x27;e&#x27;)&lt;/script&gt;" in page.text
    assert f'value="{delivery_id}"' in page.text
    data = web.get("/admin/api/topics/orders/channels/billing/dead").json()
    (item,) = data["items"]
    assert item["body_preview"] == XSS_BODY
    assert item["body_len"] == len(XSS_BODY)
    assert item["last_error"] == XSS_ERROR
    assert item["reason"] == "max_attempts"
    assert data["next_after_id"] is None


def test_dead_letters_paginate(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing")
    client.publish_many("orders", [f"m{i}" for i in range(5)])
    ids = [kill(client, "orders", "billing", "nope") for _ in range(5)]
    first = web.get("/admin/api/topics/orders/channels/billing/dead?limit=2").json()
    assert [i["delivery_id"] for i in first["items"]] == ids[:2]
    assert first["next_after_id"] == ids[1]
    rest = web.get(f"/admin/api/topics/orders/channels/billing/dead?limit=3&after_id={ids[1]}")
    assert [i["delivery_id"] for i in rest.json()["items"]] == ids[2:]
    assert rest.json()["next_after_id"] is None
    page = web.get("/admin/topics/orders/channels/billing/dead?limit=2").text
    assert f"after_id={ids[1]}" in page
    for bad in ("limit=0", "limit=x", "after_id=-3", "limit=100000"):
        reply = web.get(f"/admin/api/topics/orders/channels/billing/dead?{bad}")
        assert reply.status == 400, bad
        assert reply.json()["error"]


def test_requeue_and_delete_dead_letters(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing")
    client.publish_many("orders", [f"m{i}" for i in range(4)])
    ids = [kill(client, "orders", "billing", "nope") for _ in range(4)]
    web.login()
    base = "/admin/api/topics/orders/channels/billing/dead"
    assert web.post(f"{base}/requeue", {"ids": [ids[0]]}).json() == {"requeued": 1}
    assert client.channel_backlog("orders", "billing").dead == 3
    assert web.post(f"{base}/delete", {"ids": [ids[1]]}).json() == {"deleted": 1}
    assert web.post(f"{base}/requeue", {"all": True}).json() == {"requeued": 2}
    backlog = client.channel_backlog("orders", "billing")
    assert (backlog.ready, backlog.dead) == (3, 0)
    for payload in ({}, {"ids": []}, {"ids": ["a"]}, {"ids": [0]}, {"ids": 3}, {"all": 1}):
        reply = web.post(f"{base}/requeue", payload)
        assert reply.status == 400, payload
        assert reply.json()["error"]
    assert web.post(f"{base}/delete", {"ids": [1], "all": True}).status == 400
    assert (
        web.post("/admin/api/topics/orders/channels/nope/dead/delete", {"all": True}).status == 404
    )


def test_message_browser_and_detail(
    web: WSGIClient, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("orders", "billing")
    client.ensure_channel("orders", "shipping")
    first = client.publish("orders", XSS_BODY, headers={"<h>": "<v>"})
    clock.advance(60)
    second = client.publish("orders", "later")
    (msg,) = client.claim("orders", "billing")
    client.ack(msg)

    listing = web.get("/admin/api/topics/orders/messages").json()
    assert [m["id"] for m in listing["items"]] == [first, second]
    assert listing["channels"] == ["billing", "shipping"]
    states = {d["channel"]: d["state"] for d in listing["items"][0]["deliveries"]}
    assert states == {"billing": "acked", "shipping": "ready"}
    since = clock().replace(microsecond=0).isoformat()
    ranged = web.get(f"/admin/api/topics/orders/messages?since={since.replace('+', '%2B')}")
    assert [m["id"] for m in ranged.json()["items"]] == [second]
    assert web.get("/admin/api/topics/orders/messages?since=soon").status == 400
    assert web.get("/admin/api/topics/nope/messages").status == 404

    page = web.get("/admin/topics/orders/messages")
    assert page.status == 200
    assert XSS_BODY not in page.text
    assert "&lt;img src=x" in page.text

    detail = web.get(f"/admin/api/messages/{first}").json()
    assert detail["id"] == first
    assert detail["headers"] == {"<h>": "<v>"}
    assert detail["body_preview"] == XSS_BODY
    assert {d["channel"]: d["state"] for d in detail["deliveries"]} == states
    html_page = web.get(f"/admin/messages/{first}").text
    assert "<h>" not in html_page
    assert "&lt;h&gt;" in html_page
    assert web.get("/admin/api/messages/999999999").status == 404
    assert web.get("/admin/messages/999999999").status == 404


def test_replay_message_and_range(
    web: WSGIClient, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("orders", "billing")
    client.ensure_channel("orders", "shipping")
    start = clock()
    message_id = client.publish("orders", "x")
    for channel in ("billing", "shipping"):
        (msg,) = client.claim("orders", channel)
        client.ack(msg)
    web.login()
    reply = web.post(f"/admin/api/messages/{message_id}/replay", {"channels": ["billing"]})
    assert reply.status == 200
    assert client.channel_backlog("orders", "billing").ready == 1
    assert client.channel_backlog("orders", "shipping").ready == 0
    assert (
        web.post(f"/admin/api/messages/{message_id}/replay", {"channels": "billing"}).status == 400
    )
    assert web.post("/admin/api/messages/999999999/replay").status == 404
    ranged = web.post(
        "/admin/api/topics/orders/replay",
        {
            "since": start.isoformat(),
            "until": (start + timedelta(seconds=1)).isoformat(),
            "channels": ["shipping"],
        },
    )
    assert ranged.status == 200
    assert client.channel_backlog("orders", "shipping").ready == 1
    assert web.post("/admin/api/topics/orders/replay", {"since": start.isoformat()}).status == 400


def test_topic_api_shape(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing")
    client.publish("orders", "x")
    client.flush_stats()
    data = web.get("/admin/api/topics/orders").json()
    assert set(data) == {"day", "name", "channels", "today", "consumers"}
    assert data["name"] == "orders"
    assert data["today"]["published"] == 1
    assert [c["name"] for c in data["channels"]] == ["billing"]
    assert data["channels"][0]["backlog"]["ready"] == 1
    missing = web.get("/admin/api/topics/nope")
    assert missing.status == 404
    assert missing.json() == {"error": "topic 'nope' does not exist", "status": 404}
    assert web.get("/admin/api/topics/a%20b").status == 400


# -- bad input is 400, never 500 ---------------------------------------------------------------


def test_deeply_nested_or_oversized_json_is_400(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing")
    web.login()
    base = "/admin/api/topics/orders/channels/billing/dead"
    for raw in (
        b"[" * 200_000,
        b'{"ids": ' + b"[" * 200_000 + b"}",
        b'{"ids": [' + b"9" * 5000 + b"]}",
    ):
        reply = web.request("POST", f"{base}/requeue", raw=raw)
        assert reply.status == 400, raw[:20]
        assert "request body is not valid JSON" in reply.json()["error"]
    surrogate = web.request("POST", "/admin/api/topics/orders/publish", raw=b'{"body": "x\\ud800"}')
    assert surrogate.status == 400
    assert "UTF-8 cannot encode" in surrogate.json()["error"]


def test_ids_beyond_64_bits_are_400(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing")
    web.login()
    base = "/admin/api/topics/orders/channels/billing/dead"
    for ids in ([10**30], [2**63], [1, 2**63]):
        for action in ("requeue", "delete"):
            reply = web.post(f"{base}/{action}", {"ids": ids})
            assert reply.status == 400, (action, ids)
            assert "at most 9223372036854775807" in reply.json()["error"]
    for bad in (str(2**63), str(10**30)):
        assert web.get(f"/admin/api/messages/{bad}").status == 400
        assert web.get(f"{base}?after_id={bad}").status == 400
        assert web.get(f"/admin/api/topics/orders/messages?after_id={bad}").status == 400
        assert web.post(f"/admin/api/messages/{bad}/replay").status == 400
    # The largest id is well formed: there is just no such message.
    assert web.get(f"/admin/api/messages/{2**63 - 1}").status == 404
    assert web.post(f"{base}/delete", {"ids": [2**63 - 1]}).json() == {"deleted": 0}


def test_headers_are_published_exactly_or_refused_naming_the_key(
    web: WSGIClient, client: novaque.Client
) -> None:
    client.ensure_channel("orders", "billing")
    web.login()
    raw = b'{"body": "x", "headers": {"k\\u0000": "v\\u0000"}}'
    reply = web.request("POST", "/admin/api/topics/orders/publish", raw=raw)
    assert reply.status == 201
    assert client.get_message(reply.json()["id"]).headers == {"k\x00": "v\x00"}
    raw = b'{"body": "x", "headers": {"k": "v\\udcff"}}'
    reply = web.request("POST", "/admin/api/topics/orders/publish", raw=raw)
    assert reply.status == 400
    assert reply.json()["error"].startswith("headers['k'] holds '\\udcff' at index 1: ")


# -- DESIGN §9: deferred and waiting time, redrive, cancel -------------------------------------


def test_deferred_count_and_oldest_ready_age_on_overview_and_channel_page(
    web: WSGIClient, client: novaque.Client, clock: FakeClock
) -> None:
    client.ensure_channel("orders", "billing")
    client.ensure_channel("orders", "idle")
    first, _ = client.publish_many("orders", ["a", "b"])
    with client.engine.begin() as conn:  # what defer() leaves: one deferred delivery
        conn.execute(
            sa.update(deliveries)
            .where(deliveries.c.message_id == first)
            .values(state=STATE_DEFERRED, visible_at=DEFERRED_VISIBLE_AT)
        )
    client.ack_many(client.claim("orders", "idle", max_messages=5))
    clock.advance(125)
    data = web.get("/admin/api/overview").json()
    billing, idle = data["topics"][0]["channels"]
    assert billing["backlog"]["deferred"] == 1
    assert billing["oldest_ready_age"] == 125.0
    assert idle["oldest_ready_age"] is None
    text = web.get("/admin/").text
    row = re.search(r'<tr data-channel="billing">.*?</tr>', text, re.S)
    assert row is not None
    assert 'data-field="backlog.deferred">1</td>' in row.group(0)
    assert 'data-field="oldest_ready_age" data-format="age">2 min 5 s</td>' in row.group(0)
    idle_row = re.search(r'<tr data-channel="idle">.*?</tr>', text, re.S)
    assert idle_row is not None
    assert 'data-format="age">—</td>' in idle_row.group(0)
    assert "Oldest ready" in text
    page = web.get("/admin/topics/orders/channels/billing").text
    assert "Deferred" in page
    assert 'data-field="backlog.deferred">1</span>' in page
    assert 'data-format="age">2 min 5 s</span>' in page
    detail = web.get("/admin/api/topics/orders/channels/billing").json()
    assert (detail["backlog"]["deferred"], detail["oldest_ready_age"]) == (1, 125.0)


def test_ages_read_as_words() -> None:
    from novaque.admin._pages import age

    assert [age(s) for s in (None, 0, 59.9, 60, 3599, 3600, 86_399, 90_000)] == [
        "—",
        "0 s",
        "59 s",
        "1 min 0 s",
        "59 min 59 s",
        "1 h 0 min",
        "23 h 59 min",
        "1 d 1 h",
    ]


def test_redrive_form_and_api(web: WSGIClient, client: novaque.Client, clock: FakeClock) -> None:
    client.ensure_channel("orders", "billing")
    client.publish_many("orders", [f"m{i}" for i in range(5)])
    ids = []
    for _ in range(5):
        ids.append(kill(client, "orders", "billing", "nope"))
        clock.advance(1)
    client.ensure_channel("orders", "retry")
    client.ensure_channel("orders", "audit")
    page = web.get("/admin/topics/orders/channels/billing/dead").text
    assert 'data-redrive="/admin/api/topics/orders/channels/billing/dead/requeue"' in page
    assert '<option value="retry">retry</option>' in page
    assert '<option value="audit">audit</option>' in page
    assert '<option value="billing">' not in page
    assert web.get("/admin/api/topics/orders/channels/billing/dead").json()["other_channels"] == [
        "audit",
        "retry",
    ]
    web.login()
    base = "/admin/api/topics/orders/channels/billing/dead"
    moved = web.post(f"{base}/requeue", {"all": True, "to_channel": "retry", "limit": 2})
    assert moved.json() == {"requeued": 2}
    assert sorted(m.delivery_id for m in client.claim("orders", "retry", max_messages=9)) == ids[:2]
    assert web.post(f"{base}/requeue", {"limit": 1}).json() == {"requeued": 1}  # here, the oldest
    died = client.list_dead("orders", "billing")[0].died_at  # ids[3]'s
    assert web.post(f"{base}/delete", {"died_before": died.isoformat()}).json() == {"deleted": 0}
    later = (died + timedelta(seconds=1)).isoformat()
    assert web.post(f"{base}/delete", {"died_before": later}).json() == {"deleted": 1}
    for payload, status in (
        ({"all": True, "to_channel": "nope"}, 404),
        ({"all": True, "to_channel": 5}, 400),
        ({"all": True, "limit": 0}, 400),
        ({"all": True, "limit": "many"}, 400),
        ({"all": True, "died_before": "soon"}, 400),
    ):
        reply = web.post(f"{base}/requeue", payload)
        assert reply.status == status, payload
        assert reply.json()["error"]
    assert web.post(f"{base}/delete", {"all": True, "to_channel": "retry"}).status == 400
    assert [x.delivery_id for x in client.list_dead("orders", "billing")] == [ids[4]]


def test_cancel_button_and_api(web: WSGIClient, client: novaque.Client) -> None:
    client.ensure_channel("orders", "billing")
    client.ensure_channel("orders", "shipping")
    scheduled = client.publish("orders", "later", delay=3600)
    page = web.get(f"/admin/messages/{scheduled}").text
    assert f'data-post="/admin/api/messages/{scheduled}/cancel"' in page
    assert web.get(f"/admin/api/messages/{scheduled}").json()["cancellable"] is True
    web.login()
    assert web.post(f"/admin/api/messages/{scheduled}/cancel").json() == {"cancelled": 2}
    assert f"/messages/{scheduled}/cancel" not in web.get(f"/admin/messages/{scheduled}").text
    assert web.get(f"/admin/api/messages/{scheduled}").json()["cancellable"] is False
    assert client.channel_counters("orders", "billing").purged == 1  # flushed by the admin
    started = client.publish("orders", "now")
    for channel in ("billing", "shipping"):
        client.claim("orders", channel)
    assert web.get(f"/admin/api/messages/{started}").json()["cancellable"] is False
    assert web.post("/admin/api/messages/999999999/cancel").status == 404
    assert web.get(f"/admin/api/messages/{scheduled}/cancel").status == 405
