"""End-to-end: the admin served on 127.0.0.1, driven by Playwright in Debian's Chromium.

Skipped, with the reason, when the ``playwright`` package or ``/usr/bin/chromium``
is missing (``.ci/run`` installs chromium, so CI runs them). Playwright's own
browser downloads are never used. Screenshots go to ``test-artifacts/``.

These run on SQLite only: what they check is the UI; every backend's answers
behind it are covered by the WSGI-level tests in ``test_admin.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import novaque
from novaque.admin import create_app
from novaque.admin._serve import BackgroundServer, start_background

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("NOVAQUE_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
XSS_ERROR = "<script>window.pwned = 1</script> card declined"
XSS_BODY = '<img src=x onerror="window.pwned = 2">'

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None  # type: ignore[assignment]

if sync_playwright is None:
    pytestmark = [pytest.mark.browser, pytest.mark.skip(reason="the playwright package is missing")]
elif not os.access(CHROMIUM, os.X_OK):
    pytestmark = [
        pytest.mark.browser,
        pytest.mark.skip(reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
    ]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[novaque.Client, BackgroundServer]]:
    client = novaque.connect(f"sqlite:///{tmp_path / 'browser.db'}", default_max_attempts=2)
    client.migrate()
    server = start_background(create_app(client), "127.0.0.1", 0)
    try:
        yield client, server
    finally:
        server.stop()
        client._context.executor.engine.dispose()


@pytest.fixture
def page(served: Any) -> Iterator[Any]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 860})
            tab = context.new_page()
            tab.on("dialog", lambda dialog: dialog.accept())  # the confirmations
            problems: list[str] = []
            tab.on("pageerror", lambda exc: problems.append(str(exc)))
            tab.on(
                "console",
                lambda msg: problems.append(msg.text) if msg.type == "error" else None,
            )
            tab.problems = problems
            yield tab
        finally:
            browser.close()


def publish_in_page(tab: Any, topic: str, body: str, max_attempts: int | None = None) -> int:
    """POST to the JSON API from the page, as the UI's own script does."""
    result = tab.evaluate(
        """async ([topic, body, attempts]) => {
            const token = document.querySelector('meta[name="novaque-csrf"]').content;
            const root = document.querySelector('meta[name="novaque-root"]').content;
            const response = await fetch(root + "/api/topics/" + topic + "/publish", {
                method: "POST",
                headers: {"Content-Type": "application/json", "X-CSRF-Token": token},
                body: JSON.stringify({body: body, max_attempts: attempts}),
            });
            return [response.status, await response.json()];
        }""",
        [topic, body, max_attempts],
    )
    status, data = result
    assert status == 201, data
    return int(data["id"])


def test_dashboard_topic_channel_publish_dead_letter_requeue(page: Any, served: Any) -> None:
    client, server = served
    admin = f"{server.base_url}/admin/"
    page.goto(admin)
    expect(page.get_by_text("No topics yet")).to_be_visible()

    # Create a topic and a channel through the forms.
    page.get_by_placeholder("new topic name").fill("orders")
    page.get_by_role("button", name="Create topic").click()
    card = page.locator('section[data-topic="orders"]')
    expect(card).to_be_visible()
    card.get_by_placeholder("new channel").fill("billing")
    card.get_by_role("button", name="Add channel").click()
    row = page.locator('section[data-topic="orders"] tr[data-channel="billing"]')
    expect(row).to_be_visible()
    ready = row.locator('[data-field="backlog.ready"]')
    expect(ready).to_have_text("0")
    assert client.list_channels("orders") == ["billing"]

    # Publish through the API; the backlog changes without a reload.
    page.evaluate("window.marker = 'same page'")
    for i in range(3):
        publish_in_page(page, "orders", f'{{"order": {i}}}')
    publish_in_page(page, "orders", XSS_BODY, max_attempts=1)
    expect(ready).to_have_text("4", timeout=15_000)
    assert page.evaluate("window.marker") == "same page"  # refreshed, not reloaded
    expect(row.locator('[data-field="today.published"]')).to_have_text("4", timeout=15_000)

    # A consumer fails every message once; the one allowed a single attempt dies.
    batch = client.claim("orders", "billing", max_messages=10)
    assert len(batch) == 4
    for msg in batch:
        client.requeue(msg, delay=0, error=XSS_ERROR if msg.body == XSS_BODY.encode() else None)
    client.flush_stats()
    expect(row.locator('[data-field="backlog.dead"]')).to_have_text("1", timeout=15_000)
    page.set_viewport_size({"width": 1280, "height": 860})
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "admin-dashboard.png"), full_page=True)

    # The dead-letter browser shows the error and body as text, never as markup.
    row.get_by_role("link", name="dead letters").click()
    expect(page.locator("h1")).to_contain_text("Dead letters of")
    error_cell = page.locator("#dead td.err").first
    expect(error_cell).to_have_text(XSS_ERROR)
    expect(page.locator("#dead code.body").first).to_have_text(XSS_BODY)
    assert page.evaluate("window.pwned") is None
    page.screenshot(path=str(ARTIFACTS / "admin-dead-letters.png"), full_page=True)
    page.locator("#dead input.pick").first.check()
    page.get_by_role("button", name="Requeue selected").click()
    expect(page.get_by_text("No dead letters.")).to_be_visible(timeout=15_000)
    assert client.channel_backlog("orders", "billing").dead == 0

    # The channel page draws the trend chart from the daily counters.
    page.goto(f"{admin}topics/orders/channels/billing")
    expect(page.locator("#chart svg polyline")).to_have_count(4)
    expect(page.locator('[data-field="backlog.ready"]')).to_have_text("4")
    page.screenshot(path=str(ARTIFACTS / "admin-channel.png"), full_page=True)

    # The topic page's form publishes; its table follows without a reload.
    page.goto(f"{admin}topics/orders")
    topic_ready = page.locator('tr[data-channel="billing"] [data-field="backlog.ready"]')
    expect(topic_ready).to_have_text("4")
    page.evaluate("window.marker = 'topic page'")
    page.get_by_label("message body").fill("from the form")
    page.get_by_role("button", name="Publish").click()
    expect(page.locator("#flash")).to_contain_text("Published message")
    expect(topic_ready).to_have_text("5", timeout=15_000)
    assert page.evaluate("window.marker") == "topic page"
    assert page.problems == []


def test_live_chart_and_consumers_online(page: Any, served: Any) -> None:
    client, server = served
    admin = f"{server.base_url}/admin/"
    client.ensure_channel("orders", "audit")
    consumer = client.subscribe_and_start("orders", "billing", lambda m: None, max_in_flight=3)
    try:
        client.publish_many("orders", [b"1", b"2", b"3"])
        assert consumer._signals.wait("acked", 3, 30)
        client.flush_stats()

        # The dashboard: the consumers online, the last hour of every channel.
        page.goto(admin)
        expect(page.locator('[data-totals] [data-field="consumers"]')).to_have_text("1")
        row = page.locator('tr[data-channel="billing"]')
        expect(row.locator('[data-field="consumers"]')).to_have_text("1")
        expect(page.locator('tr[data-channel="audit"] [data-field="consumers"]')).to_have_text("0")
        expect(page.locator("#live-chart svg polyline")).to_have_count(4)
        expect(page.locator("#live-chart svg title").first).to_contain_text("every channel")
        # Points only where something happened: 3 published (2 channels), 3 acked.
        expect(page.locator("#live-chart svg circle")).to_have_count(2)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "admin-dashboard-live.png"), full_page=True)

        # The channel page: the daily trend and the last hour side by side, and who consumes.
        page.goto(f"{admin}topics/orders/channels/billing")
        expect(page.locator("#chart svg polyline")).to_have_count(4)
        expect(page.locator("#live-chart svg polyline")).to_have_count(4)
        rows = page.locator("#consumers tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first.locator("td").nth(2)).to_have_text("0 / 3")
        expect(page.get_by_text("No consumer runs on this channel.")).to_be_hidden()
        page.screenshot(path=str(ARTIFACTS / "admin-channel-live.png"), full_page=True)
        page.evaluate("window.marker = 'same page'")
    finally:
        consumer.shutdown()
    # The table follows without a reload once the consumer is gone.
    expect(page.locator("#consumers tbody tr")).to_have_count(0, timeout=15_000)
    expect(page.get_by_text("No consumer runs on this channel.")).to_be_visible()
    assert page.evaluate("window.marker") == "same page"
    assert page.problems == []
