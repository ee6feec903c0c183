"""The operator's calls: counters and backlog, dead letters, browsing, replay,
prune, compact.

:class:`Operations` holds them, over a client's :class:`~novaque._context.Context`;
:class:`novaque.Client` composes one and forwards its calls to it. Reads never
create a topic or a channel: a missing topic raises
:class:`~novaque.TopicNotFound`, a missing channel of an existing topic
:class:`~novaque.ChannelNotFound`.

The work is done by the operations of :mod:`novaque.ops.browse` and
:mod:`novaque.ops.maintain`; their statements (:mod:`novaque.ops._sql`) are
portable SQLAlchemy Core, built once at import from bound parameters. What
differs per database (deleting with or without RETURNING, EXPLAIN) goes
through :mod:`novaque.dialects`.

Counters changed by these calls (``requeued``, ``published``, ``purged``) are
recorded with the transaction and buffered only once it commits, like every
other counter; reads of counters see what was flushed (:meth:`flush_stats`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from datetime import date, datetime

from novaque import _validate
from novaque._context import Context
from novaque._maintenance import Maintenance
from novaque._stats import MINUTE_US, MINUTES_KEPT_US
from novaque._time import to_us
from novaque._waits import Waits
from novaque.dialects import FileSpace
from novaque.models import Backlog, ConsumerInfo, Counters, DeadLetter, MessageInfo
from novaque.ops import browse, maintain, presence
from novaque.ops._sql import BACKLOG, DEAD_PAGE
from novaque.options import check_int, microseconds

__all__ = ["BACKLOG", "DEAD_PAGE", "Operations", "byte_size"]


class Operations:
    """Stats, backlog, dead letters, browsing, replay, prune and compact (see the
    how-to pages of docs/guide.md): a part of :class:`novaque.Client`, which
    forwards its calls.

    It works through the client's context (``context``: its transactions,
    clock and options) and adds dead-letter retention to the purge pass of
    the client's ``maintenance``, and on SQLite a bounded step of giving free
    pages back to the file system.
    """

    def __init__(self, context: Context, maintenance: Maintenance) -> None:
        self._context = context
        maintenance.add_purge_pass(self.enforce_dead_retention)
        if context.dialect.keeps_free_pages:
            maintenance.add_purge_pass(self._return_free_pages)

    # -- counters -------------------------------------------------------------------------

    def channel_counters(
        self,
        topic: str,
        channel: str,
        *,
        since: date | None = None,
        until: date | None = None,
    ) -> Counters:
        """A channel's counters summed over the UTC days ``since``..``until`` (inclusive).

        Counters are buffered in each process and flushed every
        ``Options.stats_flush_interval``; this reads what was flushed. Call
        :meth:`flush_stats` first for this process's latest counts.
        """
        first, last = _validate.day_range(since, until)
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        return self._context.run_op("", browse.channel_counters, topic, channel, first, last)

    def topic_counters(
        self,
        topic: str,
        *,
        since: date | None = None,
        until: date | None = None,
    ) -> Counters:
        """The counters of every channel of ``topic`` added up (see :meth:`channel_counters`)."""
        first, last = _validate.day_range(since, until)
        _validate.name(topic, "topic")
        return self._context.run_op("", browse.topic_counters, topic, first, last)

    def daily_counters(
        self,
        topic: str,
        channel: str,
        *,
        since: date | None = None,
        until: date | None = None,
    ) -> list[tuple[date, Counters]]:
        """One ``(day, Counters)`` per UTC day with activity, oldest first (for charts).

        Reads flushed counters, like :meth:`channel_counters`.
        """
        first, last = _validate.day_range(since, until)
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        return self._context.run_op("", browse.daily_counters, topic, channel, first, last)

    def minute_counters(
        self, topic: str, channel: str, *, since: datetime | None = None
    ) -> list[tuple[datetime, Counters]]:
        """One ``(minute, Counters)`` per UTC minute with activity, oldest first
        (live throughput, for charts of the last hour).

        Each event counts in its minute by the client's clock; minutes are
        aware UTC datetimes on a whole minute. ``since`` (an aware datetime)
        is inclusive: the minute it falls in is the first one read; without
        it, the last 24 hours. Minute buckets are kept 24 hours (the stats
        prune deletes older ones, at most ``Options.stats_prune_interval``
        late). Reads flushed counters, like :meth:`channel_counters`: call
        :meth:`flush_stats` first for this process's latest counts.
        """
        if since is None:
            first = self._context.now() - MINUTES_KEPT_US
        else:
            first = to_us(_validate.moment(since, "since"))
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        first = first // MINUTE_US * MINUTE_US
        return self._context.run_op("", browse.minute_counters, topic, channel, first)

    # -- consumers online ---------------------------------------------------------------------

    def list_consumers(
        self, topic: str | None = None, channel: str | None = None
    ) -> list[ConsumerInfo]:
        """The consumers running now, in every process on this database, by
        topic, channel and start (``topic``/``channel``: only those).

        Each started consumer registers itself, refreshes its row every
        ``Options.consumer_heartbeat`` (with its current ``in_flight``) and
        removes it at shutdown; a consumer whose process died is listed until
        maintenance drops it, three heartbeats after its last one (by the
        clock). A name no consumer runs on gives ``[]`` (no
        :class:`~novaque.TopicNotFound`: the list is about processes).
        """
        if topic is not None:
            _validate.name(topic, "topic")
        if channel is not None:
            _validate.name(channel, "channel")
        return self._context.run_op("", presence.list_consumers, topic, channel)

    # -- backlog ------------------------------------------------------------------------------

    def channel_backlog(self, topic: str, channel: str) -> Backlog:
        """The channel's live deliveries by state, counted now from the rows.

        Index-only range counts on ``ix_novaque_deliveries_state``
        (channel, state, visible_at), one per state (and one for the
        deliveries waiting behind their group's head), in one statement after
        the channel lookup: exact, with a cost that grows with the channel's
        live deliveries (60-70 ms per million on PostgreSQL) and not with
        other channels' rows.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        return self._context.run_timed("", browse.channel_backlog, topic, channel)

    def topic_backlog(self, topic: str) -> dict[str, Backlog]:
        """The backlog of each channel of ``topic``, by channel name (sorted).

        Every channel is listed, idle ones with a zero :class:`~novaque.Backlog`; add
        them up with ``+`` for the topic's total. One statement for all
        channels (the same index-only counts per channel).
        """
        _validate.name(topic, "topic")
        return self._context.run_timed("", browse.topic_backlog, topic)

    # -- dead letters ------------------------------------------------------------------------

    def list_dead(
        self,
        topic: str,
        channel: str,
        *,
        limit: int = 100,
        after_id: int | None = None,
        with_body: bool = False,
    ) -> list[DeadLetter]:
        """A page of the channel's dead letters in delivery-id order.

        For the next page pass the last ``delivery_id`` as ``after_id``
        (keyset pagination: stable while letters come and go). ``body`` is
        filled only ``with_body``; ``body_len`` always is.
        """
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        page = _validate.page_limit(limit)
        after = _validate.after_id(after_id)
        return self._context.run_op("", browse.list_dead, topic, channel, page, after, with_body)

    def requeue_dead(
        self,
        topic: str,
        channel: str,
        ids: Iterable[int] | None = None,
        *,
        to_channel: str | None = None,
        limit: int | None = None,
        died_before: datetime | None = None,
        rate: float | None = None,
    ) -> int:
        """Make dead letters ready again, now; return how many were requeued.

        ``ids`` are delivery ids (from :meth:`list_dead`); ``None`` takes
        every dead letter of the channel. Ids that are not dead letters of this
        channel are skipped. Each one gets a fresh attempt budget (attempts
        reset to 0) and a fresh TTL: its message is kept at least
        ``Options.default_ttl`` from now. Counted as ``requeued``. On an
        ordered channel a letter keeps its place in its group (its delivery
        id): it goes before the later deliveries of the group that wait,
        and right after one that is leased.

        - ``to_channel`` (a channel of the same topic; missing:
          :class:`~novaque.ChannelNotFound`) moves the letters there instead:
          ready, attempts reset, fresh TTL, the same delivery id (its place in
          a FIFO channel), the target's ``max_attempts`` setting if it has
          one; the target's filter is not asked. A letter whose message
          already has a delivery in ``to_channel`` is deleted (counted
          ``purged``) and not counted in the result. A move counts ``purged``
          in the letter's channel and ``published`` and ``requeued`` in the
          target, so ``published == acked + purged + live`` holds in both.
        - ``limit`` (an int >= 1): at most that many, oldest died first
          (``died_at``, then delivery id).
        - ``died_before`` (an aware datetime): only letters that died earlier.
        - ``rate`` (letters per second, a number > 0): at most that many per
          second, in chunks of at most one second's worth (and at most
          ``Options.maintenance_batch``), paced in real time.

        Works in transactions of ``Options.maintenance_batch`` letters (one
        per chunk), so a crash leaves every letter either requeued (moved) or
        not, never half.
        """
        return sum(
            self.dead_letter_chunks(
                "requeue",
                topic,
                channel,
                ids,
                to_channel=to_channel,
                limit=limit,
                died_before=died_before,
                rate=rate,
            )
        )

    def delete_dead(
        self,
        topic: str,
        channel: str,
        ids: Iterable[int] | None = None,
        *,
        limit: int | None = None,
        died_before: datetime | None = None,
    ) -> int:
        """Delete dead letters; return how many were deleted.

        ``ids`` are delivery ids; ``None`` takes every dead letter of the
        channel. ``limit`` (an int >= 1): at most that many, oldest died first;
        ``died_before`` (an aware datetime): only letters that died earlier.
        Messages stay (browsable until TTL). Deleted letters count as
        ``purged``, like every delivery that leaves without an ack, so
        ``published == acked + purged + live`` holds over a channel's life.
        Works in transactions of ``Options.maintenance_batch`` letters.
        """
        return sum(
            self.dead_letter_chunks(
                "delete", topic, channel, ids, limit=limit, died_before=died_before
            )
        )

    def dead_letter_chunks(
        self,
        action: browse.DeadAction,
        topic: str,
        channel: str,
        ids: Iterable[int] | None,
        *,
        to_channel: str | None = None,
        limit: int | None = None,
        died_before: datetime | None = None,
        rate: float | None = None,
    ) -> Iterator[int]:
        """Check the arguments of :meth:`requeue_dead` / :meth:`delete_dead` (at
        once), then requeue, move or delete the letters chunk by chunk, one
        transaction each, yielding how many each chunk did (the CLI's progress
        bar counts them)."""
        _validate.name(topic, "topic")
        _validate.name(channel, "channel")
        wanted = None if ids is None else _validate.ids(ids)
        if to_channel is not None:
            _validate.name(to_channel, "to_channel")
        most = None if limit is None else check_int(limit, "limit", 1, _validate.MAX_ID)
        before = None
        if died_before is not None:
            before = to_us(_validate.moment(died_before, "died_before"))
        per_second = None if rate is None else _validate.rate(rate)
        batch = self._context.options.maintenance_batch
        if per_second is not None:
            batch = max(1, min(batch, int(per_second)))  # one second's worth at most
        channel_id, target_id = self._context.run_op(
            "", browse.dead_channels, topic, channel, to_channel
        )
        work = browse.DeadWork(
            action, topic, channel_id, microseconds(self._context.default_ttl), before, target_id
        )
        return self._dead_chunks(work, wanted, most, batch, per_second)

    def _dead_chunks(
        self,
        work: browse.DeadWork,
        wanted: list[int] | None,
        most: int | None,
        batch: int,
        per_second: float | None,
    ) -> Iterator[int]:
        if most is not None:
            # The letters to take, chosen once (one sort of the dead range),
            # then worked through by id, each checked again as it is locked.
            wanted = self._context.run_op(
                "", browse.oldest_dead, work.channel_id, wanted, work.died_before, most
            )
        pace = _Pace(per_second, self._context.waits)
        if wanted is not None:
            for i in range(0, len(wanted), batch):
                pace.wait()
                chunk = sorted(wanted[i : i + batch])
                _, done, _, effects = self._context.run_timed(
                    "", browse.dead_batch, work, chunk, 0, batch
                )
                self._context.apply(effects)
                pace.took(len(chunk))
                yield done
            return
        after = 0
        while True:
            pace.wait()
            seen, done, after, effects = self._context.run_timed(
                "", browse.dead_batch, work, None, after, batch
            )
            self._context.apply(effects)
            pace.took(seen)
            yield done
            if seen < batch:
                return

    def enforce_dead_retention(self) -> int:
        """Delete dead letters beyond their channel's bounds; return how many.

        Bounds are per channel (``ensure_channel(dead_max_age=, dead_max_count=,
        dead_max_bytes=)``), defaulting to ``Options.dead_max_age`` /
        ``Options.dead_max_count`` / ``Options.dead_max_bytes``; ``None`` means
        bounded by TTL only. Letters older than ``dead_max_age`` (by
        ``died_at``) go, then all but the newest ``dead_max_count``, then all
        but the newest whose bodies total at most ``dead_max_bytes`` bytes,
        oldest died first, in transactions of ``Options.maintenance_batch``.
        Only dead rows are touched; they count as ``purged``. Part of
        :meth:`run_maintenance`.
        """
        default_age = self._context.options.dead_max_age
        age_default = None if default_age is None else _validate.dead_max_age_us(default_age)
        count_default = self._context.options.dead_max_count
        bytes_default = self._context.options.dead_max_bytes
        bounded = self._context.run_op(
            "",
            maintain.dead_bounds,
            age_default is None and count_default is None and bytes_default is None,
        )
        total = 0
        for channel_id, age, count, size in bounded:
            max_age = age if age is not None else age_default
            max_count = count if count is not None else count_default
            max_bytes = size if size is not None else bytes_default
            if max_age is not None:
                total += self._retire_older(channel_id, int(max_age))
            if max_count is not None:
                total += self._retire_beyond(channel_id, int(max_count))
            if max_bytes is not None:
                total += self._retire_bytes(channel_id, int(max_bytes))
        if total:
            self._context.log.debug("dead-letter retention deleted %d letters", total)
        return total

    def _retire_older(self, channel_id: int, max_age_us: int) -> int:
        batch = self._context.options.maintenance_batch
        return self._context.in_batches(maintain.retire_older_batch, channel_id, max_age_us, batch)

    def _retire_beyond(self, channel_id: int, keep: int) -> int:
        """Delete all but the newest ``keep`` dead letters (by died_at), oldest first.

        Everything older than the ``keep``-th newest letter stays older than it
        as letters keep dying, so concurrent passes never delete too many.
        """
        edge = self._context.run_op("", maintain.dead_boundary, channel_id, keep)
        if edge is None:
            return 0
        batch = self._context.options.maintenance_batch
        return self._context.in_batches(maintain.retire_beyond_batch, channel_id, edge, batch)

    def _retire_bytes(self, channel_id: int, max_bytes: int) -> int:
        """Delete the oldest died dead letters until the newest left total at
        most ``max_bytes`` body bytes.

        As for :meth:`_retire_beyond`, letters that die meanwhile are newer
        than the boundary: concurrent passes never delete too many.
        """
        edge = self._context.run_op("", maintain.dead_bytes_boundary, channel_id, max_bytes)
        if edge is None:
            return 0
        batch = self._context.options.maintenance_batch
        return self._context.in_batches(maintain.retire_beyond_batch, channel_id, edge, batch)

    # -- browsing -------------------------------------------------------------------------------

    def get_message(self, id: int) -> MessageInfo:
        """A stored message with the state of each of its live deliveries.

        A channel missing from ``deliveries`` has acked the message (or did not
        exist when it was published). :class:`~novaque.MessageNotFound` if no message
        has this id (never published, or purged by TTL or :meth:`prune`).
        """
        message_id = _validate.message_id(id)
        return self._context.run_timed("", browse.get_message, message_id)

    def list_messages(
        self,
        topic: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        after_id: int | None = None,
    ) -> list[MessageInfo]:
        """A page of ``topic``'s stored messages in id (publish) order, with their deliveries.

        ``since`` (inclusive) and ``until`` (exclusive) bound ``published_at``;
        both are aware datetimes. For the next page pass the last id as
        ``after_id``. Acked messages stay listed until their TTL.
        """
        _validate.name(topic, "topic")
        page = _validate.page_limit(limit)
        after = _validate.after_id(after_id)
        since_us = None if since is None else to_us(_validate.moment(since, "since"))
        until_us = None if until is None else to_us(_validate.moment(until, "until"))
        return self._context.run_timed(
            "", browse.list_messages, topic, since_us, until_us, page, after
        )

    def cancel(self, message_id: int) -> int:
        """Delete the message's deliveries that were never attempted; return how many.

        Those ready or pending (delayed, or waiting behind their group on an
        ordered channel) with ``attempts == 0`` and not leased; one snoozed on
        its first attempt counts as never attempted. Deliveries that were
        claimed at least once, leased, deferred or dead stay. Counted as
        ``purged`` in their channels; an ordered channel's group moves on to
        its next delivery. The message stays browsable until its TTL.
        :class:`~novaque.MessageNotFound` if no message has this id. One
        transaction.
        """
        wanted_id = _validate.message_id(message_id, "message_id")
        cancelled, effects = self._context.run_timed("", browse.cancel, wanted_id)
        self._context.apply(effects)
        return cancelled

    # -- replay ---------------------------------------------------------------------------------

    def replay(self, message_id: int, channels: Iterable[str] | None = None) -> int:
        """Deliver a stored message again; return how many deliveries were created.

        ``channels`` are names of the message's topic (``None``: every channel
        it has now, including ones created after the publish, a filtered one
        only if its filter is true for the message). Each new delivery is
        ready at once with a fresh attempt budget (the channel's
        ``max_attempts`` setting, else the message's); a channel that still
        holds a live delivery of the message (pending, ready, in flight,
        deferred or dead) gets none. The message is kept at least
        ``Options.default_ttl`` from now. One transaction; counted as
        ``published``.
        """
        wanted_id = _validate.message_id(message_id, "message_id")
        names = None if channels is None else _validate.names(channels, "channel")
        ttl_us = microseconds(self._context.default_ttl)
        created, effects = self._context.run_timed("", browse.replay, wanted_id, names, ttl_us)
        self._context.apply(effects)
        return created

    def replay_range(
        self,
        topic: str,
        since: datetime,
        until: datetime,
        channels: Iterable[str] | None = None,
    ) -> int:
        """:meth:`replay` every message of ``topic`` published in ``[since, until)``.

        One transaction for the whole range (its messages are locked while it
        runs, so keep ranges moderate); returns how many deliveries it created.
        """
        _validate.name(topic, "topic")
        first = to_us(_validate.moment(since, "since"))
        last = to_us(_validate.moment(until, "until"))
        names = None if channels is None else _validate.names(channels, "channel")
        ttl_us = microseconds(self._context.default_ttl)
        created, effects = self._context.run_timed(
            "", browse.replay_range, topic, first, last, names, ttl_us
        )
        self._context.apply(effects)
        return created

    # -- prune ----------------------------------------------------------------------------------

    def prune(self, before: datetime, *, dry_run: bool = False) -> int:
        """Delete every message published before ``before``, with its deliveries.

        Returns how many messages were deleted (with ``dry_run``: would be,
        and nothing changes). Works topic by topic in transactions of
        ``Options.maintenance_batch`` messages, so it never holds long locks.
        Deleted deliveries, dead ones included, count as ``purged``.
        """
        cutoff = to_us(_validate.moment(before, "before"))
        topic_ids = self._context.run_op("", browse.topic_ids)
        if dry_run:
            return self._context.run_op("", browse.prune_count, topic_ids, cutoff)
        batch = self._context.options.maintenance_batch
        total = sum(
            self._context.in_batches(browse.prune_batch, topic_id, cutoff, batch)
            for topic_id in topic_ids
        )
        if total:
            self._context.log.info(
                "pruned %d messages published before %s", total, before.isoformat()
            )
        return total

    # -- space ----------------------------------------------------------------------------------

    def compact(self, *, full: bool = False) -> int:
        """Give the database file's free space back to the file system (SQLite);
        return how many bytes the database shrank by.

        Deleted rows (acked messages past their TTL, pruned ones, dead
        letters gone) leave free pages in an SQLite file: later writes reuse
        them, but the file does not shrink by itself. Databases that
        :meth:`migrate` (or ``novaque migrate``) creates are in SQLite's
        incremental auto-vacuum mode, and maintenance gives their free pages
        back a bounded number per pass; ``compact()`` gives back all of them
        now, in transactions of that bounded size (other writers go in
        between), then checkpoints the write-ahead log so that the file on
        disk shrinks now and the log is emptied. On a database that is not in
        incremental mode (created by an older novaque, or before novaque's
        tables were added to it) it gives nothing back and logs a WARNING
        saying how much ``full=True`` would.

        ``full=True`` runs SQLite's ``VACUUM`` instead: the whole database is
        rewritten without its free pages, and a database in SQLite's default
        mode (none) is switched to incremental mode on the way, so that
        maintenance keeps it compact from then on (one in full auto-vacuum
        mode keeps it). It holds the write lock for its whole duration: every
        writer, of this process or another, waits until it ends (novaque's
        calls in this process wait their turn, other connections up to their
        busy timeout, novaque's 30 s), which on a large file takes seconds or
        more, and it needs free disk space about the size of the database
        while it runs. Use it once on an older database, or after deleting
        most of a large one.

        PostgreSQL and MySQL/MariaDB manage their own space (autovacuum,
        InnoDB): there ``compact`` does nothing and returns 0.
        """
        if not isinstance(full, bool):
            raise TypeError(f"full must be True or False, got {type(full).__name__}")
        context = self._context
        dialect = context.dialect
        if not dialect.keeps_free_pages:
            return 0
        context.ready()
        if full:
            freed = context.executor.without_transaction(dialect.vacuum)
        else:
            freed = sum(self._free_page_steps())
        context.executor.without_transaction(dialect.checkpoint)
        left = context.run_op("", maintain.space)
        if left.free and not left.incremental:
            context.log.warning(
                "%s of free pages stay in the database file: it is not in SQLite's "
                "incremental auto-vacuum mode (it was created by an older novaque, or "
                "held tables before novaque's); compact(full=True) (novaque compact --full) "
                "gives them back and switches it, holding the write lock while it rewrites "
                "the file",
                byte_size(left.free),
            )
        context.log.info("compacted the database: %s given back", byte_size(freed))
        return freed

    def _free_page_steps(self) -> Iterator[int]:
        """Give the free pages back in transactions of the dialect's bounded
        size, yielding how many bytes each gave back, until none is left; at
        most as many steps as the pages free at the start need (writers may
        free more meanwhile)."""
        context = self._context
        start = context.run_op("", maintain.space)
        for _ in range(-(-start.free // start.step) if start.incremental else 0):
            freed = context.run_op("", maintain.return_free_pages)
            if not freed:
                return
            yield freed

    def _space(self) -> FileSpace | None:
        """The database file's size and free space; None where the database
        manages its own (PostgreSQL, MySQL/MariaDB)."""
        if not self._context.dialect.keeps_free_pages:
            return None
        return self._context.run_op("", maintain.space)

    def _return_free_pages(self) -> int:
        """Maintenance: give back one bounded step of the file's free pages
        (SQLite in incremental auto-vacuum mode). Deletes no rows: returns 0."""
        freed = self._context.run_op("", maintain.return_free_pages)
        if freed:
            self._context.log.debug("gave %d bytes of free pages back to the file system", freed)
        return 0


def byte_size(count: int) -> str:
    """``count`` bytes as people read them: ``0 bytes``, ``512 bytes``,
    ``4.0 KiB``, ``83.1 MiB``, ``1.2 GiB``."""
    if count < 1024:
        return f"{count} byte{'' if count == 1 else 's'}"
    size, unit = count / 1024, "KiB"
    for larger in ("MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, larger
    return f"{size:.1f} {unit}"


class _Pace:
    """Real-time pacing of work done in chunks: at most ``per_second`` items a
    second (None: no pacing), waiting through ``waits`` (never ``time.sleep``:
    the asyncio twin awaits the wait)."""

    def __init__(self, per_second: float | None, waits: Waits) -> None:
        self.per_second = per_second
        self.waits = waits
        self.start = time.monotonic()
        self.done = 0

    def took(self, items: int) -> None:
        self.done += items

    def wait(self) -> None:
        """Wait until the items taken so far are within the rate."""
        if self.per_second is None or not self.done:
            return
        left = self.start + self.done / self.per_second - time.monotonic()
        if left > 0 and math.isfinite(left):
            self.waits.event().wait(left)
