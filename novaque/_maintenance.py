"""Maintenance: one pass of every job (:meth:`Maintenance.run_maintenance`),
and each job on its own: the lease reaper, the TTL purge (and what runs after
it in a pass: :meth:`Maintenance.add_purge_pass`), the stats flush and prune,
the cleanup of consumers that died; and the flush at shutdown.

A part of :class:`novaque.Client` (over its :class:`~novaque._context.Context`),
which forwards these calls here; the runtime's maintenance loop runs the same
jobs on a timer.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from novaque import _validate
from novaque._claim_cursors import ReapCursor
from novaque._context import Context
from novaque._stats import MINUTE_US, MINUTES_KEPT_US
from novaque._time import day_of
from novaque.ops import consume, maintain, presence
from novaque.ops import schedules as schedules_op
from novaque.options import microseconds

__all__ = ["Maintenance"]


#: How long a look for due schedule fires holds when it found none sooner:
#: a schedule another process defines or resumes is seen within this time.
SCHEDULES_RECHECK_US = 10_000_000


class Maintenance:
    """Maintenance jobs, over a client's context (see the module docstring)."""

    def __init__(self, context: Context) -> None:
        self._context = context
        #: What a maintenance pass runs after the TTL purge (add_purge_pass).
        self._purge_passes: list[Callable[[], int]] = []
        self._reap_cursor = ReapCursor()

    def run_maintenance(self) -> None:
        """Run one pass of every maintenance job, synchronously.

        The lease reaper, the due fires of schedules, TTL purge, dead-letter
        retention (and on SQLite a bounded step of giving free pages back, see
        ``compact``), stats flush and stats prune, and the cleanup of consumers
        that died. For tests, and
        for deployments that run maintenance from cron instead of calling
        :meth:`start`.
        """
        self._context.ready()
        self._context.resample_clock()
        self.reap_leases()
        self.fire_schedules()
        self.purge_pass()
        self.flush_stats()
        self.prune_stats()
        self.forget_stale_consumers()

    def fire_schedules(self) -> int:
        """Publish the due fires of every schedule not paused (see
        :meth:`~novaque.Client.schedule`); return how many.

        Each schedule's fires commit in one transaction with the move of its
        next fire, on its row locked: run in many processes at once, every
        fire is published exactly once. Part of :meth:`run_maintenance`, and
        of the maintenance loop every second.
        """
        context = self._context
        options = context.options
        fired = 0
        for name in context.run_timed("", schedules_op.due_names):
            count, effects = context.run_timed(
                "",
                schedules_op.fire,
                name,
                default_ttl_us=microseconds(context.default_ttl),
                default_max_attempts=options.default_max_attempts,
            )
            for done in effects:
                context.apply(done)
            if count:
                context.log.debug("schedule %s fired %d times", name, count)
            fired += count
        earliest = context.run_op("", schedules_op.earliest_fire)
        later = context.now() + SCHEDULES_RECHECK_US
        context.schedules_look_at = later if earliest is None else min(earliest, later)
        return fired

    def fire_due_schedules(self) -> int:
        """:meth:`fire_schedules` when a fire may be due: at the earliest next
        fire the last look found, or :data:`SCHEDULES_RECHECK_US` after it
        (a schedule defined or resumed by another process since), or at once
        after this client defined or resumed one. The maintenance loop's job
        (every second): an idle client reads the schedules every 10 s, not
        every second."""
        if self._context.now() < self._context.schedules_look_at:
            return 0
        return self.fire_schedules()

    def add_purge_pass(self, run: Callable[[], int]) -> None:
        """Run ``run`` after the TTL purge in every maintenance pass (the
        operator's calls add dead-letter retention); it returns how many rows
        it deleted."""
        self._purge_passes.append(run)

    def purge_pass(self) -> int:
        """The purge job of a maintenance pass, in ``run_maintenance()`` and in
        ``start()``'s loop: TTL purge, then what :meth:`add_purge_pass` added."""
        return self.purge_expired() + sum(run() for run in self._purge_passes)

    def reap_leases(self) -> int:
        """Release deliveries whose lease expired; dead-letter those out of attempts.

        Returns how many deliveries it changed. Tokens of reaped leases stop
        working (:class:`~novaque.LeaseLost`).
        """
        return self._reap(None)

    def reap_since_last_pass(self) -> int:
        """:meth:`reap_leases` as the maintenance loop runs it: the leases
        expired since its last pass, and all of them once a minute (see
        ``novaque._claim_cursors.ReapCursor``)."""
        now = self._context.now()
        since = self._reap_cursor.start(now)
        changed = self._reap(since)
        self._reap_cursor.passed(since, now)
        return changed

    def _reap(self, since: int | None) -> int:
        changed = self._context.in_batches(
            maintain.reap_batch, self._context.options.maintenance_batch, since
        )
        if changed:
            self._context.log.debug("reaped %d expired leases", changed)
        return changed

    def purge_expired(self) -> int:
        """Delete messages past their TTL with all their deliveries (dead included).

        On a channel with ``dead_letter_expired`` (``ensure_channel`` setting,
        else ``Options.dead_letter_expired``), a delivery still live when its
        message expires (ready, pending, in flight or deferred) becomes a dead
        letter with reason ``"expired"`` instead (counted ``dead``; its lease,
        if any, is lost), and the message is kept ``Options.default_ttl``
        longer for it: the letters go by the channel's dead-letter bounds, or
        with their message at that later expiry. Works in batches of
        ``Options.maintenance_batch``; returns how many messages it deleted.
        """
        return self._context.in_batches(
            maintain.purge_batch,
            self._context.options.maintenance_batch,
            dead_letter_expired=self._context.options.dead_letter_expired,
            default_ttl_us=microseconds(self._context.default_ttl),
        )

    def flush_stats(self) -> None:
        """Write the buffered counter deltas to the database now.

        Safe to run in many processes at once: each adds its own deltas with
        an upsert. A failed flush keeps the deltas for the next one.
        """
        taken = self._context.stats.take()
        if not taken:
            return
        try:
            self._context.run_op("", maintain.flush_stats, *maintain.stats_rows(taken))
        except BaseException:
            self._context.stats.give_back(taken)
            raise

    def prune_stats(self) -> int:
        """Delete day buckets older than ``Options.stats_retention_days``, and
        minute buckets (:meth:`minute_counters`) older than 24 hours; return how
        many day buckets went."""
        now = self._context.now()
        first_kept = day_of(now) - timedelta(days=self._context.options.stats_retention_days - 1)
        first_minute = (now - MINUTES_KEPT_US) // MINUTE_US * MINUTE_US
        return self._context.run_op("", maintain.prune_stats, first_kept, first_minute)

    def look_behind_claim_cursors(self) -> int:
        """Look behind the claim cursors of this client's channels due for it
        (see :mod:`novaque._claim_cursors`); return how many had a claimable
        delivery there (their next claim reads from the first entry)."""
        cursors = self._context.cursors
        now = self._context.now()
        found_in = 0
        for channel_id, since in cursors.to_look_behind(now):
            found = self._context.run_op("", consume.claimable_behind, channel_id, since)
            cursors.looked_behind(channel_id, since, now, found)
            found_in += found
        return found_in

    def forget_stale_consumers(self) -> int:
        """Drop the consumers online (:meth:`list_consumers`) not seen for three
        ``Options.consumer_heartbeat`` by the clock (their process died); return
        how many. Part of :meth:`run_maintenance`, and of the maintenance loop
        once per heartbeat."""
        before = self._context.now() - microseconds(3 * self._context.consumer_heartbeat)
        return self._context.run_op("", presence.forget_stale, before)

    def close(self) -> None:
        """Flush the buffered stats, then close the connections of the engines
        novaque opened itself (the end of ``shutdown()``; calls after it open
        new ones)."""
        try:
            self.flush_stats()
        except Exception as exc:
            self._context.log.error(
                "could not flush stats at shutdown (kept in memory): %s",
                _validate.error_text(exc),
            )
        self._context.close_engines()
