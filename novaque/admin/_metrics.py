"""The admin's ``/metrics`` endpoint: novaque's state in the Prometheus text format.

One custom collector on a private :class:`prometheus_client.CollectorRegistry`
(no global state: two apps on two clients never mix), read afresh at each
scrape:

- ``novaque_backlog{topic,channel,state}``: live deliveries per state
  (``pending``, ``ready``, ``in_flight``, ``deferred``, ``dead``);
- ``novaque_oldest_ready_age_seconds{topic,channel}``: how long the oldest
  ready delivery has waited (0 when none is ready), from
  ``Backlog.oldest_ready_at``;
- ``novaque_today_total{topic,channel,counter}``: today's (UTC) counters, as
  flushed; a counter that starts again from 0 each UTC day (``rate()`` and
  ``increase()`` treat that as a counter reset);
- ``novaque_consumers{topic,channel}``: consumers online (0 for a channel
  nobody consumes, so an alert can fire on it).

A scrape costs one statement per topic for the backlogs, one per channel for
today's counters, and one for the consumers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from novaque.admin import _data
from novaque.client import Client
from novaque.errors import ChannelNotFound, TopicNotFound

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["Metrics"]

STATES = _data.STATES
COUNTERS = _data.COUNTERS


class Metrics:
    """What ``{prefix}/metrics`` answers for ``client``."""

    def __init__(self, client: Client) -> None:
        try:
            from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
        except ImportError:
            raise ImportError(
                "create_app(..., metrics=True) needs prometheus_client: "
                "pip install 'novaque[prometheus]'"
            ) from None
        self.client = client
        self.content_type: str = CONTENT_TYPE_LATEST
        self.registry: CollectorRegistry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(client))

    def render(self) -> bytes:
        """The current metrics, in the Prometheus text format."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _Collector:
    """A custom collector (``collect()``): every metric read at scrape time."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        client = self.client
        backlog = GaugeMetricFamily(
            "novaque_backlog",
            "Live deliveries of a channel, by state.",
            labels=["topic", "channel", "state"],
        )
        age = GaugeMetricFamily(
            "novaque_oldest_ready_age_seconds",
            "How long the oldest ready delivery of a channel has waited (0: none ready).",
            labels=["topic", "channel"],
        )
        today = CounterMetricFamily(
            "novaque_today",
            "Today's (UTC) counters of a channel, as flushed; back to 0 each UTC day.",
            labels=["topic", "channel", "counter"],
        )
        consumers = GaugeMetricFamily(
            "novaque_consumers",
            "Consumers online on a channel (every process).",
            labels=["topic", "channel"],
        )
        at = _data.now(client)
        day = at.date()
        online = Counter((c.topic, c.channel) for c in client.list_consumers())
        seen: set[tuple[str, str]] = set()
        for topic in client.list_topics():
            try:
                backlogs = client.topic_backlog(topic)
            except TopicNotFound:
                continue  # deleted while we were reading
            for channel, found in backlogs.items():
                seen.add((topic, channel))
                for state in STATES:
                    backlog.add_metric([topic, channel, state], getattr(found, state))
                age.add_metric([topic, channel], _data.ready_age(found, at) or 0.0)
                try:
                    counts = client.channel_counters(topic, channel, since=day, until=day)
                except (TopicNotFound, ChannelNotFound):  # deleted meanwhile
                    continue
                for name in COUNTERS:
                    today.add_metric([topic, channel, name], getattr(counts, name))
                consumers.add_metric([topic, channel], online.get((topic, channel), 0))
        for (topic, channel), count in sorted(online.items()):
            if (topic, channel) not in seen:  # consuming a channel that is gone
                consumers.add_metric([topic, channel], count)
        yield backlog
        yield age
        yield today
        yield consumers
