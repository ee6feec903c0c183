"""The HTML pages, rendered on the server from :mod:`novaque.admin._data`.

Every value that comes from the database or the request goes through
:func:`h` (``html.escape`` with quotes), names in URLs through :func:`q`.
The embedded script (``static/admin.js``) adds live refresh, the trend chart
and the POST actions; the pages read fine without it.
"""

# ruff: noqa: E501  (HTML templates read better unwrapped)
from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, urlencode

from novaque.admin._data import COUNTERS, STATES

STATE_LABELS = {
    "pending": "Pending",
    "ready": "Ready",
    "in_flight": "In flight",
    "deferred": "Deferred",
    "dead": "Dead",
}
TODAY = ("published", "acked", "requeued", "dead")


def h(value: object) -> str:
    """HTML-escape any value (quotes included, so it is safe in attributes too)."""
    return html.escape("" if value is None else str(value), quote=True)


def when(value: object) -> str:
    """An ISO time as ``YYYY-MM-DD HH:MM:SS`` (UTC), escaped."""
    text = "" if value is None else str(value)
    return h(text[:19].replace("T", " "))


def age(seconds: float | None) -> str:
    """How long something has waited, in words a person scans: ``3 min 12 s``.

    ``admin.js`` formats live updates the same way.
    """
    if seconds is None:
        return "—"
    total = int(seconds)
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def age_cell(tag: str, seconds: float | None, cls: str) -> str:
    """The live-updated age of the oldest ready delivery (``oldest_ready_age``)."""
    return (
        f'<{tag} class="{cls}" data-field="oldest_ready_age" data-format="age">'
        f"{h(age(seconds))}</{tag}>"
    )


def q(name: str) -> str:
    """A name as one URL path segment."""
    return quote(name, safe="")


class Pages:
    """Renders pages for one request: knows the URL root and the CSRF token."""

    def __init__(self, root: str, csrf: str) -> None:
        self.root = root  # SCRIPT_NAME + prefix, no trailing slash
        self.csrf = csrf

    # -- URLs ----------------------------------------------------------------------

    def url(self, path: str = "/", **query: object) -> str:
        params = {k: v for k, v in query.items() if v not in (None, "")}
        return self.root + path + (("?" + urlencode(params)) if params else "")

    def topic_url(self, topic: str, rest: str = "") -> str:
        return self.url(f"/topics/{q(topic)}{rest}")

    def channel_url(self, topic: str, channel: str, rest: str = "") -> str:
        return self.url(f"/topics/{q(topic)}/channels/{q(channel)}{rest}")

    def api(self, path: str) -> str:
        return self.root + "/api" + path

    # -- layout --------------------------------------------------------------------

    def layout(
        self, title: str, body: str, *, page: str, crumbs: Iterable[tuple[str, str]] = ()
    ) -> str:
        trail = "".join(
            f' <span class="sep">/</span> <a href="{h(href)}">{h(label)}</a>'
            for label, href in crumbs
        )
        return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{h(title)} · novaque admin</title>
<meta name="novaque-csrf" content="{h(self.csrf)}">
<meta name="novaque-root" content="{h(self.root)}">
<link rel="stylesheet" href="{h(self.url("/static/admin.css"))}">
<script src="{h(self.url("/static/admin.js"))}" defer></script>
</head>
<body data-page="{h(page)}">
<header class="top">
  <a class="brand" href="{h(self.url("/"))}">novaque</a>
  <nav class="crumbs"><a href="{h(self.url("/"))}">Dashboard</a>{trail}</nav>
  <span id="live" class="live" aria-live="polite"></span>
</header>
<main id="main">
{body}
</main>
<div id="flash" class="flash" role="status" aria-live="polite" hidden></div>
</body>
</html>
"""

    def button(
        self,
        label: str,
        api_path: str,
        *,
        confirm: str | None = None,
        payload: str | None = None,
        then: str | None = None,
        danger: bool = False,
        extra: str = "",
    ) -> str:
        """A button that POSTs to the API (through admin.js), after a confirmation."""
        attrs = [f'data-post="{h(self.api(api_path))}"']
        if confirm:
            attrs.append(f'data-confirm="{h(confirm)}"')
        if payload:
            attrs.append(f'data-payload="{h(payload)}"')
        if then:
            attrs.append(f'data-then="{h(then)}"')
        cls = "btn danger" if danger else "btn"
        return f'<button type="button" class="{cls}" {" ".join(attrs)}{extra}>{h(label)}</button>'

    def name_form(self, api_path: str, label: str, placeholder: str, then: str = "") -> str:
        return (
            f'<form class="inline" data-create="{h(self.api(api_path))}"'
            f' data-then="{h(then)}">'
            f'<input name="name" required maxlength="200" pattern="[A-Za-z0-9._:\\-]{{1,200}}"'
            f' placeholder="{h(placeholder)}" aria-label="{h(placeholder)}">'
            f'<button class="btn" type="submit">{h(label)}</button></form>'
        )

    # -- pages ---------------------------------------------------------------------

    def dashboard(self, data: dict[str, Any]) -> str:
        topics = data["topics"]
        sections = [self._topic_card(t) for t in topics]
        if not sections:
            sections.append(
                '<p class="empty">No topics yet. Create one here, publish to one, '
                "or subscribe a consumer.</p>"
            )
        body = f"""
<div class="bar">
  <h1>Topics</h1>
  <span class="actions">
    <a class="btn" href="{h(self.url("/schedules"))}">Schedules</a>
    {self.name_form("/topics", "Create topic", "new topic name")}
  </span>
</div>
<p class="muted">Backlog is live; counters are for today ({h(data["day"])}, UTC).
The numbers refresh every few seconds.
<span class="online" data-totals>Consumers online:
<strong data-field="consumers">{data["consumers"]}</strong></span></p>
<div id="topics" data-refresh="{h(self.api("/overview"))}">
{"".join(sections)}
</div>
{
            self._live_chart(
                self.api("/minutes"),
                "every channel added up",
                note="These count deliveries: a message published to a topic with two "
                "channels is two deliveries, so it counts twice.",
            )
        }"""
        return self.layout("Dashboard", body, page="dashboard")

    def schedules(self, data: dict[str, Any]) -> str:
        """Every schedule with its next and last fire, paused or not, and a
        button that pauses or resumes it."""
        rows = []
        for item in data["schedules"]:
            name = item["name"]
            if item["cron"] is not None:
                when = f"cron {item['cron']} ({item['timezone']})"
            else:
                when = f"every {item['every']:g} s"
            switch = "resume" if item["paused"] else "pause"
            state = '<span class="tag dead">paused</span>' if item["paused"] else "running"
            last = item["last_fire_at"] or "—"
            button = self.button(
                switch.capitalize(),
                f"/schedules/{q(name)}/{switch}",
                then=self.url("/schedules"),
            )
            rows.append(
                f"<tr><td><code>{h(name)}</code></td>"
                f'<td><a href="{h(self.topic_url(item["topic"]))}">{h(item["topic"])}</a></td>'
                f"<td><code>{h(when)}</code></td><td>{h(item['next_fire_at'])}</td>"
                f"<td>{h(last)}</td><td>{state}</td><td>{h(item['catch_up'])}</td>"
                f"<td>{button}</td></tr>"
            )
        table = "".join(rows) or (
            '<tr><td colspan="8" class="empty">No schedules yet: '
            "<code>client.schedule(...)</code> or <code>novaque schedule add</code> "
            "creates one.</td></tr>"
        )
        body = f"""
<div class="bar"><h1>Schedules</h1></div>
<section class="card">
<table class="grid"><thead><tr><th>Name</th><th>Topic</th><th>When</th>
<th>Next fire (UTC)</th><th>Last fire (UTC)</th><th>State</th><th>Catch-up</th><th></th>
</tr></thead><tbody>{table}</tbody></table>
<p class="muted">Fires are published by the maintenance of started clients
(or <code>run_maintenance()</code>); a paused schedule fires again once
resumed, its missed fires by its catch-up rule.</p>
</section>"""
        return self.layout(
            "Schedules", body, page="schedules", crumbs=[("Schedules", self.url("/schedules"))]
        )

    def _topic_card(self, topic: dict[str, Any]) -> str:
        name = topic["name"]
        rows = "".join(self._channel_row(name, c) for c in topic["channels"])
        if not rows:
            rows = f'<tr><td colspan="{3 + len(STATES) + len(TODAY)}" class="empty">'
            rows += "No channels: messages are kept but not delivered.</td></tr>"
        return f"""
<section class="card topic" data-topic="{h(name)}">
  <div class="bar">
    <h2><a href="{h(self.topic_url(name))}">{h(name)}</a></h2>
    <span class="actions">
      <a class="btn" href="{h(self.topic_url(name, "/messages"))}">Messages</a>
      {self.name_form(f"/topics/{q(name)}/channels", "Add channel", "new channel")}
    </span>
  </div>
  {self._channel_table(name, rows)}
</section>"""

    def _channel_table(self, topic: str, rows: str) -> str:
        state_heads = "".join(f'<th class="num">{STATE_LABELS[s]}</th>' for s in STATES)
        state_heads += '<th class="num" title="how long the oldest ready delivery has waited">'
        state_heads += "Oldest ready</th>"
        today_heads = "".join(f'<th class="num today">{s.capitalize()}</th>' for s in TODAY)
        online_head = '<th class="num" title="consumers online, every process">Consumers</th>'
        return f"""<table class="grid">
<thead><tr><th>Channel</th>{state_heads}{today_heads}{online_head}</tr>
<tr class="sub"><th></th><th colspan="{len(STATES) + 1}">backlog</th>
<th colspan="{len(TODAY)}" class="today">today</th><th>online</th></tr></thead>
<tbody>{rows}</tbody></table>"""

    @staticmethod
    def _setting_tags(settings: dict[str, Any]) -> str:
        """Tags for what sets a channel apart: paused, its ordering, a filter."""
        tags = ""
        if settings["paused"]:
            tags += ' <span class="tag dead">paused</span>'
        if settings["ordering"] != "standard":
            tags += f' <span class="tag">{h(settings["ordering"])}</span>'
        if settings["filter"] is not None:
            tags += f' <span class="tag" title="{h(settings["filter"])}">filtered</span>'
        limits = [
            f"{name}={settings[name]}"
            for name in ("max_leased", "group_max_leased")
            if settings[name]
        ]
        if settings["rate_limit"] is not None:
            limits.append(f"rate_limit={_rate(settings['rate_limit'])}")
        if limits:
            tags += f' <span class="tag" title="{h(", ".join(limits))}">limited</span>'
        return tags

    def _channel_row(self, topic: str, channel: dict[str, Any]) -> str:
        name = channel["name"]
        cells = "".join(
            f'<td class="num s-{s}" data-field="backlog.{s}">{channel["backlog"][s]}</td>'
            for s in STATES
        )
        cells += age_cell("td", channel["oldest_ready_age"], "num age")
        cells += "".join(
            f'<td class="num today" data-field="today.{c}">{channel["today"][c]}</td>'
            for c in TODAY
        )
        cells += f'<td class="num online" data-field="consumers">{channel["consumers"]}</td>'
        dead_link = self._setting_tags(channel["settings"])
        if channel["backlog"]["dead"]:
            dead_link = (
                f' <a class="tag dead" href="{h(self.channel_url(topic, name, "/dead"))}">'
                "dead letters</a>"
            )
        return (
            f'<tr data-channel="{h(name)}"><td><a href="{h(self.channel_url(topic, name))}">'
            f"{h(name)}</a>{dead_link}</td>{cells}</tr>"
        )

    def topic(self, data: dict[str, Any], day: str) -> str:
        name = data["name"]
        rows = "".join(self._channel_row(name, c) for c in data["channels"])
        if not rows:
            rows = f'<tr><td colspan="{3 + len(STATES) + len(TODAY)}" class="empty">'
            rows += "No channels yet.</td></tr>"
        body = f"""
<div class="bar">
  <h1>Topic <code>{h(name)}</code></h1>
  <span class="actions">
    <a class="btn" href="{h(self.topic_url(name, "/messages"))}">Browse messages</a>
    {
            self.button(
                "Delete topic",
                f"/topics/{q(name)}/delete",
                confirm=f"Delete topic {name} with all its channels, messages and counters?",
                then=self.url("/"),
                danger=True,
            )
        }
  </span>
</div>
<section class="card" data-topic="{h(name)}" id="topics" data-refresh="{
            h(self.api(f"/topics/{q(name)}"))
        }">
  <div class="bar"><h2>Channels</h2>
  {self.name_form(f"/topics/{q(name)}/channels", "Add channel", "new channel")}</div>
  {self._channel_table(name, rows)}
  <p class="muted">Counters are for today ({h(day)}, UTC).</p>
</section>
<section class="card">
  <h2>Publish</h2>
  <form class="stack" data-publish="{h(self.api(f"/topics/{q(name)}/publish"))}">
    <textarea name="body" rows="4" placeholder="message body (UTF-8 text)"
     aria-label="message body"></textarea>
    <label>delay (seconds) <input name="delay" type="number" min="0" step="any"></label>
    <button class="btn" type="submit">Publish</button>
  </form>
</section>"""
        return self.layout(
            f"Topic {name}", body, page="topic", crumbs=[(name, self.topic_url(name))]
        )

    def channel(self, data: dict[str, Any], days: dict[str, Any]) -> str:
        topic, name = data["topic"], data["channel"]
        backlog = "".join(
            f'<div class="stat s-{s}"><span class="k">{STATE_LABELS[s]}</span>'
            f'<span class="v" data-field="backlog.{s}">{data["backlog"][s]}</span></div>'
            for s in STATES
        )
        backlog += (
            '<div class="stat"><span class="k">Oldest ready waited</span>'
            + age_cell("span", data["oldest_ready_age"], "v")
            + "</div>"
        )
        names = COUNTERS
        heads = "".join(f'<th class="num">{n.capitalize()}</th>' for n in names)
        today = "".join(f'<td class="num">{data["today"][n]}</td>' for n in names)
        window = "".join(f'<td class="num">{data["window"]["counters"][n]}</td>' for n in names)
        day_rows = (
            "".join(
                f"<tr><td>{h(d['day'])}</td>"
                + "".join(f'<td class="num">{d[n]}</td>' for n in names)
                + "</tr>"
                for d in reversed(days["days"])
            )
            or f'<tr><td colspan="{len(names) + 1}" class="empty">No activity yet.</td></tr>'
        )
        settings, defaults = data["settings"], data["defaults"]

        def setting(key: str, unit: str = "", none: str = "no limit") -> str:
            return _setting(settings[key], defaults[key], unit, none)

        switch = "resume" if settings["paused"] else "pause"
        setting_rows = "".join(
            f"<tr><th>{h(label)}</th><td><code>{h(value)}</code></td></tr>"
            for label, value in (
                ("State", "paused" if settings["paused"] else "running"),
                ("Ordering", settings["ordering"]),
                (
                    "Filter",
                    "none (every message)" if settings["filter"] is None else settings["filter"],
                ),
                ("Lease", setting("lease", " s")),
                ("Max attempts", setting("max_attempts")),
                (
                    "Dead letters kept for",
                    setting("dead_max_age", " s", none="until their message's TTL"),
                ),
                ("Dead letters kept, at most", setting("dead_max_count")),
                ("Dead-letter bytes, at most", setting("dead_max_bytes")),
                ("Expired deliveries become dead letters", setting("dead_letter_expired")),
                ("Leased at once, at most", _value(settings["max_leased"], "", "no limit")),
                ("Handed out, at most", _rate(settings["rate_limit"])),
                (
                    "Leased at once per group, at most",
                    _value(settings["group_max_leased"], "", "no limit"),
                ),
            )
        )
        body = f"""
<div class="bar">
  <h1>Channel <code>{h(topic)}</code> / <code>{h(name)}</code></h1>
  <span class="actions">
    <a class="btn" href="{h(self.channel_url(topic, name, "/dead"))}">Dead letters
      ({data["backlog"]["dead"]})</a>
    {
            self.button(
                switch.capitalize(),
                f"/topics/{q(topic)}/channels/{q(name)}/{switch}",
                then=self.channel_url(topic, name),
            )
        }
    {
            self.button(
                "Delete channel",
                f"/topics/{q(topic)}/channels/{q(name)}/delete",
                confirm=f"Delete channel {name} of {topic} with its deliveries and counters?",
                then=self.topic_url(topic),
                danger=True,
            )
        }
  </span>
</div>
<section class="card"><h2>Settings</h2>
<table class="grid"><tbody>{setting_rows}</tbody></table></section>
<section class="card"><h2>Backlog</h2>
<div class="stats" data-refresh-channel="{h(self.api(f"/topics/{q(topic)}/channels/{q(name)}"))}">{
            backlog
        }</div></section>
<div class="charts">
<section class="card">
  <h2>Trend <span class="muted">{h(days["since"])} to {h(days["until"])}, per UTC day</span></h2>
  <div id="chart" class="chart" data-daily="{
            h(self.api(f"/topics/{q(topic)}/channels/{q(name)}/daily"))
        }" data-since="{h(days["since"])}" data-until="{h(days["until"])}">
    <p class="muted">The chart needs JavaScript; the table below has the same numbers.</p>
  </div>
</section>
{self._live_chart(self.api(f"/topics/{q(topic)}/channels/{q(name)}/minutes"), f"{topic}/{name}")}
</div>
{self._consumers(data["consumers"])}
<section class="card"><h2>Counters</h2>
<table class="grid"><thead><tr><th></th>{heads}</tr></thead><tbody>
<tr><th>Today</th>{today}</tr>
<tr><th>Since {h(data["window"]["since"])}</th>{window}</tr>
</tbody></table>
<details><summary>Per day</summary>
<table class="grid"><thead><tr><th>Day</th>{heads}</tr></thead><tbody>{day_rows}</tbody></table>
</details></section>"""
        return self.layout(
            f"{topic}/{name}",
            body,
            page="channel",
            crumbs=[(topic, self.topic_url(topic)), (name, self.channel_url(topic, name))],
        )

    @staticmethod
    def _live_chart(api_url: str, what: str, note: str = "") -> str:
        """The "last hour, per minute" chart, redrawn live by admin.js. Its
        counters count deliveries (``Counters``), which the title says."""
        title = f"Deliveries per minute of the last hour, {what}"
        note_html = f'\n  <p class="muted">{h(note)}</p>' if note else ""
        return f"""<section class="card">
  <h2>Last hour <span class="muted">deliveries per minute, {h(what)}</span></h2>
  <div id="live-chart" class="chart" data-minutes="{h(api_url)}" data-title="{h(title)}">
    <p class="muted">The chart needs JavaScript.</p>
  </div>{note_html}
</section>"""

    @staticmethod
    def _consumers(found: list[dict[str, Any]]) -> str:
        """The consumers online of a channel (rows rebuilt live by admin.js)."""
        rows = "".join(
            f'<tr><td>{h(c["host"])}</td><td class="num">{h(c["pid"])}</td>'
            f'<td class="num">{h(c["in_flight"])} / {h(c["max_in_flight"])}</td>'
            f"<td>{when(c['started_at'])}</td><td>{when(c['heartbeat_at'])}</td></tr>"
            for c in found
        )
        return f"""<section class="card"><h2>Consumers online
<span class="muted" data-field="consumer_count">{len(found)}</span></h2>
<table class="grid" id="consumers"><thead><tr><th>Host</th><th class="num">PID</th>
<th class="num">In flight / max</th><th>Started (UTC)</th><th>Last heartbeat (UTC)</th></tr></thead>
<tbody>{rows}</tbody></table>
<p class="muted empty-note"{"" if not found else " hidden"}>No consumer runs on this channel.</p>
</section>"""

    def dead(self, data: dict[str, Any], after_id: int | None) -> str:
        topic, name = data["topic"], data["channel"]
        base = f"/topics/{q(topic)}/channels/{q(name)}/dead"
        rows = []
        for item in data["items"]:
            more = "…" if item.get("body_truncated") else ""
            rows.append(
                f'<tr><td><input type="checkbox" class="pick" value="{item["delivery_id"]}"'
                f' aria-label="select dead letter {item["delivery_id"]}"></td>'
                f"<td>{item['delivery_id']}</td>"
                f'<td><a href="{h(self.url("/messages/" + str(item["message_id"])))}">'
                f"{item['message_id']}</a></td>"
                f'<td class="num">{item["attempts"]}</td>'
                f"<td>{h(item['reason'])}</td>"
                f'<td class="err">{h(item["last_error"] or "")}</td>'
                f'<td><code class="body">{h(item.get("body_preview", ""))}{more}</code>'
                f' <span class="muted">{item["body_len"]} B</span></td>'
                f'<td class="time">{when(item["died_at"])}</td></tr>'
            )
        table = "".join(rows) or '<tr><td colspan="8" class="empty">No dead letters.</td></tr>'
        pager = []
        if after_id is not None:
            pager.append(
                f'<a class="btn" href="{h(self.channel_url(topic, name, "/dead"))}">First page</a>'
            )
        if data["next_after_id"] is not None:
            pager.append(
                f'<a class="btn" href="{h(self.url(base, after_id=data["next_after_id"]))}">'
                "Next page</a>"
            )
        body = f"""
<div class="bar">
  <h1>Dead letters of <code>{h(topic)}</code> / <code>{h(name)}</code></h1>
  <span class="actions">
    {self.button("Requeue selected", base + "/requeue", confirm="Requeue the selected dead letters?", extra=" data-selected")}
    {self.button("Delete selected", base + "/delete", confirm="Delete the selected dead letters for good?", danger=True, extra=" data-selected")}
    {self.button("Requeue all", base + "/requeue", confirm=f"Requeue every dead letter of {topic}/{name}?", payload='{"all":true}')}
    {self.button("Delete all", base + "/delete", confirm=f"Delete every dead letter of {topic}/{name} for good?", payload='{"all":true}', danger=True)}
  </span>
</div>
<table class="grid" id="dead">
<thead><tr><th><input type="checkbox" id="pick-all" aria-label="select all"></th>
<th>Delivery</th><th>Message</th><th class="num">Attempts</th><th>Reason</th>
<th>Last error</th><th>Body</th><th>Died at (UTC)</th></tr></thead>
<tbody>{table}</tbody></table>
<p class="pager">{" ".join(pager)}</p>
{self._redrive_form(topic, name, data["other_channels"])}"""
        return self.layout(
            f"Dead letters {topic}/{name}",
            body,
            page="dead",
            crumbs=[
                (topic, self.topic_url(topic)),
                (name, self.channel_url(topic, name)),
                ("dead letters", self.channel_url(topic, name, "/dead")),
            ],
        )

    def _redrive_form(self, topic: str, name: str, others: list[str]) -> str:
        """Requeue the letters that died first, here or into another channel."""
        options = '<option value="">this channel (requeue here)</option>' + "".join(
            f'<option value="{h(c)}">{h(c)}</option>' for c in others
        )
        api = self.api(f"/topics/{q(topic)}/channels/{q(name)}/dead/requeue")
        return f"""<section class="card"><h2>Redrive</h2>
<form class="inline" data-redrive="{h(api)}" data-topic-name="{h(topic)}" data-channel-name="{h(name)}">
  <label>to <select name="to_channel" aria-label="channel to move the letters to">{options}</select></label>
  <label>at most <input name="limit" type="number" min="1" step="1" placeholder="all" aria-label="at most this many letters"></label>
  <button class="btn" type="submit">Redrive</button>
</form>
<p class="muted">Requeues the letters that died first (all of them without a limit), ready at
once with attempts reset and a fresh TTL. Moved to another channel of the topic, a letter
keeps its delivery id and skips that channel's filter; one whose message the channel already
holds is deleted instead.</p></section>"""

    def messages(self, data: dict[str, Any], query: dict[str, str]) -> str:
        topic = data["topic"]
        rows = []
        for item in data["items"]:
            states = " ".join(
                f'<span class="tag st-{h(d["state"])}" title="{h(d["channel"])}: {h(d["state"])}">'
                f"{h(d['channel'])}: {h(d['state'])}</span>"
                for d in item["deliveries"]
            )
            more = "…" if item["body_truncated"] else ""
            mid = item["id"]
            replay = self.button(
                "Replay",
                f"/messages/{mid}/replay",
                confirm=f"Replay message {mid} to every channel of {topic}?",
            )
            rows.append(
                f'<tr><td><a href="{h(self.url(f"/messages/{mid}"))}">{mid}</a></td>'
                f'<td class="time">{when(item["published_at"])}</td>'
                f'<td><code class="body">{h(item["body_preview"])}{more}</code>'
                f' <span class="muted">{item["body_len"]} B</span></td>'
                f"<td>{states}</td><td>{replay}</td></tr>"
            )
        table = "".join(rows) or '<tr><td colspan="5" class="empty">No messages in range.</td></tr>'
        base = f"/topics/{q(topic)}/messages"
        pager = []
        if query.get("after_id"):
            first = {k: v for k, v in query.items() if k != "after_id"}
            pager.append(f'<a class="btn" href="{h(self.url(base, **first))}">First page</a>')
        if data["next_after_id"] is not None:
            nxt = {**query, "after_id": data["next_after_id"]}
            pager.append(f'<a class="btn" href="{h(self.url(base, **nxt))}">Next page</a>')
        channel_boxes = "".join(
            f'<label><input type="checkbox" name="channel" value="{h(c)}" checked> {h(c)}</label> '
            for c in data["channels"]
        )
        body = f"""
<div class="bar"><h1>Messages of <code>{h(topic)}</code></h1></div>
<form class="inline filters" method="get" action="{h(self.url(base))}">
  <label>since (UTC) <input name="since" type="datetime-local" step="1" value="{h(query.get("since", ""))}"></label>
  <label>until (UTC) <input name="until" type="datetime-local" step="1" value="{h(query.get("until", ""))}"></label>
  <button class="btn" type="submit">Show</button>
</form>
<table class="grid" id="messages">
<thead><tr><th>Id</th><th>Published (UTC)</th><th>Body</th>
<th>Delivery state per channel</th><th></th></tr></thead>
<tbody>{table}</tbody></table>
<p class="pager">{" ".join(pager)}</p>
<section class="card"><h2>Replay a time range</h2>
<form class="stack" data-replay-range="{h(self.api(f"/topics/{q(topic)}/replay"))}">
  <label>since (UTC) <input name="since" type="datetime-local" step="1" required value="{h(query.get("since", ""))}"></label>
  <label>until (UTC, exclusive) <input name="until" type="datetime-local" step="1" required value="{h(query.get("until", ""))}"></label>
  <div>to channels: {channel_boxes or '<span class="muted">none</span>'}</div>
  <button class="btn" type="submit">Replay range</button>
</form></section>"""
        return self.layout(
            f"Messages of {topic}",
            body,
            page="messages",
            crumbs=[
                (topic, self.topic_url(topic)),
                ("messages", self.topic_url(topic, "/messages")),
            ],
        )

    def message(self, data: dict[str, Any]) -> str:
        topic = data["topic"]
        headers = (
            "".join(
                f"<tr><th>{h(k)}</th><td>{h(v)}</td></tr>"
                for k, v in sorted(data["headers"].items())
            )
            or '<tr><td class="empty" colspan="2">none</td></tr>'
        )
        rows = (
            "".join(
                f'<tr><td><label><input type="checkbox" class="pick-channel" value="{h(d["channel"])}">'
                f" {h(d['channel'])}</label></td>"
                f'<td><span class="tag st-{h(d["state"])}">{h(d["state"])}</span></td>'
                f'<td class="num">{h(d.get("attempts") if d.get("attempts") is not None else "")}</td>'
                f'<td class="err">{h(d.get("last_error") or "")}</td>'
                f'<td class="time">{when(d.get("visible_at"))}</td></tr>'
                for d in data["deliveries"]
            )
            or '<tr><td colspan="5" class="empty">The topic has no channels.</td></tr>'
        )
        more = " (preview, truncated)" if data["body_truncated"] else ""
        body = f"""
<div class="bar"><h1>Message {data["id"]} of <code>{h(topic)}</code></h1>
<span class="actions">
  {self.button("Replay to all channels", f"/messages/{data['id']}/replay", confirm=f"Replay message {data['id']} to every channel of {topic}?")}
  {self.button("Replay to selected", f"/messages/{data['id']}/replay", confirm=f"Replay message {data['id']} to the selected channels?", extra=" data-selected-channels")}
  {self.button("Cancel", f"/messages/{data['id']}/cancel", confirm=f"Cancel message {data['id']}: delete its deliveries that were never attempted?", danger=True) if data["cancellable"] else ""}
</span></div>
<section class="card"><table class="kv">
<tr><th>Published (UTC)</th><td class="time">{when(data["published_at"])}</td></tr>
<tr><th>Expires (UTC)</th><td class="time">{when(data["expires_at"])}</td></tr>
<tr><th>Size</th><td>{data["body_len"]} bytes{more}</td></tr></table></section>
<section class="card"><h2>Deliveries</h2>
<table class="grid"><thead><tr><th>Channel</th><th>State</th><th class="num">Attempts</th>
<th>Last error</th><th>Visible at / lease until (UTC)</th></tr></thead><tbody>{rows}</tbody></table>
<p class="muted">"acked" means the channel has no live delivery: it acked the message,
or was created after it was published.</p></section>
<section class="card"><h2>Headers</h2><table class="kv">{headers}</table></section>
<section class="card"><h2>Body</h2><pre class="body">{h(data["body_preview"])}</pre></section>"""
        return self.layout(
            f"Message {data['id']}",
            body,
            page="message",
            crumbs=[
                (topic, self.topic_url(topic)),
                ("messages", self.topic_url(topic, "/messages")),
                (str(data["id"]), self.url(f"/messages/{data['id']}")),
            ],
        )

    def error(self, status: int, message: str) -> str:
        body = f"""<section class="card error"><h1>{status}</h1><p>{h(message)}</p>
<p><a href="{h(self.url("/"))}">Back to the dashboard</a></p></section>"""
        return self.layout(f"Error {status}", body, page="error")


def _setting(value: object, default: object, unit: str, none: str) -> str:
    """A channel setting as the page shows it: its own value, or the client's
    default it falls back to, said so (``30 s (the client's default)``)."""
    if value is None:
        return f"{_value(default, unit, none)} (the client's default)"
    return _value(value, unit, none)


def _rate(limit: dict[str, Any] | None) -> str:
    """A channel's rate limit as the page shows it (``100 per 60 s``)."""
    if limit is None:
        return "no limit"
    return f"{limit['count']} per {_value(limit['period'], ' s', '')}"


def _value(value: object, unit: str, none: str) -> str:
    if value is None:
        return none
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value}{unit}"
