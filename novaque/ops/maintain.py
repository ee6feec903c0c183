"""Maintenance: the lease reaper, TTL purge, stats flush and prune."""

from __future__ import annotations

from collections import Counter
from datetime import date
from typing import Any

from novaque._stats import Tally
from novaque._time import day_of
from novaque.schema import (
    COUNTER_COLUMNS,
    deliveries,
)

d = deliveries


def stats_rows(
    deltas: dict[tuple[int, date], Any], only: str | None = None
) -> list[dict[str, Any]]:
    """Rows for :meth:`Dialect.upsert_stats`: ``deltas`` maps (channel, day) to the
    counter values in :data:`COUNTER_COLUMNS` order, or, with ``only``, to the
    count of that one counter."""
    rows = []
    for (channel_id, day), values in sorted(deltas.items()):
        counts = (
            dict(zip(COUNTER_COLUMNS, values, strict=True))
            if only is None
            else {c: values if c == only else 0 for c in COUNTER_COLUMNS}
        )
        rows.append({"channel_id": channel_id, "day": day, **counts})
    return rows


def count_purged(channel_ids: list[int], now: int, tally: Tally) -> None:
    """Count deleted deliveries (one channel id each) as purged in ``tally``."""
    if channel_ids:
        tally.add("purged", day_of(now), Counter(channel_ids))
