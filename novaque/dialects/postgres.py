"""PostgreSQL: one-statement publish, claim and ack, NOTIFY, the server clock."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.util import await_only

from novaque._tables import PARKED_OFFSET, STATE_LEASED, STATE_READY, channels, groups, topics
from novaque.dialects.base import (
    DECLINED,
    NOTIFY_CHANNEL,
    PLAIN_CHANNEL_SQL,
    ClaimedRow,
    Dialect,
    NotifyListener,
    SelectT,
    Table,
    claimed_rows,
    d,
    described,
    leasing,
    m,
    table_of,
)
from novaque.dialects.listen import _AwaitedPostgresListener, _PostgresListener
from novaque.dialects.params import (
    AckClaimParams,
    ClaimParams,
    Driver,
    Link,
    Plain,
    PublishParams,
)
from novaque.errors import TopicGone

MIGRATION_LOCK_KEY = 0x6E6F7661717565  # "novaque"

#: SQLSTATEs of a server that cannot serve now (besides class 08, connection
#: exceptions): shutting down (57P01 admin, 57P02 crash), starting or in
#: recovery (57P03), a read-only session: a standby, or a multi-host URL's
#: primary gone (25006).
_UNAVAILABLE_CODES = frozenset({"57P01", "57P02", "57P03", "25006"})
#: What PgBouncer's errors (SQLSTATE 08P01) say when its server is lost or
#: cannot be reached.
_POOLER_OUTAGES = (
    "server conn crashed",
    "cannot connect to server",
    "query_wait_timeout",
    "server_login_retry",
    "server login has been failing",
)


def array_literal(values: Sequence[int | str | None]) -> str:
    """PostgreSQL's text form of a one-dimensional array of integers or strings
    (``{1,NULL,"a \\"b\\""}``): each string quoted, its ``\\`` and ``"`` escaped."""
    return (
        "{"
        + ",".join(
            "NULL"
            if v is None
            else str(v)
            if isinstance(v, int)
            else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
            for v in values
        )
        + "}"
    )


def _driver_text(stmt: sa.TextClause) -> str:
    """A statement in psycopg's SQL (the same for its async connections)."""
    return str(stmt.compile(dialect=pg_psycopg.dialect()))  # type: ignore[no-untyped-call]


#: The head of both publish statements (:attr:`PostgresDialect._publish_sql`,
#: ``_publish_one_driver``): whether the topic has routed channels, and its
#: row held FOR KEY SHARE (no foreign key holds it: migration 0006).
_PUBLISH_HEAD = f"""WITH routed AS (
            SELECT EXISTS (
                SELECT 1 FROM {channels.name}
                WHERE topic_id = :topic_id AND NOT ({PLAIN_CHANNEL_SQL.format(c="")})
            ) AS yes
        ), tp AS (
            SELECT id FROM {topics.name} WHERE id = :topic_id FOR KEY SHARE
        )"""


#: The claim's pick (migration 0007): the ids of up to ``p_limit`` due
#: deliveries of the channel, oldest first, locked ``FOR UPDATE SKIP LOCKED``,
#: none for a paused channel, ``p_skip`` left out. A function with
#: ``enable_sort = off``, so PostgreSQL walks the claim index whatever its
#: statistics say of the channel (a bitmap scan and a sort read the whole
#: backlog); declared ``ROWS 1``, so the statement around it reaches the
#: picked rows by their primary key, as it did the subquery it replaces.
#: Since migration 0014 it starts at ``p_from``, the claim cursor, where the
#: channel's lanes and ordering allow (:data:`~novaque.dialects.base.scan_from`).
CLAIM_PICK = "novaque_claim_pick"
_CLAIM_PICK_CALL = (
    f"{CLAIM_PICK}(CAST(:p_channel AS INTEGER), CAST(:p_now AS BIGINT), "
    "CAST(:p_limit AS INTEGER), CAST({skip} AS BIGINT[]), CAST(:p_held AS INTEGER) = 1, "
    "CAST(:p_from AS BIGINT))"
)
_claim_pick: sa.Select[Any] = sa.select(sa.literal_column("id")).select_from(
    sa.text(_CLAIM_PICK_CALL.format(skip="'{}'") + " AS id").bindparams(
        sa.bindparam("p_held", 0, type_=sa.Integer),
        sa.bindparam("p_from", None, type_=sa.BigInteger),
    )
)


@contextlib.contextmanager
def _autocommit(dbapi: Any) -> Iterator[None]:
    """psycopg's connection ``dbapi`` in autocommit, then left as it was."""
    switch = not dbapi.autocommit
    if switch:
        dbapi.autocommit = True
    try:
        yield
    finally:
        if switch:
            dbapi.autocommit = False


def _autocommit_rows(dbapi: Any, sql: str, params: dict[str, Any]) -> Table:
    """The result (columns' names and rows) of one statement run on psycopg's connection
    ``dbapi`` in autocommit: a transaction by itself, one round trip (as on
    SQLAlchemy's path, see SyncExecutor._transaction); autocommit is left as
    it was."""
    with _autocommit(dbapi):
        cursor = dbapi.cursor()
        try:
            cursor.execute(sql, params)
            return described(cursor)
        finally:
            cursor.close()


def _pipelined_rows(dbapi: Any, statements: Sequence[tuple[str, dict[str, Any]]]) -> list[Table]:
    """The rows (by column name) of each of ``statements``, sent on psycopg's connection
    ``dbapi`` in one pipeline: one round trip, and in autocommit one implicit
    transaction (they commit together when the pipeline ends, or none does,
    and each sees what those before it wrote). Autocommit is left as it was;
    SQLAlchemy's adapter of an ``AsyncConnection`` is awaited through the
    greenlet bridge, as its own calls are."""
    import psycopg  # the driver of this path (driver_ops)

    with _autocommit(dbapi):
        conn = getattr(dbapi, "_connection", dbapi)
        if isinstance(conn, psycopg.AsyncConnection):
            return await_only(_pipelined_async(conn, statements))
        return _pipelined(conn, statements)


def _pipelined(conn: Any, statements: Sequence[tuple[str, dict[str, Any]]]) -> list[Table]:
    with conn.pipeline():
        cursors = [conn.cursor() for _ in statements]
        for cursor, (sql, params) in zip(cursors, statements, strict=True):
            cursor.execute(sql, params)
    return [described(cursor) for cursor in cursors]


async def _pipelined_async(
    conn: Any, statements: Sequence[tuple[str, dict[str, Any]]]
) -> list[Table]:
    async with conn.pipeline():
        cursors = [conn.cursor() for _ in statements]
        for cursor, (sql, params) in zip(cursors, statements, strict=True):
            await cursor.execute(sql, params)
    found: list[Table] = []
    for cursor in cursors:
        names = [column[0] for column in cursor.description]
        found.append((names, await cursor.fetchall()))
    return found


def _pair_params(pairs: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """``:ids`` and ``:tokens`` of (delivery id, lease token) pairs, in id
    order (the order rows are locked in)."""
    ordered = sorted(pairs)
    return {"ids": [p[0] for p in ordered], "tokens": [p[1] for p in ordered]}


def _pairs_of(rows: Iterable[Sequence[Any]]) -> set[tuple[int, str]]:
    """The (delivery id, lease token) pairs of rows that start with them."""
    return {(int(r[0]), str(r[1])) for r in rows}


def _ack_and_claim_params(pairs: Sequence[tuple[int, str]], claim: ClaimParams) -> dict[str, Any]:
    return {**claim.bind(), **_pair_params(pairs)}


def _acked_and_claimed(table: Table) -> tuple[set[tuple[int, str]], list[ClaimedRow]]:
    """The acks done (``kind`` 0) and the rows claimed (1), of
    PostgresDialect._ack_and_claim's result."""
    names, rows = table
    kind, delivery, token = (names.index(n) for n in ("kind", "delivery_id", "token"))
    done: set[tuple[int, str]] = set()
    claimed = []
    for r in rows:
        if r[kind] == 0:
            done.add((int(r[delivery]), str(r[token])))
        else:
            claimed.append(r)
    return done, claimed_rows((names, claimed))


class PostgresDialect(Dialect):
    name = "PostgreSQL"
    floor = (14,)
    supports_notify = True

    def __init__(self) -> None:
        claimed = leasing(_claim_pick).cte("claimed")
        self._claim_stmt = (
            sa.select(
                claimed.c.delivery_id,
                claimed.c.message_id,
                claimed.c.attempts,
                claimed.c.max_attempts,
                m.c.body,
                m.c.headers,
                m.c.published_at,
                claimed.c.until,
                claimed.c.channel_lease,
                m.c.group_key,
                claimed.c.order_key,
                m.c.priority,
            )
            .join_from(claimed, m, m.c.id == claimed.c.message_id)
            .order_by(claimed.c.delivery_id)
        )
        # Receive-and-delete in one statement: the claim's pick, deleted, and
        # the messages joined (as the claim's).
        popped = (
            sa.delete(d)
            .where(d.c.id.in_(_claim_pick.scalar_subquery()))
            .returning(d.c.id, d.c.message_id, d.c.attempts, d.c.max_attempts, d.c.group_key)
            .cte("popped")
        )
        self._pop_stmt = (
            sa.select(
                popped.c.id.label("delivery_id"),
                popped.c.message_id,
                (popped.c.attempts + 1).label("attempts"),
                popped.c.max_attempts,
                m.c.body,
                m.c.headers,
                m.c.published_at,
                m.c.group_key,
                popped.c.group_key.label("order_key"),
                m.c.priority,
            )
            .join_from(popped, m, m.c.id == popped.c.message_id)
            .order_by(popped.c.id)
        )

    def claim_statement(self) -> sa.ClauseElement:
        return self._claim_stmt

    @classmethod
    @contextlib.contextmanager
    def migration_lock(cls, conn: sa.Connection) -> Iterator[None]:
        # Held to the end of the migration's transaction (DDL is transactional).
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
        yield

    one_statement_ops = frozenset(
        {"publish", "publish_one", "claim", "ack", "ack_claim", "ack_ordered", "settle"}
    )

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
        ), ch AS (
            SELECT lease FROM {channels.name} WHERE id = :p_channel
        ), claimed AS (
            UPDATE {d.name}
            SET state = {STATE_LEASED}, lease_token = :p_token, attempts = attempts + 1,
                attempt_id = NULL, visible_at = COALESCE(
                    CASE WHEN :p_channel_lease = 1 THEN :p_now + (SELECT lease FROM ch) END,
                    :p_until)
            WHERE id IN (SELECT id FROM {_CLAIM_PICK_CALL.format(skip=":ids")} AS id)
            RETURNING id, message_id, attempts, max_attempts, visible_at, group_key
        )
        SELECT 0 AS kind, id AS delivery_id, NULL AS message_id, NULL AS attempts,
               NULL AS max_attempts, NULL AS body, NULL AS headers, NULL AS published_at,
               lease_token AS token, NULL AS until, NULL AS channel_lease, NULL AS group_key,
               NULL AS order_key, NULL AS priority
        FROM acked
        UNION ALL
        SELECT 1, c.id, c.message_id, c.attempts, c.max_attempts, m.body, m.headers,
               m.published_at, NULL, c.visible_at, (SELECT lease FROM ch), m.group_key,
               c.group_key, m.priority
        FROM claimed c JOIN {m.name} m ON m.id = c.message_id
        """
    )

    _ack_and_claim_driver = _driver_text(_ack_and_claim)

    def ack_and_claim(
        self, link: Link, p: AckClaimParams
    ) -> tuple[set[tuple[int, str]], list[ClaimedRow]] | None:
        if isinstance(link, Driver):
            if p.ordered:
                return self._ack_ordered_and_claim(link.dbapi, p)
            params = _ack_and_claim_params(p.pairs, p.claim)
            return _acked_and_claimed(
                _autocommit_rows(link.dbapi, self._ack_and_claim_driver, params)
            )
        if p.ordered:
            return super().ack_and_claim(link, p)
        params = _ack_and_claim_params(p.pairs, p.claim)
        return _acked_and_claimed(table_of(link.execute(self._ack_and_claim, params)))

    def delete_leased_pairs(
        self, conn: sa.Connection, pairs: Sequence[tuple[int, str]]
    ) -> set[tuple[int, str]]:
        return _pairs_of(conn.execute(self._delete_pairs, _pair_params(pairs)))

    # An ordered ack in one call of ``novaque_ack_ordered``
    # (migration 0008): the acks' DELETE, which also locks the rows of the
    # groups they left in (channel, group key) order, then, in a statement of
    # the function with a snapshot of its own (it sees what a publisher that
    # held a group's lock meanwhile committed), the heads moved on as
    # :meth:`move_heads` moves them.
    _ack_ordered = sa.text(
        "SELECT acked_id, acked_token FROM novaque_ack_ordered("
        "CAST(:ids AS BIGINT[]), CAST(:tokens AS TEXT[]))"
    )

    def delete_leased_pairs_moving_groups(
        self, conn: sa.Connection, pairs: Sequence[tuple[int, str]]
    ) -> set[tuple[int, str]] | None:
        return _pairs_of(conn.execute(self._ack_ordered, _pair_params(pairs)))

    _ack_ordered_driver = _driver_text(_ack_ordered)

    def _ack_ordered_and_claim(
        self, dbapi: Any, p: AckClaimParams
    ) -> tuple[set[tuple[int, str]], list[ClaimedRow]]:
        # The ordered ack's call, then the claim (the ack-and-claim statement
        # with nothing to ack), pipelined: one round trip and one commit. The
        # claim sees the groups moved on, as a later statement of the same
        # transaction.
        acks = _pair_params(p.pairs)
        claim = _ack_and_claim_params((), p.claim)
        acked, claimed = _pipelined_rows(
            dbapi, [(self._ack_ordered_driver, acks), (self._ack_and_claim_driver, claim)]
        )
        return _pairs_of(acked[1]), _acked_and_claimed(claimed)[1]

    # The groups' next deliveries (read on ix_novaque_deliveries_group, as
    # _groups._nexts), the heads moved to them, unparked, and the groups left
    # empty dropped: one statement instead of four.
    _move_heads = sa.text(
        f"""
        WITH nx AS (
            SELECT g.group_key, (
                SELECT n.id FROM {d.name} AS n
                WHERE n.channel_id = g.channel_id AND n.group_key = g.group_key
                  AND n.state + 0 = {STATE_READY} AND n.visible_at + 0 >= {PARKED_OFFSET}
                ORDER BY n.id LIMIT 1
            ) AS next_id
            FROM {groups.name} AS g
            WHERE g.channel_id = :p_channel AND g.group_key = ANY(CAST(:p_keys AS TEXT[]))
        ), moved AS (
            UPDATE {groups.name} AS g SET head_id = nx.next_id FROM nx
            WHERE g.channel_id = :p_channel AND g.group_key = nx.group_key
              AND nx.next_id IS NOT NULL
            RETURNING g.group_key
        ), unparked AS (
            UPDATE {d.name} SET visible_at = visible_at - {PARKED_OFFSET}
            WHERE id IN (SELECT next_id FROM nx WHERE next_id IS NOT NULL)
              AND state = {STATE_READY} AND visible_at >= {PARKED_OFFSET}
            RETURNING id
        ), dropped AS (
            DELETE FROM {groups.name} AS g USING nx
            WHERE g.channel_id = :p_channel AND g.group_key = nx.group_key
              AND nx.next_id IS NULL
            RETURNING g.group_key
        )
        SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM unparked),
               (SELECT count(*) FROM dropped)
        """
    )

    def move_heads(self, conn: sa.Connection, channel_id: int, keys: Sequence[str]) -> bool:
        conn.execute(self._move_heads, {"p_channel": channel_id, "p_keys": sorted(keys)})
        return True

    def db_now_us(self, conn: sa.Connection) -> int | None:
        return int(
            conn.exec_driver_sql(
                "SELECT (extract(epoch from clock_timestamp()) * 1000000)::bigint"
            ).scalar_one()
        )

    def is_retryable(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) in ("40P01", "40001")

    def is_unavailable(self, exc: DBAPIError) -> bool:
        if super().is_unavailable(exc):
            return True
        code = getattr(exc.orig, "sqlstate", None)
        if code is None:
            # psycopg's own errors carry no SQLSTATE: a connection that could
            # not be opened (refused, no primary among the hosts of a
            # multi-host URL, a timeout) or was lost.
            return isinstance(exc, sa.exc.OperationalError)
        if code == "08P01":
            # PostgreSQL's "protocol violation" is a bug, not an outage; but
            # PgBouncer reports its lost or unreachable servers with it.
            text = str(exc.orig).lower()
            return any(sign in text for sign in _POOLER_OUTAGES)
        return code.startswith("08") or code in _UNAVAILABLE_CODES

    can_cancel = True

    def cancel(self, driver_conn: Any) -> None:
        # libpq's cancel request, on a connection of its own (safe from
        # another thread, for psycopg's sync and asyncio connections alike).
        driver_conn.pgconn.get_cancel().cancel()

    def notify(self, conn: sa.Connection, topic: str) -> None:
        conn.execute(sa.select(sa.func.pg_notify(NOTIFY_CHANNEL, topic)))

    # One statement does the whole publish: the messages from an array of
    # bodies (in order, so their ids ascend with it), one delivery per
    # (message, plain channel the topic has when the statement starts), the
    # count per channel for the stats, NOTIFY when deliveries were written,
    # and whether the topic has routed channels. Guarded, it writes
    # nothing when it has (the caller runs outside a transaction and cannot
    # write their deliveries in the same one: it publishes again in one).
    # No foreign key checks the topic and the channels here (migration
    # 0006): the statement holds their rows FOR KEY SHARE, once each, and
    # writes nothing for one deleted meanwhile (the last column: whether
    # the topic still exists).
    _publish_sql = f"""
        {_PUBLISH_HEAD}, msg AS (
            INSERT INTO {m.name} (topic_id, body, headers, published_at, expires_at, max_attempts,
                                  group_key)
            SELECT tp.id, u.body, CAST(:headers AS TEXT), :published_at, :expires_at,
                   :max_attempts, u.grp
            FROM tp, unnest(CAST(:bodies AS BYTEA[]), CAST(:groups AS TEXT[]))
                 WITH ORDINALITY AS u(body, grp, n)
            {{guard}}
            ORDER BY u.n
            RETURNING id
        ), dl AS (
            INSERT INTO {d.name} (message_id, channel_id, state, visible_at, attempts,
                                  max_attempts)
            SELECT msg.id, c.id, {STATE_READY}, :visible, 0,
                   COALESCE(c.max_attempts, :max_attempts)
            FROM msg CROSS JOIN {channels.name} c
            WHERE c.topic_id = :topic_id AND {PLAIN_CHANNEL_SQL.format(c="c.")}
            ORDER BY msg.id, c.id
            FOR KEY SHARE OF c
            RETURNING channel_id
        ), fan AS (
            SELECT channel_id, count(*) AS n FROM dl GROUP BY channel_id
        )
        SELECT ARRAY(SELECT id FROM msg ORDER BY id),
               ARRAY(SELECT channel_id FROM fan ORDER BY channel_id),
               ARRAY(SELECT n FROM fan ORDER BY channel_id),
               CASE WHEN EXISTS (SELECT 1 FROM dl)
                    THEN pg_notify('{NOTIFY_CHANNEL}', :topic) END,
               (SELECT yes FROM routed),
               EXISTS (SELECT 1 FROM tp)
        """
    _publish = sa.text(_publish_sql.format(guard=""))
    _publish_guarded = sa.text(_publish_sql.format(guard="WHERE NOT (SELECT yes FROM routed)"))

    _hold_topic = (
        sa.select(topics.c.id)
        .where(topics.c.id == sa.bindparam("p_id"))
        .with_for_update(key_share=True)
    )

    holds_parents = True

    # Delivery rows as one array per column: one statement whatever their
    # number. Each array is sent as its literal text (psycopg dumps a list
    # element by element: 2,000 rows took ~4 ms more so): SQLAlchemy's
    # executemany of a routed publish's 2,000 rows spent 19 of its 31 ms
    # building and sending them, the arrays ~6.
    _delivery_columns = (
        ("message_id", "BIGINT"),
        ("channel_id", "INTEGER"),
        ("state", "SMALLINT"),
        ("visible_at", "BIGINT"),
        ("attempts", "INTEGER"),
        ("max_attempts", "INTEGER"),
        ("group_key", "TEXT"),
    )
    _insert_delivery_rows = sa.text(
        f"INSERT INTO {d.name} ({', '.join(c for c, _ in _delivery_columns)}) "
        f"SELECT {', '.join(f'u.{c}' for c, _ in _delivery_columns)} "
        f"FROM unnest({', '.join(f'CAST(:{c} AS {t}[])' for c, t in _delivery_columns)}) "
        f"WITH ORDINALITY AS u({', '.join(c for c, _ in _delivery_columns)}, n) "
        "ORDER BY u.n"
    )

    def insert_delivery_rows(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> None:
        params = {c: array_literal([row.get(c) for row in rows]) for c, _ in self._delivery_columns}
        conn.execute(self._insert_delivery_rows, params)

    def insert_deduplicated(self, conn: sa.Connection, row: dict[str, Any]) -> int | None:
        # The key's unique index is partial (migration 0006): ON CONFLICT names it.
        stmt = (
            pg_dialect.insert(m)
            .on_conflict_do_nothing(
                index_elements=[m.c.topic_id, m.c.dedup_key], index_where=m.c.dedup_key.is_not(None)
            )
            .returning(m.c.id)
        )
        found = conn.execute(stmt, row).scalar_one_or_none()
        return None if found is None else int(found)

    def read_held(self, stmt: SelectT) -> SelectT:
        return stmt.with_for_update(key_share=True)

    def hold_topic(self, conn: sa.Connection, topic_id: int) -> bool:
        return conn.execute(self._hold_topic, {"p_id": topic_id}).first() is not None

    def publish_plain(self, link: Link, p: PublishParams) -> Plain:
        if isinstance(link, Driver):
            [body] = p.bodies
            params = {**p.fields, "body": body, "visible": p.visible, "topic": p.topic}
            [one] = _autocommit_rows(link.dbapi, self._publish_one_driver, params)[1]
            if not one[4]:
                raise TopicGone(p.topic)
            if one[3]:  # routed channels: the guard wrote nothing
                return DECLINED
            return Plain([int(one[0])], {int(c): 1 for c in one[1]}, False)
        keys = list(p.groups) if p.groups is not None else [None] * len(p.bodies)
        row = link.execute(
            self._publish if p.routed else self._publish_guarded,
            {
                **p.fields,
                "bodies": list(p.bodies),
                "groups": keys,
                "visible": p.visible,
                "topic": p.topic,
            },
        ).one()
        if not row[5]:
            raise TopicGone(p.topic)
        counts = {int(c): int(n) for c, n in zip(row[1], row[2], strict=True)}
        return Plain([int(i) for i in row[0]], counts, bool(row[4]))

    # The guarded publish of one message, its parameters scalars (psycopg
    # dumps an array and loads an array result at a cost per call): the
    # message id (NULL when the guard wrote nothing), the channels written
    # to, NOTIFY, whether the topic has routed channels, whether it exists.
    _publish_one_driver = _driver_text(
        sa.text(
            f"""
        {_PUBLISH_HEAD}, msg AS (
            INSERT INTO {m.name} (topic_id, body, headers, published_at, expires_at, max_attempts)
            SELECT tp.id, CAST(:body AS BYTEA), CAST(:headers AS TEXT), :published_at,
                   :expires_at, :max_attempts
            FROM tp WHERE NOT (SELECT yes FROM routed)
            RETURNING id
        ), dl AS (
            INSERT INTO {d.name} (message_id, channel_id, state, visible_at, attempts,
                                  max_attempts)
            SELECT msg.id, c.id, {STATE_READY}, :visible, 0,
                   COALESCE(c.max_attempts, :max_attempts)
            FROM msg CROSS JOIN {channels.name} c
            WHERE c.topic_id = :topic_id AND {PLAIN_CHANNEL_SQL.format(c="c.")}
            ORDER BY c.id
            FOR KEY SHARE OF c
            RETURNING channel_id
        )
        SELECT (SELECT id FROM msg), ARRAY(SELECT channel_id FROM dl),
               CASE WHEN EXISTS (SELECT 1 FROM dl)
                    THEN pg_notify('{NOTIFY_CHANNEL}', :topic) END,
               (SELECT yes FROM routed),
               EXISTS (SELECT 1 FROM tp)
        """
        )
    )

    def driver_ops(self, sql_dialect: sa.Dialect) -> frozenset[str]:
        return (
            frozenset({"publish_one", "ack_claim", "claim"}) | self._pipelined_ops()
            if sql_dialect.driver == "psycopg"
            else frozenset()
        )

    @staticmethod
    def _pipelined_ops() -> frozenset[str]:
        """The driver path's operations that need psycopg's pipeline mode
        (libpq 14 or later: psycopg's binary wheels bring their own)."""
        import psycopg

        return frozenset({"ack_ordered_claim"}) if psycopg.Pipeline.is_supported() else frozenset()

    def open_listener(self, engine: sa.Engine, *, awaited: bool = False) -> NotifyListener | None:
        try:
            import psycopg  # noqa: F401  (psycopg 3 reads notifications with a timeout)
        except ImportError:
            return None
        return _AwaitedPostgresListener(engine) if awaited else _PostgresListener(engine)

    def claim(self, link: Link, p: ClaimParams) -> list[ClaimedRow]:
        if isinstance(link, Driver):
            # The ack-and-claim with nothing to ack: its DELETE of no pairs
            # costs nothing, and an idle consumer's claim, on a NOTIFY, is
            # then one round trip without SQLAlchemy's statement machinery.
            params = _ack_and_claim_params((), p)
            return _acked_and_claimed(
                _autocommit_rows(link.dbapi, self._ack_and_claim_driver, params)
            )[1]
        # One statement: lock (skipping rows other consumers hold), lease, and
        # return the message with each delivery.
        return claimed_rows(table_of(link.execute(self._claim_stmt, p.bind())))

    def pop(self, conn: sa.Connection, p: ClaimParams) -> list[ClaimedRow]:
        found = conn.execute(self._pop_stmt, p.bind())
        return claimed_rows(table_of(found), until=p.now, channel_lease=None)

    def _insert(self, table: sa.Table) -> Any:
        return pg_dialect.insert(table)
