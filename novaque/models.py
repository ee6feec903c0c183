"""Result types returned by the client. All datetimes are aware UTC."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

__all__ = [
    "Backlog",
    "ChannelSettings",
    "ConsumerInfo",
    "Counters",
    "DeadLetter",
    "DeliveryInfo",
    "DeliveryState",
    "Message",
    "MessageInfo",
    "ScheduleInfo",
]

DeliveryState = Literal["pending", "ready", "in_flight", "deferred", "dead"]
Ordering = Literal["standard", "group_fifo", "strict_fifo"]


@dataclass(slots=True)
class Message:
    """One delivery of a message to a channel, as a handler or ``claim`` sees it.

    ``attempts`` counts this attempt too. ``lease_token`` fences the lease: ack,
    requeue, renew and reject succeed only while it is current. ``renew``
    updates ``lease_expires_at`` in place.
    """

    #: The message's id, as ``publish`` returned it (the same in every channel).
    id: int
    #: The topic it was published to.
    topic: str
    #: The channel this delivery belongs to.
    channel: str
    #: The body, as published (a ``str`` body is stored encoded UTF-8).
    body: bytes
    #: The headers given at publish (``{}`` when none).
    headers: dict[str, str]
    #: Attempts made on this delivery, this one included (1 on the first).
    attempts: int
    #: Attempts allowed before the delivery is dead-lettered.
    max_attempts: int
    #: When the message was published (aware UTC).
    published_at: datetime
    #: The delivery's id in its channel: what dead letters, ``defer`` and
    #: ``claim_deferred`` name it by.
    delivery_id: int
    #: The token of this lease; a settle with a token no longer current raises
    #: :class:`~novaque.LeaseLost`.
    lease_token: str
    #: When the lease runs out (aware UTC), unless renewed.
    lease_expires_at: datetime
    #: The ordering key given at publish (None when none).
    group: str | None = None
    #: The priority given at publish (lower runs first; 0 by default).
    priority: int = 0
    channel_id: int = field(default=0, repr=False, compare=False)
    #: The lease the claim took (microseconds), and the channel's own lease
    #: setting as the claim read it (None: none), which ``renew`` extends by.
    lease_us: int = field(default=0, repr=False, compare=False)
    channel_lease_us: int | None = field(default=None, repr=False, compare=False)
    #: The delivery's key in its channel's ordering (None: its group, if any,
    #: waits on nothing): settling it may hand its group's next delivery out.
    order_key: str | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class Counters:
    """Delivery counters of a channel (or the sum over a topic's channels).

    ``published`` counts deliveries created (fan-out, replay, a dead letter
    moved in); ``purged`` counts deliveries removed without an ack (TTL purge,
    dead-letter retention, ``delete_dead``, ``cancel``, ``prune``, a dead
    letter moved out).
    """

    published: int = 0
    claimed: int = 0
    acked: int = 0
    requeued: int = 0
    dead: int = 0
    purged: int = 0

    def __add__(self, other: Counters) -> Counters:
        return Counters(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))


def _values(c: Counters) -> tuple[int, int, int, int, int, int]:
    return (c.published, c.claimed, c.acked, c.requeued, c.dead, c.purged)


@dataclass(frozen=True, slots=True)
class Backlog:
    """Live deliveries of a channel by state.

    ``pending``: not yet due (delay or backoff); ``ready``: due and not leased;
    ``in_flight``: leased (an expired lease not yet reaped included);
    ``deferred``: set aside by ``defer``, fetched by ``claim_deferred``;
    ``dead``. ``oldest_ready_at``: the earliest due time among the ready ones
    (aware UTC; None when none is ready), how long the oldest has waited.
    Backlogs add up with ``+`` (e.g. over the channels of a topic), keeping
    the earliest ``oldest_ready_at``; ``==`` compares the counts.
    """

    pending: int = 0
    ready: int = 0
    in_flight: int = 0
    dead: int = 0
    deferred: int = 0
    oldest_ready_at: datetime | None = field(default=None, compare=False)

    def __add__(self, other: Backlog) -> Backlog:
        oldest = [t for t in (self.oldest_ready_at, other.oldest_ready_at) if t is not None]
        return Backlog(
            self.pending + other.pending,
            self.ready + other.ready,
            self.in_flight + other.in_flight,
            self.dead + other.dead,
            self.deferred + other.deferred,
            min(oldest) if oldest else None,
        )

    @property
    def total(self) -> int:
        """Every live delivery, whatever its state."""
        return self.pending + self.ready + self.in_flight + self.deferred + self.dead


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead delivery, addressed by ``delivery_id``."""

    delivery_id: int
    message_id: int
    attempts: int
    reason: str
    last_error: str | None
    body_len: int
    published_at: datetime
    died_at: datetime
    body: bytes | None = None


@dataclass(frozen=True, slots=True)
class DeliveryInfo:
    """The state of one live delivery of a message (see :class:`MessageInfo`)."""

    channel: str
    state: DeliveryState
    attempts: int
    last_error: str | None
    visible_at: datetime | None


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """A stored message and its live deliveries.

    A channel of the topic that is missing from ``deliveries`` has acked the
    message (or did not exist when it was published).
    """

    id: int
    topic: str
    body: bytes
    headers: dict[str, str]
    published_at: datetime
    expires_at: datetime
    deliveries: list[DeliveryInfo]
    #: The ordering key given at publish (None when none).
    group: str | None = None
    #: The priority given at publish (lower runs first).
    priority: int = 0


@dataclass(frozen=True, slots=True)
class ChannelSettings:
    """A channel's settings (see ``Client.ensure_channel``); ``None``: the
    client's default (``Options``), or for a limit: no limit.

    ``max_leased``: most deliveries of the channel leased at once;
    ``rate_limit``: ``(count, period)``, most deliveries handed out in each
    window of ``period`` (aligned to the Unix epoch); ``group_max_leased``:
    most deliveries of one group leased at once."""

    ordering: Ordering
    filter: str | None
    lease: timedelta | None
    max_attempts: int | None
    dead_max_age: timedelta | None
    dead_max_count: int | None
    dead_max_bytes: int | None
    dead_letter_expired: bool | None
    paused: bool
    max_leased: int | None = None
    rate_limit: tuple[int, timedelta] | None = None
    group_max_leased: int | None = None


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """A running consumer, as :meth:`novaque.Client.list_consumers` lists it.

    ``host`` and ``pid`` name its process; ``max_in_flight`` is its number of
    workers and ``in_flight`` the deliveries it held at its last heartbeat
    (every ``Options.consumer_heartbeat``); ``started_at`` and
    ``heartbeat_at`` are by the clock of its client. A consumer whose process
    died stays listed until maintenance drops it, three heartbeats after its
    last one.
    """

    host: str
    pid: int
    topic: str
    channel: str
    max_in_flight: int
    in_flight: int
    started_at: datetime
    heartbeat_at: datetime


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule (a recurring publish), as :meth:`novaque.Client.schedule`,
    :meth:`~novaque.Client.get_schedule` and :meth:`~novaque.Client.list_schedules`
    return it.

    Exactly one of ``cron`` (a five-field expression, evaluated in the IANA
    ``timezone``) and ``every`` (a period, fired on a fixed grid from the time
    the schedule was defined) is set. ``next_fire_at`` is the scheduled time of
    its next fire, ``last_fire_at`` that of the last fire published (None
    before the first). ``catch_up`` says which missed fires are published
    (``"latest"``, ``"none"`` or ``"all"``). ``priority`` is each fire's
    message's.
    """

    name: str
    topic: str
    cron: str | None
    every: timedelta | None
    timezone: str
    next_fire_at: datetime
    last_fire_at: datetime | None
    paused: bool
    catch_up: Literal["latest", "none", "all"]
    priority: int = 0
