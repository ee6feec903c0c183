"""The network broker (novaque.broker), over HTTP as a service in another language
uses it: a live uvicorn server on each backend, requests with httpx (and a
Node.js script), the database checked with a sync client."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

import novaque
import novaque.aio
from novaque.aio import core_of
from novaque.broker import Tokens, TokensError, create_app, hash_token, new_token, token_toml
from novaque.broker._app import BrokerApp
from novaque.broker._wire import Receive
from novaque.client import runtime_of
from novaque.testing import FakeClock
from tests._broker import Live, live_broker, token_of, tokens
from tests._twin import async_url
from tests.conftest import Backend

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def live(backend: Backend) -> Iterator[Live]:
    with live_broker(backend.name, backend.url) as made:
        yield made


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def error_of(answer: httpx.Response) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]["code"]


def until(condition: Callable[[], bool], timeout: float) -> bool:
    """Whether ``condition()`` became true within ``timeout`` seconds (looked at
    every 10 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def backlog(backend: Backend, topic: str = "orders", channel: str = "billing") -> novaque.Backlog:
    return backend.client().channel_backlog(topic, channel)


def put_channel(
    live: Live, topic: str = "orders", channel: str = "billing", **settings: Any
) -> None:
    answer = live.http().put(f"/v1/topics/{topic}/channels/{channel}", json=settings)
    assert answer.status_code == 200, answer.text


def publish(
    live: Live, *messages: dict[str, Any], token: str = "admin", topic: str = "orders"
) -> list[int]:
    answer = live.http(token).post(
        f"/v1/topics/{topic}/messages", json={"messages": list(messages)}
    )
    assert answer.status_code == 201, answer.text
    ids: list[int] = answer.json()["ids"]
    return ids


def receive(
    live: Live, token: str = "admin", channel: str = "billing", **request: Any
) -> list[dict[str, Any]]:
    answer = live.http(token).post(f"/v1/topics/orders/channels/{channel}/receive", json=request)
    assert answer.status_code == 200, answer.text
    got: list[dict[str, Any]] = answer.json()["messages"]
    return got


def settle(live: Live, *items: dict[str, Any], channel: str = "billing") -> list[dict[str, Any]]:
    answer = live.http().post(
        f"/v1/topics/orders/channels/{channel}/settle", json={"items": list(items)}
    )
    assert answer.status_code == 200, answer.text
    results: list[dict[str, Any]] = answer.json()["results"]
    return results


def item(msg: dict[str, Any], action: str, **extra: Any) -> dict[str, Any]:
    return {
        "delivery_id": msg["delivery_id"],
        "lease_token": msg["lease_token"],
        "action": action,
        **extra,
    }


# -- publish, receive, settle -------------------------------------------------------------


def test_publish_receive_and_every_settle_action(live: Live, backend: Backend) -> None:
    put_channel(live)
    ids = publish(
        live,
        {"body": "héllo", "headers": {"tier": "gold"}, "group": "g1"},
        {"body_b64": base64.b64encode(b"\xff\x00").decode()},
        {"body": "three", "max_attempts": 3},
        {"body": "four"},
        {"body": "five"},
    )
    assert ids == sorted(ids)
    assert len(ids) == 5
    got = receive(live, max_messages=10)
    assert [m["id"] for m in got] == ids
    first, binary = got[0], got[1]
    assert first["body"] == "héllo"
    assert base64.b64decode(first["body_b64"]) == "héllo".encode()
    assert first["headers"] == {"tier": "gold"}
    assert first["group"] == "g1"
    assert first["topic"] == "orders"
    assert first["channel"] == "billing"
    assert first["attempts"] == 1
    assert first["max_attempts"] == 5
    assert got[2]["max_attempts"] == 3
    assert "body" not in binary
    assert base64.b64decode(binary["body_b64"]) == b"\xff\x00"
    published = datetime.fromisoformat(first["published_at"].replace("Z", "+00:00"))
    expires = datetime.fromisoformat(first["lease_expires_at"].replace("Z", "+00:00"))
    assert published.tzinfo is not None
    assert expires > published
    results = settle(
        live,
        item(got[0], "complete"),
        item(got[1], "abandon", delay=0, error="boom"),
        item(got[2], "dead_letter", reason="bad order"),
        item(got[3], "defer"),
        item(got[4], "snooze", delay=3600),
    )
    assert results == [{"delivery_id": m["delivery_id"], "ok": True} for m in got]
    found = backlog(backend)
    assert (found.ready, found.dead, found.deferred, found.pending, found.in_flight) == (
        1,
        1,
        1,
        1,
        0,
    )
    checker = backend.client()
    [dead] = checker.list_dead("orders", "billing")
    assert dead.reason == "bad order"
    # Settled once: every token is stale now.
    again = settle(live, *(item(m, "complete") for m in got))
    assert again == [
        {"delivery_id": m["delivery_id"], "ok": False, "error": "lease_lost"} for m in got
    ]
    # The abandoned one comes back with its error kept, its attempt counted.
    [retry] = receive(live)
    assert retry["id"] == ids[1]
    assert retry["attempts"] == 2
    # The deferred one, by its delivery id.
    answer = live.http().post(
        "/v1/topics/orders/channels/billing/deferred",
        json={"delivery_ids": [got[3]["delivery_id"]]},
    )
    assert answer.status_code == 200
    [fetched] = answer.json()["messages"]
    assert fetched["delivery_id"] == got[3]["delivery_id"]
    assert fetched["attempts"] == 2


def test_receive_and_delete_and_renew(live: Live, backend: Backend) -> None:
    put_channel(live, lease=30)
    publish(live, {"body": "a"}, {"body": "b"})
    [popped] = receive(live, mode="receive_and_delete")
    assert popped["lease_token"] == ""
    assert popped["lease_expires_at"] is None
    assert settle(live, item(popped, "complete")) == [
        {"delivery_id": popped["delivery_id"], "ok": False, "error": "lease_lost"}
    ]
    [leased] = receive(live, lease=5)
    before = datetime.fromisoformat(leased["lease_expires_at"].replace("Z", "+00:00"))
    answer = live.http().post(
        "/v1/topics/orders/channels/billing/renew",
        json={
            "items": [
                {"delivery_id": leased["delivery_id"], "lease_token": leased["lease_token"]},
                {"delivery_id": leased["delivery_id"] + 1000, "lease_token": "x"},
            ],
            "lease": 600,
        },
    )
    assert answer.status_code == 200, answer.text
    renewed, lost = answer.json()["results"]
    assert renewed["ok"] is True
    assert lost == {
        "delivery_id": leased["delivery_id"] + 1000,
        "ok": False,
        "error": "lease_lost",
    }
    after = datetime.fromisoformat(renewed["lease_expires_at"].replace("Z", "+00:00"))
    assert after - before > timedelta(seconds=500)
    assert backlog(backend).in_flight == 1


def test_priorities_pass_through(live: Live) -> None:
    put_channel(live)
    publish(live, {"body": "bulk", "priority": 50}, {"body": "normal"})
    publish(live, {"body": "urgent", "priority": -10})
    got = receive(live, max_messages=10)
    assert [(m["body"], m["priority"]) for m in got] == [
        ("urgent", -10),
        ("normal", 0),
        ("bulk", 50),
    ]
    for bad in (101, True, "1"):
        answer = live.http().post(
            "/v1/topics/orders/messages", json={"messages": [{"body": "x", "priority": bad}]}
        )
        assert error_of(answer) == (400, "invalid"), bad
        assert "priority" in answer.json()["error"]["message"]


def test_ordered_channels_hand_a_group_out_one_at_a_time(live: Live) -> None:
    """Settling by id and token moves a group on as a Python ack does."""
    put_channel(live, ordering="group_fifo")
    publish(
        live,
        {"body": "g1", "group": "g"},
        {"body": "g2", "group": "g"},
        {"body": "h1", "group": "h"},
    )
    first = receive(live, max_messages=10)
    assert sorted(m["body"] for m in first) == ["g1", "h1"]
    assert receive(live) == []  # g2 waits for its head
    head = next(m for m in first if m["body"] == "g1")
    settle(live, item(head, "abandon", delay=0))
    [again] = receive(live)
    assert again["body"] == "g1"  # still its group's head
    assert again["attempts"] == 2
    settle(live, item(again, "complete"))
    [second] = receive(live)
    assert second["body"] == "g2"
    # A missing channel, waiting or not: 404.
    for wait in (0, 1):
        answer = live.http().post("/v1/topics/orders/channels/missing/receive", json={"wait": wait})
        assert error_of(answer) == (404, "not_found")


def test_a_database_that_cannot_be_reached_is_503(tmp_path: Path) -> None:
    client = novaque.aio.connect("postgresql+psycopg://postgres@127.0.0.1:1/nothing")
    app = create_app(client, tokens=tokens())
    from novaque.broker._serve import Server

    server = Server(app).start()
    try:
        headers = {"Authorization": f"Bearer {token_of('admin')}"}
        with httpx.Client(base_url=server.base_url, headers=headers, timeout=60) as http:
            health = http.get("/v1/health")
            assert health.status_code == 503
            assert health.json() == {"status": "down"}
            answer = http.post("/v1/topics/orders/messages", json={"messages": [{"body": "a"}]})
            assert error_of(answer) == (503, "unavailable")
    finally:
        server.stop()


def test_idempotent_receive_with_attempt_id(live: Live) -> None:
    put_channel(live)
    publish(live, {"body": "a"}, {"body": "b"})
    first = receive(live, max_messages=1, attempt_id="poll-1")
    again = receive(live, max_messages=1, attempt_id="poll-1")
    assert [(m["delivery_id"], m["lease_token"]) for m in again] == [
        (m["delivery_id"], m["lease_token"]) for m in first
    ]


def test_a_lease_never_settled_comes_back(backend: Backend, clock: FakeClock) -> None:
    with live_broker(backend.name, backend.url, clock=clock) as live:
        put_channel(live, lease=10)
        publish(live, {"body": "a"})
        [first] = receive(live)
        assert receive(live) == []
        clock.advance(11)
        backend.client(clock=clock).reap_leases()
        [second] = receive(live)
        assert second["delivery_id"] == first["delivery_id"]
        assert second["attempts"] == 2
        assert settle(live, item(first, "complete"))[0]["ok"] is False
        assert settle(live, item(second, "complete"))[0]["ok"] is True


def test_a_publish_batch_mixing_options_is_one_transaction(live: Live, backend: Backend) -> None:
    put_channel(live)
    ids = publish(live, {"body": "a", "delay": 60}, {"body": "b"}, {"body": "c", "ttl": 600})
    assert ids == sorted(ids)
    assert len(ids) == 3
    found = backlog(backend)
    assert (found.pending, found.ready) == (1, 2)
    # A dedup conflict in the last run: the runs before it are not written either.
    publish(live, {"body": "x", "dedup_key": "k"})
    answer = live.http().post(
        "/v1/topics/orders/messages",
        json={"messages": [{"body": "y", "delay": 5}, {"body": "other", "dedup_key": "k"}]},
    )
    assert error_of(answer) == (409, "dedup_conflict")
    assert "k" in answer.json()["error"]["message"]
    assert backlog(backend).ready == 3
    # The same key and body: the first id again, nothing written.
    assert publish(live, {"body": "x", "dedup_key": "k"}) == [ids[-1] + 1]


# -- refusals ---------------------------------------------------------------------------


def test_refused_requests_write_nothing(live: Live, backend: Backend) -> None:
    put_channel(live)
    http = live.http()
    refused = {
        "bad JSON": http.post("/v1/topics/orders/messages", content=b"{nope"),
        "not an object": http.post("/v1/topics/orders/messages", json=[1]),
        "no messages": http.post("/v1/topics/orders/messages", json={"messages": []}),
        "two bodies": http.post(
            "/v1/topics/orders/messages", json={"messages": [{"body": "a", "body_b64": "YQ=="}]}
        ),
        "bad base64": http.post(
            "/v1/topics/orders/messages", json={"messages": [{"body_b64": "%%"}]}
        ),
        "a bad second message": http.post(
            "/v1/topics/orders/messages",
            json={"messages": [{"body": "ok"}, {"body": "x", "delay": -1}]},
        ),
        "unknown field": http.post(
            "/v1/topics/orders/messages", json={"messages": [{"body": "ok", "dealy": 1}]}
        ),
        "delay past the ttl": http.post(
            "/v1/topics/orders/messages",
            json={"messages": [{"body": "ok"}, {"body": "x", "delay": 100, "ttl": 50}]},
        ),
        "bad name": http.post("/v1/topics/bad%20name/messages", json={"messages": [{"body": "a"}]}),
        "wait too long": http.post("/v1/topics/orders/channels/billing/receive", json={"wait": 21}),
        "max_messages 0": http.post(
            "/v1/topics/orders/channels/billing/receive", json={"max_messages": 0}
        ),
        "bad mode": http.post("/v1/topics/orders/channels/billing/receive", json={"mode": "peek"}),
    }
    for what, answer in refused.items():
        assert error_of(answer) == (400, "invalid"), what
        assert answer.json()["error"]["message"], what
    assert "from 0 to 20" in refused["wait too long"].json()["error"]["message"]
    assert "dealy" in refused["unknown field"].json()["error"]["message"]
    assert backend.client().list_messages("orders") == []
    # A malformed settle item refuses the whole request: the good one is not settled.
    publish(live, {"body": "a"})
    [msg] = receive(live)
    answer = http.post(
        "/v1/topics/orders/channels/billing/settle",
        json={
            "items": [
                item(msg, "complete"),
                {**item(msg, "complete"), "delivery_id": 99, "action": "finish"},
            ]
        },
    )
    assert error_of(answer) == (400, "invalid")
    assert "complete, abandon, defer, dead_letter, snooze" in answer.json()["error"]["message"]
    assert backlog(backend).in_flight == 1
    # Out-of-range values refuse the whole request too, before any item.
    renewing = {"delivery_id": msg["delivery_id"], "lease_token": msg["lease_token"]}
    too_long = [
        ("renew", {"items": [renewing], "lease": 8 * 86400}),
        ("settle", {"items": [item(msg, "snooze", delay=1e9)]}),
        ("settle", {"items": [item(msg, "snooze")]}),
        ("deferred", {"delivery_ids": [msg["delivery_id"]], "lease": 0}),
    ]
    for endpoint, body in too_long:
        answer = http.post(f"/v1/topics/orders/channels/billing/{endpoint}", json=body)
        assert error_of(answer) == (400, "invalid"), (endpoint, body)
    assert backend.client().claim("orders", "billing") == []  # still leased, as it was
    assert backlog(backend).in_flight == 1


def test_sizes_are_bounded(backend: Backend) -> None:
    with live_broker(backend.name, backend.url, max_body_bytes=1000) as live:
        put_channel(live)
        http = live.http()
        too_many = http.post("/v1/topics/orders/messages", json={"messages": [{"body": "a"}] * 501})
        assert error_of(too_many) == (413, "too_large")
        too_big = http.post(
            "/v1/topics/orders/messages", json={"messages": [{"body": "a"}, {"body": "x" * 1001}]}
        )
        assert error_of(too_big) == (413, "too_large")
        huge = http.post("/v1/topics/orders/messages", content=b" " * (17 * 1024 * 1024))
        assert error_of(huge) == (413, "too_large")
        items = [
            {"delivery_id": n, "lease_token": "t", "action": "complete"} for n in range(1, 502)
        ]
        assert error_of(
            http.post("/v1/topics/orders/channels/billing/settle", json={"items": items})
        ) == (413, "too_large")
        assert backend.client().list_messages("orders") == []


def test_tokens_and_scopes(live: Live, backend: Backend) -> None:
    put_channel(live)
    put_channel(live, channel="shipping")
    assert error_of(live.http(None).get("/v1/topics/orders/channels/billing")) == (
        401,
        "unauthorized",
    )
    unknown = httpx.get(
        f"{live.base_url}/v1/topics/orders/channels/billing",
        headers={"Authorization": "Bearer nvq_nobody"},
    )
    assert error_of(unknown) == (401, "unauthorized")
    assert unknown.headers["www-authenticate"].startswith("Bearer")
    # publish:orders publishes, and nothing else.
    publish(live, {"body": "a"}, token="publisher")
    assert error_of(live.http("publisher").post("/v1/topics/orders/channels/billing/receive")) == (
        403,
        "forbidden",
    )
    # consume:orders/billing consumes billing only, publishes nothing.
    assert len(receive(live, token="billing")) == 1
    assert live.http("billing").get("/v1/topics/orders/channels/billing").status_code == 200
    for method, path in [
        ("POST", "/v1/topics/orders/channels/shipping/receive"),
        ("POST", "/v1/topics/orders/messages"),
        ("PUT", "/v1/topics/orders/channels/billing"),
        ("DELETE", "/v1/topics/orders/channels/billing"),
        ("DELETE", "/v1/topics/orders"),
        ("POST", "/v1/topics/orders/channels/billing/dead/requeue"),
        ("POST", "/v1/messages/1/cancel"),
    ]:
        answer = live.http("billing").request(method, path, json={})
        assert error_of(answer) == (403, "forbidden"), (method, path)
    # A delivery of another channel, settled through one the token may use:
    # not found there (lease_lost), and left alone.
    publish(live, {"body": "ship me"})
    [shipped] = receive(live, channel="shipping")
    for action in ("complete", "dead_letter"):
        answer = live.http("billing").post(
            "/v1/topics/orders/channels/billing/settle", json={"items": [item(shipped, action)]}
        )
        assert answer.json()["results"][0] == {
            "delivery_id": shipped["delivery_id"],
            "ok": False,
            "error": "lease_lost",
        }
    assert backlog(backend, channel="shipping").in_flight == 1
    # A name outside the scopes: the same answer whether it exists or not.
    existing = live.http("other").get("/v1/topics/orders/channels/billing")
    missing = live.http("other").get("/v1/topics/nowhere/channels/nothing")
    assert error_of(existing) == error_of(missing) == (403, "forbidden")
    assert existing.json()["error"]["message"].replace("orders/billing", "X") == missing.json()[
        "error"
    ]["message"].replace("nowhere/nothing", "X")
    # Inside the scopes, a missing name is 404.
    assert error_of(live.http("other").get("/v1/topics/other-a/channels/c")) == (404, "not_found")
    # The health check needs no token, and says only up.
    health = live.http(None).get("/v1/health")
    assert health.status_code == 200
    assert health.json() == {"status": "up"}


def test_channels_topics_dead_letters_and_cancel(live: Live, backend: Backend) -> None:
    http = live.http()
    answer = http.put(
        "/v1/topics/orders/channels/billing",
        json={"lease": 60, "max_attempts": 2, "ordering": "group_fifo", "paused": False},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["lease"] == 60
    assert answer.json()["ordering"] == "group_fifo"
    # null returns a setting to the default; the others keep theirs.
    answer = http.put("/v1/topics/orders/channels/billing", json={"lease": None})
    assert answer.json()["lease"] is None
    assert answer.json()["max_attempts"] == 2
    assert error_of(http.put("/v1/topics/orders/channels/billing", json={"ordering": "fifo"})) == (
        400,
        "invalid",
    )
    assert error_of(http.put("/v1/topics/orders/channels/billing", json={"leese": 1})) == (
        400,
        "invalid",
    )
    bad_filter = http.put("/v1/topics/orders/channels/billing", json={"filter": "headers["})
    assert error_of(bad_filter) == (400, "invalid")
    http.put("/v1/topics/orders/channels/billing", json={"paused": True})
    ids = publish(live, {"body": "a"}, {"body": "b"}, {"body": "c", "delay": 3600})
    assert receive(live) == []
    detail = http.get("/v1/topics/orders/channels/billing").json()
    assert detail["settings"]["paused"] is True
    assert detail["backlog"]["ready"] == 2
    assert detail["backlog"]["pending"] == 1
    assert detail["today"]["published"] == 3
    http.put("/v1/topics/orders/channels/billing", json={"paused": False})
    # Dead letters: reject both, requeue one, delete the other.
    got = receive(live, max_messages=10)
    assert len(got) == 2
    settle(live, *(item(m, "dead_letter") for m in got))
    requeued = http.post(
        "/v1/topics/orders/channels/billing/dead/requeue", json={"ids": [got[0]["delivery_id"]]}
    )
    assert requeued.json() == {"count": 1}
    deleted = http.post(
        "/v1/topics/orders/channels/billing/dead/delete",
        json={"died_before": "2999-01-01T00:00:00Z", "limit": 10},
    )
    assert deleted.json() == {"count": 1}
    assert error_of(
        http.post(
            "/v1/topics/orders/channels/billing/dead/delete", json={"died_before": "2999-01-01"}
        )
    ) == (400, "invalid")
    # Cancel the delayed one, never attempted.
    assert http.post(f"/v1/messages/{ids[2]}/cancel").json() == {"count": 1}
    assert error_of(http.post("/v1/messages/999999/cancel")) == (404, "not_found")
    assert error_of(http.post("/v1/messages/abc/cancel")) == (400, "invalid")
    # Deletes: 204, then 404.
    assert http.delete("/v1/topics/orders/channels/billing").status_code == 204
    assert error_of(http.delete("/v1/topics/orders/channels/billing")) == (404, "not_found")
    assert http.delete("/v1/topics/orders").status_code == 204
    assert error_of(http.delete("/v1/topics/orders")) == (404, "not_found")
    assert error_of(http.get("/v1/nothing")) == (404, "not_found")
    assert error_of(http.get("/v1/topics/orders/messages"))[0] == 405


def test_channel_limits_pass_through_and_hold(backend: Backend) -> None:
    # A poll interval longer than the test: a waiting receive is woken by the
    # settle that makes room, or not at all.
    with live_broker(backend.name, backend.url, poll_interval=60) as live:
        channel_limits(live)


def channel_limits(live: Live) -> None:
    http = live.http()
    answer = http.put(
        "/v1/topics/orders/channels/billing",
        json={"max_leased": 1, "rate_limit": [1000, 60]},
    )
    assert answer.status_code == 200, answer.text
    assert (answer.json()["max_leased"], answer.json()["rate_limit"]) == (1, [1000, 60.0])
    detail = http.get("/v1/topics/orders/channels/billing").json()["settings"]
    assert (detail["max_leased"], detail["rate_limit"], detail["group_max_leased"]) == (
        1,
        [1000, 60.0],
        None,
    )
    for bad in ({"rate_limit": [0, 60]}, {"rate_limit": 5}, {"max_leased": 0}):
        assert error_of(http.put("/v1/topics/orders/channels/billing", json=bad)) == (
            400,
            "invalid",
        ), bad
    # max_leased 1: one at a time, and a waiting receive gets the next as soon
    # as the first is settled over HTTP.
    publish(live, {"body": "a"}, {"body": "b"})
    [first] = receive(live, max_messages=10)
    assert receive(live) == []
    signals = runtime_of(core_of(live.client)).signals
    before = signals.count("long_poll_fetches")
    with ThreadPoolExecutor(1) as pool:
        polling = pool.submit(receive, live, wait=15)
        assert signals.wait("long_poll_fetches", before + 1, 10)
        started = time.monotonic()
        assert settle(live, item(first, "complete"))[0]["ok"] is True
        [second] = polling.result(timeout=20)
    assert second["body"] == "b"
    assert time.monotonic() - started < 5
    # null lifts a limit.
    answer = http.put("/v1/topics/orders/channels/billing", json={"max_leased": None})
    assert answer.json()["max_leased"] is None
    assert answer.json()["rate_limit"] == [1000, 60.0]


def test_openapi_document_lists_every_endpoint(live: Live) -> None:
    doc = live.http().get("/v1/openapi.json").json()
    assert doc["openapi"] == "3.1.0"
    routes = live.server._server.config.app.app.routes  # the Starlette app behind Managed
    served = {(m.lower(), r.path) for r in routes for m in r.methods if m != "HEAD"}
    documented = {(m, p) for p, item in doc["paths"].items() for m in item if m != "parameters"}
    assert served == documented
    assert error_of(live.http(None).get("/v1/openapi.json")) == (401, "unauthorized")


def test_the_server_answers_kept_alive_connections_without_delay(live: Live) -> None:
    """Its socket is a TCP one by name, so asyncio sets TCP_NODELAY on every
    connection: an answer's headers and body never wait for the caller's
    delayed ACK (40 ms a request on a kept-alive connection otherwise)."""
    assert live.server._socket.proto == socket.IPPROTO_TCP


# -- long polls ---------------------------------------------------------------------------


def test_a_long_poll_answers_as_soon_as_a_message_is_published(
    live: Live, backend: Backend
) -> None:
    put_channel(live)
    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        polling = pool.submit(receive, live, wait=15)
        signals = runtime_of(core_of(live.client)).signals
        assert signals.wait("long_poll_fetches", 1, 10)
        # Published by another client, in another connection: the wake-up is
        # the database's (NOTIFY or the change watcher), not the broker's.
        backend.client().publish("orders", b"wake up")
        [got] = polling.result(timeout=15)
    assert got["body"] == "wake up"
    assert time.monotonic() - started < 5


def test_a_caller_gone_mid_poll_leaves_nothing_leased(live: Live, backend: Backend) -> None:
    put_channel(live)
    signals = runtime_of(core_of(live.client)).signals
    before = signals.count("long_poll_fetches")
    host, port = live.base_url.removeprefix("http://").split(":")
    body = json.dumps({"wait": 20}).encode()
    request = (
        f"POST /v1/topics/orders/channels/billing/receive HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {token_of('admin')}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(request)
        assert signals.wait("long_poll_fetches", before + 1, 10)
    # The caller is gone: its poll ends at once (no poll waits any more), and
    # a message published now stays ready.
    runtime = runtime_of(core_of(live.client))
    assert until(lambda: runtime._pollers == 0, 10)
    backend.client().publish("orders", b"for someone else")
    found = backlog(backend)
    assert (found.ready, found.in_flight) == (1, 0)


def test_a_stopping_server_answers_its_waiting_receives_at_once(
    live: Live, backend: Backend
) -> None:
    put_channel(live)
    signals = runtime_of(core_of(live.client)).signals
    with ThreadPoolExecutor(1) as pool:
        polling = pool.submit(receive, live, wait=20)
        assert signals.wait("long_poll_fetches", 1, 10)
        started = time.monotonic()
        live.server.stop()
        assert polling.result(timeout=30) == []
    assert time.monotonic() - started < 5
    assert not live.server.alive()


def test_a_claim_that_raced_the_disconnect_is_released(backend: Backend) -> None:
    """The caller goes away while the claim runs: what it leased is given back."""

    async def scenario() -> list[Any]:
        client = novaque.aio.connect(async_url(backend.name, backend.url))
        try:
            await client.ensure_channel("orders", "billing")
            await client.publish_many("orders", [b"a", b"b"])
            broker = create_app(client, tokens=tokens()).state.broker
            assert isinstance(broker, BrokerApp)
            gone = asyncio.Event()

            async def receive() -> dict[str, Any]:
                await gone.wait()
                return {"type": "http.disconnect"}

            loop = asyncio.get_running_loop()
            core = core_of(client)

            def fetch_once() -> list[novaque.Message]:
                got = core.claim("orders", "billing", max_messages=10)
                loop.call_soon(gone.set)  # the caller leaves as the claim commits
                from sqlalchemy.util import await_only

                await_only(asyncio.sleep(0.05))  # the watcher runs meanwhile
                return got

            spec = Receive(wait=5, max_messages=10)
            with pytest.raises(Exception) as raised:
                await broker._long_poll(receive, "orders", "billing", fetch_once, spec)
            assert type(raised.value).__name__ == "_Gone"
            return await client.claim("orders", "billing", max_messages=10)
        finally:
            await client.shutdown()

    again = asyncio.run(scenario())
    # Released: both are claimable again, their first attempt not counted.
    assert sorted(m.attempts for m in again) == [1, 1]


def test_hundreds_of_long_polls_hold_no_connection_and_no_thread(backend: Backend) -> None:
    # A poll interval longer than the test: between wake-ups the polls only wait.
    with live_broker(backend.name, backend.url, poll_interval=60) as live:
        hundreds_of_long_polls(live, backend)


def hundreds_of_long_polls(live: Live, backend: Backend) -> None:
    put_channel(live)
    polls = 200
    engine = live.client.own_engine.sync_engine
    threads_before = threading.active_count()

    async def scenario() -> tuple[int, int, list[int]]:
        limits = httpx.Limits(max_connections=polls + 10)
        headers = {"Authorization": f"Bearer {token_of('admin')}"}
        async with httpx.AsyncClient(
            base_url=live.base_url, headers=headers, limits=limits, timeout=60
        ) as http:
            tasks = [
                asyncio.ensure_future(
                    http.post("/v1/topics/orders/channels/billing/receive", json={"wait": 20})
                )
                for _ in range(polls)
            ]
            signals = runtime_of(core_of(live.client)).signals
            assert await asyncio.to_thread(signals.wait, "long_poll_fetches", polls, 30)
            # Connections checked out now and then (maintenance runs too):
            # none for the 200 waiting polls.
            samples = []
            for _ in range(20):
                await asyncio.sleep(0.05)
                samples.append(engine.pool.checkedout())
            held = min(samples)
            threads = threading.active_count()
            publisher = backend.client()
            await asyncio.to_thread(publisher.publish_many, "orders", [b"x"] * polls)
            answers = await asyncio.gather(*tasks)
            return held, threads, [len(a.json()["messages"]) for a in answers]

    held, threads, counts = asyncio.run(scenario())
    assert held <= 1  # the change watcher's connection is its own, outside the pool
    assert threads - threads_before < 20
    assert sum(counts) == polls


def test_concurrent_http_consumers_never_hold_one_delivery_at_once(
    live: Live, backend: Backend
) -> None:
    put_channel(live)
    total = 300
    for start in range(0, total, 100):
        publish(live, *({"body": f"m{n}"} for n in range(start, start + 100)))
    held: dict[int, str] = {}
    seen: list[int] = []
    lock = threading.Lock()
    overlaps: list[int] = []

    def consume() -> None:
        with httpx.Client(
            base_url=live.base_url,
            headers={"Authorization": f"Bearer {token_of('worker')}"},
            timeout=60,
        ) as http:
            while True:
                answer = http.post(
                    "/v1/topics/orders/channels/billing/receive",
                    json={"max_messages": 7, "wait": 0.5},
                )
                got = answer.json()["messages"]
                if not got:
                    return
                with lock:
                    for msg in got:
                        if msg["delivery_id"] in held:
                            overlaps.append(msg["delivery_id"])
                        held[msg["delivery_id"]] = msg["lease_token"]
                        seen.append(msg["delivery_id"])
                items = [item(m, "complete") for m in got]
                with lock:
                    for msg in got:
                        del held[msg["delivery_id"]]
                results = http.post(
                    "/v1/topics/orders/channels/billing/settle", json={"items": items}
                ).json()
                assert all(r["ok"] for r in results["results"])

    with ThreadPoolExecutor(6) as pool:
        for done in [pool.submit(consume) for _ in range(6)]:
            done.result(timeout=120)
    assert overlaps == []
    assert sorted(seen) == sorted(set(seen))
    assert len(seen) == total
    assert backlog(backend) == novaque.Backlog()


# -- as a Node.js service uses it ---------------------------------------------------------


def test_a_node_service_publishes_long_polls_and_settles(live: Live, backend: Backend) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    put_channel(live)
    done = subprocess.run(
        [node, str(ROOT / "tests" / "broker_client.mjs"), live.base_url, token_of("worker")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "ok"
    found = backlog(backend)
    assert (found.ready, found.in_flight, found.dead) == (0, 0, 1)


# -- tokens -------------------------------------------------------------------------------


def test_tokens_file_is_read_checked_and_reloaded(tmp_path: Path) -> None:
    token = new_token()
    assert token.startswith("nvq_")
    assert len(token) > 40
    assert new_token() != token
    path = tmp_path / "tokens.toml"
    path.write_text(token_toml(token, ["publish:orders", "consume:orders/*"], "billing"))
    made = Tokens.from_file(path)
    found = made.find(token)
    assert found is not None
    assert found.name == "billing"
    assert found.sha256 == hash_token(token)
    assert found.allows("publish", "orders")
    assert not found.allows("publish", "order")
    assert found.allows("consume", "orders", "any")
    assert not found.allows("admin")
    assert made.find(token + "x") is None
    assert token not in path.read_text()
    # A new token added: read again (the file is looked at once a second at most).
    other = new_token()
    path.write_text(path.read_text() + token_toml(other, ["admin"]))
    os.utime(path, (time.time() + 5, time.time() + 5))
    made._checked = 0.0
    assert made.find(other) is not None
    for text, wrong in [
        ("[[token]]\nsha256 = 'abc'\nscopes = ['admin']\n", "64 hex digits"),
        (f"[[token]]\nsha256 = '{'0' * 64}'\nscopes = ['read:x']\n", "publish:<topic glob>"),
        (f"[[token]]\nsha256 = '{'0' * 64}'\nscopes = []\n", "non-empty"),
        ("[[token]\n", "not valid TOML"),
        ("users = 1\n", "unknown key"),
    ]:
        path.write_text(text)
        with pytest.raises(TokensError, match=wrong.replace("[", r"\[").replace("*", r"\*")):
            Tokens.from_file(path)
    with pytest.raises(TokensError, match="cannot read"):
        Tokens.from_file(tmp_path / "missing.toml")


def test_serve_takes_the_url_of_every_command_and_stops_on_sigterm(
    backend: Backend, tmp_path: Path
) -> None:
    """``novaque --url URL serve`` with the URL the other commands take (a sync
    driver: PyMySQL, pysqlite): served through the database's asyncio driver."""
    token = new_token()
    (tmp_path / "tokens.toml").write_text(token_toml(token, ["admin"]))
    serving = subprocess.Popen(
        [
            *(sys.executable, "-m", "novaque.cli", "--url", backend.url, "serve"),
            *("--tokens", "tokens.toml", "--port", "0"),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert serving.stdout is not None
        ready = serving.stdout.readline()
        assert ready.startswith("novaque broker on http://127.0.0.1:"), ready
        base = ready.split()[3].removesuffix("/v1/")
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
            assert http.get("/v1/health").json() == {"status": "up"}
            put = http.put("/v1/topics/orders/channels/billing", json={})
            assert put.status_code == 200, put.text
            sent = http.post("/v1/topics/orders/messages", json={"messages": [{"body": "a"}]})
            assert sent.status_code == 201, sent.text
        serving.send_signal(signal.SIGTERM)
        assert serving.wait(60) == 0
        assert serving.stderr is not None
        assert serving.stderr.read().strip().splitlines()[-1] == "stopped"
    finally:
        if serving.poll() is None:
            serving.kill()
            serving.wait(60)
        for stream in (serving.stdout, serving.stderr):
            if stream is not None:
                stream.close()
    assert backlog(backend).ready == 1


def test_the_app_mounts_under_a_prefix(tmp_path: Path) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    url = f"sqlite:///{tmp_path / 'mounted.db'}"
    migrating = novaque.connect(url)
    migrating.migrate()
    migrating.shutdown()

    async def scenario() -> tuple[int, int]:
        client = novaque.aio.connect(url)
        try:
            app = Starlette(routes=[Mount("/queues", create_app(client, tokens=tokens()))])
            transport = httpx.ASGITransport(app=app)
            headers = {"Authorization": f"Bearer {token_of('admin')}"}
            async with httpx.AsyncClient(
                transport=transport, base_url="http://app", headers=headers
            ) as http:
                sent = await http.post(
                    "/queues/v1/topics/orders/messages", json={"messages": [{"body": "a"}]}
                )
                missing = await http.get("/v1/health")
                return sent.status_code, missing.status_code
        finally:
            await client.shutdown()

    assert asyncio.run(scenario()) == (201, 404)


def test_create_app_needs_an_async_client_and_tokens(tmp_path: Path) -> None:
    sync = novaque.connect(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(TypeError, match=r"novaque\.aio"):
        create_app(sync, tokens=tokens())  # type: ignore[arg-type]
    client = novaque.aio.connect(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(TokensError):
        create_app(client, tokens=tmp_path / "none.toml")
    sync.engine.dispose()


def test_the_cli_makes_tokens_and_serve_needs_a_tokens_file(tmp_path: Path) -> None:
    from novaque.cli import build_parser

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "novaque.cli", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            check=False,
            timeout=60,
        )

    made = cli("token", "new", "--scope", "publish:orders", "--scope", "admin", "--name", "ci")
    assert made.returncode == 0, made.stderr
    token, toml = made.stdout.split("\n", 1)
    (tmp_path / "tokens.toml").write_text(toml)
    found = Tokens.from_file(tmp_path / "tokens.toml").find(token)
    assert found is not None
    assert [str(s) for s in found.scopes] == ["publish:orders", "admin"]
    bad = cli("token", "new", "--scope", "read:orders")
    assert bad.returncode == 1
    assert "publish:<topic glob>" in bad.stderr
    args = build_parser().parse_args(["serve", "--tokens", "t.toml"])
    assert (args.host, args.port) == ("127.0.0.1", 8090)
    missing = cli("serve")
    assert missing.returncode == 2
    assert "--tokens" in missing.stderr
    (tmp_path / "broken.toml").write_text("[[token]]\n")
    broken = cli("--url", f"sqlite:///{tmp_path / 'none.db'}", "serve", "--tokens", "broken.toml")
    assert broken.returncode == 1
    assert len(broken.stderr.strip().splitlines()) == 1
