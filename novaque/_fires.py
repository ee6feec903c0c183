"""When a schedule fires: the validation of its timing (a cron expression
and its IANA time zone, or a period) and the arithmetic of its fires, in
epoch microseconds (UTC), as the maintenance pass and ``schedule`` need it.

Cron expressions are evaluated by cronsim (the ``schedules`` extra), in the
schedule's time zone (:mod:`zoneinfo`): a local time that does not exist
(the spring gap of a daylight-saving change) fires at the next minute that
does; one that occurs twice (autumn) fires once, the first time. A period
fires on a fixed grid: ``next_fire_at`` + k·period, whatever the time each
fire was published at.
"""

from __future__ import annotations

import dataclasses
import zoneinfo
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from novaque._time import US, from_us, to_us
from novaque.errors import InvalidOption
from novaque.options import Duration, microseconds, seconds

__all__ = [
    "CATCH_UPS",
    "LATE_US",
    "MAX_FIRES_PER_PASS",
    "MAX_PERIOD_S",
    "Timing",
    "catch_up",
    "check_cron",
    "check_every",
    "check_timezone",
    "due_fires",
]

#: How a schedule publishes the fires it missed (see :func:`due_fires`).
CATCH_UPS = ("latest", "none", "all")
#: How late a fire may be published with ``catch_up="none"``.
LATE_US = 60 * US
#: The most fires of one schedule a maintenance pass publishes (``catch_up="all"``).
MAX_FIRES_PER_PASS = 1000
#: The longest period of an ``every`` schedule: 3650 days.
MAX_PERIOD_S = 3650 * 86_400.0
#: How many fields a cron expression has: minute, hour, day of month, month, day of week.
CRON_FIELDS = 5


def _cronsim() -> Any:
    """cronsim's ``CronSim`` class, or an :class:`ImportError` that names the extra."""
    try:
        from cronsim import CronSim
    except ImportError:
        raise ImportError(
            "cron= schedules need the cronsim package: pip install 'novaque[schedules]' "
            "(every= schedules work without it)"
        ) from None
    return CronSim


def check_cron(value: object) -> str:
    """``value`` if it is a valid five-field cron expression, else
    :class:`TypeError` or :class:`~novaque.InvalidOption` saying what is allowed."""
    if not isinstance(value, str):
        raise TypeError(
            f"cron must be a str (a 5-field cron expression), got {type(value).__name__}"
        )
    fields = value.split()
    if len(fields) != CRON_FIELDS or value.lstrip().startswith("@"):
        raise InvalidOption(
            f"cron must have exactly 5 fields (minute hour day-of-month month day-of-week, "
            f"no @daily-style aliases), got {value!r}"
        )
    cron_sim = _cronsim()
    try:
        cron_sim(value, datetime(2000, 1, 1, tzinfo=timezone.utc))
    except Exception as exc:  # cronsim's CronSimError (a plain Exception)
        raise InvalidOption(f"cron {value!r} is not a valid cron expression: {exc}") from None
    return " ".join(fields)


def check_timezone(value: object) -> str:
    """``value`` if it names an IANA time zone (``"UTC"``, ``"Europe/Paris"``),
    else :class:`TypeError` or :class:`~novaque.InvalidOption`."""
    if not isinstance(value, str):
        raise TypeError(
            f"timezone must be a str (an IANA time zone like 'Europe/Paris'), "
            f"got {type(value).__name__}"
        )
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidOption(
            f"timezone {value!r} is not an IANA time zone (like 'UTC' or 'Europe/Paris'; "
            "install tzdata where the system has no zone database)"
        ) from None
    return value


def check_every(value: object) -> int:
    """A period (seconds or a ``timedelta``) from 1 s to 3650 days, in microseconds."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise TypeError(
            f"every must be a duration (seconds as int or float, or a timedelta), "
            f"got {type(value).__name__}"
        )
    period: Duration = value
    result = seconds(period, "every")
    if not 1.0 <= result <= MAX_PERIOD_S:
        raise InvalidOption(
            f"every must be from 1 s to {MAX_PERIOD_S:.15g} s (3650 days), got {result:.15g} s"
        )
    return microseconds(result)


def catch_up(value: object) -> str:
    """``value`` if it is one of :data:`CATCH_UPS`, else :class:`~novaque.InvalidOption`."""
    if not isinstance(value, str) or value not in CATCH_UPS:
        raise InvalidOption(f"catch_up must be 'latest', 'none' or 'all', got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Timing:
    """When a schedule fires: ``cron`` in ``timezone``, or every ``every_us``."""

    cron: str | None
    every_us: int | None
    timezone: str

    def first_after(self, t: int, grid: int | None = None) -> int:
        """The first fire strictly after ``t`` (a period: on the grid through
        ``grid``, default ``t`` itself, so the first fire is ``t`` + period)."""
        if self.every_us is not None:
            start = t if grid is None else grid
            if t < start:
                return start
            return start + ((t - start) // self.every_us + 1) * self.every_us
        return next(self._cron_after(t))

    def _cron_after(self, t: int) -> Iterator[int]:
        """The cron fires strictly after ``t``, in order, each local time once."""
        assert self.cron is not None
        zone = zoneinfo.ZoneInfo(self.timezone)
        cron_sim = _cronsim()
        last = t
        while True:
            for local in cron_sim(self.cron, from_us(last).astimezone(zone)):
                if _second_time(local):
                    continue  # the repeated hour of autumn: fired the first time
                found = to_us(local)
                if found > last:
                    last = found
                    yield found
                    break

    def _cron_back(self, now: int) -> int | None:
        """A cron fire at or before ``now`` found backwards (where the forward
        search of :meth:`latest` may start; that search decides)."""
        assert self.cron is not None
        zone = zoneinfo.ZoneInfo(self.timezone)
        for local in _cronsim()(self.cron, from_us(now).astimezone(zone), reverse=True):
            return to_us(local)
        return None  # pragma: no cover - every valid expression recurs

    def fires_between(self, first: int, now: int, limit: int) -> list[int]:
        """Up to ``limit`` fires from ``first`` (a fire) to ``now``, in order."""
        if first > now:
            return []
        if self.every_us is not None:
            count = min(limit, (now - first) // self.every_us + 1)
            return [first + k * self.every_us for k in range(count)]
        found = [first]
        for fire in self._cron_after(first):
            if fire > now or len(found) >= limit:
                break
            found.append(fire)
        return found

    def latest(self, first: int, now: int) -> int:
        """The most recent fire from ``first`` (a fire, at most ``now``) to ``now``."""
        if self.every_us is not None:
            return first + (now - first) // self.every_us * self.every_us
        # After a long stop, searching forward from ``first`` would step
        # through every missed fire: start a minute before the last one.
        back = self._cron_back(now)
        starts = [first]
        if back is not None and back - 60 * US > first:
            starts.insert(0, back - 60 * US)
        for start in starts:
            latest = None
            for fire in self._cron_after(start):
                if fire > now:
                    break
                latest = fire
            if latest is not None:
                return latest
        return first


def _second_time(local: datetime) -> bool:
    """Whether ``local`` is the second occurrence of a local time that occurs
    twice (``fold=1`` in the repeated hour of a daylight-saving change)."""
    if not local.fold:
        return False
    return local.replace(fold=0).utcoffset() != local.utcoffset()


def due_fires(timing: Timing, next_fire_at: int, now: int, how: str) -> tuple[list[int], int]:
    """The fires to publish now of a schedule due at ``next_fire_at`` (at most
    ``now``) by its catch-up rule ``how``, oldest first, and its next
    ``next_fire_at``.

    ``"latest"``: the most recent due fire; ``"none"``: the due fires at
    most :data:`LATE_US` late; ``"all"``: every due fire, at most
    :data:`MAX_FIRES_PER_PASS` (a later pass publishes the rest). The next
    fire is the first after ``now``, but after a capped ``"all"`` the first
    one not published.
    """
    if how == "latest":
        fires = [timing.latest(next_fire_at, now)]
    elif how == "none":
        if next_fire_at >= now - LATE_US:
            first = next_fire_at
        else:
            first = timing.first_after(now - LATE_US - 1, grid=next_fire_at)
        fires = timing.fires_between(first, now, MAX_FIRES_PER_PASS)
    else:
        fires = timing.fires_between(next_fire_at, now, MAX_FIRES_PER_PASS)
        if len(fires) == MAX_FIRES_PER_PASS:
            following = timing.first_after(fires[-1], grid=next_fire_at)
            if following <= now:
                return fires, following
    return fires, timing.first_after(now, grid=next_fire_at)
