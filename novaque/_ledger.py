"""A consumer's bookkeeping, free of I/O and of any way of waiting.

What a consumer holds: the deliveries claimed and not yet started, those whose
handler runs, the results waiting to be written, and every lease it holds
(with those it learned were lost). The thread runtime (:mod:`novaque.consumer`)
changes a :class:`Ledger` under its lock and does the waiting and the I/O
around it; a runtime of tasks can use the same ledger as it is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import sqlalchemy as sa

from novaque._time import to_us
from novaque.errors import DatabaseUnavailable
from novaque.models import Message

__all__ = ["SETTLE_MAX_FAILURES", "Ledger", "Outcome", "key", "split_failed", "transient"]

#: Failed writes in a row after which a result is given up (its lease lapses).
SETTLE_MAX_FAILURES = 30

Key = tuple[int, str]  # (delivery id, lease token)
#: What a handler's result means (see :func:`novaque._settle.outcome_of`).
Kind = Literal["ack", "retry", "reject", "defer", "snooze"]


def key(msg: Message) -> Key:
    return (msg.delivery_id, msg.lease_token)


@dataclass(slots=True)
class Outcome:
    """A handler's result, waiting to be written."""

    kind: Kind
    msg: Message
    text: str | None = None  # last error (retry) or reason (reject)
    delay: float = 0.0  # retry or snooze delay in seconds
    failures: int = 0  # failed writes in a row


class Ledger:
    """What one consumer holds and owes; every method is quick and does no I/O."""

    def __init__(self) -> None:
        self.work: deque[Message] = deque()  # claimed, not started
        self.running: dict[Key, Message] = {}
        self.results: deque[Outcome] = deque()
        #: Every lease held and not settled or released: a delivery whose lease
        #: was lost may be claimed again by this very consumer while its first
        #: handler runs, hence the token in the key.
        self.held: dict[Key, Message] = {}
        self.lost: set[Key] = set()

    @property
    def busy(self) -> int:
        """Deliveries claimed and not finished (waiting to start or running)."""
        return len(self.work) + len(self.running)

    def claimed(self, msgs: Iterable[Message], *, to_work: bool) -> None:
        """Hold the leases of ``msgs``; queue them for the workers if ``to_work``."""
        for msg in msgs:
            self.held[key(msg)] = msg
            if to_work:
                self.work.append(msg)

    def start_next(self) -> Message | None:
        """The next delivery to handle, now running; None when there is none."""
        if not self.work:
            return None
        msg = self.work.popleft()
        self.running[key(msg)] = msg
        return msg

    def finished(self, outcome: Outcome, *, keep: bool) -> None:
        """A handler returned; its result waits to be written unless not ``keep``."""
        del self.running[key(outcome.msg)]
        if keep:
            self.results.append(outcome)

    def take_unstarted(self) -> list[Message]:
        unstarted = list(self.work)
        self.work.clear()
        return unstarted

    def take_acks(self) -> list[Outcome]:
        """Remove and return the pending acks (they ride with the next claim)."""
        if not self.results:
            return []
        acks = [o for o in self.results if o.kind == "ack"]
        if acks:
            rest = [o for o in self.results if o.kind != "ack"]
            self.results.clear()
            self.results.extend(rest)
        return acks

    def put_back(self, outcomes: list[Outcome]) -> None:
        """Results that could not be written go first in line again."""
        self.results.extendleft(reversed(outcomes))

    def settler_batch(self, *, claiming: bool) -> list[Outcome]:
        """What the settler writes now: all but the acks while claiming goes on
        (they ride with the claims), everything once it stopped."""
        if not claiming:
            batch = list(self.results)
            self.results.clear()
            return batch
        batch = [o for o in self.results if o.kind != "ack"]
        if batch:
            acks = [o for o in self.results if o.kind == "ack"]
            self.results.clear()
            self.results.extend(acks)
        return batch

    def let_go(self, msg: Message) -> None:
        """The lease of ``msg`` is no longer this consumer's (settled, released,
        given up or lost)."""
        self.held.pop(key(msg), None)
        self.lost.discard(key(msg))

    def renewal_due(self, now_us: int, within_us: int) -> list[Message]:
        """Held leases (not known lost) that expire within ``within_us``, or within
        half their own lease when that is shorter (a channel's lease)."""
        return [
            m
            for k, m in self.held.items()
            if k not in self.lost
            and to_us(m.lease_expires_at) - now_us <= min(within_us, m.lease_us // 2 or within_us)
        ]

    def shortest_lease_us(self) -> int | None:
        """The shortest lease (microseconds) among those held, if any is known."""
        return min((m.lease_us for m in self.held.values() if m.lease_us > 0), default=None)

    def mark_lost(self, msg: Message) -> bool:
        """A renewal found the lease gone; False if it was let go meanwhile."""
        if key(msg) not in self.held:
            return False
        self.lost.add(key(msg))
        return True

    def clear(self) -> tuple[int, int]:
        """At the end of a shutdown: forget every lease; how many handlers still
        ran and how many results were left unwritten."""
        left = (len(self.running), len(self.results))
        self.held.clear()
        return left


def transient(exc: BaseException) -> bool:
    """True for errors that writing the same thing again may cure: a lost
    connection, a deadlock, a lock or pool timeout, a busy database. Not data
    the database refuses, nor bugs."""
    if isinstance(exc, DatabaseUnavailable):
        return True
    if isinstance(exc, sa.exc.DBAPIError):
        return exc.connection_invalidated or isinstance(
            exc, (sa.exc.OperationalError, sa.exc.InterfaceError)
        )
    return isinstance(exc, (sa.exc.DisconnectionError, sa.exc.TimeoutError, OSError))


def split_failed(
    outcomes: list[Outcome], exc: BaseException
) -> tuple[list[Outcome], list[Outcome]]:
    """After a failed write of ``outcomes``: (those to try again, those given up).

    A transient error is tried again up to :data:`SETTLE_MAX_FAILURES` times in
    a row; any other one would fail the same way forever.
    """
    retry: list[Outcome] = []
    given_up: list[Outcome] = []
    for outcome in outcomes:
        outcome.failures += 1
        if transient(exc) and outcome.failures < SETTLE_MAX_FAILURES:
            retry.append(outcome)
        else:
            given_up.append(outcome)
    return retry, given_up
