"""Topology: topics and channels (ensure, settings, pause and resume, delete,
list), and the channel ids the hot paths use, cached.

A part of :class:`novaque.Client` (over its :class:`~novaque._context.Context`),
which forwards its topology calls here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from novaque import _validate
from novaque._context import Context
from novaque.models import ChannelSettings
from novaque.ops import topology
from novaque.options import Duration

__all__ = ["CHANNEL_CACHE_S", "Topology"]

#: How long a cached channel id is trusted when claims come back empty.
CHANNEL_CACHE_S = 5.0


class Topology:
    """Topics and channels, over a client's context (see the module docstring)."""

    def __init__(self, context: Context) -> None:
        self._context = context
        #: Channel ids by (topic, channel), with when each was read.
        self._channel_cache: dict[tuple[str, str], tuple[int, float]] = {}

    def forget_all(self) -> None:
        """Drop the channel ids cached (the schema was downgraded)."""
        self._channel_cache.clear()

    def channel_id(self, topic: str, channel: str) -> int:
        """A channel's id for the hot path, cached (see :data:`CHANNEL_CACHE_S`)."""
        cached = self._channel_cache.get((topic, channel))
        if cached is not None:
            return cached[0]
        self._context.ready()
        with self._context.executor.connect() as conn:
            channel_id = topology.channel_id(conn, self._context.dialect, topic, channel)
        self._channel_cache[(topic, channel)] = (channel_id, time.monotonic())
        return channel_id

    def channel_maybe_gone(self, topic: str, channel: str) -> None:
        """An empty claim: distrust a cached channel id that has not been checked lately."""
        cached = self._channel_cache.get((topic, channel))
        if cached is not None and time.monotonic() - cached[1] > CHANNEL_CACHE_S:
            del self._channel_cache[(topic, channel)]

    def ensure_topic(self, topic: str) -> None:
        """Create ``topic`` if it does not exist."""
        _validate.name(topic, "topic")
        self._context.run_timed("", topology.ensure_topic, topic)

    def ensure_channel(
        self,
        topic: str,
        channel: str,
        *,
        ordering: str | None = None,
        filter: str | None = None,
        lease: Duration | None = None,
        max_attempts: int | None = None,
        dead_max_age: Duration | None = None,
        dead_max_count: int | None = None,
        dead_max_bytes: int | None = None,
        dead_letter_expired: bool | None = None,
        max_leased: int | None = None,
        rate_limit: tuple[int, Duration] | None = None,
        group_max_leased: int | None = None,
        reset: Iterable[str] = (),
    ) -> None:
        """Create ``channel`` on ``topic`` (and the topic) if missing, with settings.

        A new channel receives messages published from now on and takes the
        settings given (the others: ``"standard"`` ordering and the client's
        ``Options``). For an existing channel each setting given replaces the
        stored one and the others keep theirs; ``reset`` names settings to
        return to the client's defaults.

        - ``ordering``: ``"standard"``, ``"group_fifo"`` or ``"strict_fifo"``;
        - ``filter``: a boolean CEL expression over ``headers``, ``group`` and
          ``topic`` that a message must satisfy to be delivered to the channel
          (``""`` removes it); compiled and checked here (its types, its
          depth, and its cost: at most 20,000 evaluation steps), raising
          :class:`~novaque.InvalidFilter` (and storing nothing) for a bad one;
        - ``lease``: of claims and consumers on the channel that name none;
        - ``max_attempts``: the budget of every delivery created in the channel
          from then on, whatever the publish said;
        - ``dead_max_age``, ``dead_max_count``, ``dead_max_bytes`` (total body
          bytes): bounds of its dead letters, the oldest died going first;
        - ``dead_letter_expired``: whether a delivery still live when its
          message's TTL passes becomes a dead letter (reason ``"expired"``)
          instead of being purged;
        - ``max_leased``: most deliveries of the channel leased at once,
          across every process and host (an int >= 1);
        - ``rate_limit``: ``(count, period)``, most deliveries handed out in
          each window of ``period`` (1 s to 1 day) aligned to the Unix epoch,
          across every process and host (count an int >= 1);
        - ``group_max_leased``: most deliveries of one group leased at once
          (an int >= 1; standard channels only); deliveries without a group
          are not limited.

        A limit given as ``None`` is not given (the stored one stays);
        ``reset`` removes it. Settings committed here hold for every claim and publish that starts
        afterwards, in every process.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        settings = _validate.channel_settings(
            reset,
            ordering=ordering,
            filter=filter,
            lease=lease,
            max_attempts=max_attempts,
            dead_max_age=dead_max_age,
            dead_max_count=dead_max_count,
            dead_max_bytes=dead_max_bytes,
            dead_letter_expired=dead_letter_expired,
            max_leased=max_leased,
            rate_limit=rate_limit,
            group_max_leased=group_max_leased,
        )
        self._context.run_timed("", topology.ensure_channel, topic, channel, settings)
        self._context.limits.changed()

    def channel_settings(self, topic: str, channel: str) -> ChannelSettings:
        """The stored settings of a channel (see :meth:`ensure_channel`)."""
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        return self._context.run_op("", topology.channel_settings, topic, channel)

    def pause_channel(self, topic: str, channel: str) -> None:
        """Stop handing out the channel's deliveries, in every process.

        A paused channel still receives deliveries, and leases already held
        can still be settled and renewed, but no claim or consumer gets
        anything from it until :meth:`resume_channel`.
        """
        self._set_paused(topic, channel, True)

    def resume_channel(self, topic: str, channel: str) -> None:
        """Hand out the channel's deliveries again; its consumers pick up within
        a poll interval (at once on PostgreSQL, through NOTIFY)."""
        self._set_paused(topic, channel, False)

    def _set_paused(self, topic: str, channel: str, paused: bool) -> None:
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        self._context.apply(self._context.run_op("", topology.set_paused, topic, channel, paused))
        self._context.log.info(
            "%s channel %s/%s", "paused" if paused else "resumed", topic, channel
        )

    def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` with its channels, messages, deliveries and counters."""
        _validate.name(topic, "topic")
        self._context.run_op("", topology.delete_topic, topic)
        self._forget(topic)
        self._context.log.info("deleted topic %s", topic)

    def delete_channel(self, topic: str, channel: str) -> None:
        """Delete a channel with its deliveries and counters; messages stay."""
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        self._context.run_op("", topology.delete_channel, topic, channel)
        self._forget(topic, channel)
        self._context.log.info("deleted channel %s/%s", topic, channel)

    def _forget(self, topic: str, channel: str | None = None) -> None:
        if channel is None:
            self._context.topic_ids.pop(topic, None)
        for key in [k for k in self._channel_cache if k[0] == topic and channel in (None, k[1])]:
            self._channel_cache.pop(key, None)

    def list_topics(self) -> list[str]:
        """Every topic's name, sorted."""
        return self._context.run_op("", topology.list_topics)

    def list_channels(self, topic: str) -> list[str]:
        """The channel names of ``topic``, sorted; :class:`~novaque.TopicNotFound` if missing."""
        _validate.name(topic, "topic")
        return self._context.run_op("", topology.list_channels, topic)

    def channels_under(self, prefix: str) -> dict[str, list[str]]:
        """Every topic whose name starts with ``prefix``, sorted, each with its
        channels' names, sorted (the kombu transport's topics and queues)."""
        return self._context.run_op("", topology.channels_under, prefix)
