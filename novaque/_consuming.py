"""Claiming and settling deliveries, the low-level consuming calls: claim
(with its long poll), pop, claim of deferred deliveries, ack and ack-and-claim,
requeue and snooze, reject, defer, renew, release.

A part of :class:`novaque.Client` (over its :class:`~novaque._context.Context`),
which forwards these calls here; it is also what a
:class:`~novaque.consumer.Consumer` goes through (it is a
:class:`~novaque.consumer.ConsumerHost`), and what writes a handler's result
(a :class:`~novaque._settle.Settler`).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import sqlalchemy as sa

from novaque import _validate, dialects
from novaque._channel_limits import Hold
from novaque._context import Context
from novaque._time import US, from_us
from novaque.dialects.params import ClaimParams
from novaque.errors import InvalidOption, LeaseLost
from novaque.models import Message
from novaque.ops import Effects, consume, limits
from novaque.options import Duration, check_int, microseconds

__all__ = ["MAX_CLAIM", "ChannelIds", "Consuming", "LongPoll"]

T = TypeVar("T")
P = ParamSpec("P")

#: How a long poll waits: ``(topic, channel, fetch, wait_s)`` → what ``fetch`` found.
LongPoll = Callable[[str, str, Callable[[], list[Message]], float], list[Message]]

#: Most deliveries one claim leases.
MAX_CLAIM = 1000


class ChannelIds(Protocol):
    """Where the ids of channels come from (the client's topology, which caches them)."""

    def channel_id(self, topic: str, channel: str) -> int: ...

    def channel_maybe_gone(self, topic: str, channel: str) -> None: ...


class Consuming:
    """Claiming and settling, over a client's context (see the module docstring)."""

    def __init__(self, context: Context, channels: ChannelIds) -> None:
        self._context = context
        self._channels = channels
        #: What a consumer logs with, and how it runs its loops and waits.
        self.log = context.log
        self.waits = context.waits
        #: How ``claim(wait=)`` and ``pop(wait=)`` wait (set_long_poll).
        self._long_poller: LongPoll | None = None

    def now(self) -> int:
        """The client's clock, in epoch microseconds."""
        return self._context.now()

    def channel_id(self, topic: str, channel: str) -> int:
        """A channel's id for the hot path (cached by the topology)."""
        return self._channels.channel_id(topic, channel)

    def claim(
        self,
        topic: str,
        channel: str,
        *,
        max_messages: int = 1,
        lease: Duration | None = None,
        wait: Duration | None = None,
        attempt_id: str | None = None,
    ) -> list[Message]:
        """Lease up to ``max_messages`` due deliveries of a channel, oldest first.

        Returns ``[]`` when nothing is due. Each delivery's attempt counter goes
        up by one. Settle each message with :meth:`ack`, :meth:`requeue`,
        :meth:`snooze`, :meth:`defer` or :meth:`reject` before ``lease`` runs
        out (or :meth:`renew` it); an expired lease makes the delivery
        claimable again.

        ``wait`` (0 < wait <= 300 s): when nothing is due, wait up to that long
        (real time) for a delivery instead of returning ``[]`` at once; a
        publish in this process or a PostgreSQL ``NOTIFY`` wakes the wait,
        else it polls every ``Options.poll_interval``. No connection is held
        while it waits.

        ``attempt_id`` (1-200 characters) makes the claim idempotent: a claim
        that repeats it on the channel while deliveries are leased under it
        (and their leases have not expired) returns those deliveries, with
        the same tokens and attempt counts, and claims nothing new, even on a
        paused channel; once none is leased under it, it claims afresh.

        A channel's limits (``max_leased``, ``rate_limit``,
        ``group_max_leased``: see :meth:`ensure_channel`) hold across every
        process: a claim gets what fits, possibly nothing.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        check_int(max_messages, "max_messages", 1, MAX_CLAIM)
        lease_s = _validate.lease(lease, self._context.default_lease)
        wait_s = _validate.wait(wait)
        attempt = _validate.attempt_id(attempt_id)

        def fetch() -> list[Message]:
            return self.claim_batch(
                topic,
                channel,
                self._channels.channel_id(topic, channel),
                max_messages,
                lease_s,
                lease is None,
                attempt,
            )

        return fetch() if wait_s is None else self._long_poll(topic, channel, fetch, wait_s)

    def claim_batch(
        self,
        topic: str,
        channel: str,
        channel_id: int,
        limit: int,
        lease_s: float,
        channel_lease: bool = False,
        attempt_id: str | None = None,
    ) -> list[Message]:
        """Claim with ``lease_s``; with ``channel_lease`` the channel's own lease,
        when it has one, replaces it (``attempt_id``: see :meth:`claim`)."""
        token = secrets.token_hex(16)
        claim = ClaimParams(
            channel_id, limit, microseconds(lease_s), token, channel_lease, attempt_id
        )
        if self._context.limits.limited(channel_id):
            return self._claim_limited(topic, channel, claim)
        if attempt_id is not None:
            rows, now, effects = self._context.run_timed("", consume.claim, claim)
        else:
            claim = self._from_cursor(claim)
            rows, now, effects = self._context.run_timed("claim", consume.claim, claim)
            self._context.cursors.claimed(channel_id, claim.since, now, limit, rows)
        if not rows and self._limited_now(channel_id):
            self._context.apply(effects)
            return self._claim_limited(topic, channel, claim)
        return self._handed_out(topic, channel, channel_id, token, rows, now, effects)

    def _from_cursor(self, claim: ClaimParams) -> ClaimParams:
        """``claim``, starting where this client's claim cursor of its channel
        says (see :mod:`novaque._claim_cursors`)."""
        since = self._context.cursors.start(claim.channel_id, self._context.now())
        return dataclasses.replace(claim, since=since) if since is not None else claim

    # -- channels with limits (see novaque._channel_limits) ---------------------------

    def _limited_now(self, channel_id: int) -> bool:
        """After an empty claim of a channel seen without limits: whether it has
        some now (read again once :data:`~novaque._channel_limits.LOOK_AGAIN_S`
        passed since it was last read)."""
        known = self._context.limits
        if not known.look_again(channel_id):
            return False
        found = self._context.run_op("", limits.is_limited, channel_id)
        known.seen(channel_id, found)
        return found

    def _claim_limited(self, topic: str, channel: str, claim: ClaimParams) -> list[Message]:
        """:meth:`claim_batch` of a channel with limits (:func:`novaque.ops.limits.claim`)."""
        rows, now, effects, seen = self._context.run_timed("", limits.claim, claim)
        self._context.limits.seen(claim.channel_id, seen.limited, seen.hold)
        return self._handed_out(topic, channel, claim.channel_id, claim.token, rows, now, effects)

    def held_back(self, channel_id: int, since: float) -> Hold | None:
        """What held this client's claims of the channel back since ``since``
        (``time.monotonic()``), if a limit did (for a consumer's wait)."""
        return self._context.limits.held_back(channel_id, since)

    def wait_for_room(self, channel_id: int, waker: Callable[[], None]) -> None:
        """Call ``waker`` once when this client settles a delivery of the channel."""
        self._context.limits.wait_for_room(channel_id, waker)

    def _freed(self, msgs: Sequence[Message], lost: Sequence[Message] = ()) -> None:
        """``msgs`` were settled (but ``lost``): wake consumers of this client that
        a limit of their channel holds back."""
        known = self._context.limits
        if not known.waiting:
            return
        gone = {id(msg) for msg in lost}
        for channel_id, count in Counter(
            msg.channel_id for msg in msgs if id(msg) not in gone
        ).items():
            known.freed(channel_id, count)

    def _hand_out(
        self,
        topic: str,
        channel: str,
        channel_id: int,
        token: str,
        op: str,
        fn: Callable[
            Concatenate[sa.Connection, dialects.Dialect, int, int, P],
            tuple[list[dialects.ClaimedRow], int, Effects],
        ],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> list[Message]:
        """Run the operation ``fn`` that hands deliveries of the channel out (its
        rows, its time, its effects; ``op``: as for :meth:`Context.run`): their
        messages, leased with ``token``."""
        rows, now, effects = self._context.run_timed(op, fn, channel_id, *args, **kwargs)
        return self._handed_out(topic, channel, channel_id, token, rows, now, effects)

    def _handed_out(
        self,
        topic: str,
        channel: str,
        channel_id: int,
        token: str,
        rows: list[dialects.ClaimedRow],
        now: int,
        effects: Effects,
    ) -> list[Message]:
        """After an operation handed ``rows`` out at ``now``: their messages."""
        self._context.apply(effects)
        if not rows:
            self._channels.channel_maybe_gone(topic, channel)
            return []
        return consume.messages_of(rows, topic, channel, channel_id, token, now)

    def _long_poll(
        self, topic: str, channel: str, fetch: Callable[[], list[Message]], wait_s: float
    ) -> list[Message]:
        """Call ``fetch`` (of ``topic``/``channel``) until it returns something, or
        return ``[]`` once ``wait_s`` seconds of real time have passed (the
        wait is the runtime's: :meth:`set_long_poll`)."""
        if self._long_poller is None:
            raise RuntimeError("this client has no runtime to wait with")
        return self._long_poller(topic, channel, fetch, wait_s)

    def set_long_poll(self, long_poll: LongPoll) -> None:
        """Wait with ``long_poll`` in ``claim(wait=)`` and ``pop(wait=)``."""
        self._long_poller = long_poll

    def pop(
        self,
        topic: str,
        channel: str,
        *,
        max_messages: int = 1,
        wait: Duration | None = None,
    ) -> list[Message]:
        """Receive-and-delete: take up to ``max_messages`` due deliveries of a
        channel, oldest first, and delete them in the same transaction.

        At-most-once: a message popped is gone from the channel even if the
        caller then fails. Counted ``claimed`` and ``acked``; each message's
        ``attempts`` counts this one. The messages carry no lease
        (``lease_token == ""``): settling one raises :class:`~novaque.LeaseLost`.
        Ordering applies (a popped head lets its group's next delivery go, as
        an ack does), and a paused channel gives ``[]``. On a channel with
        ``max_leased`` it takes at most the limit minus what is leased now,
        and a ``rate_limit`` counts it. ``wait``: as for :meth:`claim`.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        check_int(max_messages, "max_messages", 1, MAX_CLAIM)
        wait_s = _validate.wait(wait)

        def fetch() -> list[Message]:
            channel_id = self._channels.channel_id(topic, channel)
            if not self._context.limits.limited(channel_id):
                got = self._hand_out(topic, channel, channel_id, "", "", consume.pop, max_messages)
                if got or not self._limited_now(channel_id):
                    return got
            rows, now, effects, seen = self._context.run_timed(
                "", limits.pop, channel_id, max_messages
            )
            self._context.limits.seen(channel_id, seen.limited, seen.hold)
            return self._handed_out(topic, channel, channel_id, "", rows, now, effects)

        return fetch() if wait_s is None else self._long_poll(topic, channel, fetch, wait_s)

    def claim_deferred(
        self,
        topic: str,
        channel: str,
        delivery_ids: Iterable[int],
        *,
        lease: Duration | None = None,
    ) -> list[Message]:
        """Lease the deferred deliveries of a channel named by ``delivery_ids``
        (``Message.delivery_id`` of each message given to :meth:`defer`).

        As :meth:`claim` does: each attempt counted, the lease ``lease`` (the
        channel's own when None, else ``Options.default_lease``), the
        messages in delivery-id order. Ids that are not deferred deliveries
        of this channel are ignored (at most 1000 ids per call), and a paused
        channel gives ``[]``. On an ordered channel a deferred delivery is
        leased only when nothing of its group is leased and no delivery of
        the group with a lower delivery id waits; it then heads its group
        again (the later ones wait for it). Otherwise it stays deferred. One
        whose attempts are all spent (it was deferred on its last attempt)
        becomes a dead letter instead, with reason ``max_attempts`` (counted
        ``dead``): ``requeue_dead`` gives it fresh attempts. A channel's
        limits hold: only what fits is leased, the rest stays deferred.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        ids = _validate.ids(delivery_ids, "delivery_ids")
        if len(ids) > MAX_CLAIM:
            raise InvalidOption(
                f"delivery_ids has {len(ids)} ids; at most {MAX_CLAIM} are claimed at once"
            )
        lease_s = _validate.lease(lease, self._context.default_lease)
        channel_id = self._channels.channel_id(topic, channel)
        if not ids:
            return []
        token = secrets.token_hex(16)
        return self._hand_out(
            topic,
            channel,
            channel_id,
            token,
            "",
            consume.claim_deferred,
            ids,
            microseconds(lease_s),
            token,
            lease is None,
        )

    def leased(self, topic: str, channel: str, pairs: Sequence[tuple[int, str]]) -> list[Message]:
        """The deliveries named by ``pairs`` (``(delivery_id, lease_token)``)
        leased on the channel with that token now, as messages to settle (no
        body or headers): what settles a delivery known only by its id and token
        (the network broker's clients). Pairs not leased so are left out."""
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        channel_id = self._channels.channel_id(topic, channel)
        if not pairs:
            return []
        rows = self._context.run_op("", consume.leased, channel_id, pairs)
        return consume.messages_of(rows, topic, channel, channel_id, "", self.now())

    def ack_named(self, topic: str, channel: str, pairs: Sequence[tuple[int, str]]) -> set[int]:
        """Ack the deliveries named by ``pairs`` (``(delivery_id, lease_token)``)
        that are leased on the channel with that token, in one transaction
        (what :meth:`leased` then :meth:`ack_many` do in two): the ids acked;
        the others' leases were lost."""
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        channel_id = self._channels.channel_id(topic, channel)
        if not pairs:
            return set()
        acked, effects = self._context.run_timed("", consume.ack_named, channel_id, pairs)
        self._context.apply(effects)
        known = self._context.limits
        if acked and known.waiting:
            known.freed(channel_id, len(acked))
        return acked

    def ack_and_claim(
        self,
        acks: Sequence[Message],
        topic: str,
        channel: str,
        channel_id: int,
        limit: int,
        lease_s: float,
        channel_lease: bool = False,
    ) -> tuple[list[Message], list[Message]]:
        """Ack ``acks`` and lease up to ``limit`` more deliveries in one transaction.

        What a consumer does between two batches: one commit (one round trip
        on PostgreSQL) instead of two. Returns the acks whose lease was lost
        (as :meth:`ack_many`) and the messages claimed (as :meth:`claim`).
        Ordered acks move their groups on first, so the claim may take their
        next deliveries; on PostgreSQL's driver path the two statements go in
        one pipeline, still one round trip and one commit.
        """
        if not acks:
            if not limit:
                return [], []
            return [], self.claim_batch(topic, channel, channel_id, limit, lease_s, channel_lease)
        if limit <= 0:
            return self.ack_many(acks), []
        token = secrets.token_hex(16)
        claim = ClaimParams(channel_id, limit, microseconds(lease_s), token, channel_lease)
        known = self._context.limits
        if known.limited(channel_id):
            lost, (rows, now, effects, seen) = self._context.run_timed(
                "", limits.ack_and_claim, acks, claim
            )
            known.seen(channel_id, seen.limited, seen.hold)
            known.freed(channel_id, len(acks) - len(lost) - len(rows))
        else:
            op = "ack_ordered_claim" if consume.ordered(acks) else "ack_claim"
            claim = self._from_cursor(claim)
            lost, rows, now, effects = self._context.run_timed(
                op, consume.ack_and_claim, acks, claim
            )
            self._context.cursors.claimed(channel_id, claim.since, now, limit, rows)
            if not rows and self._limited_now(channel_id):
                self._context.apply(effects)
                return lost, self._claim_limited(topic, channel, claim)
        self._context.apply(effects)
        if not rows:
            self._channels.channel_maybe_gone(topic, channel)
            return lost, []
        return lost, consume.messages_of(rows, topic, channel, channel_id, token, now)

    def ack(self, msg: Message) -> None:
        """Settle ``msg`` as done: its delivery is deleted (the message stays until TTL).

        Raises :class:`~novaque.LeaseLost` if the lease is no longer current.
        """
        if self.ack_many([msg]):
            raise LeaseLost(_lost_text(msg))

    def ack_many(self, msgs: Sequence[Message]) -> list[Message]:
        """Ack many messages in one transaction; return those whose lease was lost."""
        if not msgs:
            return []
        op = "ack_ordered" if consume.ordered(msgs) else "ack"
        lost, effects = self._context.run_timed(op, consume.ack, msgs)
        self._context.apply(effects)
        self._freed(msgs, lost)
        return lost

    def requeue(
        self,
        msg: Message,
        *,
        delay: Duration | None = None,
        error: str | BaseException | None = None,
    ) -> None:
        """Give ``msg`` back for another attempt after ``delay``.

        ``delay=None`` applies the client's backoff policy; ``delay=0`` retries
        at once. ``error`` (text or exception) is kept as the delivery's last
        error (at most 4000 characters; NUL and lone surrogates replaced by
        U+FFFD). After the last allowed attempt the delivery becomes dead at
        once (reason ``max_attempts``). Raises :class:`~novaque.LeaseLost` if the lease
        is no longer current.

        A positive ``delay`` that would make the retry due only at or after
        the message's expiry (its TTL) raises :class:`~novaque.InvalidOption` and
        changes nothing: the message would be purged before the retry. A delay
        from the backoff policy (``delay=None``, as the consumer retries) is
        not refused: if it reaches past the expiry, the delivery is purged at
        TTL like any other still waiting then.

        On an ordered channel the delivery stays its group's head, unless a
        delivery of the group with a lower delivery id came back while it was
        leased (a requeued dead letter): it then waits behind that one.
        """
        delay_s = (
            self._context.options.backoff.delay(msg.attempts)
            if delay is None
            else _validate.retry_delay(delay)
        )
        explicit = delay is not None and delay_s > 0
        self.retry_after(msg, delay_s, _validate.error_text(error), within_ttl=explicit)

    def retry_after(
        self, msg: Message, delay_s: float, error: str | None, *, within_ttl: bool = False
    ) -> None:
        if msg.attempts >= msg.max_attempts:
            self._bury(msg, "max_attempts", error)
            return
        self._put_back(msg, delay_s, error, within_ttl=within_ttl)

    def snooze(self, msg: Message, delay: Duration) -> None:
        """Give ``msg`` back for ``delay`` without spending its attempt.

        The delivery is due again ``delay`` from now with ``attempts`` as
        before the claim (so a snooze never brings it closer to
        ``max_attempts``, and one snoozed on its first attempt counts as never
        attempted) and its last error kept; counted ``requeued``. On an
        ordered channel a snoozed head stays its group's head, unless a
        delivery of the group with a lower delivery id came back while it was
        leased (a requeued dead letter): it then waits behind that one. A positive
        ``delay`` that would make it due only at or after the message's
        expiry raises :class:`~novaque.InvalidOption` and changes nothing, as for
        :meth:`requeue`. Raises :class:`~novaque.LeaseLost` if the lease is no longer
        current.
        """
        delay_s = _validate.retry_delay(delay)
        self.snooze_after(msg, delay_s, within_ttl=delay_s > 0)

    def snooze_after(self, msg: Message, delay_s: float, *, within_ttl: bool = False) -> None:
        self._put_back(msg, delay_s, None, within_ttl=within_ttl, refund=True)

    def _put_back(
        self,
        msg: Message,
        delay_s: float,
        error: str | None,
        *,
        within_ttl: bool,
        refund: bool = False,
    ) -> None:
        """Make ``msg`` due again after ``delay_s`` (a retry, or with ``refund`` a snooze)."""
        # An ordered head given back may yield to a delivery below it: not one statement.
        op = "" if consume.ordered([msg]) else "settle"
        changed, effects = self._context.run_timed(
            op, consume.requeue, msg, microseconds(delay_s), error, within_ttl, refund
        )
        if not changed:
            if within_ttl:
                self._refuse_past_expiry(msg, delay_s)
            raise LeaseLost(_lost_text(msg))
        self._context.apply(effects)
        self._freed([msg])

    def _refuse_past_expiry(self, msg: Message, delay_s: float) -> None:
        """After a requeue that changed nothing: InvalidOption if the lease is
        still current (so the expiry refused the delay); else return."""
        expires, now = self._context.run_timed("", consume.expiry_if_leased, msg)
        if expires is not None:
            raise InvalidOption(
                f"delay is {delay_s:.15g} s but message {msg.id} expires at "
                f"{from_us(int(expires)).isoformat()}, {(int(expires) - now) / US:.15g} s from "
                "now: the retry would never run; the delay must end before the expiry"
            )

    def reject(self, msg: Message, reason: str = "") -> None:
        """Dead-letter ``msg`` at once; ``reason`` is kept (``"rejected"`` when empty).

        At most 4000 characters of it, with NUL and lone surrogates replaced
        by U+FFFD.
        """
        self._bury(msg, _validate.reason(reason), None)

    def _bury(self, msg: Message, reason: str, error: str | None) -> None:
        self._leave(msg, consume.kill, reason, error)

    def defer(self, msg: Message) -> None:
        """Set ``msg`` aside: its delivery becomes ``"deferred"``.

        A deferred delivery is never claimed, by :meth:`claim` or a consumer;
        it stays (``Backlog.deferred``, ``get_message``) until its message's
        TTL purges it, or until :meth:`claim_deferred` names its
        ``msg.delivery_id``. Its attempt stays counted; nothing else is
        counted (the delivery is still live). On an ordered channel the
        group's next delivery goes on at once. Raises :class:`~novaque.LeaseLost` if
        the lease is no longer current.
        """
        self._leave(msg, consume.defer)

    def _leave(
        self,
        msg: Message,
        fn: Callable[
            Concatenate[sa.Connection, dialects.Dialect, int, Message, P], tuple[bool, Effects]
        ],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> None:
        """Settle ``msg`` with ``fn`` (whether its lease was current, and its
        effects), which moves its group on when it is ordered."""
        op = "" if consume.ordered([msg]) else "settle"
        changed, effects = self._context.run_timed(op, fn, msg, *args, **kwargs)
        if not changed:
            raise LeaseLost(_lost_text(msg))
        self._context.apply(effects)
        self._freed([msg])

    def renew(self, msg: Message, *, lease: Duration | None = None) -> Any:
        """Extend ``msg``'s lease to ``lease`` from now (default: the channel's
        ``lease`` setting as the claim read it, else ``Options.default_lease``).

        Keeps the token, updates ``msg.lease_expires_at`` and returns the new
        expiry. Raises :class:`~novaque.LeaseLost` if the lease is no longer current.
        """
        if lease is None and msg.channel_lease_us is not None:
            lease_s = msg.channel_lease_us / US
        else:
            lease_s = _validate.lease(lease, self._context.default_lease)
        until = self._context.run_timed("settle", consume.renew, msg, microseconds(lease_s))
        if until is None:
            raise LeaseLost(_lost_text(msg))
        msg.lease_expires_at = from_us(until)
        return msg.lease_expires_at

    def _release(self, msgs: Sequence[Message]) -> int:
        """Release leased, unstarted deliveries at once; their attempt is not counted."""
        released = self._context.run_timed("", consume.release, msgs)
        if released:
            self._freed(msgs)
        return released

    def release(self, msgs: Sequence[Message]) -> int:
        """Give leased deliveries back at once, without counting their attempt.

        For a consumer of its own that claimed more than it will handle (a
        prefetch buffer given back at shutdown): the deliveries are due again
        at once and their ``attempts`` are as before the claim. Messages whose
        lease is no longer current are left alone (no :class:`~novaque.LeaseLost`);
        returns how many were released. Use :meth:`requeue` for a message
        that was worked on. On an ordered channel a released head waits, as
        after :meth:`requeue`, behind a delivery of its group with a lower
        delivery id that came back while it was leased.
        """
        if not msgs:
            return 0
        return self._release(msgs)


def _lost_text(msg: Message) -> str:
    return (
        f"lease of delivery {msg.delivery_id} (message {msg.id} on {msg.topic}/{msg.channel}) "
        "is no longer current: it was settled, reaped after expiry or claimed again"
    )
