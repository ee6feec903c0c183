"""Where this client's claims of a channel start reading: the claim cursor.

A claim takes the oldest due deliveries of a channel, reading its range of
the claim index (``visible_at`` order) from the first entry. Every claim, ack
and retry leaves a dead version of a delivery in that range, at the time it
was due; the database removes them once no snapshot needs them. While some
session holds a snapshot open (a report, a backup, a forgotten ``BEGIN``)
nothing is removed, and a claim that reads from the first entry walks every
version churned since: its cost grows with time.

So each claim says where to start (``ClaimParams.since``), and this client
keeps, per channel, a point before which nothing due is left for it:

- a claim that took fewer than it asked for read everything due up to its
  time: the next starts :data:`MARGIN_US` before that time;
- a claim that took all it asked for stopped at its last row: the next
  starts :data:`MARGIN_US` before the oldest publish time among the rows it
  took (no delivery is due before its message was published).

The margin is for publishes still committing: a delivery is written due at
its publish's time, and becomes visible only when that transaction commits.

A delivery can still become claimable behind that point: a publish whose
transaction commits more than :data:`MARGIN_US` after it began, a claim that
locked a delivery and then rolled back, a client whose clock runs behind.
Every :data:`RESCAN_US` a claim of the channel reads it from the first
entry, so such a delivery waits at most that long. In a started client the
maintenance loop looks behind each cursor every :data:`LOOK_BEHIND_US`
instead (a read without locks): the claims then read from the first entry
only when something is there, and never wait for that walk themselves. A
delivery that becomes due by the clock (a delay, a retry's backoff, an
expired lease) is never behind: each claim reads from before the previous
one's time.

The database takes the point only for a channel of one lane and standard
ordering (:data:`novaque.dialects.base.scan_from`): claims of other channels
read from the first entry, and so do pops, claims with an attempt id and
claims of channels with limits.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from novaque._time import US

__all__ = [
    "LOOK_BEHIND_US",
    "MARGIN_US",
    "REAP_RESCAN_US",
    "RESCAN_US",
    "ClaimCursors",
    "ReapCursor",
]

#: How far before what a claim read the next claim of the channel starts: a
#: publish committed within this long after it began is never behind.
MARGIN_US = 2 * US
#: How often a claim of each channel reads it from the first entry, unless a
#: look of the maintenance loop (:data:`LOOK_BEHIND_US`) found nothing behind
#: the cursor meanwhile: the most a delivery that became claimable behind the
#: cursor waits.
RESCAN_US = 15 * US
#: How often a started client's maintenance loop looks behind each cursor
#: (a read without locks, which walks what the claims skip): when something
#: claimable is there, the channel's next claim reads from the first entry;
#: when nothing is, the claims need not. So a claim never pays for that walk
#: while the loop runs.
LOOK_BEHIND_US = 10 * US


def _start(found: tuple[int, int] | None, now: int, rescan_us: int) -> int | None:
    """Where a scan at ``now`` starts, of ``found`` (a cursor and when a scan
    last read from the first entry); None: from the first (none yet, a
    rescan due every ``rescan_us``, or the clock moved back)."""
    if found is None:
        return None
    since, scanned_at = found
    if not scanned_at <= now < scanned_at + rescan_us or since > now:
        return None
    return since


class ClaimCursors:
    """One client's claim cursors, by channel id (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: channel id -> (where its next claim starts, when one last read it
        #: from the first entry), both epoch microseconds of the client's clock.
        self._cursors: dict[int, tuple[int, int]] = {}

    def start(self, channel_id: int, now: int) -> int | None:
        """Where a claim of the channel made at ``now`` starts reading; None:
        from the first entry (the channel not claimed yet, a rescan due, or
        the clock moved back)."""
        return _start(self._cursors.get(channel_id), now, RESCAN_US)

    def claimed(
        self,
        channel_id: int,
        since: int | None,
        now: int,
        limit: int,
        rows: Sequence[Any],
    ) -> None:
        """A claim of the channel that started at ``since`` (:meth:`start`),
        made at ``now``, asked for ``limit`` and took ``rows`` (claimed rows,
        with their message's ``published_at``)."""
        filled = len(rows) >= limit
        after = (min(int(row.published_at) for row in rows) if filled else now) - MARGIN_US
        with self._lock:
            found = self._cursors.get(channel_id)
            if since is None or found is None:
                self._cursors[channel_id] = (after, now)
            else:
                self._cursors[channel_id] = (max(found[0], after), found[1])

    def to_look_behind(self, now: int) -> list[tuple[int, int]]:
        """(channel id, cursor) of the channels whose cursor was last read from
        the first entry, or looked behind, :data:`LOOK_BEHIND_US` or more before ``now``."""
        with self._lock:
            return [
                (channel_id, since)
                for channel_id, (since, scanned_at) in self._cursors.items()
                if not scanned_at <= now < scanned_at + LOOK_BEHIND_US
            ]

    def looked_behind(self, channel_id: int, since: int, now: int, found: bool) -> None:
        """A look at ``now`` behind the channel's cursor ``since``: with ``found``
        the next claim reads from the first entry; without, claims need not
        until :data:`RESCAN_US` after ``now``."""
        with self._lock:
            current = self._cursors.get(channel_id)
            if current is None:
                return
            if found:
                del self._cursors[channel_id]
            elif current[0] >= since:
                self._cursors[channel_id] = (current[0], now)

    def forget(self) -> None:
        """Every channel's next claim reads it from the first entry (the schema
        was migrated: a downgrade may have made deliveries due anywhere)."""
        with self._lock:
            self._cursors.clear()


#: How often the lease reaper of a client's maintenance loop reads every
#: lease, expired since whenever: the most a lease that expired behind its
#: cursor (one written by a client whose clock runs behind) waits for it.
REAP_RESCAN_US = 60 * US


class ReapCursor:
    """Where the lease reaper of a client's maintenance loop starts reading
    expired leases (the state index's range, which the dead versions of
    acked leases fill as the claim index's): from :data:`MARGIN_US` before
    the time of its last pass that read them all, and from the first every
    :data:`REAP_RESCAN_US`. A lease expires by the clock, after it was
    written: a pass never misses one for starting late."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (where the next pass starts, when one last read from the first).
        self._at: tuple[int, int] | None = None

    def start(self, now: int) -> int | None:
        """Where a pass at ``now`` starts; None: from the first."""
        with self._lock:
            found = self._at
        return _start(found, now, REAP_RESCAN_US)

    def passed(self, since: int | None, now: int) -> None:
        """A pass that started at ``since``, at ``now``, read every lease expired by then."""
        with self._lock:
            scanned_at = now if since is None or self._at is None else self._at[1]
            self._at = (now - MARGIN_US, scanned_at)
