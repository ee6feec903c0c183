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

Registering costs a dict insertion and removal (no lock, no wake-up): the
thread looks at the entries a few times a second.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable

__all__ = ["Deadline", "watch"]

#: Longest pause of the watching thread between two looks (seconds): how late
#: a deadline may be acted on.
LOOK_S = 0.1


class Deadline:
    """One transaction's deadline; :attr:`passed` once it was cancelled."""

    __slots__ = ("at", "cancel", "key", "passed")

    def __init__(self, at: float, cancel: Callable[[], None], key: int) -> None:
        self.at = at
        self.cancel = cancel
        self.key = key
        self.passed = False

    def end(self) -> bool:
        """The transaction ended: stop watching it; whether its deadline passed."""
        _active.pop(self.key, None)
        return self.passed


_active: dict[int, Deadline] = {}
_keys = itertools.count()
_started_in: int | None = None
_start_lock = threading.Lock()


def watch(seconds: float, cancel: Callable[[], None]) -> Deadline:
    """Call ``cancel`` (on a thread of its own) if the returned deadline has
    not :meth:`~Deadline.end`-ed within ``seconds``."""
    if _started_in != os.getpid():
        _start()
    deadline = Deadline(time.monotonic() + seconds, cancel, next(_keys))
    _active[deadline.key] = deadline
    return deadline


def _start() -> None:
    """Start the watching thread of this process (after a fork: the child's,
    the parent's deadlines forgotten)."""
    global _started_in
    with _start_lock:
        if _started_in == os.getpid():
            return
        _active.clear()
        threading.Thread(target=_look, name="novaque-deadlines", daemon=True).start()
        _started_in = os.getpid()


def _look() -> None:
    while True:
        now = time.monotonic()
        soonest = now + LOOK_S
        for deadline in _active.copy().values():
            if deadline.passed:
                continue
            if deadline.at <= now:
                deadline.passed = True
                threading.Thread(
                    target=_cancel, args=(deadline.cancel,), name="novaque-cancel", daemon=True
                ).start()
            else:
                soonest = min(soonest, deadline.at)
        time.sleep(max(0.005, soonest - time.monotonic()))


def _cancel(cancel: Callable[[], None]) -> None:
    # A server that cannot be reached for the cancel request either: the
    # connection is closed by the transaction's owner when it returns.
    with contextlib.suppress(Exception):
        cancel()
