"""Consumers online, the client's side: each running consumer's row, kept fresh.

A :class:`Presence` belongs to a client's :class:`~novaque._runtime.Runtime`. A
consumer that starts is registered at once (one INSERT); while any consumer of
the client runs, one loop of the client's (a thread, or a task on the asyncio
twin) refreshes every row each ``Options.consumer_heartbeat`` of real time with
the consumer's current ``in_flight`` (one transaction, one UPDATE per running
consumer: nothing rides on the claims); a consumer that stops deletes its row.
A registration or a refresh that fails is logged and tried again at the next
beat; a row that maintenance dropped meanwhile (the process stalled for three
heartbeats) is registered again. The operations live in
:mod:`novaque.ops.presence`.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import weakref
from typing import TYPE_CHECKING

from novaque import _validate
from novaque._signals import Signals
from novaque._waits import Event, Runner
from novaque.ops import presence

if TYPE_CHECKING:
    from novaque._context import Context
    from novaque.consumer import Consumer

__all__ = ["Presence"]

#: ``novaque_consumers.host`` holds at most this many characters.
HOST_CHARS = 255
#: Spread of the refresh interval (+-10 %), so processes do not beat in lockstep.
BEAT_JITTER = 0.1

#: Every Presence of the process: a forked child forgets its parent's consumers.
_everyone: weakref.WeakSet[Presence] = weakref.WeakSet()


def _forget_in_child() -> None:
    """In a forked child: the parent's consumers and loop do not run here (their
    rows are the parent's to refresh and remove)."""
    for kept in list(_everyone):
        kept._lock = threading.Lock()
        kept._rows.clear()
        kept._loop = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


class Presence:
    """The rows of one client's running consumers (see the module docstring)."""

    def __init__(self, context: Context, interval_s: float) -> None:
        self._context = context
        self.interval_s = interval_s
        self._lock = threading.Lock()
        #: Running consumers and their row ids (None: not registered yet).
        self._rows: dict[Consumer, int | None] = {}
        self._loop: tuple[Runner, Event] | None = None
        #: ``beats`` (refresh passes) and ``errors``: tests wait on these.
        self.signals = Signals()
        _everyone.add(self)

    def joined(self, consumer: Consumer) -> None:
        """Register a consumer that just started; start the refresh loop."""
        row = self._register(consumer)
        with self._lock:
            self._rows[consumer] = row
            if self._loop is None:
                stop = self._context.waits.event()
                runner = self._context.waits.spawn(
                    lambda: self._beat_loop(stop), "novaque-consumers-online"
                )
                self._loop = (runner, stop)

    def left(self, consumer: Consumer, timeout: float = 5.0) -> None:
        """Delete a stopped consumer's row; stop the loop after the last one."""
        with self._lock:
            row = self._rows.pop(consumer, None)
            loop = self._loop if not self._rows else None
            if loop is not None:
                self._loop = None
        if row is not None:
            try:
                self._context.run_op("", presence.leave, row)
            except Exception as exc:
                self._context.log.warning(
                    "could not remove consumer %s/%s from the consumers online (maintenance "
                    "drops it after three heartbeats): %s",
                    consumer.topic,
                    consumer.channel,
                    _validate.error_text(exc),
                )
        if loop is not None:
            runner, stop = loop
            stop.set()
            if not runner.is_current():
                runner.join(timeout)

    def beat(self) -> None:
        """Refresh every running consumer's row now (the loop's pass)."""
        with self._lock:
            rows = list(self._rows.items())
        known = [(row, consumer) for consumer, row in rows if row is not None]
        by_row = dict(known)
        gone = self._context.run_timed(
            "", presence.beat, [(row, consumer.in_flight) for row, consumer in known]
        )
        again = [by_row[row] for row in gone] + [c for c, row in rows if row is None]
        for consumer in again:
            row = self._register(consumer)
            with self._lock:
                if consumer in self._rows:  # not stopped meanwhile
                    self._rows[consumer] = row
                    continue
            if row is not None:  # it stopped while registering: take the row back
                self._context.run_op("", presence.leave, row)
        self.signals.bump("beats")

    def _register(self, consumer: Consumer) -> int | None:
        try:
            return self._context.run_timed(
                "",
                presence.register,
                host=socket.gethostname()[:HOST_CHARS],
                pid=os.getpid(),
                topic=consumer.topic,
                channel=consumer.channel,
                max_in_flight=consumer.max_in_flight,
                in_flight=consumer.in_flight,
            )
        except Exception as exc:
            self.signals.bump("errors")
            self._context.log.warning(
                "could not register consumer %s/%s with the consumers online (retrying at "
                "the next heartbeat): %s",
                consumer.topic,
                consumer.channel,
                _validate.error_text(exc),
            )
            return None

    def _beat_loop(self, stop: Event) -> None:
        spread = random.uniform(1 - BEAT_JITTER, 1 + BEAT_JITTER)
        while not stop.wait(self.interval_s * spread):
            try:
                self.beat()
            except Exception as exc:
                self.signals.bump("errors")
                self._context.log.warning(
                    "could not refresh the consumers online (retrying at the next heartbeat): %s",
                    _validate.error_text(exc),
                )
