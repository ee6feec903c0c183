"""Counters of things that happened in a background loop, and a way to wait for them.

Consumers and maintenance count what they do (claim passes, handlers started,
acks, renewals, maintenance passes, errors). Tests wait for "a pass happened"
with a deadline instead of sleeping; the counts are cheap enough to keep in
production, where they also help when debugging a stuck consumer.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

__all__ = ["Signals"]


class Signals:
    """Named counters that threads bump and other threads can wait on."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._counts: Counter[str] = Counter()

    def bump(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` and wake everybody waiting."""
        with self._cond:
            self._counts[name] += n
            self._cond.notify_all()

    def count(self, name: str) -> int:
        """The current value of counter ``name`` (0 if never bumped)."""
        with self._cond:
            return self._counts[name]

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter."""
        with self._cond:
            return dict(self._counts)

    def wait(self, name: str, at_least: int, timeout: float) -> bool:
        """Wait until counter ``name`` reaches ``at_least``; False on timeout."""
        return self.wait_until(lambda counts: counts[name] >= at_least, timeout)

    def wait_until(self, predicate: Callable[[Counter[str]], bool], timeout: float) -> bool:
        """Wait until ``predicate(counters)`` holds; False if ``timeout`` runs out first.

        The predicate is evaluated again each time a counter changes.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self._counts):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True
