"""Time as novaque sees it: integer microseconds since the Unix epoch, UTC."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone

from novaque.errors import InvalidOption

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
US = 1_000_000
DAY_US = 86_400 * US


def to_us(moment: datetime) -> int:
    """Epoch microseconds of an aware datetime."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidOption(f"datetimes must be timezone-aware (UTC), got naive {moment!r}")
    return (moment - _EPOCH) // timedelta(microseconds=1)


def from_us(us: int) -> datetime:
    """Aware UTC datetime of epoch microseconds."""
    return _EPOCH + timedelta(microseconds=us)


def day_of(us: int) -> date:
    """The UTC day an epoch-microsecond instant falls on."""
    return (_EPOCH + timedelta(microseconds=us)).date()


def start_of_day(day: date) -> int:
    return to_us(datetime(day.year, day.month, day.day, tzinfo=timezone.utc))


class Clock:
    """The client's time source.

    With a user clock (``Options.clock``) every decision uses it. Otherwise the
    database server's clock is the reference: the client samples it when it
    first connects and at each maintenance pass, and in between adds the local
    clock's progress to the last sample. So every host agrees with the
    database (to within a network round trip) even when host clocks are
    skewed, at no per-call cost. SQLite has no server: there it is the host's
    clock.
    """

    def __init__(self, user_clock: Callable[[], datetime] | None) -> None:
        self._user = user_clock
        self._offset_us = 0
        self._lock = threading.Lock()

    @property
    def injected(self) -> bool:
        return self._user is not None

    def now_us(self) -> int:
        if self._user is not None:
            moment = self._user()
            if not isinstance(moment, datetime):
                raise InvalidOption(
                    f"Options.clock must return a datetime, got {type(moment).__name__}"
                )
            return to_us(moment)
        return time.time_ns() // 1000 + self._offset_us

    def sample(self, read_server_us: Callable[[], int | None]) -> None:
        """Align with the server clock read by ``read_server_us`` (None: keep local)."""
        if self._user is not None:
            return
        before = time.time_ns() // 1000
        server = read_server_us()
        after = time.time_ns() // 1000
        if server is not None:
            with self._lock:
                self._offset_us = server - (before + after) // 2
