"""The one place that knows which database novaque is talking to.

Every statement whose SQL differs between PostgreSQL, MySQL/MariaDB and SQLite
lives here, in one class per dialect family chosen from the engine's dialect
name: claiming, settling with RETURNING or without, the stats upsert, the
server clock, NOTIFY, version floors, which errors are worth a retry, and how
novaque's own connections are set up. The client, consumers and maintenance
call these methods and never branch on the database themselves.

Statements are built once, at import, from bound parameters, so SQLAlchemy's
compiled cache serves every call.
"""

from __future__ import annotations

import contextlib
import random
import select
import socket
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import DBAPIError

from novaque.errors import UnsupportedDatabase
from novaque.schema import (
    COUNTER_COLUMNS,
    STATE_LEASED,
    STATE_READY,
    channels,
    deliveries,
    messages,
    stats,
)

T = TypeVar("T")
T_row = TypeVar("T_row", bound=tuple[Any, ...])

d = deliveries
m = messages

#: Engines built by :func:`novaque.connect` are already set up for novaque.
_PREPARED: weakref.WeakSet[sa.Engine] = weakref.WeakSet()
#: MySQL engines built by :func:`novaque.connect`: READ COMMITTED on every connection.
_READ_COMMITTED: weakref.WeakSet[sa.Engine] = weakref.WeakSet()

NOTIFY_CHANNEL = "novaque"
MIGRATION_LOCK_KEY = 0x6E6F7661717565  # "novaque"
MIGRATION_LOCK_NAME = "novaque_migrate"
#: An idle listening connection is checked with a query this often (seconds),
#: so a connection that died silently is noticed and replaced.
LISTEN_HEALTH_CHECK_S = 15.0


class NotifyListener(Protocol):
    """A connection that receives the wake-ups sent by :meth:`Dialect.notify`."""

    def wait(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` seconds; return the topics notified meanwhile.

        Returns early (possibly with nothing) after :meth:`interrupt`. Raises
        when the connection is lost; the caller then closes it and opens a
        new one.
        """
        ...

    def interrupt(self) -> None:
        """Make a :meth:`wait` in another thread return at once."""
        ...

    def close(self) -> None:
        """Close the connection (safe to call twice, and on a broken connection)."""
        ...


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    """One claimed delivery with its message, as the dialects return it."""

    delivery_id: int
    message_id: int
    attempts: int
    max_attempts: int
    body: bytes
    headers: str | None
    published_at: int


# -- statements shared by several dialects ------------------------------------

_claim_filter = sa.and_(
    d.c.channel_id == sa.bindparam("p_channel"),
    d.c.visible_at <= sa.bindparam("p_now"),
    d.c.attempts < d.c.max_attempts,
)
_claim_ids = (
    sa.select(d.c.id)
    .where(_claim_filter)
    .order_by(d.c.visible_at, d.c.id)
    .limit(sa.bindparam("p_limit", type_=sa.Integer))
    .with_for_update(skip_locked=True)
)
_lease_values = {
    "state": STATE_LEASED,
    "visible_at": sa.bindparam("p_until"),
    "lease_token": sa.bindparam("p_token"),
    "attempts": d.c.attempts + 1,
}
_claim_update_returning = (
    sa.update(d)
    .where(d.c.id.in_(_claim_ids.scalar_subquery()))
    .values(_lease_values)
    .returning(d.c.id, d.c.message_id, d.c.attempts, d.c.max_attempts)
)
_message_fields = sa.select(m.c.id, m.c.body, m.c.headers, m.c.published_at).where(
    m.c.id.in_(sa.bindparam("p_ids", expanding=True))
)
_channels_of_topic = (
    sa.select(channels.c.id)
    .where(channels.c.topic_id == sa.bindparam("p_topic_id"))
    .order_by(channels.c.id)
)
_ack_delete_returning = (
    sa.delete(d)
    .where(
        d.c.id.in_(sa.bindparam("p_ids", expanding=True)),
        d.c.lease_token == sa.bindparam("p_token"),
    )
    .returning(d.c.id)
)


class Dialect:
    """Behaviour shared by every backend; subclasses override what differs."""

    name: ClassVar[str] = ""
    #: (major, minor, ...) below which :meth:`check_floor` refuses the database.
    floor: ClassVar[tuple[int, ...]] = ()
    #: Whether the server pushes wake-ups (PostgreSQL LISTEN/NOTIFY).
    supports_notify: ClassVar[bool] = False

    def __init__(self, engine: sa.Engine) -> None:
        #: The engine novaque runs its own transactions on.
        self.engine = engine

    # -- set-up -----------------------------------------------------------------

    @classmethod
    def check_floor(cls, conn: sa.Connection) -> None:
        version = tuple(conn.dialect.server_version_info or ())
        if version < cls.floor:
            raise UnsupportedDatabase(
                f"{cls.label(conn)} {_dotted(version)} is too old: novaque needs "
                f"{cls.label(conn)} >= {_dotted(cls.floor)}"
            )

    @classmethod
    def label(cls, conn: sa.Connection) -> str:
        return cls.name

    @classmethod
    @contextlib.contextmanager
    def migration_lock(cls, conn: sa.Connection) -> Iterator[None]:
        """Serialize migrations of many processes starting at once.

        SQLite needs nothing more: novaque's transactions hold the write lock.
        """
        yield

    def db_now_us(self, conn: sa.Connection) -> int | None:
        """The server clock in epoch microseconds, or None to use the local clock."""
        return None

    @contextlib.contextmanager
    def migration_transaction(self) -> Iterator[sa.Connection]:
        """The transaction that :meth:`Client.migrate` and ``downgrade`` run in."""
        with self.engine.begin() as conn:
            yield conn

    # -- transactions -------------------------------------------------------------

    def is_retryable(self, exc: DBAPIError) -> bool:
        """True for errors a repeat of the same transaction can cure (deadlock, busy)."""
        return False

    #: Operations ("publish", "claim", "ack", "ack_claim", "settle": requeue,
    #: reject, renew)
    #: that this dialect does in a single
    #: statement; their callers pass ``one_statement=True`` to :meth:`run`.
    one_statement_ops: ClassVar[frozenset[str]] = frozenset()

    def run(
        self, fn: Callable[[sa.Connection], T], *, attempts: int = 8, one_statement: bool = False
    ) -> T:
        """Run ``fn`` in one transaction on novaque's engine, retrying deadlocks.

        ``one_statement`` promises that ``fn`` executes exactly one statement,
        which is a transaction by itself; a dialect may then save the round
        trips of BEGIN and COMMIT (see :meth:`PostgresDialect.run`).
        """
        for attempt in range(1, attempts + 1):
            try:
                with self._transaction(one_statement) as conn:
                    return fn(conn)
            except DBAPIError as exc:
                if attempt == attempts or not self.is_retryable(exc):
                    raise
                time.sleep(random.uniform(0, 0.002 * 2**attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.contextmanager
    def _transaction(self, one_statement: bool) -> Iterator[sa.Connection]:
        with self.engine.begin() as conn:
            self.begin_transaction(conn)
            yield conn

    def begin_transaction(self, conn: sa.Connection) -> None:
        """First statement of each of novaque's own transactions, if any."""

    # -- publishing -----------------------------------------------------------------

    def insert_messages(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> list[int]:
        """Insert message rows in one round trip and return their ids, in order."""
        if len(rows) == 1:
            return [_inserted_id(conn.execute(sa.insert(m), rows[0]))]
        result = conn.execute(sa.insert(m).returning(m.c.id, sort_by_parameter_order=True), rows)
        return [int(row[0]) for row in result]

    def publish_plain(
        self,
        conn: sa.Connection,
        topic: str,
        fields: dict[str, Any],
        bodies: list[bytes],
        visible: int,
    ) -> tuple[list[int], dict[int, int]]:
        """Insert messages without dedup keys and one delivery per channel of the topic.

        ``fields`` holds the columns every message shares (``topic_id``,
        ``headers``, ``published_at``, ``expires_at``, ``max_attempts``).
        Returns the message ids in the order of ``bodies`` and the number of
        deliveries written per channel id; wakes listeners when there are any.
        """
        ids = self.insert_messages(conn, [{**fields, "body": b, "dedup_key": None} for b in bodies])
        counts = self.fan_out(conn, topic, fields["topic_id"], ids, visible, fields["max_attempts"])
        return ids, counts

    def fan_out(
        self,
        conn: sa.Connection,
        topic: str,
        topic_id: int,
        message_ids: list[int],
        visible: int,
        max_attempts: int,
    ) -> dict[int, int]:
        """One delivery per (message, channel the topic has now); the count per channel."""
        channel_ids = [r[0] for r in conn.execute(_channels_of_topic, {"p_topic_id": topic_id})]
        if not channel_ids:
            return {}
        conn.execute(
            sa.insert(d),
            [
                {
                    "message_id": mid,
                    "channel_id": cid,
                    "state": STATE_READY,
                    "visible_at": visible,
                    "attempts": 0,
                    "max_attempts": max_attempts,
                }
                for mid in message_ids
                for cid in channel_ids
            ],
        )
        self.notify(conn, topic)
        return {cid: len(message_ids) for cid in channel_ids}

    def notify(self, conn: sa.Connection, topic: str) -> None:
        """Wake listening consumers of ``topic`` when the transaction commits."""

    def open_listener(self) -> NotifyListener | None:
        """Open a connection that receives :meth:`notify` wake-ups.

        Returns None where the database has no such push (consumers then only
        poll). Raises if the server cannot be reached.
        """
        return None

    def read_latest(self, stmt: sa.Select[T_row]) -> sa.Select[T_row]:
        """``stmt`` made to see the latest committed rows in the caller's transaction.

        A plain read does on PostgreSQL and SQLite (READ COMMITTED, one writer).
        """
        return stmt

    def insert_ignore(self, conn: sa.Connection, table: sa.Table, values: dict[str, Any]) -> None:
        """Insert a row unless it would break a unique constraint (then do nothing).

        Never raises on a duplicate, so it is safe inside the caller's transaction
        while another transaction creates the same row.
        """
        conn.execute(self._insert(table).on_conflict_do_nothing(), values)

    def insert_deduplicated(self, conn: sa.Connection, row: dict[str, Any]) -> int | None:
        """Insert a message with a dedup key; its id, or None if the key is taken."""
        stmt = (
            self._insert(m)
            .on_conflict_do_nothing(index_elements=[m.c.topic_id, m.c.dedup_key])
            .returning(m.c.id)
        )
        found = conn.execute(stmt, row).scalar_one_or_none()
        return None if found is None else int(found)

    def delete_deliveries(self, conn: sa.Connection, where: sa.ColumnElement[bool]) -> list[int]:
        """Delete the deliveries matching ``where``; the channel id of each one deleted.

        Concurrent callers never both report the same row (each row is counted
        once in the ``purged`` counter).
        """
        return [
            int(r[0]) for r in conn.execute(sa.delete(d).where(where).returning(d.c.channel_id))
        ]

    # -- query plans ------------------------------------------------------------------

    def claim_statement(self) -> sa.ClauseElement:
        """The statement that picks and leases deliveries in :meth:`claim` (for plan checks).

        Parameters: ``p_channel``, ``p_now``, ``p_limit``, ``p_until``, ``p_token``.
        """
        return _claim_update_returning

    def explain(
        self,
        conn: sa.Connection,
        stmt: sa.ClauseElement,
        params: dict[str, Any],
        *,
        analyze: bool = False,
    ) -> str:
        """The database's plan for ``stmt`` with ``params``, as text (one line per row).

        ``analyze`` runs the statement and reports real timings where the
        database can (PostgreSQL ``EXPLAIN (ANALYZE, BUFFERS)``, MariaDB
        ``ANALYZE``, MySQL ``EXPLAIN ANALYZE``); use it on reads only.
        ``params`` fill the statement's bound parameters (not expanding ones).
        """
        sql, values = _driver_sql(conn, stmt, params)
        rows = conn.exec_driver_sql(self._explain_prefix(conn, analyze) + sql, values).all()
        return "\n".join(" ".join(str(v) for v in row) for row in rows)

    def _explain_prefix(self, conn: sa.Connection, analyze: bool) -> str:
        return "EXPLAIN (ANALYZE, BUFFERS) " if analyze else "EXPLAIN "

    # -- claiming -------------------------------------------------------------------

    def claim(
        self, conn: sa.Connection, channel_id: int, limit: int, now: int, until: int, token: str
    ) -> list[ClaimedRow]:
        """Lease up to ``limit`` due deliveries of a channel, oldest due first."""
        params = _claim_params(channel_id, limit, now, until, token)
        leased = conn.execute(_claim_update_returning, params).all()
        return self._with_messages(conn, [(r[0], r[1], r[2], r[3]) for r in leased])

    def _with_messages(
        self, conn: sa.Connection, leased: Sequence[tuple[int, int, int, int]]
    ) -> list[ClaimedRow]:
        if not leased:
            return []
        ids = sorted({message_id for _, message_id, _, _ in leased})
        found = {r[0]: r for r in conn.execute(_message_fields, {"p_ids": ids})}
        rows = [
            ClaimedRow(
                did, mid, attempts, max_attempts, bytes(found[mid][1]), found[mid][2], found[mid][3]
            )
            for did, mid, attempts, max_attempts in leased
        ]
        rows.sort(key=lambda row: row.delivery_id)
        return rows

    def ack_and_claim(
        self,
        conn: sa.Connection,
        pairs: Sequence[tuple[int, str]],
        channel_id: int,
        limit: int,
        now: int,
        until: int,
        token: str,
    ) -> tuple[set[tuple[int, str]], list[ClaimedRow]]:
        """:meth:`delete_leased_pairs`, then :meth:`claim`, in the caller's transaction.

        The deliveries acked are gone before the claim looks, so it never
        leases one of them (not even one whose lease had expired).
        """
        done = self.delete_leased_pairs(conn, pairs)
        return done, self.claim(conn, channel_id, limit, now, until, token)

    # -- settling -------------------------------------------------------------------

    def delete_leased(self, conn: sa.Connection, ids: Sequence[int], token: str) -> set[int]:
        """Delete the deliveries among ``ids`` still leased with ``token``; return those."""
        result = conn.execute(_ack_delete_returning, {"p_ids": list(ids), "p_token": token})
        return {int(r[0]) for r in result}

    def delete_leased_pairs(
        self, conn: sa.Connection, pairs: Sequence[tuple[int, str]]
    ) -> set[tuple[int, str]]:
        """Delete each delivery of ``(delivery_id, lease_token)`` still leased with that
        token; return the pairs deleted."""
        by_token: dict[str, list[int]] = {}
        for delivery_id, token in pairs:
            by_token.setdefault(token, []).append(delivery_id)
        done: set[tuple[int, str]] = set()
        for token, ids in by_token.items():
            done.update((i, token) for i in self.delete_leased(conn, sorted(ids), token))
        return done

    # -- stats ----------------------------------------------------------------------

    def upsert_stats(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> None:
        """Add counter deltas to their (channel, day) buckets, creating missing ones."""
        insert = self._insert(stats)
        stmt = insert.on_conflict_do_update(
            index_elements=[stats.c.channel_id, stats.c.day],
            set_={c: stats.c[c] + insert.excluded[c] for c in COUNTER_COLUMNS},
        )
        conn.execute(stmt, rows)

    def _insert(self, table: sa.Table) -> Any:
        """The dialect's own INSERT construct (with its upsert clauses)."""
        raise NotImplementedError


def _driver_sql(
    conn: sa.Connection, stmt: sa.ClauseElement, params: dict[str, Any]
) -> tuple[str, Any]:
    """``stmt`` compiled for the connection's driver, with its parameters in driver form."""
    compiled = stmt.compile(dialect=conn.dialect)
    assert isinstance(compiled, sa.sql.compiler.SQLCompiler)
    values = compiled.construct_params(params)
    if compiled.positional:
        return compiled.string, tuple(values[name] for name in compiled.positiontup or ())
    return compiled.string, values


def _claim_params(
    channel_id: int, limit: int, now: int, until: int, token: str
) -> dict[str, object]:
    return {
        "p_channel": channel_id,
        "p_now": now,
        "p_limit": limit,
        "p_until": until,
        "p_token": token,
    }


def _dotted(version: Iterable[object]) -> str:
    return ".".join(str(part) for part in version)


def _inserted_id(result: sa.CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def _mysql_code(exc: DBAPIError) -> object:
    args: tuple[object, ...] = tuple(getattr(exc.orig, "args", ()))
    return args[0] if args else None


class PostgresDialect(Dialect):
    name = "PostgreSQL"
    floor = (14,)
    supports_notify = True

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        claimed = _claim_update_returning.cte("claimed")
        self._claim_stmt = (
            sa.select(
                claimed.c.id,
                claimed.c.message_id,
                claimed.c.attempts,
                claimed.c.max_attempts,
                m.c.body,
                m.c.headers,
                m.c.published_at,
            )
            .join_from(claimed, m, m.c.id == claimed.c.message_id)
            .order_by(claimed.c.id)
        )

    def claim_statement(self) -> sa.ClauseElement:
        return self._claim_stmt

    @classmethod
    @contextlib.contextmanager
    def migration_lock(cls, conn: sa.Connection) -> Iterator[None]:
        # Held to the end of the migration's transaction (DDL is transactional).
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
        yield

    one_statement_ops = frozenset({"publish", "claim", "ack", "ack_claim", "settle"})

    @contextlib.contextmanager
    def _transaction(self, one_statement: bool) -> Iterator[sa.Connection]:
        if not one_statement:
            with super()._transaction(False) as conn:
                yield conn
            return
        # A single statement is a transaction by itself: in autocommit it costs
        # one round trip instead of three (BEGIN, statement, COMMIT), with the
        # same atomicity and durability. psycopg switches autocommit on the
        # client side, and the pool switches it back when the connection returns.
        with self.engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    # Ack: one statement for any number of (delivery, token) pairs.
    _delete_pairs = sa.text(
        f"""
        DELETE FROM {d.name} AS d
        USING unnest(CAST(:ids AS BIGINT[]), CAST(:tokens AS TEXT[])) AS a(id, token)
        WHERE d.id = a.id AND d.lease_token = a.token
        RETURNING d.id, d.lease_token
        """
    )

    # Ack and claim in one statement: the acks' DELETE and the claim's UPDATE
    # run on one snapshot, so the claim leaves out the deliveries being acked
    # by id (one whose lease expired would otherwise be both deleted and
    # leased by the same statement).
    _ack_and_claim = sa.text(
        f"""
        WITH acked AS (
            DELETE FROM {d.name} AS d
            USING unnest(CAST(:ids AS BIGINT[]), CAST(:tokens AS TEXT[])) AS a(id, token)
            WHERE d.id = a.id AND d.lease_token = a.token
            RETURNING d.id, d.lease_token
        ), claimed AS (
            UPDATE {d.name}
            SET state = {STATE_LEASED}, visible_at = :p_until, lease_token = :p_token,
                attempts = attempts + 1
            WHERE id IN (
                SELECT id FROM {d.name}
                WHERE channel_id = :p_channel AND visible_at <= :p_now
                  AND attempts < max_attempts AND id <> ALL(CAST(:ids AS BIGINT[]))
                ORDER BY visible_at, id
                LIMIT :p_limit
                FOR UPDATE SKIP LOCKED
            )
            RETURNING id, message_id, attempts, max_attempts
        )
        SELECT 0, id, NULL, NULL, NULL, NULL, NULL, NULL, lease_token FROM acked
        UNION ALL
        SELECT 1, c.id, c.message_id, c.attempts, c.max_attempts, m.body, m.headers,
               m.published_at, NULL
        FROM claimed c JOIN {m.name} m ON m.id = c.message_id
        """
    )

    def ack_and_claim(
        self,
        conn: sa.Connection,
        pairs: Sequence[tuple[int, str]],
        channel_id: int,
        limit: int,
        now: int,
        until: int,
        token: str,
    ) -> tuple[set[tuple[int, str]], list[ClaimedRow]]:
        ordered = sorted(pairs)
        params = _claim_params(channel_id, limit, now, until, token)
        params.update(ids=[p[0] for p in ordered], tokens=[p[1] for p in ordered])
        done: set[tuple[int, str]] = set()
        rows: list[ClaimedRow] = []
        for r in conn.execute(self._ack_and_claim, params):
            if r[0] == 0:
                done.add((int(r[1]), str(r[8])))
            else:
                rows.append(ClaimedRow(r[1], r[2], r[3], r[4], bytes(r[5]), r[6], r[7]))
        rows.sort(key=lambda row: row.delivery_id)
        return done, rows

    def delete_leased_pairs(
        self, conn: sa.Connection, pairs: Sequence[tuple[int, str]]
    ) -> set[tuple[int, str]]:
        ordered = sorted(pairs)
        result = conn.execute(
            self._delete_pairs,
            {"ids": [p[0] for p in ordered], "tokens": [p[1] for p in ordered]},
        )
        return {(int(r[0]), str(r[1])) for r in result}

    def db_now_us(self, conn: sa.Connection) -> int | None:
        return int(
            conn.exec_driver_sql(
                "SELECT (extract(epoch from clock_timestamp()) * 1000000)::bigint"
            ).scalar_one()
        )

    def is_retryable(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) in ("40P01", "40001")

    def notify(self, conn: sa.Connection, topic: str) -> None:
        conn.execute(sa.select(sa.func.pg_notify(NOTIFY_CHANNEL, topic)))

    # One statement does the whole publish: the messages from an array of
    # bodies (in order, so their ids ascend with it), one delivery per
    # (message, channel the topic has when the statement starts), the count per
    # channel for the stats, and NOTIFY when deliveries were written.
    _publish = sa.text(
        f"""
        WITH msg AS (
            INSERT INTO {m.name} (topic_id, body, headers, published_at, expires_at, max_attempts)
            SELECT :topic_id, u.body, CAST(:headers AS TEXT), :published_at, :expires_at,
                   :max_attempts
            FROM unnest(CAST(:bodies AS BYTEA[])) WITH ORDINALITY AS u(body, n)
            ORDER BY u.n
            RETURNING id
        ), dl AS (
            INSERT INTO {d.name} (message_id, channel_id, state, visible_at, attempts,
                                  max_attempts)
            SELECT msg.id, c.id, {STATE_READY}, :visible, 0, :max_attempts
            FROM msg CROSS JOIN {channels.name} c
            WHERE c.topic_id = :topic_id
            ORDER BY msg.id, c.id
            RETURNING channel_id
        ), fan AS (
            SELECT channel_id, count(*) AS n FROM dl GROUP BY channel_id
        )
        SELECT ARRAY(SELECT id FROM msg ORDER BY id),
               ARRAY(SELECT channel_id FROM fan ORDER BY channel_id),
               ARRAY(SELECT n FROM fan ORDER BY channel_id),
               CASE WHEN EXISTS (SELECT 1 FROM dl)
                    THEN pg_notify('{NOTIFY_CHANNEL}', :topic) END
        """
    )

    def publish_plain(
        self,
        conn: sa.Connection,
        topic: str,
        fields: dict[str, Any],
        bodies: list[bytes],
        visible: int,
    ) -> tuple[list[int], dict[int, int]]:
        row = conn.execute(
            self._publish, {**fields, "bodies": bodies, "visible": visible, "topic": topic}
        ).one()
        return [int(i) for i in row[0]], {
            int(c): int(n) for c, n in zip(row[1], row[2], strict=True)
        }

    def open_listener(self) -> NotifyListener | None:
        try:
            import psycopg  # noqa: F401  (psycopg 3 reads notifications with a timeout)
        except ImportError:
            return None
        return _PostgresListener(self.engine)

    def claim(
        self, conn: sa.Connection, channel_id: int, limit: int, now: int, until: int, token: str
    ) -> list[ClaimedRow]:
        # One statement: lock (skipping rows other consumers hold), lease, and
        # return the message with each delivery.
        params = _claim_params(channel_id, limit, now, until, token)
        return [
            ClaimedRow(r[0], r[1], r[2], r[3], bytes(r[4]), r[5], r[6])
            for r in conn.execute(self._claim_stmt, params)
        ]

    def _insert(self, table: sa.Table) -> Any:
        return pg_dialect.insert(table)


class _PostgresListener:
    """``LISTEN novaque`` on a dedicated autocommit psycopg 3 connection.

    The connection is held outside the engine's pool (it lives as long as the
    client and must never be handed to a query): it is opened the way the
    engine opens its connections (its ``connect_args``, ``creator`` and
    connect events included) and then detached from the pool for good.
    Waiting is a ``select`` on the connection's socket and a private socket
    pair, so :meth:`interrupt` ends a wait at once; notifications are then
    read without blocking.
    """

    def __init__(self, engine: sa.Engine) -> None:
        import psycopg

        conn: Any
        if engine.dialect.driver == "psycopg":
            proxied = engine.raw_connection()
            proxied.detach()
            conn = proxied.dbapi_connection
        else:  # another driver for the engine: libpq keywords work for psycopg too
            cargs, cparams = engine.dialect.create_connect_args(engine.url)
            params: dict[str, Any] = {k: v for k, v in cparams.items() if isinstance(v, (str, int))}
            params.setdefault("connect_timeout", 10)
            conn = psycopg.connect(*cargs, **params)
        self._conn = conn
        self._wake_r, self._wake_w = socket.socketpair()
        try:
            self._conn.autocommit = True
            self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
        except BaseException:
            self.close()
            raise
        self._checked = time.monotonic()

    def wait(self, timeout: float) -> list[str]:
        sock = self._conn.fileno()
        ready, _, _ = select.select([sock, self._wake_r], [], [], max(timeout, 0.0))
        if self._wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while self._wake_r.recv(4096):
                    pass
        if sock in ready:
            # Read what arrived. A tiny timeout rather than 0, in case a
            # psycopg version reads a falsy timeout as "wait forever"; and
            # stop_after, or psycopg waits out that timeout for more after the
            # first batch (a millisecond added to every wake-up).
            topics = [n.payload for n in self._conn.notifies(timeout=0.001, stop_after=1)]
            if topics:
                self._checked = time.monotonic()
                return topics
            # Readable without a notification: maybe the server is closing
            # the connection. A query tells (it raises if so).
            self._health_check()
        elif time.monotonic() - self._checked > LISTEN_HEALTH_CHECK_S:
            self._health_check()
        return []

    def _health_check(self) -> None:
        self._conn.execute("SELECT 1")
        self._checked = time.monotonic()

    def interrupt(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()
        for sock in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()


class MySQLDialect(Dialect):
    name = "MySQL"
    floor = (8, 0, 1)

    # The message fields come with the locking read, through primary-key
    # subqueries: InnoDB locks only the rows of the outer query (a locking
    # clause does not reach a nested subquery), so messages stay unlocked for
    # the consumers of the topic's other channels. Saves the round trip of a
    # separate SELECT of the messages.
    _lock_ids = (
        sa.select(
            d.c.id,
            d.c.message_id,
            d.c.attempts,
            d.c.max_attempts,
            *(
                sa.select(col).where(m.c.id == d.c.message_id).correlate(d).scalar_subquery()
                for col in (m.c.body, m.c.headers, m.c.published_at)
            ),
        )
        .where(_claim_filter)
        .order_by(d.c.visible_at, d.c.id)
        .limit(sa.bindparam("p_limit", type_=sa.Integer))
        .with_for_update(skip_locked=True)
    )
    _lease = (
        sa.update(d).where(d.c.id.in_(sa.bindparam("p_ids", expanding=True))).values(_lease_values)
    )
    _lock_leased = (
        sa.select(d.c.id)
        .where(
            d.c.id.in_(sa.bindparam("p_ids", expanding=True)),
            d.c.lease_token == sa.bindparam("p_token"),
        )
        .with_for_update()
    )
    _delete_ids = sa.delete(d).where(d.c.id.in_(sa.bindparam("p_ids", expanding=True)))

    @classmethod
    def label(cls, conn: sa.Connection) -> str:
        return "MariaDB" if getattr(conn.dialect, "is_mariadb", False) else "MySQL"

    def claim_statement(self) -> sa.ClauseElement:
        return self._lock_ids

    def explain(
        self,
        conn: sa.Connection,
        stmt: sa.ClauseElement,
        params: dict[str, Any],
        *,
        analyze: bool = False,
    ) -> str:
        if analyze and not getattr(conn.dialect, "is_mariadb", False):
            return super().explain(conn, stmt, params, analyze=True)  # EXPLAIN ANALYZE: a tree
        sql, values = _driver_sql(conn, stmt, params)
        result = conn.exec_driver_sql(("ANALYZE " if analyze else "EXPLAIN ") + sql, values)
        keys = list(result.keys())
        # One line per table access: table, access type, index, rows, extra.
        return "\n".join(
            " ".join(f"{k}={v}" for k, v in zip(keys, row, strict=True) if v is not None)
            for row in result
        )

    def _explain_prefix(self, conn: sa.Connection, analyze: bool) -> str:
        return "EXPLAIN ANALYZE " if analyze else "EXPLAIN "

    @classmethod
    def check_floor(cls, conn: sa.Connection) -> None:
        if getattr(conn.dialect, "is_mariadb", False):
            version = tuple(conn.dialect.server_version_info or ())
            if version < (10, 6):
                raise UnsupportedDatabase(
                    f"MariaDB {_dotted(version)} is too old: novaque needs MariaDB >= 10.6 "
                    "(for SKIP LOCKED)"
                )
            return
        super().check_floor(conn)

    @classmethod
    @contextlib.contextmanager
    def migration_lock(cls, conn: sa.Connection) -> Iterator[None]:
        # A named lock of the session: DDL commits implicitly on MySQL, so a
        # transaction-scoped lock would not last the whole migration.
        got = conn.execute(sa.select(sa.func.get_lock(MIGRATION_LOCK_NAME, 600))).scalar()
        if got != 1:
            raise UnsupportedDatabase(
                f"could not take the lock {MIGRATION_LOCK_NAME!r} within 600 s: "
                "is another migration stuck?"
            )
        try:
            yield
        finally:
            conn.execute(sa.select(sa.func.release_lock(MIGRATION_LOCK_NAME)))

    def db_now_us(self, conn: sa.Connection) -> int | None:
        return int(
            conn.exec_driver_sql(
                "SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
            ).scalar_one()
        )

    def is_retryable(self, exc: DBAPIError) -> bool:
        # 1213 deadlock, 1205 lock wait timeout
        return _mysql_code(exc) in (1213, 1205)

    def begin_transaction(self, conn: sa.Connection) -> None:
        # READ COMMITTED for this transaction only: locking reads take no gap
        # locks, so claims never deadlock with concurrent publishes. Engines
        # made by novaque.connect() run every connection in READ COMMITTED
        # already, which saves this round trip.
        if self.engine in _READ_COMMITTED:
            return
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")

    def insert_messages(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> list[int]:
        if len(rows) == 1 or conn.dialect.insert_executemany_returning_sort_by_parameter_order:
            return super().insert_messages(conn, rows)
        # MySQL proper has no RETURNING and interleaves auto-increment values
        # across concurrent inserts: ids are only known row by row.
        return [_inserted_id(conn.execute(sa.insert(m), row)) for row in rows]

    def claim(
        self, conn: sa.Connection, channel_id: int, limit: int, now: int, until: int, token: str
    ) -> list[ClaimedRow]:
        # No UPDATE ... RETURNING, and no LIMIT inside IN (subquery): lock the
        # rows first (skipping others' locks), then lease exactly those.
        locked = conn.execute(
            self._lock_ids, {"p_channel": channel_id, "p_now": now, "p_limit": limit}
        ).all()
        if not locked:
            return []
        conn.execute(
            self._lease, {"p_ids": [r[0] for r in locked], "p_until": until, "p_token": token}
        )
        # The locking read returns the latest committed deliveries, but its
        # subqueries read the statement's snapshot: a delivery committed just
        # after it began comes with its message fields NULL. A new statement
        # has a new snapshot (READ COMMITTED) that holds them.
        late = sorted({int(r[1]) for r in locked if r[4] is None})
        fields = {int(r[1]): (r[4], r[5], r[6]) for r in locked if r[4] is not None}
        if late:
            fields.update(
                (int(r[0]), (r[1], r[2], r[3]))
                for r in conn.execute(_message_fields, {"p_ids": late})
            )
        rows = [
            ClaimedRow(r[0], r[1], r[2] + 1, r[3], bytes(fields[r[1]][0]), *fields[r[1]][1:])
            for r in locked
        ]
        rows.sort(key=lambda row: row.delivery_id)
        return rows

    # MariaDB: deliveries written by the server from the channel rows, and
    # counted from what the INSERT returns (one statement instead of two).
    _fan_out_returning = (
        sa.insert(d)
        .from_select(
            ["message_id", "channel_id", "state", "visible_at", "attempts", "max_attempts"],
            sa.select(
                m.c.id,
                channels.c.id,
                sa.literal(STATE_READY, sa.SmallInteger),
                sa.bindparam("p_visible", type_=sa.BigInteger),
                sa.literal(0, sa.Integer),
                sa.bindparam("p_max_attempts", type_=sa.Integer),
            )
            .join_from(m, channels, channels.c.topic_id == m.c.topic_id)
            .where(
                channels.c.topic_id == sa.bindparam("p_topic_id"),
                m.c.id.in_(sa.bindparam("p_ids", expanding=True)),
            )
            .order_by(m.c.id, channels.c.id),
        )
        .returning(d.c.channel_id)
    )

    def fan_out(
        self,
        conn: sa.Connection,
        topic: str,
        topic_id: int,
        message_ids: list[int],
        visible: int,
        max_attempts: int,
    ) -> dict[int, int]:
        if not conn.dialect.insert_returning:  # MySQL proper: no INSERT ... RETURNING
            return super().fan_out(conn, topic, topic_id, message_ids, visible, max_attempts)
        counts: dict[int, int] = {}
        for (channel_id,) in conn.execute(
            self._fan_out_returning,
            {
                "p_topic_id": topic_id,
                "p_ids": message_ids,
                "p_visible": visible,
                "p_max_attempts": max_attempts,
            },
        ):
            counts[channel_id] = counts.get(channel_id, 0) + 1
        return counts

    def delete_leased(self, conn: sa.Connection, ids: Sequence[int], token: str) -> set[int]:
        if conn.dialect.delete_returning:  # MariaDB
            return super().delete_leased(conn, ids, token)
        held = [
            int(r[0])
            for r in conn.execute(self._lock_leased, {"p_ids": list(ids), "p_token": token})
        ]
        if held:
            conn.execute(self._delete_ids, {"p_ids": held})
        return set(held)

    def read_latest(self, stmt: sa.Select[T_row]) -> sa.Select[T_row]:
        # REPEATABLE READ (MySQL's default) reads an older snapshot; a locking
        # read sees the latest commit, and keeps the row until ours ends.
        return stmt.with_for_update(read=True)

    def insert_ignore(self, conn: sa.Connection, table: sa.Table, values: dict[str, Any]) -> None:
        # Not INSERT IGNORE: that would also swallow foreign key and data errors.
        key = next(iter(table.primary_key.columns))
        stmt = mysql_dialect.insert(table).on_duplicate_key_update({key.name: key})
        conn.execute(stmt, values)

    def insert_deduplicated(self, conn: sa.Connection, row: dict[str, Any]) -> int | None:
        # A duplicate key error ends only the statement on InnoDB, never the
        # transaction, so the unique index decides and the caller reads the winner.
        try:
            return _inserted_id(conn.execute(sa.insert(m), row))
        except sa.exc.IntegrityError as exc:
            if _mysql_code(exc) != 1062:
                raise
            return None

    def delete_deliveries(self, conn: sa.Connection, where: sa.ColumnElement[bool]) -> list[int]:
        if conn.dialect.delete_returning:  # MariaDB
            return super().delete_deliveries(conn, where)
        held = conn.execute(sa.select(d.c.id, d.c.channel_id).where(where).with_for_update()).all()
        if held:
            conn.execute(self._delete_ids, {"p_ids": [r[0] for r in held]})
        return [int(r[1]) for r in held]

    def upsert_stats(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> None:
        insert = mysql_dialect.insert(stats)
        stmt = insert.on_duplicate_key_update(
            {c: stats.c[c] + insert.inserted[c] for c in COUNTER_COLUMNS}
        )
        conn.execute(stmt, rows)


#: One lock per SQLite file: novaque's transactions in one process take turns
#: on it (see :meth:`SQLiteDialect.run`).
_sqlite_locks: dict[str, threading.RLock] = {}
_sqlite_locks_guard = threading.Lock()


class SQLiteDialect(Dialect):
    name = "SQLite"
    floor = (3, 35)
    busy_timeout_ms = 30_000

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        key = engine.url.database or ""
        with _sqlite_locks_guard:
            self._turn = _sqlite_locks.setdefault(key, threading.RLock())

    def run(
        self, fn: Callable[[sa.Connection], T], *, attempts: int = 8, one_statement: bool = False
    ) -> T:
        # Every transaction of novaque's takes SQLite's write lock up front.
        # Threads of one process wait for each other here, where the next one
        # goes as soon as the lock is free, rather than in SQLite's busy
        # handler, which sleeps for growing intervals (up to 100 ms) between
        # tries: a consumer's claims and acks would otherwise stall each other.
        # Other processes still meet in the busy handler.
        with self._turn:
            return super().run(fn, attempts=attempts, one_statement=one_statement)

    @classmethod
    def check_floor(cls, conn: sa.Connection) -> None:
        version = sqlite3.sqlite_version_info
        if version < cls.floor:
            raise UnsupportedDatabase(
                f"SQLite {_dotted(version)} is too old: novaque needs SQLite >= 3.35 "
                "(for UPDATE ... RETURNING)"
            )

    @contextlib.contextmanager
    def migration_transaction(self) -> Iterator[sa.Connection]:
        # Rebuilding a table (how SQLite alters most things) drops it, and
        # dropping a parent table with foreign keys enforced deletes its
        # children: migrations run with enforcement off (it can only be
        # switched outside a transaction), and the result is checked before
        # the commit.
        with self.engine.connect() as conn:
            raw: Any = conn.connection.dbapi_connection
            raw.execute("PRAGMA foreign_keys = OFF")
            try:
                with conn.begin():
                    yield conn
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise RuntimeError(
                            f"migration left {len(broken)} rows with a dangling foreign key "
                            f"(first: {tuple(broken[0])}); rolled back"
                        )
            finally:
                raw.execute("PRAGMA foreign_keys = ON")

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
            d.c.id,
            d.c.message_id,
            d.c.attempts,
            d.c.max_attempts,
            *(
                sa.select(col).where(m.c.id == d.c.message_id).correlate(d).scalar_subquery()
                for col in (m.c.body, m.c.headers, m.c.published_at)
            ),
        )
    )

    def claim_statement(self) -> sa.ClauseElement:
        return self._claim_stmt

    def claim(
        self, conn: sa.Connection, channel_id: int, limit: int, now: int, until: int, token: str
    ) -> list[ClaimedRow]:
        params = _claim_params(channel_id, limit, now, until, token)
        rows = [
            ClaimedRow(r[0], r[1], r[2], r[3], bytes(r[4]), r[5], r[6])
            for r in conn.execute(self._claim_stmt, params)
        ]
        rows.sort(key=lambda row: row.delivery_id)
        return rows

    _insert_messages = (
        f"INSERT INTO {m.name} (topic_id, body, headers, published_at, expires_at, max_attempts) "
        "VALUES (?, ?, ?, ?, ?, ?)"
    )
    _insert_message_returning = _insert_messages + " RETURNING id"
    _fan_out_one = (
        f"INSERT INTO {d.name} (message_id, channel_id, state, visible_at, attempts, "
        f"max_attempts) SELECT ?, id, {STATE_READY}, ?, 0, ? FROM {channels.name} "
        "WHERE topic_id = ? ORDER BY id RETURNING channel_id"
    )
    _channel_ids = f"SELECT id FROM {channels.name} WHERE topic_id = ? ORDER BY id"
    _fan_out_range = (
        f"INSERT INTO {d.name} (message_id, channel_id, state, visible_at, attempts, "
        f"max_attempts) SELECT m.id, c.id, {STATE_READY}, ?, 0, ? "
        f"FROM {m.name} m JOIN {channels.name} c ON c.topic_id = m.topic_id "
        "WHERE m.id BETWEEN ? AND ? AND m.topic_id = ? ORDER BY m.id, c.id"
    )

    def publish_plain(
        self,
        conn: sa.Connection,
        topic: str,
        fields: dict[str, Any],
        bodies: list[bytes],
        visible: int,
    ) -> tuple[list[int], dict[int, int]]:
        if conn.engine is not self.engine:
            # The caller's transaction: it may not hold the write lock yet.
            return super().publish_plain(conn, topic, fields, bodies, visible)
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
                    self._insert_message_returning, (topic_id, bodies[0], *common, max_attempts)
                ).scalar_one()
            )
            counts: dict[int, int] = {}
            for (cid,) in conn.exec_driver_sql(
                self._fan_out_one, (message_id, visible, max_attempts, topic_id)
            ):
                counts[cid] = 1
            return [message_id], counts
        conn.exec_driver_sql(
            self._insert_messages, [(topic_id, b, *common, max_attempts) for b in bodies]
        )
        last = int(conn.exec_driver_sql("SELECT last_insert_rowid()").scalar_one())
        first = last - len(bodies) + 1
        channel_ids = [r[0] for r in conn.exec_driver_sql(self._channel_ids, (topic_id,))]
        if channel_ids:
            conn.exec_driver_sql(
                self._fan_out_range, (visible, max_attempts, first, last, topic_id)
            )
        return list(range(first, last + 1)), {cid: len(bodies) for cid in channel_ids}

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

    @classmethod
    def own_engine(cls, engine: sa.Engine) -> sa.Engine:
        """An engine on the same file, set up for novaque's transactions.

        novaque's writes must take SQLite's write lock up front (``BEGIN
        IMMEDIATE``), so that waiting happens where ``busy_timeout`` applies;
        a deferred transaction that reads and then writes fails at once under
        contention. Changing how transactions begin on the application's
        engine would change the application's own transactions, so novaque
        opens its own engine on the same file instead.
        """
        url = engine.url
        database = url.database or ""
        if (
            database in ("", ":memory:")
            or database.startswith("file::memory:")
            or ("mode=memory" in database or url.query.get("mode") == "memory")
        ):
            raise UnsupportedDatabase(
                "novaque needs a file-backed SQLite database: an in-memory database "
                "is private to one connection and cannot be shared by novaque's "
                "connections, consumers and processes (use e.g. sqlite:///novaque.db)"
            )
        own = sa.create_engine(url, pool_size=8, max_overflow=16, pool_timeout=60)
        cls.configure(own)
        return own

    @classmethod
    def configure(cls, engine: sa.Engine) -> None:
        """Pragmas on every connection, and BEGIN IMMEDIATE for every transaction."""

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, record: Any) -> None:
            # Let novaque, not the sqlite3 module, decide when transactions begin.
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {cls.busy_timeout_ms}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = FULL")
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: sa.Connection) -> None:
            # Straight to the driver: this runs before every transaction, and
            # SQLAlchemy's statement machinery would cost more than SQLite does.
            conn.connection.dbapi_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]


_DIALECTS: dict[str, type[Dialect]] = {
    "postgresql": PostgresDialect,
    "mysql": MySQLDialect,
    "mariadb": MySQLDialect,
    "sqlite": SQLiteDialect,
}


def for_engine(engine: sa.Engine) -> Dialect:
    """The dialect layer for ``engine``, with the engine novaque should run on."""
    cls = _DIALECTS.get(engine.dialect.name)
    if cls is None:
        raise UnsupportedDatabase(
            f"novaque does not support the {engine.dialect.name!r} database; "
            "it runs on PostgreSQL, MySQL/MariaDB and SQLite"
        )
    if cls is SQLiteDialect and engine not in _PREPARED:
        return SQLiteDialect(SQLiteDialect.own_engine(engine))
    return cls(engine)


def class_for(conn: sa.Connection) -> type[Dialect]:
    """The dialect class of a connection (for work done on the caller's connection)."""
    cls = _DIALECTS.get(conn.dialect.name)
    if cls is None:
        raise UnsupportedDatabase(f"novaque does not support the {conn.dialect.name!r} database")
    return cls


#: A pooled connection unused for longer than this is pinged before it is handed out.
PING_IDLE_S = 1.0


def _ping_when_idle(engine: sa.Engine) -> None:
    """Check a pooled connection before use only when it has been idle a while.

    ``pool_pre_ping`` would add a round trip to every transaction, which on
    the hot path (one publish, one claim, one ack) costs about as much as the
    statement itself. A connection used within the last second is as good as
    known alive; one that sat idle (and so may have been dropped by a server
    restart, a proxy or a timeout) is pinged, and a dead one is replaced
    before the caller sees it (SQLAlchemy's pessimistic disconnect recipe).
    A failure on a busy connection still invalidates the pool, as usual.
    """

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        last = record.info.get("novaque_checkin")
        if last is None or time.monotonic() - last < PING_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise sa.exc.DisconnectionError(f"pooled connection is gone: {exc}") from exc
        if not alive:
            raise sa.exc.DisconnectionError("pooled connection is gone")

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_conn: Any, record: Any) -> None:
        record.info["novaque_checkin"] = time.monotonic()


def _rollback_if_open(dbapi_conn: Any, record: Any, state: Any) -> None:
    """Pool reset on return for MySQL: roll back only if a transaction is open.

    SQLAlchemy's default reset sends ROLLBACK whenever a connection returns to
    the pool, even right after a COMMIT: one more round trip per transaction
    with PyMySQL (psycopg skips it when idle). The server reports in every
    reply whether a transaction is open, so only those are rolled back.
    """
    if state.transaction_was_reset or state.terminate_only:
        return
    status = getattr(dbapi_conn, "server_status", None)
    if status is None or status & _SERVER_STATUS_IN_TRANS:
        dbapi_conn.rollback()


#: Bit of the MySQL protocol's server status flags: a transaction is open.
_SERVER_STATUS_IN_TRANS = 0x0001


#: Per backend: the extra that installs novaque's driver, and the URL form using it.
_DRIVERS = {
    "postgresql": ("postgres", "postgresql+psycopg://"),
    "mysql": ("mysql", "mysql+pymysql://"),
    "mariadb": ("mysql", "mariadb+pymysql://"),
}


def missing_driver(url: sa.URL, exc: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error for a URL whose driver is not installed: the extra and URL form to use."""
    backend = url.get_backend_name()
    extra, form = _DRIVERS.get(backend, ("postgres", "postgresql+psycopg://"))
    named = url.drivername
    if named == form.removesuffix("://"):
        text = f"{exc}: install novaque's driver with pip install 'novaque[{extra}]'"
    else:
        text = (
            f"{named}:// needs a driver that is not installed ({exc}); novaque's driver "
            f"is installed with pip install 'novaque[{extra}]' and used with {form} URLs"
        )
    error = ModuleNotFoundError(text)
    error.name = exc.name
    return error


def create_engine(url: str | sa.URL, pool_size: int) -> sa.Engine:
    """Build an engine for ``url`` with the settings novaque runs best with."""
    parsed = sa.make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        probe = sa.create_engine(parsed)
        try:
            engine = SQLiteDialect.own_engine(probe)
        finally:
            probe.dispose()
    elif backend in ("postgresql", "mysql", "mariadb"):
        kwargs: dict[str, Any] = {"pool_size": pool_size, "max_overflow": pool_size}
        if backend != "postgresql":
            kwargs["pool_recycle"] = 3600  # below MySQL's default wait_timeout
            # READ COMMITTED set once per connection instead of a SET TRANSACTION
            # before each of novaque's transactions (see MySQLDialect).
            kwargs["isolation_level"] = "READ COMMITTED"
            kwargs["pool_reset_on_return"] = None  # replaced by _rollback_if_open
        try:
            engine = sa.create_engine(parsed, **kwargs)
        except ModuleNotFoundError as exc:
            raise missing_driver(parsed, exc) from None
        _ping_when_idle(engine)
        if backend != "postgresql":
            _READ_COMMITTED.add(engine)
            event.listen(engine, "reset", _rollback_if_open)
    else:
        raise UnsupportedDatabase(
            f"novaque does not support {backend!r} URLs; use postgresql+psycopg://, "
            "mysql+pymysql:// or sqlite:///"
        )
    _PREPARED.add(engine)
    return engine
