"""The admin's Prometheus endpoint (DESIGN §10): ``{prefix}/metrics``, parsed
with prometheus_client's own parser."""

from __future__ import annotations

import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

import novaque
from novaque.admin import create_app
from novaque.testing import FakeClock
from tests.wsgi import WSGIClient


def scrape(
    web: WSGIClient, path: str = "/admin/metrics"
) -> dict[tuple[str, tuple[str, ...]], float]:
    """{(sample name, label values sorted by label name): value} of one scrape."""
    reply = web.get(path)
    assert reply.status == 200, reply.text
    assert reply.headers["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            labels = tuple(v for _, v in sorted(sample.labels.items()))
            samples[(sample.name, labels)] = sample.value
    return samples


def test_metrics_give_backlog_age_today_and_consumers_per_channel(
    client: novaque.Client, clock: FakeClock
) -> None:
    # At noon: the 90 s below stay within one UTC day, whenever the test runs.
    clock.set(clock().replace(hour=12, minute=0, second=0))
    client.ensure_channel("orders", "billing")
    client.ensure_channel("orders", "audit")
    client.publish_many("orders", [b"1", b"2", b"3"])
    client.publish("orders", b"later", delay=60)
    [msg] = client.claim("orders", "billing")
    client.ack(msg)
    [dead] = client.claim("orders", "audit")
    client.reject(dead)
    client.flush_stats()
    clock.advance(90)  # the oldest ready delivery has waited 90 s, "later" 30 s
    consumer = client.subscribe("mail", "send", lambda m: None, max_in_flight=2)
    consumer.start()
    try:
        got = scrape(WSGIClient(create_app(client, metrics=True)))
    finally:
        consumer.shutdown()

    # label values sorted by label name: (channel, state, topic)
    assert got[("novaque_backlog", ("billing", "ready", "orders"))] == 3
    assert got[("novaque_backlog", ("billing", "pending", "orders"))] == 0
    assert got[("novaque_backlog", ("audit", "dead", "orders"))] == 1
    assert got[("novaque_backlog", ("audit", "ready", "orders"))] == 3
    assert got[("novaque_backlog", ("audit", "deferred", "orders"))] == 0
    assert got[("novaque_backlog", ("send", "in_flight", "mail"))] == 0
    assert got[("novaque_oldest_ready_age_seconds", ("billing", "orders"))] == 90
    assert got[("novaque_oldest_ready_age_seconds", ("send", "mail"))] == 0  # none ready
    # (channel, counter, topic)
    assert got[("novaque_today_total", ("billing", "published", "orders"))] == 4
    assert got[("novaque_today_total", ("billing", "acked", "orders"))] == 1
    assert got[("novaque_today_total", ("audit", "dead", "orders"))] == 1
    assert got[("novaque_consumers", ("send", "mail"))] == 1
    assert got[("novaque_consumers", ("billing", "orders"))] == 0


def test_metrics_are_behind_basic_auth_and_404_unless_asked_for(client: novaque.Client) -> None:
    assert WSGIClient(create_app(client)).get("/admin/metrics").status == 404
    web = WSGIClient(create_app(client, basic_auth=("ops", "pw"), metrics=True))
    reply = web.get("/admin/metrics")
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"].startswith("Basic")
    web.auth = ("ops", "pw")
    assert scrape(web) == {}  # no topic yet: the families are there, without samples
    assert WSGIClient(create_app(client, prefix="", metrics=True)).get("/metrics").status == 200
    with pytest.raises(novaque.InvalidOption, match="metrics must be True or False"):
        create_app(client, metrics="yes")  # type: ignore[arg-type]


def test_two_apps_keep_their_metrics_apart(client: novaque.Client, backend: object) -> None:
    client.ensure_channel("t", "c")
    one = WSGIClient(create_app(client, metrics=True))
    two = WSGIClient(create_app(client, metrics=True))
    assert scrape(one) == scrape(two)  # private registries: no "Duplicated timeseries"


def test_metrics_without_prometheus_client_say_what_to_install(
    client: novaque.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"pip install 'novaque\[prometheus\]'"):
        create_app(client, metrics=True)
    create_app(client)  # the rest of the admin needs nothing
