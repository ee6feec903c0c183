"""Schedules: recurring publishes defined in the database (instead of a cron
box or a Celery beat process), by name: :meth:`Schedules.schedule` and the
calls that read, pause, resume and delete them. The maintenance pass of every
started client (and ``run_maintenance()``) publishes their due fires
(:meth:`novaque._maintenance.Maintenance.fire_schedules`).

A part of :class:`novaque.Client` (over its :class:`~novaque._context.Context`),
which forwards these calls here.
"""

from __future__ import annotations

from datetime import timedelta

from novaque import _fires, _validate
from novaque._context import Context
from novaque.errors import InvalidOption
from novaque.models import ScheduleInfo
from novaque.ops import schedules as schedules_op
from novaque.options import MAX_ATTEMPTS, Duration, check_int, microseconds

__all__ = ["Schedules"]


class Schedules:
    """Defining and operating schedules, over a client's context."""

    def __init__(self, context: Context) -> None:
        self._context = context

    def schedule(
        self,
        name: str,
        topic: str,
        body: bytes | str = b"",
        *,
        cron: str | None = None,
        every: Duration | None = None,
        timezone: str = "UTC",
        headers: dict[str, str] | None = None,
        ttl: Duration | None = None,
        max_attempts: int | None = None,
        catch_up: str = "latest",
        priority: int = 0,
    ) -> ScheduleInfo:
        """Create the schedule ``name`` (a name like a topic's), which publishes
        ``body`` to ``topic`` at each fire, or replace its definition.

        Exactly one of ``cron`` (a five-field cron expression, ``"0 9 * * 1-5"``,
        evaluated in the IANA ``timezone``; no ``@daily``-style aliases; needs
        the ``schedules`` extra) and ``every`` (seconds or a ``timedelta``, at
        least 1 s: fires at the time of this call + k·``every``, a fixed grid)
        is given. A local time that does not exist (the spring gap of a
        daylight-saving change) fires at the next minute that does; one that
        occurs twice fires once, the first time.

        Each fire publishes one message (``ttl`` and ``max_attempts`` as for
        :meth:`publish`, the client's defaults when None; ``priority`` as for
        :meth:`publish`) with ``headers`` and
        two of novaque's: ``novaque-schedule`` (the name) and
        ``novaque-fire-at`` (the fire's scheduled time, ISO 8601 UTC), which
        replace any of those names in ``headers``. The maintenance pass of
        any started client, and :meth:`run_maintenance`, publishes each due
        fire exactly once across every process: the fire commits with the
        move of the schedule's next fire. Fires missed while nothing ran or
        while paused: ``catch_up="latest"`` publishes the most recent only,
        ``"none"`` those at most 60 s late, ``"all"`` each of them in order
        (at most 1,000 a pass).

        Replacing a schedule takes the whole new definition (omitted
        parameters back to their defaults), keeps whether it is paused and its
        last fire, and computes its next fire from the clock. The topic is
        created if missing. A bad parameter raises :class:`TypeError` or
        :class:`~novaque.InvalidOption` and stores nothing.
        """
        definition = self._definition(
            name, topic, body, cron, every, timezone, headers, ttl, max_attempts, catch_up, priority
        )
        info = self._context.run_timed("", schedules_op.define, definition)
        self._context.schedules_look_at = 0  # its first fire may be the earliest
        return info

    def _definition(
        self,
        name: object,
        topic: object,
        body: object,
        cron: object,
        every: object,
        timezone: object,
        headers: object,
        ttl: object,
        max_attempts: object,
        catch_up: object,
        priority: object,
    ) -> schedules_op.Definition:
        """The validated definition of a ``schedule`` call."""
        name = _validate.name(name, "schedule")
        topic = _validate.name(topic, "topic")
        data = _validate.body(body, self._context.options.max_body_bytes)
        zone = _fires.check_timezone(timezone)
        if (cron is None) == (every is None):
            raise InvalidOption(
                "give exactly one of cron= (a 5-field cron expression) and every= "
                "(a duration of at least 1 s)"
            )
        timing = _fires.Timing(
            None if cron is None else _fires.check_cron(cron),
            None if every is None else _fires.check_every(every),
            zone,
        )
        header_text = _validate.headers(headers)
        # The fire's headers must be storable too: checked with the longest
        # fire time (one with microseconds) now, not at the fire.
        schedules_op.fire_headers(header_text, name, 1)
        ttl_us = None
        if ttl is not None:
            if not isinstance(ttl, (int, float, timedelta)) or isinstance(ttl, bool):
                raise TypeError(f"ttl must be a duration or None, got {type(ttl).__name__}")
            ttl_us = microseconds(_validate.ttl(ttl, self._context.default_ttl))
        attempts = None
        if max_attempts is not None:
            if not isinstance(max_attempts, int) or isinstance(max_attempts, bool):
                raise TypeError(
                    f"max_attempts must be an int or None, got {type(max_attempts).__name__}"
                )
            attempts = check_int(max_attempts, "max_attempts", 1, MAX_ATTEMPTS)
        return schedules_op.Definition(
            name,
            topic,
            data,
            header_text,
            timing,
            ttl_us,
            attempts,
            _fires.catch_up(catch_up),
            _validate.priority(priority),
        )

    def unschedule(self, name: str) -> bool:
        """Delete the schedule ``name``; whether it existed (messages of its
        past fires stay)."""
        _validate.name(name, "schedule")
        return self._context.run_op("", schedules_op.undefine, name)

    def get_schedule(self, name: str) -> ScheduleInfo:
        """The schedule ``name`` (:class:`~novaque.ScheduleNotFound` if there is none)."""
        _validate.name(name, "schedule")
        return self._context.run_op("", schedules_op.get, name)

    def list_schedules(self) -> list[ScheduleInfo]:
        """Every schedule, by name."""
        return self._context.run_op("", schedules_op.list_all)

    def pause_schedule(self, name: str) -> ScheduleInfo:
        """Stop the schedule ``name`` from firing until :meth:`resume_schedule`
        (:class:`~novaque.ScheduleNotFound` if there is none). Pausing a
        paused schedule changes nothing."""
        _validate.name(name, "schedule")
        return self._context.run_op("", schedules_op.set_paused, name, True)

    def resume_schedule(self, name: str) -> ScheduleInfo:
        """Let the paused schedule ``name`` fire again
        (:class:`~novaque.ScheduleNotFound` if there is none): the fires it
        missed meanwhile are published by its ``catch_up`` rule at the next
        maintenance pass."""
        _validate.name(name, "schedule")
        info = self._context.run_op("", schedules_op.set_paused, name, False)
        self._context.schedules_look_at = 0
        return info
