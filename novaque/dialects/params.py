"""What the hot operations take: one frozen parameters object per operation,
and :class:`Driver`, the link a dialect runs an operation on when it runs it
in the driver's own SQL.

A dialect's hot method (``claim``, ``ack_and_claim``, ``publish_plain``) is
called with a *link*: a SQLAlchemy ``Connection`` (in novaque's transaction
or the caller's: SQLAlchemy Core runs it) or a :class:`Driver` (a pooled DBAPI
connection on which the dialect runs the whole transaction itself). The
executor decides which it hands out (:meth:`novaque._executor.SyncExecutor.run`,
``op=``), from the operations the dialect writes for the driver
(:meth:`~novaque.dialects.Dialect.driver_ops`); the operation's code in
:mod:`novaque.ops` is the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa


@dataclass(frozen=True, slots=True)
class Driver:
    """A pooled DBAPI connection (PEP 249) of novaque's engine, on which a
    dialect runs one operation as a whole transaction of its own, in the
    driver's SQL, leaving the connection as it found it (no transaction open,
    autocommit as it was)."""

    dbapi: Any


#: Where a hot operation runs: SQLAlchemy's connection or the driver's.
Link = sa.Connection | Driver


@dataclass(frozen=True, slots=True)
class ClaimParams:
    """A claim: lease up to ``limit`` due deliveries of the channel with
    ``token`` for ``lease_us`` from ``now`` (with ``channel_lease``, for the
    channel's own lease where it has one), storing ``attempt_id`` with each
    lease. Made once per call; :meth:`at` gives each attempt its time."""

    channel_id: int
    limit: int
    lease_us: int
    token: str
    channel_lease: bool = False
    attempt_id: str | None = None
    now: int = 0
    #: The caller holds the channel's row and asks for what fits its limits
    #: (see :mod:`novaque.ops.limits`); any other claim takes nothing from a
    #: channel with a limit.
    held: bool = False
    #: Where the claim starts reading the channel's due deliveries: none due
    #: before this (epoch microseconds) is taken; None: from the first. The
    #: database takes it only for a channel of one lane and standard
    #: ordering, and reads others from the first (see
    #: :mod:`novaque._claim_cursors`).
    since: int | None = None

    @property
    def until(self) -> int:
        """The lease's expiry (unless the channel's own lease replaces it)."""
        return self.now + self.lease_us

    def at(self, now: int) -> ClaimParams:
        """This claim, made at ``now`` (built field by field: ``dataclasses.replace``
        costs twice as much, once a claim)."""
        return ClaimParams(
            self.channel_id,
            self.limit,
            self.lease_us,
            self.token,
            self.channel_lease,
            self.attempt_id,
            now,
            self.held,
            self.since,
        )

    def bind(self) -> dict[str, Any]:
        """The claim statements' bound parameters."""
        return {
            "p_channel": self.channel_id,
            "p_now": self.now,
            "p_limit": self.limit,
            "p_until": self.now + self.lease_us,
            "p_token": self.token,
            "p_channel_lease": int(self.channel_lease),
            "p_attempt_id": self.attempt_id,
            "p_held": int(self.held),
            "p_from": self.since,
        }


@dataclass(frozen=True, slots=True)
class AckClaimParams:
    """An ack of ``pairs`` ((delivery id, lease token), each deleted if still
    leased with its token) and a claim, in one transaction. ``ordered``: some
    of the acked deliveries head a group, which moves on before the claim
    looks."""

    pairs: Sequence[tuple[int, str]]
    claim: ClaimParams
    ordered: bool = False


@dataclass(frozen=True, slots=True)
class PublishParams:
    """Messages of one topic (``fields``: ``topic_id``, ``headers``,
    ``published_at``, ``expires_at``, ``max_attempts``) and their deliveries
    to its plain channels, due at ``visible``.

    ``routed=False``: the caller expects no routed channel and lets the
    dialect write the publish as one statement outside a transaction; one that
    does so writes nothing when the topic has some. ``plan``: what the last
    publish to the topic learned of its channels (:attr:`Plain.plan`)."""

    topic: str
    fields: dict[str, Any]
    bodies: Sequence[bytes]
    visible: int
    groups: Sequence[str | None] | None = None
    routed: bool = True
    plan: str | None = None


@dataclass(frozen=True, slots=True)
class Plain:
    """What a plain publish wrote: the message ids in order (none if the
    topic has routed channels and the publish declined), the deliveries per
    channel, whether the topic has routed channels, and the topic's plan for
    the next publish (None: no plan; see :meth:`Dialect.publish_plain`)."""

    ids: list[int]
    counts: dict[int, int]
    routed: bool
    plan: str | None = None
