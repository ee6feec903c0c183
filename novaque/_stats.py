"""In-memory counter deltas, flushed to ``novaque_stats`` in batches.

Hot paths only add to a dict under a lock, keyed by (channel, UTC minute of
the event by the client's clock); :meth:`StatsBuffer.take` hands the
accumulated deltas to the flusher, which adds them to the (channel, day)
buckets and to the (channel, minute) buckets of the live throughput, one
upsert each, in one transaction. A failed flush gives the deltas back, so
counters are never lost, only late.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

from novaque._tables import COUNTER_COLUMNS

FIELD_INDEX = {name: i for i, name in enumerate(COUNTER_COLUMNS)}

#: Microseconds in a minute: an event at ``now`` falls in minute ``now // MINUTE_US``.
MINUTE_US = 60_000_000
#: How far back minute counters are kept (and read by default): 24 hours.
MINUTES_KEPT_US = 24 * 60 * MINUTE_US

Key = tuple[int, int]  # (channel_id, UTC minute: whole minutes since the epoch)


class StatsBuffer:
    """``on_first`` is called (outside the lock) whenever deltas arrive in an empty
    buffer: the owner makes sure a flush will follow."""

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._deltas: defaultdict[Key, list[int]] = defaultdict(lambda: [0] * len(COUNTER_COLUMNS))
        self._on_first = on_first

    def add(self, field: str, minute: int, channel_ids: dict[int, int]) -> None:
        """Add ``channel_ids[channel]`` to ``field`` of each channel's bucket for
        ``minute`` (whole minutes since the epoch)."""
        index = FIELD_INDEX[field]
        with self._lock:
            was_empty = not self._deltas
            for channel_id, count in channel_ids.items():
                if count:
                    self._deltas[(channel_id, minute)][index] += count
            first = was_empty and bool(self._deltas)
        if first and self._on_first is not None:
            self._on_first()

    def take(self) -> dict[Key, list[int]]:
        with self._lock:
            taken = dict(self._deltas)
            self._deltas.clear()
        return taken

    def give_back(self, taken: dict[Key, list[int]]) -> None:
        # No ``on_first`` here: whoever failed to flush tries again (or the
        # flush at exit does).
        with self._lock:
            for key, values in taken.items():
                bucket = self._deltas[key]
                for i, value in enumerate(values):
                    bucket[i] += value

    def forget(self) -> None:
        """Drop every delta without the lock: for a forked child, where another
        thread of the parent may have held the lock at the fork."""
        self._lock = threading.Lock()
        self._deltas.clear()

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._deltas)


class Tally:
    """Counter deltas of one transaction, applied to the buffer only after it commits.

    A transaction that is retried (deadlock, busy) starts with a fresh tally,
    so a rolled-back attempt never counts.
    """

    def __init__(self) -> None:
        self._entries: list[tuple[str, int, dict[int, int]]] = []

    def add(self, field: str, now: int, channel_ids: dict[int, int]) -> None:
        """Record ``channel_ids[channel]`` more of ``field`` at ``now`` (epoch
        microseconds by the client's clock: its UTC day and minute)."""
        if channel_ids:
            self._entries.append((field, now // MINUTE_US, dict(channel_ids)))

    def apply(self, buffer: StatsBuffer) -> None:
        for field, minute, channel_ids in self._entries:
            buffer.add(field, minute, channel_ids)
