"""Which channels have limits, as this client last saw them, and the consumers
a limit holds back.

A claim of a channel without limits is the fast one (one statement, the
dialect's); the database refuses it any delivery of a channel with a limit
(``max_leased``, ``rate_limit``, ``group_max_leased``), so safety never
depends on what this client believes. What it believes only decides which
path a claim takes first: a channel seen limited is claimed by the limited
claim (:mod:`novaque.ops.limits`), which reads the limits again each time
and marks the channel unlimited once they are gone; a channel seen
unlimited is claimed fast, and when such a claim comes back empty and what
was seen is older than :data:`LOOK_AGAIN_S`, the channel's limits are read
again (so a limit set in another process is followed within that time of
an empty claim, and a limit set by this client at once).

A consumer whose claim a limit left empty (:class:`Hold`) waits for room:
an ack, requeue, reject, defer, snooze or release of a delivery of the
channel by this client wakes as many held-back consumers of the channel as
deliveries it settled (:meth:`LimitedChannels.freed`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LOOK_AGAIN_S", "Hold", "LimitedChannels"]

#: How long "this channel has no limit" is trusted before an empty fast claim
#: reads the channel's limits again.
LOOK_AGAIN_S = 1.0


@dataclass(frozen=True, slots=True)
class Hold:
    """A claim of a limited channel got nothing because of a limit.

    ``window_end_us``: the rate limit's window was used up, until then (the
    client's clock, epoch microseconds); None: the leases counted (the
    channel's or a group's) filled the limit, until some end.
    """

    window_end_us: int | None = None
    #: When it was seen (``time.monotonic()``).
    at: float = 0.0


class LimitedChannels:
    """One client's view of which channels have limits (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: channel id -> (limited?, when seen: time.monotonic()).
        self._seen: dict[int, tuple[bool, float]] = {}
        #: channel id -> the last hold a claim of it met.
        self._holds: dict[int, Hold] = {}
        #: channel id -> wakers of the consumers waiting for room, in order.
        self._waiting: dict[int, list[Callable[[], None]]] = {}

    def limited(self, channel_id: int) -> bool:
        """Whether the channel was seen limited (its claims go the limited way)."""
        seen = self._seen.get(channel_id)
        return seen is not None and seen[0]

    def look_again(self, channel_id: int) -> bool:
        """After an empty fast claim: whether to read the channel's limits again."""
        seen = self._seen.get(channel_id)
        return seen is None or (not seen[0] and time.monotonic() - seen[1] >= LOOK_AGAIN_S)

    def seen(self, channel_id: int, limited: bool, hold: Hold | None = None) -> None:
        """A read of the channel's limits: whether it has any, and what held its claim back."""
        now = time.monotonic()
        self._seen[channel_id] = (limited, now)
        if hold is None:
            self._holds.pop(channel_id, None)
        else:
            self._holds[channel_id] = Hold(hold.window_end_us, now)

    def held_back(self, channel_id: int, since: float) -> Hold | None:
        """What held the channel's claims back, if a claim met a limit at or
        after ``since`` (``time.monotonic()``) and none got deliveries since."""
        hold = self._holds.get(channel_id)
        return hold if hold is not None and hold.at >= since else None

    def wait_for_room(self, channel_id: int, waker: Callable[[], None]) -> None:
        """Call ``waker`` once when this client settles a delivery of the channel
        (or the limits may have changed); a waker registered twice is called once."""
        with self._lock:
            waiting = self._waiting.setdefault(channel_id, [])
            if waker not in waiting:
                waiting.append(waker)

    @property
    def waiting(self) -> bool:
        """Whether any consumer of this client waits for room."""
        return bool(self._waiting)

    def freed(self, channel_id: int, count: int = 1) -> None:
        """This client settled ``count`` leased deliveries of the channel: wake
        as many consumers waiting for room there (the first ones that waited)."""
        if count <= 0 or not self._waiting.get(channel_id):
            return
        with self._lock:
            waiting = self._waiting.get(channel_id, [])
            woken, waiting[:count] = waiting[:count], []
            if not waiting:
                self._waiting.pop(channel_id, None)
        for waker in woken:
            waker()

    def changed(self) -> None:
        """This client changed a channel's settings: read every channel's
        limits again, and wake every consumer waiting for room."""
        with self._lock:
            self._seen.clear()
            self._holds.clear()
            woken = [w for found in self._waiting.values() for w in found]
            self._waiting.clear()
        for waker in woken:
            waker()
