"""What a handler's result means, and how that result is written.

One place for the handler contract, shared by everything that runs handlers
(the thread consumer, :func:`novaque.testing.drain`):

- :func:`outcome_of` runs a handler on one message and decides what its
  result means: return ⇒ ack; :class:`~novaque.Reject` ⇒ dead at once with
  its reason; :class:`~novaque.Defer` ⇒ deferred; :class:`~novaque.Snooze`
  ⇒ due again after its delay, the attempt given back; any other exception
  (a ``Snooze`` with a bad delay included) ⇒ retry after the backoff (dead
  with reason ``max_attempts`` once attempts ran out);
- :func:`write` writes one such :class:`~novaque._ledger.Outcome` through the
  client's settle calls, so a runner that writes one result at a time needs
  no rules of its own (the consumer writes acks in batches, and the rest
  through :func:`write`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Protocol

from novaque import _hooks, _validate
from novaque._ledger import Outcome
from novaque._waits import THREADS, Waits
from novaque.errors import Defer, InvalidOption, Reject, Snooze
from novaque.models import Message
from novaque.options import Backoff

__all__ = ["Settler", "buries", "outcome_of", "signal_of", "write"]


class Settler(Protocol):
    """The client calls that write a handler's result."""

    def ack(self, msg: Message) -> None: ...

    def retry_after(self, msg: Message, delay_s: float, error: str | None) -> None: ...

    def reject(self, msg: Message, reason: str = "") -> None: ...

    def defer(self, msg: Message) -> None: ...

    def snooze_after(self, msg: Message, delay_s: float) -> None: ...


def outcome_of(
    handler: Callable[[Message], object],
    msg: Message,
    *,
    backoff: Backoff,
    log: logging.Logger,
    waits: Waits = THREADS,
) -> Outcome:
    """Run ``handler`` on ``msg`` (called, or awaited by the asyncio twin's
    ``waits``); the outcome its return or exception means.

    Every exception, :class:`BaseException` included, is the handler's
    failure: nothing a handler raises escapes to the runner, but the
    cancellation of the task running it (its event loop closing), which is
    not a result. The failure is logged at WARNING with its traceback; the
    ``Type: text`` of the exception is kept as the delivery's last error.
    """
    try:
        hook = _hooks.process  # an instrumentation's span around the call (novaque.otel)
        if hook is None:
            waits.call_handler(handler, msg)
        else:
            hook(msg, functools.partial(waits.call_handler, handler, msg))
    except asyncio.CancelledError:
        raise
    except Reject as exc:
        reason = exc.reason if isinstance(exc.reason, str) else _validate.text_of(exc.reason)
        log.info(
            "message %d rejected by the handler of %s/%s%s",
            msg.id,
            msg.topic,
            msg.channel,
            f": {_validate.reason(reason)}" if reason else " (no reason given)",
        )
        return Outcome("reject", msg, reason)
    except Defer:
        log.debug("message %d deferred by the handler of %s/%s", msg.id, msg.topic, msg.channel)
        return Outcome("defer", msg)
    except Snooze as exc:
        try:
            delay = _validate.retry_delay(exc.delay)
        except InvalidOption as bad:
            return _failed(msg, bad, backoff, log, "raised Snooze with a bad delay")
        log.debug(
            "message %d snoozed %.15g s by the handler of %s/%s",
            msg.id,
            delay,
            msg.topic,
            msg.channel,
        )
        return Outcome("snooze", msg, delay=delay)
    except BaseException as exc:
        return _failed(msg, exc, backoff, log, "failed")
    return Outcome("ack", msg)


def _failed(
    msg: Message, exc: BaseException, backoff: Backoff, log: logging.Logger, what: str
) -> Outcome:
    """A handler's failure: logged at WARNING with its traceback, retried after
    the backoff with its ``Type: text`` as the last error."""
    text = _validate.error_text(exc)
    log.warning(
        "handler of %s/%s %s on message %d (attempt %d of %d): %s",
        msg.topic,
        msg.channel,
        what,
        msg.id,
        msg.attempts,
        msg.max_attempts,
        text,
        exc_info=exc,
    )
    return Outcome("retry", msg, text, backoff.delay(msg.attempts))


def buries(outcome: Outcome) -> bool:
    """Whether writing ``outcome`` makes the delivery dead (rejected, or a
    retry after the last allowed attempt)."""
    if outcome.kind == "retry":
        return outcome.msg.attempts >= outcome.msg.max_attempts
    return outcome.kind == "reject"


def signal_of(outcome: Outcome) -> str:
    """The consumer's signal for a written outcome other than an ack."""
    if buries(outcome):
        return "dead"
    return {"defer": "deferred", "snooze": "snoozed"}.get(outcome.kind, "retried")


def write(client: Settler, outcome: Outcome) -> None:
    """Write one outcome: ack, retry after its delay, reject with its reason,
    defer, or snooze for its delay.

    A snooze is written as asked even when its delay reaches past the
    message's expiry (the delivery is then purged at TTL, like a retry whose
    backoff reaches that far). Raises :class:`~novaque.LeaseLost` when the
    lease is no longer current, and whatever the database raised.
    """
    msg = outcome.msg
    if outcome.kind == "ack":
        client.ack(msg)
    elif outcome.kind == "retry":
        client.retry_after(msg, outcome.delay, outcome.text)
    elif outcome.kind == "defer":
        client.defer(msg)
    elif outcome.kind == "snooze":
        client.snooze_after(msg, outcome.delay)
    else:
        client.reject(msg, outcome.text or "")
