"""The change watchers of SQLite and MySQL/MariaDB: new deliveries seen by looking often.

Neither database pushes a wake-up to another connection (PostgreSQL's
``NOTIFY``, :mod:`~novaque.dialects.listen`). A watcher holds one connection
of its own per client (outside the pool, like the LISTEN connection) and looks
every ``interval`` seconds at a marker that is cheap to read and changes when
another connection commits: SQLite's ``PRAGMA data_version`` (a read of the
WAL index header, microseconds), MySQL's ``MAX(id)`` of the deliveries (one
dive into the primary key). Only when it changed does it read which topics got
deliveries with an id above the highest it has seen (a primary-key range scan
joined to the channels and topics), and return those topic names, as a
listener returns the notified ones.

It covers new rows only: a delivery that becomes due later (a delay, a retry's
backoff) is the consumers' own timer, as without the watcher. Deliveries are
numbered when inserted: on SQLite one writer at a time commits them in that
order; on MySQL a transaction may commit a lower id after a higher one was
seen, and that delivery is then found by the consumers' next claim (they claim
again at once after a batch) or poll, not by the watcher.

Every read is a transaction by itself (autocommit): on SQLite a read held open
would pin the WAL (no checkpoint could pass it), and on MySQL a REPEATABLE
READ snapshot would never see anything new.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from typing import Any, ClassVar

import sqlalchemy as sa

from novaque._tables import channels, deliveries, topics
from novaque.dialects.listen import _await, readable

_TOPICS_SINCE = (
    f"SELECT t.name, MAX(d.id) FROM {deliveries.name} d "
    f"JOIN {channels.name} c ON c.id = d.channel_id "
    f"JOIN {topics.name} t ON t.id = c.topic_id "
    "WHERE d.id > {param} GROUP BY t.name"
)
_NEWEST = f"SELECT MAX(id) FROM {deliveries.name}"


class ChangeWatcher:
    """A :class:`~novaque.dialects.NotifyListener` that polls one connection.

    Subclasses say what the change marker is (:meth:`_changed`) and how the
    driver spells a parameter. The connection is opened the way the engine
    opens its own (its ``connect_args``, ``creator`` and connect events: the
    pragmas on SQLite), then detached from the pool for good and switched to
    autocommit. Waits between looks are a ``select`` on a private socket pair,
    so :meth:`interrupt` ends one at once; ``awaited``: for the asyncio twin,
    inside SQLAlchemy's greenlet bridge, every statement and wait awaited.
    """

    #: The driver's parameter marker.
    param: ClassVar[str] = "?"

    def __init__(self, engine: sa.Engine, interval: float, *, awaited: bool = False) -> None:
        self.interval = interval
        self._awaited = awaited
        self._topics_since = _TOPICS_SINCE.format(param=self.param)
        self._wake_r, self._wake_w = socket.socketpair()
        self._conn: Any = None
        #: The highest delivery id seen: only deliveries above it are news.
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
            cursor.execute(sql, params)
            # Read to the end: a statement left unfinished would keep its
            # read transaction open on SQLite.
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            cursor.close()

    def look(self) -> list[str]:
        """One look: the topics with deliveries above :attr:`last`, if the marker moved."""
        if not self._changed():
            return []
        found = self._query(self._topics_since, (self.last,))
        if found:
            self.last = max(self.last, *(int(row[1]) for row in found))
        return [str(row[0]) for row in found]

    def wait(self, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.look()
            if found:
                return found
            left = deadline - time.monotonic()
            if left <= 0 or self._pause(min(self.interval, left)):
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
    """``MAX(id)`` of the deliveries, above the highest id seen: new rows."""

    param = "%s"

    def _opened(self) -> None:
        #: The server's id of the connection (``KILL`` takes it).
        self.session_id = int(self._query("SELECT CONNECTION_ID()")[0][0])
        self._probed = 0

    def _changed(self) -> bool:
        self._probed = self._newest()
        return self._probed > self.last

    def look(self) -> list[str]:
        found = super().look()
        # Rows above ``last`` gone already (acked meanwhile) are no news next time.
        self.last = max(self.last, self._probed)
        return found
