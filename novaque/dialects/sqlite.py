"""SQLite: claims in write transactions (BEGIN IMMEDIATE), publish straight to the driver."""

from __future__ import annotations

import contextlib
import sqlite3
import weakref
from collections.abc import Iterator
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import DBAPIError

from novaque._tables import STATE_READY, channels
from novaque.dialects.base import (
    NEXT_LANE,
    PLAIN_CHANNEL_SQL,
    ClaimedRow,
    Dialect,
    FileSpace,
    NotifyListener,
    _channel_lease,
    _claim_ids,
    _dotted,
    _driver_sql,
    _lease_values,
    by_token,
    claimed_rows,
    core,
    d,
    described,
    driver_statement,
    fan_out_one_sql,
    has_routed_sql,
    in_lanes,
    insert_message_sql,
    m,
    message_columns,
    publish_one_committed,
    table_of,
)
from novaque.dialects.params import AckClaimParams, ClaimParams, Driver, Link, Plain, PublishParams
from novaque.dialects.watch import SQLiteWatcher
from novaque.errors import UnsupportedDatabase

#: SQLite's driver (the sqlite3 module), for the driver path's statements.
_PYSQLITE = sqlite_dialect.pysqlite.dialect()

#: Engines whose every transaction begins with ``BEGIN IMMEDIATE`` (set up by
#: :func:`novaque.dialects.engines.configure_sqlite`): a transaction on one
#: holds the write lock from its start.
BEGINS_IMMEDIATE: weakref.WeakSet[sa.Engine] = weakref.WeakSet()


#: ``PRAGMA auto_vacuum``'s values: none (SQLite's default), incremental (1: full).
AUTO_VACUUM_NONE, AUTO_VACUUM_INCREMENTAL = 0, 2


def _pragma(raw: Any, name: str) -> int:
    cursor = raw.cursor()
    try:
        cursor.execute(f"PRAGMA {name}")
        return int(cursor.fetchone()[0])
    finally:
        cursor.close()


def _space(raw: Any) -> tuple[int, int, int, int]:
    """(pages, free pages, page size in bytes, auto_vacuum mode) of the
    database on the driver's connection ``raw``."""
    return (
        _pragma(raw, "page_count"),
        _pragma(raw, "freelist_count"),
        _pragma(raw, "page_size"),
        _pragma(raw, "auto_vacuum"),
    )


def _incremental_if_new(raw: Any) -> None:
    """Put a database that has no table yet in incremental auto-vacuum mode
    (on the driver's connection ``raw``, outside a transaction).

    The mode can change only before the first table, or by a rewrite of the
    file: the engine's first connection has already written the file's
    header (the switch to WAL), so an empty database takes it with a
    ``VACUUM`` (instant on an empty file). A database that holds tables, an
    application's or novaque's, keeps its mode (``compact(full=True)``
    switches it).
    """
    cursor = raw.cursor()
    try:
        cursor.execute("SELECT count(*) FROM sqlite_schema")
        if int(cursor.fetchone()[0]):
            return
        cursor.execute("PRAGMA auto_vacuum")
        if int(cursor.fetchone()[0]) == AUTO_VACUUM_INCREMENTAL:
            return
        cursor.execute("PRAGMA auto_vacuum = INCREMENTAL")
        cursor.execute("VACUUM")
    finally:
        cursor.close()


class SQLiteDialect(Dialect):
    name = "SQLite"
    floor = (3, 35)
    busy_timeout_ms = 30_000
    # Every transaction of novaque's takes SQLite's write lock up front.
    # Threads of one process wait for each other in the executor, where the
    # next one goes as soon as the lock is free, rather than in SQLite's busy
    # handler, which sleeps for growing intervals (up to 100 ms) between
    # tries: a consumer's claims and acks would otherwise stall each other.
    # Other processes still meet in the busy handler.
    one_writer = True
    # Another connection's commit changes PRAGMA data_version.
    supports_watch = True

    @classmethod
    def check_floor(cls, conn: sa.Connection) -> None:
        version = sqlite3.sqlite_version_info
        if version < cls.floor:
            raise UnsupportedDatabase(
                f"SQLite {_dotted(version)} is too old: novaque needs SQLite >= 3.35 "
                "(for UPDATE ... RETURNING)"
            )

    @contextlib.contextmanager
    def migration_session(self, conn: sa.Connection) -> Iterator[None]:
        # Rebuilding a table (how SQLite alters most things) drops it, and
        # dropping a parent table with foreign keys enforced deletes its
        # children: migrations run with enforcement off (it can only be
        # switched outside a transaction), and the result is checked before
        # the commit (check_migration).
        raw: Any = conn.connection.dbapi_connection
        _incremental_if_new(raw)
        raw.execute("PRAGMA foreign_keys = OFF")
        try:
            yield
        finally:
            raw.execute("PRAGMA foreign_keys = ON")

    # -- space ----------------------------------------------------------------------

    # Deleted rows leave free pages in the file, which later writes reuse
    # before it grows; SQLite gives them back to the file system only when
    # asked. Databases novaque creates are in incremental auto-vacuum mode
    # (set before their first table, see _incremental_if_new): free pages can
    # then be given back a few at a time, each step moving one page from the
    # end of the file into a free slot and truncating the file by a page.
    keeps_free_pages = True
    #: Free pages given back per transaction (:meth:`return_free_pages`): 2 MiB
    #: at SQLite's default 4 KiB pages. Each page moved costs about 25 µs and
    #: a frame of the write-ahead log, so a step holds the write lock about as
    #: long as a large publish_many (about 15 ms here, the commit's sync
    #: included) and adds about half of SQLite's 1000-frame auto-checkpoint
    #: threshold to the log. At one step per maintenance pass (every
    #: ``purge_interval``, 5 s) that still gives back up to 1.4 GiB an hour,
    #: beyond what a queue frees between its bursts.
    free_pages_step: ClassVar[int] = 512

    def space(self, conn: sa.Connection) -> FileSpace:
        size, free, page, mode = _space(conn.connection.dbapi_connection)
        incremental = mode == AUTO_VACUUM_INCREMENTAL
        return FileSpace(size * page, free * page, incremental, self.free_pages_step * page)

    def return_free_pages(self, conn: sa.Connection) -> int:
        raw: Any = conn.connection.dbapi_connection
        before, free, page, mode = _space(raw)
        if mode != AUTO_VACUUM_INCREMENTAL or not free:
            return 0
        cursor = raw.cursor()
        try:
            # One page per statement: the sqlite3 module steps a statement
            # that returns no columns only once, and each step of
            # incremental_vacuum gives back one page.
            for _ in range(min(free, self.free_pages_step)):
                cursor.execute("PRAGMA incremental_vacuum(1)")
        finally:
            cursor.close()
        return (before - _space(raw)[0]) * page

    def vacuum(self, conn: sa.Connection) -> int:
        raw: Any = conn.connection.dbapi_connection
        before, _, page, mode = _space(raw)
        cursor = raw.cursor()
        try:
            if mode == AUTO_VACUUM_NONE:
                # Changed by the rewrite that follows. A database in full
                # mode (it gives pages back at every commit) keeps it.
                cursor.execute("PRAGMA auto_vacuum = INCREMENTAL")
            cursor.execute("VACUUM")
        finally:
            cursor.close()
        after, _, page, _ = _space(raw)
        return max(0, before - after) * page

    def checkpoint(self, conn: sa.Connection) -> None:
        # TRUNCATE: every frame copied into the file (which is cut to the
        # database's pages), then the log emptied. Readers still on an older
        # snapshot are waited for up to the busy timeout; if one stays, the
        # file shrinks at a later checkpoint instead.
        raw: Any = conn.connection.dbapi_connection
        cursor = raw.cursor()
        try:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            cursor.fetchall()
        finally:
            cursor.close()

    def check_migration(self, conn: sa.Connection) -> None:
        broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
        if broken:
            raise RuntimeError(
                f"migration left {len(broken)} rows with a dangling foreign key "
                f"(first: {tuple(broken[0])}); rolled back"
            )

    def open_watcher(
        self,
        engine: sa.Engine,
        interval: float,
        *,
        idle_interval: float | None = None,
        awaited: bool = False,
    ) -> NotifyListener:
        return SQLiteWatcher(engine, interval, idle_interval=idle_interval, awaited=awaited)

    def is_retryable(self, exc: DBAPIError) -> bool:
        text = str(exc.orig).lower()
        return "database is locked" in text or "database is busy" in text

    def _insert(self, table: sa.Table) -> Any:
        return sqlite_dialect.insert(table)

    # Claim in one statement: RETURNING cannot join, but it can read each
    # leased delivery's message fields with primary-key subqueries.
    _claim_stmt = (
        sa.update(d)
        .where(d.c.id.in_(_claim_ids.scalar_subquery()))
        .values(_lease_values)
        .returning(
            d.c.id.label("delivery_id"),
            d.c.message_id,
            d.c.attempts,
            d.c.max_attempts,
            *message_columns,
            d.c.visible_at.label("until"),
            _channel_lease.label("channel_lease"),
            d.c.group_key.label("order_key"),
        )
    )

    def claim_statement(self) -> sa.ClauseElement:
        return self._claim_stmt

    def claim(self, link: Link, p: ClaimParams) -> list[ClaimedRow]:
        conn = core(link)
        return in_lanes(
            lambda q: claimed_rows(table_of(conn.execute(self._claim_stmt, q))),
            lambda q: conn.execute(NEXT_LANE, q).scalar(),
            p.bind(),
        )

    _insert_messages = insert_message_sql("?")
    _insert_message_returning = _insert_messages + " RETURNING id"
    _fan_out_one = fan_out_one_sql("?")
    _has_routed = has_routed_sql("?")
    _publish_one = (_insert_messages, _fan_out_one, _has_routed)
    _channel_ids = (
        f"SELECT id, {PLAIN_CHANNEL_SQL.format(c='')} FROM {channels.name} "
        "WHERE topic_id = ? ORDER BY id"
    )
    _fan_out_range = (
        f"INSERT INTO {d.name} (message_id, channel_id, state, visible_at, attempts, "
        f"max_attempts) SELECT m.id, c.id, {STATE_READY}, ?, 0, coalesce(c.max_attempts, ?) "
        f"FROM {m.name} m JOIN {channels.name} c ON c.topic_id = m.topic_id "
        f"WHERE m.id BETWEEN ? AND ? AND m.topic_id = ? AND {PLAIN_CHANNEL_SQL.format(c='c.')} "
        "ORDER BY m.id, c.id"
    )

    def publish_plain(self, link: Link, p: PublishParams) -> Plain:
        if isinstance(link, Driver):
            # novaque's own engine: the sqlite3 module begins no transaction itself.
            return publish_one_committed(link.dbapi, self._publish_one, p, begin="BEGIN IMMEDIATE")
        conn = link
        if conn.engine not in BEGINS_IMMEDIATE:
            # The caller's transaction: it may not hold the write lock yet.
            return super().publish_plain(conn, p)
        fields, bodies, visible = p.fields, p.bodies, p.visible
        keys = list(p.groups) if p.groups is not None else [None] * len(bodies)
        # novaque's own transaction began with BEGIN IMMEDIATE: nobody else
        # writes until it ends, so the AUTOINCREMENT ids of the rows inserted
        # by one executemany are consecutive, ending at last_insert_rowid(),
        # and the channels read now are the ones the INSERT ... SELECT sees.
        # The driver binds the rows in C: no per-row work in Python.
        topic_id = fields["topic_id"]
        common = (fields["headers"], fields["published_at"], fields["expires_at"])
        max_attempts = fields["max_attempts"]
        if len(bodies) == 1:
            # One message: two statements, each returning what is needed.
            message_id = int(
                conn.exec_driver_sql(
                    self._insert_message_returning,
                    (topic_id, bodies[0], *common, max_attempts, keys[0]),
                ).scalar_one()
            )
            counts: dict[int, int] = {}
            special = None
            for cid, routed_too in conn.exec_driver_sql(
                self._fan_out_one, (message_id, visible, max_attempts, topic_id, topic_id)
            ):
                counts[cid] = 1
                special = bool(routed_too)
            if special is None:  # no plain channel said: ask
                special = bool(conn.exec_driver_sql(self._has_routed, (topic_id,)).scalar())
            return Plain([message_id], counts, special)
        conn.exec_driver_sql(
            self._insert_messages,
            [(topic_id, b, *common, max_attempts, g) for b, g in zip(bodies, keys, strict=True)],
        )
        last = int(conn.exec_driver_sql("SELECT last_insert_rowid()").scalar_one())
        first = last - len(bodies) + 1
        found = conn.exec_driver_sql(self._channel_ids, (topic_id,)).all()
        plain = [r[0] for r in found if r[1]]
        if plain:
            conn.exec_driver_sql(
                self._fan_out_range, (visible, max_attempts, first, last, topic_id)
            )
        ids = list(range(first, last + 1))
        return Plain(ids, {cid: len(bodies) for cid in plain}, len(plain) < len(found))

    def driver_ops(self, sql_dialect: sa.Dialect) -> frozenset[str]:
        return frozenset({"publish_one", "ack_claim"})

    def ack_and_claim(
        self, link: Link, p: AckClaimParams
    ) -> tuple[set[tuple[int, str]], list[ClaimedRow]] | None:
        if not isinstance(link, Driver):
            return super().ack_and_claim(link, p)
        # The acks deleted (one statement per lease token), then the claim, in
        # one BEGIN IMMEDIATE transaction on the driver's connection.
        claim = driver_statement(self._claim_stmt, _PYSQLITE)
        done: set[tuple[int, str]] = set()
        cursor = link.dbapi.cursor()
        try:
            cursor.execute("BEGIN IMMEDIATE")
            for lease_token, ids in by_token(p.pairs).items():
                marks = ", ".join("?" * len(ids))
                cursor.execute(
                    f"DELETE FROM {d.name} WHERE lease_token = ? AND id IN ({marks}) RETURNING id",
                    (lease_token, *ids),
                )
                done.update((int(r[0]), lease_token) for r in cursor.fetchall())
            lane = driver_statement(NEXT_LANE, _PYSQLITE)

            def take(q: dict[str, Any]) -> list[ClaimedRow]:
                cursor.execute(claim.sql, claim.args(q))
                return claimed_rows(described(cursor))

            def next_lane(q: dict[str, Any]) -> int | None:
                cursor.execute(lane.sql, lane.args(q))
                found: int | None = cursor.fetchone()[0]
                return found

            rows = in_lanes(take, next_lane, p.claim.bind())
        finally:
            cursor.close()
        link.dbapi.commit()
        return done, rows

    def explain(
        self,
        conn: sa.Connection,
        stmt: sa.ClauseElement,
        params: dict[str, Any],
        *,
        analyze: bool = False,
    ) -> str:
        # EXPLAIN QUERY PLAN rows are (id, parent, notused, detail); keep the detail.
        sql, values = _driver_sql(conn, stmt, params)
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, values).all()
        return "\n".join(str(row[-1]) for row in rows)
