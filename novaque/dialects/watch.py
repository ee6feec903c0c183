"""The change watchers of SQLite and MySQL/MariaDB: new messages seen by looking often.

Neither database pushes a wake-up to another connection (PostgreSQL's
``NOTIFY``, :mod:`~novaque.dialects.listen`). A watcher holds one connection
of its own per client (outside the pool, like the LISTEN connection) and looks
often (how often: below) at a marker that is cheap to read and changes when
another connection commits: SQLite's ``PRAGMA data_version`` (a read of the
WAL index header, microseconds), MySQL's ``MAX(id)`` of the messages (one
dive into the primary key). Only when it changed does it read which topics
with channels got messages with an id above the highest it has seen (a
primary-key range scan joined to the topics), and return those topic names,
as a listener returns the notified ones.

Messages, not deliveries: an ack deletes its delivery, and while some session
holds a snapshot open InnoDB keeps every deleted row, so ``MAX(id)`` of the
deliveries of a drained queue would step back over every delivery acked since
that snapshot began, at every look. A message stays until its retention ends,
so the newest ones are there to read.

It covers new messages only: a delivery that becomes due later (a delay, a
retry's backoff) is the consumers' own timer, as without the watcher, and so
is one a replay adds to an earlier message. Messages are numbered when
inserted: on SQLite one writer at a time commits them in that order; on MySQL
a transaction may commit a lower id after a higher one was seen, and that
message is then found by the consumers' next claim (they claim again at once
after a batch) or poll, not by the watcher.

Every read is a transaction by itself (autocommit): on SQLite a read held open
would pin the WAL (no checkpoint could pass it), and on MySQL a REPEATABLE
READ snapshot would never see anything new.

How often it looks (:class:`Pace`): every ``interval`` (``Options.watch_interval``,
2 ms) while messages move, less and less often as they stop, down to every
``idle_interval`` (``Options.watch_idle_interval``, 200 ms) when nothing
moved for a while. After a look that found nothing, the watcher waits a tenth
of the time since the last news (:data:`QUIET_SHARE`), but at least
``interval`` and at most ``idle_interval``: the waits grow geometrically,
each about 1.1 times the one before. News is a look that found new
messages (of any topic), or a hint of the process that messages move in it
(:meth:`ChangeWatcher.hurry`: a consumer's claim or a long poll's fetch that
got messages); it makes the watcher look every ``interval`` again, at once
(a hint ends a long wait). So:

- a steady stream of deliveries up to 10 ``interval`` apart (20 ms by
  default) is seen within ``interval`` of each, as without any back-off;
  one with longer gaps within a tenth of the gap;
- the first delivery after a quiet spell of at least 10 ``idle_interval``
  (two seconds by default) is seen within ``idle_interval``, once; those
  that follow it closely, within ``interval`` again;
- an idle client looks ``1 / idle_interval`` times a second: on MySQL one
  ``SELECT MAX(id)`` each (5 statements a second by default, against 500 at
  2 ms), on SQLite a ``PRAGMA data_version``, a read of the file's WAL index
  in the process (no server). From the last news, it takes about 60 looks to
  get there (10 at ``interval``, 50 growing).

Why 200 ms by default: an idle consumer claims every ``poll_interval``
(0.2 s) whatever the watcher does, and that claim finds a new message too.
Looking twice as often halves the worst wait for the first message after a
quiet spell, for twice the watcher's statements; at the same pace an idle
client stays within 20 statements a second on MySQL.

A publish in the process wakes the local consumers of its topic without the
watcher (the client's ``_wake``), and is no hint by itself: after a quiet
second, a request published here whose reply comes from another process
gets that reply seen within ``idle_interval``. An ``idle_interval`` at or
below ``interval`` keeps the watcher at ``interval`` always (no back-off).
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Callable
from typing import Any, ClassVar

import sqlalchemy as sa

from novaque._tables import channels, messages, topics
from novaque.dialects.listen import _await, readable

#: The topics with channels that got messages above ``{param}``, read from
#: the messages' primary key first (``{hint}`` and ``{join}``: MySQL's index
#: hint and STRAIGHT_JOIN keep that plan, where one from the topics would
#: read each topic's messages through its index from the first, and one with
#: statistics taken on a small table would read them all).
_TOPICS_SINCE = (
    f"SELECT t.name, MAX(m.id) FROM {messages.name} m {{hint}}"
    f"{{join}} {topics.name} t ON t.id = m.topic_id "
    f"WHERE m.id > {{param}} AND EXISTS (SELECT 1 FROM {channels.name} c WHERE c.topic_id = t.id) "
    "GROUP BY t.name"
)
_NEWEST = f"SELECT MAX(id) FROM {messages.name}"

#: After a look that found nothing, the watcher waits this share of the time
#: since its last news (within its two intervals): a delivery after a quiet
#: spell is seen within a tenth of that spell.
QUIET_SHARE = 0.1


class Pace:
    """When the change watcher looks next: every ``interval`` after news, then
    less and less often, down to every ``idle_interval``.

    A pure schedule: it reads no clock, every call is told the time (seconds
    on one monotonic scale), so the schedule is tested without waiting.
    """

    def __init__(self, interval: float, idle_interval: float, now: float) -> None:
        self.interval = interval
        #: The longest wait (never below ``interval``: no back-off then).
        self.idle_interval = max(idle_interval, interval)
        #: When the last news came (the start counts as news: something may
        #: have been published while nobody watched).
        self.news_at = now

    def news(self, now: float) -> None:
        """News at ``now`` (new messages found, or messages moving in the
        process): look every ``interval`` again."""
        self.news_at = max(self.news_at, now)

    def wait(self, now: float) -> float:
        """Seconds to wait after a look at ``now`` that found nothing: a tenth
        of the quiet time since the last news, within the two intervals."""
        quiet = max(0.0, now - self.news_at)
        return min(self.idle_interval, max(self.interval, quiet * QUIET_SHARE))


class ChangeWatcher:
    """A :class:`~novaque.dialects.NotifyListener` that polls one connection.

    Subclasses say what the change marker is (:meth:`_changed`) and how the
    driver spells a parameter. The connection is opened the way the engine
    opens its own (its ``connect_args``, ``creator`` and connect events: the
    pragmas on SQLite), then detached from the pool for good and switched to
    autocommit. It looks every ``interval`` seconds while there is news and
    backs off to every ``idle_interval`` (None: ``interval``) when there is
    none (:class:`Pace`). Waits between looks are a ``select`` on a private
    socket pair, so :meth:`interrupt` ends one at once, and so does
    :meth:`hurry` one longer than ``interval``; ``awaited``: for the asyncio
    twin, inside SQLAlchemy's greenlet bridge, every statement and wait
    awaited.
    """

    #: The driver's parameter marker.
    param: ClassVar[str] = "?"
    #: How the topics query reads the messages, and joins the topics to them.
    hint: ClassVar[str] = ""
    join: ClassVar[str] = "JOIN"

    def __init__(
        self,
        engine: sa.Engine,
        interval: float,
        *,
        idle_interval: float | None = None,
        awaited: bool = False,
    ) -> None:
        self.interval = interval
        self._awaited = awaited
        self._topics_since = _TOPICS_SINCE.format(param=self.param, hint=self.hint, join=self.join)
        self._wake_r, self._wake_w = socket.socketpair()
        self._conn: Any = None
        #: The clock of the schedule (tests replace it, and :meth:`_pause`).
        self._clock: Callable[[], float] = time.monotonic
        idle = interval if idle_interval is None else idle_interval
        self.pace = Pace(interval, idle, self._clock())
        #: :meth:`interrupt` was called; :meth:`hurry` was; the wait now under
        #: way is longer than ``interval`` (a hurry ends it).
        self._interrupted = False
        self._hurried = False
        self._slow = False
        #: Statements sent on the connection so far.
        self.statements = 0
        #: The highest message id seen: only messages above it are news.
        self.last = 0
        try:
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            proxied = engine.raw_connection()
            self._conn = proxied.dbapi_connection  # read before detach() forgets it
            proxied.detach()
            engine.dialect.set_isolation_level(self._conn, "AUTOCOMMIT")
            self._opened()
            self.last = self._newest()
        except BaseException:
            self.close()
            raise

    def _opened(self) -> None:
        """Set up the new connection (before the first look)."""

    def _changed(self) -> bool:
        """Whether something may have been committed since the last look."""
        raise NotImplementedError

    def _newest(self) -> int:
        row = self._query(_NEWEST)
        return int(row[0][0] or 0) if row else 0

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        cursor = self._conn.cursor()
        try:
            self.statements += 1
            cursor.execute(sql, params)
            # Read to the end: a statement left unfinished would keep its
            # read transaction open on SQLite.
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            cursor.close()

    def look(self) -> list[str]:
        """One look: the topics with messages above :attr:`last`, if the marker moved."""
        if not self._changed():
            return []
        found = self._query(self._topics_since, (self.last,))
        if found:
            self.last = max(self.last, *(int(row[1]) for row in found))
        return [str(row[0]) for row in found]

    def wait(self, timeout: float) -> list[str]:
        """Look, and look again on :attr:`pace`'s schedule, until a look finds
        something or ``timeout`` seconds passed (or :meth:`interrupt`)."""
        now = self._clock()
        deadline = now + timeout
        while True:
            if self._hurried:
                self._hurried = False
                self.pace.news(now)
            found = self.look()
            now = self._clock()
            if found:
                self.pace.news(now)
                return found
            left = deadline - now
            if left <= 0:
                return []
            pause = min(self.pace.wait(now), left)
            self._slow = pause > self.interval
            try:
                woken = self._pause(pause)
            finally:
                self._slow = False
            now = self._clock()
            if woken and self._interrupted:
                self._interrupted = False
                return []

    def _pause(self, timeout: float) -> bool:
        """Wait ``timeout`` seconds or until :meth:`interrupt`; True if interrupted."""
        if self._awaited:
            woken = "woken" in _await(readable({"woken": self._wake_r.fileno()}, timeout))
        else:
            ready, _, _ = select.select([self._wake_r], [], [], max(timeout, 0.0))
            woken = bool(ready)
        if woken:
            with contextlib.suppress(BlockingIOError):
                while self._wake_r.recv(4096):
                    pass
        return woken

    def interrupt(self) -> None:
        self._interrupted = True
        self._send()

    def hurry(self) -> None:
        """Messages move in this process: look every ``interval`` again, and
        end a wait longer than that now (a wait of ``interval`` runs on: its
        look comes soon enough)."""
        self._hurried = True
        if self._slow:
            self._send()

    def _send(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        for sock in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()


class SQLiteWatcher(ChangeWatcher):
    """``PRAGMA data_version`` changes when another connection commits to the file."""

    def _opened(self) -> None:
        self._version = self._data_version()

    def _data_version(self) -> int:
        return int(self._query("PRAGMA data_version")[0][0])

    def _changed(self) -> bool:
        version = self._data_version()
        changed, self._version = version != self._version, version
        return changed


class MySQLWatcher(ChangeWatcher):
    """``MAX(id)`` of the messages, above the highest id seen: new rows."""

    param = "%s"
    hint = "FORCE INDEX (PRIMARY) "
    join = "STRAIGHT_JOIN"

    def _opened(self) -> None:
        #: The server's id of the connection (``KILL`` takes it).
        self.session_id = int(self._query("SELECT CONNECTION_ID()")[0][0])
        self._probed = 0

    def _changed(self) -> bool:
        self._probed = self._newest()
        return self._probed > self.last

    def look(self) -> list[str]:
        found = super().look()
        # Rows above ``last`` gone already (purged meanwhile) are no news next time.
        self.last = max(self.last, self._probed)
        return found
