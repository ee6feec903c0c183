"""What a handler's result means, and how that result is written.

One place for the handler contract, shared by everything that runs handlers
(the thread consumer, :func:`novaque.testing.drain`):

- :func:`outcome_of` runs a handler on one message and decides what its
  result means: return ⇒ ack; :class:`~novaque.Reject` ⇒ dead at once with
  its reason; any other exception ⇒ retry after the backoff (dead with reason
  ``max_attempts`` once attempts ran out);
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
from novaque.errors import Reject
from novaque.models import Message
from novaque.options import Backoff

__all__ = ["Settler", "buries", "outcome_of", "write"]


class Settler(Protocol):
    """The client calls that write a handler's result."""

    def ack(self, msg: Message) -> None: ...

    def _retry(self, msg: Message, delay_s: float, error: str | None) -> None: ...

    def reject(self, msg: Message, reason: str = "") -> None: ...


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
        log.info("message %d rejected by the handler of %s/%s", msg.id, msg.topic, msg.channel)
        reason = exc.reason
        return Outcome("reject", msg, reason if isinstance(reason, str) else str(reason))
    except BaseException as exc:
        text = _validate.error_text(exc)
        log.warning(
            "handler of %s/%s failed on message %d (attempt %d of %d): %s",
            msg.topic,
            msg.channel,
            msg.id,
            msg.attempts,
            msg.max_attempts,
            text,
            exc_info=exc,
        )
        return Outcome("retry", msg, text, backoff.delay(msg.attempts))
    return Outcome("ack", msg)


def buries(outcome: Outcome) -> bool:
    """Whether writing ``outcome`` makes the delivery dead (rejected, or a
    retry after the last allowed attempt)."""
    if outcome.kind == "ack":
        return False
    return outcome.kind == "reject" or outcome.msg.attempts >= outcome.msg.max_attempts


def write(client: Settler, outcome: Outcome) -> None:
    """Write one outcome: ack, retry after its delay, or reject with its reason.

    Raises :class:`~novaque.LeaseLost` when the lease is no longer current,
    and whatever the database raised.
    """
    if outcome.kind == "ack":
        client.ack(outcome.msg)
    elif outcome.kind == "retry":
        client._retry(outcome.msg, outcome.delay, outcome.text)
    else:
        client.reject(outcome.msg, outcome.text or "")
