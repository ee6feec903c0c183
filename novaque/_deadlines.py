"""The deadline of novaque's own transactions: one that runs too long is cancelled.

A server that accepts connections but never answers must not hang a publish,
a claim or a shutdown. PostgreSQL's ``statement_timeout`` does not cover it:
the wait of a commit for a synchronous standby (a promoted standby that kept
``synchronous_standby_names``, a standby gone) runs after the statement's
timer is off. So the executor registers each transaction here with its
deadline and a way to cancel it (the dialect's ``cancel``: a cancel request
sent to the server, which ends a running statement and a commit's wait for
its standby alike), and one thread per process cancels those past their
deadline. A transaction that ran past its deadline is reported as
:class:`~novaque.DatabaseUnavailable` (and its connection closed), whatever
the driver answered after the cancel: a commit whose wait was cancelled
happened on the server without the replication asked for.

Registering costs a dict insertion and removal under an uncontended lock (no
wake-up): the thread looks at the entries ten times a second. The lock makes
the end of a transaction and its cancel exclusive: once :meth:`Deadline.end`
said the deadline had not passed, no cancel is sent (it would reach the
connection's next transaction).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Deadline", "watch"]

#: Longest pause of the watching thread between two looks (seconds): how late
#: a deadline may be acted on.
LOOK_S = 0.1


class Deadline:
    """One transaction's deadline; :attr:`passed` once it was cancelled."""

    __slots__ = ("at", "cancel", "conn", "key", "passed")

    def __init__(self, at: float, cancel: Callable[[Any], None], conn: Any, key: int) -> None:
        self.at = at
        self.cancel = cancel
        self.conn = conn
        self.key = key
        self.passed = False

    def end(self) -> bool:
        """The transaction ended: stop watching it; whether its deadline passed
        (its cancel was sent, or is on its way)."""
        with _lock:
            _active.pop(self.key, None)
            return self.passed


_active: dict[int, Deadline] = {}
_lock = threading.Lock()
_keys = itertools.count()
#: Whether this process's watching thread runs.
_started = False
_start_lock = threading.Lock()


def watch(seconds: float, cancel: Callable[[Any], None], conn: Any) -> Deadline:
    """Call ``cancel(conn)`` (on a thread of its own) if the returned deadline
    has not :meth:`~Deadline.end`-ed within ``seconds``."""
    if not _started:
        _start()
    deadline = Deadline(time.monotonic() + seconds, cancel, conn, next(_keys))
    with _lock:
        _active[deadline.key] = deadline
    return deadline


def _start() -> None:
    """Start the watching thread of this process (after a fork, the child's)."""
    global _started
    with _start_lock:
        if _started:
            return
        threading.Thread(target=_look, name="novaque-deadlines", daemon=True).start()
        _started = True


def _forget_parents() -> None:
    """In a forked child: the parent's deadlines and locks (held, maybe, by a
    thread that the child does not have) are not the child's."""
    global _lock, _start_lock, _started
    _started = False
    _active.clear()
    _lock = threading.Lock()
    _start_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parents)


def _look() -> None:
    while True:
        now = time.monotonic()
        soonest = now + LOOK_S
        due: list[Deadline] = []
        with _lock:
            for deadline in _active.values():
                if deadline.passed:
                    continue
                if deadline.at <= now:
                    deadline.passed = True
                    due.append(deadline)
                else:
                    soonest = min(soonest, deadline.at)
        for deadline in due:
            threading.Thread(
                target=_cancel,
                args=(deadline.cancel, deadline.conn),
                name="novaque-cancel",
                daemon=True,
            ).start()
        time.sleep(max(0.005, soonest - time.monotonic()))


def _cancel(cancel: Callable[[Any], None], conn: Any) -> None:
    # A server that cannot be reached for the cancel request either: the
    # connection is closed by the transaction's owner when it returns.
    with contextlib.suppress(Exception):
        cancel(conn)
