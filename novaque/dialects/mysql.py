"""MySQL, and MariaDB as a named variant of it (RETURNING where MariaDB has it)."""

from __future__ import annotations

import contextlib
import functools
import operator
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.exc import DBAPIError

from novaque._tables import (
    CLAIM_INDEX,
    COUNTER_COLUMNS,
    STATE_INDEX,
    STATE_LEASED,
    STATE_READY,
    channels,
    exact_key_text,
    groups,
    stats,
)
from novaque.dialects.base import (
    DECLINED,
    NEXT_LANE,
    PLAIN_CHANNEL_SQL,
    ClaimedRow,
    Dialect,
    NotifyListener,
    SelectT,
    _channel_lease,
    _channel_paused,
    _claim_range,
    _dotted,
    _driver_sql,
    _inserted_id,
    _lease_values,
    _message_fields,
    _scan_from,
    claim_ids,
    claim_lane,
    claimed_rows,
    d,
    described,
    in_lanes,
    insert_message_sql,
    m,
    mappings,
    message_columns,
    message_values,
    on_index,
    plain_channel,
    scan_from,
    table_of_dicts,
)
from novaque.dialects.params import AckClaimParams, ClaimParams, Driver, Link, Plain, PublishParams
from novaque.dialects.watch import MySQLWatcher
from novaque.errors import UnsupportedDatabase

MIGRATION_LOCK_NAME = "novaque_migrate"

_routed = channels.alias("routed")
#: Whether the topic has routed channels (see Dialect.publish_plain). In the
#: RETURNING of the fan-out's INSERT ... SELECT a locking read, as the rest of
#: that statement (the latest committed channels, whatever the snapshot of a
#: caller's REPEATABLE READ transaction); elsewhere :data:`_routed_exists_held`.
_routed_exists = sa.exists().where(
    _routed.c.topic_id == sa.bindparam("p_topic_id"),
    sa.not_(sa.and_(_routed.c.filter_expr.is_(None), _routed.c.ordering == 0)),
)
#: :data:`_routed_exists` as a locking read of its own (LOCK IN SHARE MODE in
#: the subquery): the channels the plain fan-out saw, not the snapshot's.
_routed_exists_held = sa.exists(
    sa.select(sa.literal(1))
    .where(
        _routed.c.topic_id == sa.bindparam("p_topic_id"),
        sa.not_(sa.and_(_routed.c.filter_expr.is_(None), _routed.c.ordering == 0)),
    )
    .with_for_update(read=True)
)


#: Errors of a server that cannot serve now (see Dialect.is_unavailable):
#: 1047 a Galera node not ready for clients (joining, or cut off from the
#: cluster's primary component), 1053 the server shutting down, 1290 and 1836
#: a read-only server, 1927 the connection killed, 2002/2003 no connection
#: (socket, TCP), 2006/2013/2055 the connection lost, 4031 closed by the
#: server after idling.
_UNAVAILABLE_CODES = frozenset({1047, 1053, 1290, 1836, 1927, 2002, 2003, 2006, 2013, 2055, 4031})


def _mysql_code(exc: DBAPIError) -> object:
    args: tuple[object, ...] = tuple(getattr(exc.orig, "args", ()))
    return args[0] if args else None


#: MariaDB's multi-row message insert (see MySQLDialect.insert_plain_messages):
#: the fields every row shares, then each row's body and group by index.
_SHARED_FIELDS = ("topic_id", "headers", "published_at", "expires_at", "max_attempts")
_INSERT_PLAIN = (
    f"INSERT INTO {m.name} (topic_id, body, headers, published_at, expires_at, "
    "max_attempts, dedup_key, group_key) VALUES"
)
_SHARED_ROW = (
    "(%(s_topic_id)s, {body}, %(s_headers)s, %(s_published_at)s, %(s_expires_at)s, "
    "%(s_max_attempts)s, NULL, {group})"
)


def _hex_literal(value: bytes) -> str:
    """``value`` as a MySQL hex literal (``X'...'``): built by ``bytes.hex`` in
    C, where the drivers escape ``bytes`` byte by byte (PyMySQL in Python,
    asyncmy slower still), and the same size as escaping's worst case."""
    return f"X'{value.hex()}'"


#: How many slices a Galera cluster's claims are spread over (see
#: :meth:`MySQLDialect.learn_server`).
CLAIM_SLICES = 16

#: The deliveries of one slice: a hash of the id (CRC32: ids step by the
#: cluster's size on Galera, so their remainders alone would not spread).
_in_slice = sa.func.mod(
    sa.func.crc32(d.c.id), sa.bindparam("p_slices", type_=sa.Integer)
) == sa.bindparam("p_slice", type_=sa.Integer)


#: The oldest due deliveries of one slice (``p_slice`` of ``p_slices``), from
#: the claim index alone (the claim's locking read checks their attempts): a
#: derived table, which the locking clause of a SELECT does not reach.
def _slice_candidates(lane: sa.ColumnElement[Any], since: sa.ColumnElement[Any]) -> sa.Subquery:
    candidates = (
        sa.select(d.c.id)
        .where(
            d.c.channel_id == sa.bindparam("p_channel"),
            d.c.priority == lane,
            d.c.visible_at >= since,
            d.c.visible_at <= sa.bindparam("p_now"),
            _in_slice,
        )
        .order_by(d.c.visible_at, d.c.id)
        .limit(sa.bindparam("p_limit", type_=sa.Integer))
    )
    return on_index(candidates, d, CLAIM_INDEX).subquery("candidates")


#: The lane of a claim block's pick: its variable ``lane``, found before the
#: pick (:func:`_lease_block`): a subquery's value bounds no range in
#: MariaDB's plan, which then reads past the due deliveries to the lane's end.
_BLOCK_LANE = sa.bindparam("p_lane_at", type_=sa.SmallInteger)
#: Where a claim block's pick starts: its variable ``scan_from``, read with
#: the channel's lanes (see :data:`~novaque.dialects.base.scan_from`).
_BLOCK_FROM = sa.bindparam("p_scan_from", type_=sa.BigInteger)
#: A claim block's pick (its parameters ``p_lane_at`` and ``p_scan_from`` the
#: block's variables ``lane`` and ``scan_from``, :func:`_in_block`).
BLOCK_PICK = claim_ids(_BLOCK_LANE, _BLOCK_FROM)

_PickT = TypeVar("_PickT", bound=sa.Select[Any])


def _in_one_slice(
    pick: _PickT,
    lane: sa.ColumnElement[Any] = claim_lane,
    since: sa.ColumnElement[Any] = _scan_from,
) -> _PickT:
    """``pick``, a claim's locking read (a SELECT) of due deliveries, taking
    only those of one slice: found first by a read without locks, then locked
    by their keys (still due, skipping others' locks).

    On a Galera cluster a node applies the others' writes with priority over
    its own transactions: a claim that holds a lock on a row another node's
    claim leased is aborted (1213), whatever it wanted the row for. So the
    claim's scan of the slice takes no locks, and only the rows it leases
    are locked.
    """
    candidates = _slice_candidates(lane, since)
    return pick.where(d.c.id.in_(sa.select(candidates.c.id)))


def _pyformat(stmt: sa.ClauseElement) -> str:
    """``stmt`` in the driver's SQL (``%(name)s`` parameters)."""
    return str(stmt.compile(dialect=mysql_dialect.dialect(paramstyle="pyformat")))


#: The parameters of a claim's statements that stand for a
#: :func:`_lease_block`'s variables there: the pick's lane, start and count,
#: and when the block's leases expire and the channel's own lease.
_BLOCK_VARIABLES = {
    "p_lane_at": "lane",
    "p_scan_from": "scan_from",
    "p_limit": "want",
    "p_lease_until": "lease_until",
    "p_block_lease": "channel_lease",
}


def _in_block(stmt: sa.ClauseElement) -> str:
    """One of a claim's statements in a :func:`_lease_block`, its parameters
    of :data:`_BLOCK_VARIABLES` the block's variables."""
    sql = _pyformat(stmt)
    for param, variable in _BLOCK_VARIABLES.items():
        sql = sql.replace(f"%({param})s", variable)
    return sql


_BLOCK_UNTIL = sa.bindparam("p_lease_until", type_=sa.BigInteger)
_BLOCK_LEASE = sa.bindparam("p_block_lease", type_=sa.BigInteger)
#: What a claim block leased, with their messages: its deliveries leased with
#: its token at its lease's expiry, read through the state index by name (as
#: for the pick, the dead entries a held snapshot keeps misled MariaDB's
#: planner into reading the channel's whole claim index instead).
BLOCK_LEASED = on_index(
    sa.select(
        d.c.id.label("delivery_id"),
        d.c.message_id,
        d.c.attempts,
        d.c.max_attempts,
        m.c.body,
        m.c.headers,
        m.c.published_at,
        _BLOCK_UNTIL.label("until"),
        _BLOCK_LEASE.label("channel_lease"),
        m.c.group_key,
        d.c.group_key.label("order_key"),
        m.c.priority,
    )
    .join_from(d, m, m.c.id == d.c.message_id)
    .where(
        d.c.channel_id == sa.bindparam("p_channel"),
        d.c.state == sa.literal_column(str(STATE_LEASED)),
        d.c.visible_at == _BLOCK_UNTIL,
        d.c.lease_token == sa.bindparam("p_token"),
    )
    .order_by(d.c.id),
    d,
    STATE_INDEX,
)


#: A claim block's lanes, within the channel's ``low_lane`` to ``high_lane``
#: (``lane`` to ``top``): the lowest of its deliveries, then the next above
#: ``lane`` (each one probe of the claim index).
_FIRST_LANE_SQL = (
    f"SELECT min(priority) FROM {d.name} WHERE channel_id = %(p_channel)s "
    "AND priority >= lane AND priority <= top"
)
_NEXT_LANE_SQL = (
    f"SELECT min(priority) FROM {d.name} WHERE channel_id = %(p_channel)s "
    "AND priority > lane AND priority <= top"
)


#: Where a claim block's pick starts (as :data:`~novaque.dialects.base.scan_from`).
_SCAN_FROM_SQL = _pyformat(scan_from).replace("novaque_channels.", "c.")

#: What a spread claim's block declares: how many rows its slice gave, and their ids.
_SPREAD_DECLARED = "DECLARE taken INT DEFAULT 0; DECLARE taken_ids LONGTEXT DEFAULT '[]'; "


def _lease_block(*, ack: bool, spread: bool = False) -> str:
    """MariaDB's claim (``ack``: after the ack of a batch) as one compound
    statement (``BEGIN NOT ATOMIC``), a whole transaction in one round trip,
    in READ COMMITTED as :meth:`MySQLDialect.begin_transaction` sets it (no
    gap locks: claims never deadlock with publishes).

    It deletes the acked deliveries still leased with their token (returned),
    leases the claim's rows (its locking read, skipping others' locks, joined
    by the UPDATE, which then reaches each row by its key: MariaDB's UPDATE
    has neither RETURNING nor SKIP LOCKED of its own), returns them with their
    messages, found by the claim's token at the lease's expiry (an index range
    of the channel's leased rows), and commits. A paused channel leases
    nothing. Parameters: :func:`_lease_params`, and for the ack ``ids`` and
    ``pairs`` (tuples: the driver writes them as lists).

    ``spread``: the claim looks in one slice of the due deliveries first
    (``p_slice`` of ``p_slices``; :func:`_in_one_slice`), and in all of them
    only when that slice gives none (see :meth:`MySQLDialect.learn_server`).
    Its locking read is a cursor's, whose rows' ids are gathered (a JSON
    array) and leased by one UPDATE joined on them: an UPDATE's derived table
    would lock every row its read without locks passed over too (the scan of
    the other slices).
    """
    acked = (
        f"DELETE FROM {d.name} WHERE id IN %(ids)s AND (id, lease_token) IN %(pairs)s "
        "RETURNING id, lease_token; "
        if ack
        else ""
    )
    leasing = (
        f"SET {{row}}state = {STATE_LEASED}, {{row}}visible_at = lease_until, "
        "{row}lease_token = %(p_token)s, {row}attempts = {row}attempts + 1, "
        "{row}attempt_id = NULL"
    )
    pick = BLOCK_PICK
    picks = (
        f"UPDATE {d.name} AS leased JOIN ({_in_block(pick)}) AS picked "
        f"ON leased.id = picked.id {leasing.format(row='leased.')}; "
    )
    if spread:
        picks = (
            "SET taken = 0; SET taken_ids = '[]'; "
            f"FOR picked IN ({_in_block(_in_one_slice(pick, _BLOCK_LANE, _BLOCK_FROM))}) DO "
            "SET taken_ids = JSON_ARRAY_APPEND(taken_ids, '$', picked.id); "
            "SET taken = taken + 1; END FOR; "
            f"IF taken = 0 THEN {picks}ELSE UPDATE {d.name} AS leased JOIN JSON_TABLE(taken_ids, "
            "'$[*]' COLUMNS (id BIGINT PATH '$')) AS picked ON leased.id = picked.id "
            f"{leasing.format(row='leased.')}; END IF; "
        )
    return (
        "BEGIN NOT ATOMIC DECLARE lease_until BIGINT; DECLARE channel_lease BIGINT; "
        "DECLARE lane SMALLINT; DECLARE top SMALLINT; DECLARE want INT; "
        "DECLARE scan_from BIGINT; "
        f"{_SPREAD_DECLARED if spread else ''}"
        "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; "
        f"{acked}"
        # The channel's lease and lanes (none if the channel is gone) and
        # where the pick starts; a channel of several lanes then finds its
        # lowest (in a statement of its own: MariaDB reads a MIN() subquery's
        # value when it plans the statement, whether a CASE needs it or not,
        # and the probe walks the dead versions at the head of the lane).
        f"SELECT c.lease, c.low_lane, c.high_lane, {_SCAN_FROM_SQL} "
        "INTO channel_lease, lane, top, scan_from "
        f"FROM (SELECT 1) AS one LEFT JOIN {channels.name} AS c "
        "ON c.id = %(p_channel)s; "
        f"IF lane < top THEN SET lane = ({_FIRST_LANE_SQL}); END IF; "
        "SET lease_until = coalesce(CASE WHEN %(p_channel_lease)s = 1 "
        "THEN %(p_now)s + channel_lease END, %(p_until)s); "
        # The lanes, lowest first, until the claim has its rows (as in_lanes).
        "SET want = %(p_limit)s; "
        f"WHILE want > 0 AND lane IS NOT NULL DO {picks}"
        "SET want = want - ROW_COUNT(); "
        f"IF want > 0 AND lane < top THEN SET lane = ({_NEXT_LANE_SQL}); "
        "ELSE SET lane = NULL; END IF; END WHILE; "
        f"{_in_block(BLOCK_LEASED)}; "
        "COMMIT; END"
    )


def _lease_params(p: ClaimParams, slices: int = 0) -> dict[str, Any]:
    """The parameters of a :func:`_lease_block` (``slices``: of a spread one)."""
    params = p.bind()
    if slices:
        params.update(_slice_params(slices))
    return params


def _slice_params(slices: int) -> dict[str, int]:
    """A claim's slice, at random, of ``slices``."""
    return {"p_slices": slices, "p_slice": random.randrange(slices)}


def _one_row(dbapi: Any, block: str, params: Sequence[Any]) -> tuple[Any, ...]:
    """The one row a compound statement returns (its closing OK read by the
    cursor's close)."""
    cursor = dbapi.cursor()
    try:
        cursor.execute(block, params)
        row: tuple[Any, ...] = cursor.fetchone()
        return row
    finally:
        cursor.close()


def _leased_rows(cursor: Any) -> list[ClaimedRow]:
    """The rows a :func:`_lease_block` leased (its current result); its
    remaining results are read here or by the cursor's close, which raise an
    error of its COMMIT."""
    found = described(cursor)
    while cursor.nextset():
        pass
    return claimed_rows(found, text=exact_key_text)


#: The message insert of the one-message publish blocks, its body a hex
#: literal put in per call (``{body}``, see :func:`_hex_literal`; asyncmy
#: escapes ``bytes`` at about 30 ns a byte, 6 µs for 200 bytes, 30 ms for
#: 1 MiB) and its other fields parameters (:func:`_message_params`).
_INSERT_ONE = insert_message_sql("%s", body="{body}")


def _message_params(fields: dict[str, Any], body: bytes) -> tuple[Any, ...]:
    """:func:`message_values` but the body (in :data:`_INSERT_ONE` as a literal)."""
    topic_id, _, *rest = message_values(fields, body)
    return (topic_id, *rest)


#: Not cut at the session's group_concat_max_len, whatever the application
#: set it to (16 MiB: two million channel ids).
_UNCUT = "SET STATEMENT group_concat_max_len = 16777216 FOR "

#: A topic's plan, read into ``plan`` inside a compound statement: each of its
#: channels as ``id:max_attempts`` (empty: the message's), ``id:r`` if it is
#: routed, in id order, joined by commas (NULL: no channel). A publish that
#: knows it inserts the deliveries itself, from values, then checks it.
_READ_PLAN = (
    f"{_UNCUT}SELECT GROUP_CONCAT(CONCAT(id, ':', "
    f"IF({PLAIN_CHANNEL_SQL.format(c='')}, IFNULL(max_attempts, ''), 'r')) ORDER BY id) "
    f"INTO plan FROM {channels.name} WHERE topic_id = %s; "
)

#: A foreign key found no row (MariaDB's ER_NO_REFERENCED_ROW_2).
_NO_REFERENCED_ROW = 1452


@functools.lru_cache(maxsize=64)
def _planned_publish_block(fan_out: int) -> str:
    """MariaDB's one-message publish to a topic whose plan is known, with
    ``fan_out`` plain channels: the deliveries inserted from values (an INSERT
    ... SELECT of the channels cost about 150 µs more, the routed check 70),
    then the plan read again and compared, in the same transaction: the
    message id if it held (committed), else NULL (rolled back, as when a
    channel named in it was deleted meanwhile: its delivery's foreign key).
    A channel created or changed later than that read is ordered after this
    publish, as one committed later than a publish is."""
    rows = ", ".join([f"(new_id, %s, {STATE_READY}, %s, 0, %s)"] * fan_out)
    deliveries = (
        f"INSERT INTO {d.name} (message_id, channel_id, state, visible_at, attempts, "
        f"max_attempts) VALUES {rows}; "
        if fan_out
        else ""
    )
    return (
        "BEGIN NOT ATOMIC DECLARE new_id BIGINT; DECLARE plan LONGTEXT; "
        f"DECLARE EXIT HANDLER FOR {_NO_REFERENCED_ROW} BEGIN ROLLBACK; SELECT NULL; END; "
        f"{_INSERT_ONE}; SET new_id = LAST_INSERT_ID(); {deliveries}"
        f"{_READ_PLAN}IF plan <=> %s THEN COMMIT; SELECT new_id; "
        "ELSE ROLLBACK; SELECT NULL; END IF; END"
    )


def _plan_channels(plan: str) -> list[tuple[int, int | None]] | None:
    """The plain channels of a plan, with their max_attempts; None if it names
    a routed one."""
    found: list[tuple[int, int | None]] = []
    for entry in plan.split(",") if plan else ():
        channel_id, _, max_attempts = entry.partition(":")
        if max_attempts == "r":
            return None
        found.append((int(channel_id), int(max_attempts) if max_attempts else None))
    return found


class MySQLDialect(Dialect):
    name = "MySQL"
    floor = (8, 0, 1)
    # No push: the newest delivery id is looked at instead.
    supports_watch = True

    def __init__(self) -> None:
        #: How many slices the claims are spread over (0: none; see
        #: :meth:`learn_server`).
        self.slices = 0

    def learn_server(self, conn: sa.Connection) -> None:
        # A Galera cluster certifies each transaction against the others'
        # writes when it commits: claims on different nodes that lease the
        # same oldest rows (no node sees another's locks) abort all but one,
        # as deadlocks. Each claim there looks first in one slice of the due
        # deliveries at random (the oldest due of the slice: its rows are
        # among the channel's oldest few hundred due), so concurrent claims
        # mostly lease different rows; a lone server keeps the plain claim.
        found: dict[str, str] = dict(
            conn.exec_driver_sql(
                "SHOW VARIABLES WHERE Variable_name IN ('wsrep_on', 'wsrep_provider')"
            ).all()
        )
        on = found.get("wsrep_on", "OFF").upper() in ("ON", "1")
        provider = found.get("wsrep_provider", "none").lower()
        self.slices = CLAIM_SLICES if on and provider not in ("", "none") else 0

    def open_watcher(
        self,
        engine: sa.Engine,
        interval: float,
        *,
        idle_interval: float | None = None,
        awaited: bool = False,
    ) -> NotifyListener:
        return MySQLWatcher(engine, interval, idle_interval=idle_interval, awaited=awaited)

    # The message fields come with the locking read, through primary-key
    # subqueries: InnoDB locks only the rows of the outer query (a locking
    # clause does not reach a nested subquery), so messages stay unlocked for
    # the consumers of the topic's other channels. Saves the round trip of a
    # separate SELECT of the messages. The channel's settings come the same
    # way, unlocked (a locking read of the channel row would make every other
    # consumer of the channel skip it and claim nothing).
    _lock_ids = (
        sa.select(
            d.c.id.label("delivery_id"),
            d.c.message_id,
            d.c.attempts,
            d.c.max_attempts,
            *message_columns,
            _channel_lease.label("channel_lease"),
            _channel_paused.label("paused"),
            d.c.group_key.label("order_key"),
        )
        .where(_claim_range)
        .order_by(d.c.visible_at, d.c.id)
        .limit(sa.bindparam("p_limit", type_=sa.Integer))
        .with_for_update(skip_locked=True)
    )
    _lock_ids_in_slice = _in_one_slice(_lock_ids)
    _lease = (
        sa.update(d)
        .where(d.c.id.in_(sa.bindparam("p_ids", expanding=True)))
        .values({**_lease_values, "visible_at": sa.bindparam("p_until")})
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
        # 1213 deadlock (and a Galera cluster's certification conflict), 1205
        # lock wait timeout, 1020 a locking read of a row changed since the
        # snapshot (MariaDB >= 11.6, innodb_snapshot_isolation)
        return _mysql_code(exc) in (1213, 1205, 1020)

    def is_unavailable(self, exc: DBAPIError) -> bool:
        return super().is_unavailable(exc) or _mysql_code(exc) in _UNAVAILABLE_CODES

    def begin_transaction(self, conn: sa.Connection) -> None:
        # READ COMMITTED for this transaction only: locking reads take no gap
        # locks, so claims never deadlock with concurrent publishes. Engines
        # made by novaque.connect() run every connection in READ COMMITTED
        # already, which saves this round trip.
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")

    def insert_plain_messages(
        self,
        conn: sa.Connection,
        fields: dict[str, Any],
        bodies: Sequence[bytes],
        groups: Sequence[str | None],
    ) -> list[int]:
        if len(bodies) == 1 or not conn.dialect.insert_returning:
            return super().insert_plain_messages(conn, fields, bodies, groups)
        # MariaDB: one multi-row INSERT whose shared fields are parameters of
        # their own, each escaped once: PyMySQL escapes every parameter in
        # Python, and SQLAlchemy's executemany form would pass it all seven
        # columns of every row (a quarter of a 500-message publish). Bodies
        # and group keys (VARBINARY) go as hex literals: no escaping at all.
        params: dict[str, Any] = {f"s_{name}": fields[name] for name in _SHARED_FIELDS}
        rows = [
            _SHARED_ROW.format(
                body=_hex_literal(body),
                group="NULL" if group is None else _hex_literal(group.encode("utf-8")),
            )
            for body, group in zip(bodies, groups, strict=True)
        ]
        sql = f"{_INSERT_PLAIN} {', '.join(rows)} RETURNING id"
        # Each row's id is taken as it is inserted, rows in order: ascending
        # ids are the rows' order, however the server returns them.
        return sorted(int(row[0]) for row in conn.exec_driver_sql(sql, params))

    def insert_messages(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> list[int]:
        if len(rows) == 1 or conn.dialect.insert_executemany_returning_sort_by_parameter_order:
            return super().insert_messages(conn, rows)
        # MySQL proper has no RETURNING and interleaves auto-increment values
        # across concurrent inserts: ids are only known row by row.
        return [_inserted_id(conn.execute(sa.insert(m), row)) for row in rows]

    def claim(self, link: Link, p: ClaimParams) -> list[ClaimedRow]:
        if isinstance(link, Driver):
            block = self._claim_spread if self.slices else self._claim_block
            cursor = link.dbapi.cursor()
            try:
                cursor.execute(block, _lease_params(p, self.slices))
                return _leased_rows(cursor)
            finally:
                cursor.close()
        # No UPDATE ... RETURNING, and no LIMIT inside IN (subquery): lock the
        # rows first (skipping others' locks), then lease exactly those.
        locked = self._lock_due(link, p)
        if not locked:
            return []
        lease = locked[0]["channel_lease"]
        until = p.now + int(lease) if p.channel_lease and lease is not None else p.until
        link.execute(
            self._lease,
            {
                "p_ids": [r["delivery_id"] for r in locked],
                "p_until": until,
                "p_token": p.token,
                "p_attempt_id": p.attempt_id,
            },
        )
        return self._claimed(link, locked, until, lease)

    def pop(self, conn: sa.Connection, p: ClaimParams) -> list[ClaimedRow]:
        # Two statements: the claim's locking read, then the DELETE of those rows.
        locked = self._lock_due(conn, p)
        if not locked:
            return []
        conn.execute(self._delete_ids, {"p_ids": [r["delivery_id"] for r in locked]})
        return self._claimed(conn, locked, p.now, None)

    def _lock_due(self, conn: sa.Connection, p: ClaimParams) -> list[Mapping[str, Any]]:
        """The claim's locking read: up to ``p.limit`` due deliveries with their
        message fields and the channel's settings; none when the channel is
        paused. Spread (:attr:`slices`): from one slice first."""

        def take(params: dict[str, Any]) -> list[Mapping[str, Any]]:
            locked: list[Mapping[str, Any]] = []
            if self.slices:
                found = conn.execute(
                    self._lock_ids_in_slice, {**params, **_slice_params(self.slices)}
                )
                locked = list(mappings(found))
            if not locked:
                locked = list(mappings(conn.execute(self._lock_ids, params)))
            if not locked or locked[0]["paused"]:  # nothing due, or the channel is paused
                return []
            return locked

        params = {
            "p_channel": p.channel_id,
            "p_now": p.now,
            "p_limit": p.limit,
            "p_held": int(p.held),
            "p_from": p.since,
        }
        return in_lanes(
            take,
            lambda q: conn.execute(NEXT_LANE, q).scalar(),
            params,
            operator.itemgetter("priority"),
        )

    def _claimed(
        self,
        conn: sa.Connection,
        locked: Sequence[Mapping[str, Any]],
        until: int,
        lease: int | None,
    ) -> list[ClaimedRow]:
        """The rows of a locking read taken, their attempt counted."""
        # The locking read returns the latest committed deliveries, but its
        # subqueries read the statement's snapshot: a delivery committed just
        # after it began comes with its message fields NULL. A new statement
        # has a new snapshot (READ COMMITTED) that holds them.
        late = sorted({int(r["message_id"]) for r in locked if r["body"] is None})
        fields: dict[int, Mapping[str, Any]] = {}
        if late:
            found = conn.execute(_message_fields, {"p_ids": late})
            fields = {int(r["message_id"]): r for r in mappings(found)}
        return claimed_rows(
            table_of_dicts(
                [
                    {
                        **r,
                        **fields.get(int(r["message_id"]), {}),
                        "attempts": r["attempts"] + 1,
                        "until": until,
                        "channel_lease": lease,
                    }
                    for r in locked
                ]
            )
        )

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
                sa.func.coalesce(
                    channels.c.max_attempts, sa.bindparam("p_max_attempts", type_=sa.Integer)
                ),
            )
            .join_from(m, channels, channels.c.topic_id == m.c.topic_id)
            .where(
                channels.c.topic_id == sa.bindparam("p_topic_id"),
                m.c.id.in_(sa.bindparam("p_ids", expanding=True)),
                plain_channel,
            )
            .order_by(m.c.id, channels.c.id),
        )
        .returning(d.c.channel_id, _routed_exists)
    )
    _has_routed = sa.select(_routed_exists_held)
    #: MariaDB's one-message publish in one round trip instead of three: a
    #: compound statement (``BEGIN NOT ATOMIC``, MariaDB 10.1+; one statement
    #: to the protocol, so no multi-statement flag) that inserts the message
    #: and its deliveries to the plain channels, then commits and returns the
    #: message id, the channels it went to (their ids joined by commas, read
    #: by the message's index before the COMMIT: no one else sees them yet)
    #: and the topic's plan (:data:`_READ_PLAN`), or rolls back when the
    #: topic has routed channels and returns NULLs. One result set, not one
    #: per step: each one more is parsed by PyMySQL and awaited twice on the
    #: asyncio twin. The routed check reads the channels after the fan-out
    #: did: a routed channel the fan-out could have seen sends the publish
    #: down the general path.
    _publish_one_block = (
        "BEGIN NOT ATOMIC DECLARE new_id BIGINT; DECLARE went_to LONGTEXT; "
        "DECLARE plan LONGTEXT; "
        f"{_INSERT_ONE}; "
        "SET new_id = LAST_INSERT_ID(); "
        f"INSERT INTO {d.name} (message_id, channel_id, state, visible_at, attempts, "
        f"max_attempts) SELECT new_id, id, {STATE_READY}, %s, 0, coalesce(max_attempts, %s) "
        f"FROM {channels.name} WHERE topic_id = %s AND {PLAIN_CHANNEL_SQL.format(c='')}; "
        f"IF EXISTS (SELECT 1 FROM {channels.name} WHERE topic_id = %s "
        f"AND NOT ({PLAIN_CHANNEL_SQL.format(c='')})) THEN ROLLBACK; SELECT NULL, NULL, NULL; "
        f"ELSE {_UNCUT}SELECT GROUP_CONCAT(channel_id) INTO went_to FROM {d.name} "
        f"WHERE message_id = new_id; {_READ_PLAN}"
        "COMMIT; SELECT new_id, went_to, plan; END IF; END"
    )

    #: MariaDB's ack of a batch with the claim of the next, in one round trip
    #: instead of four (DELETE, locking read, UPDATE, COMMIT), and the claim
    #: alone in one instead of three (see :func:`_lease_block`).
    _ack_and_claim_block = _lease_block(ack=True)
    _claim_block = _lease_block(ack=False)
    _ack_and_claim_spread = _lease_block(ack=True, spread=True)
    _claim_spread = _lease_block(ack=False, spread=True)

    def driver_ops(self, sql_dialect: sa.Dialect) -> frozenset[str]:
        # MariaDB: INSERT ... SELECT ... RETURNING writes and counts the
        # deliveries in one statement, and compound statements carry a whole
        # transaction (MySQL proper keeps SQLAlchemy's path).
        if not sql_dialect.insert_returning:
            return frozenset()
        return frozenset({"publish_one", "ack_claim", "claim"})

    def ack_and_claim(
        self, link: Link, p: AckClaimParams
    ) -> tuple[set[tuple[int, str]], list[ClaimedRow]] | None:
        if not isinstance(link, Driver):
            return super().ack_and_claim(link, p)
        ordered = sorted(p.pairs)
        params = _lease_params(p.claim, self.slices)
        params.update(ids=tuple(pair[0] for pair in ordered), pairs=tuple(ordered))
        block = self._ack_and_claim_spread if self.slices else self._ack_and_claim_block
        cursor = link.dbapi.cursor()
        try:
            cursor.execute(block, params)
            done = {(int(i), str(t)) for i, t in cursor.fetchall()}
            cursor.nextset()
            return done, _leased_rows(cursor)
        finally:
            cursor.close()

    def publish_plain(self, link: Link, p: PublishParams) -> Plain:
        if not isinstance(link, Driver):
            return super().publish_plain(link, p)
        # REPEATABLE READ (the server's default) is fine here: nothing is read
        # but the channels, and a locking read of those takes no lock a claim
        # waits for (claims read the channel row without locking it). This
        # saves SET TRANSACTION's round trip on a plain engine.
        dbapi = link.dbapi
        [body] = p.bodies
        fields = p.fields
        if p.plan is not None:
            done = self._publish_planned(dbapi, fields, body, p.visible, p.plan)
            if done is not None:
                return done
        topic_id = fields["topic_id"]
        row = _one_row(
            dbapi,
            self._publish_one_block.format(body=_hex_literal(body)),
            (*_message_params(fields, body), p.visible, fields["max_attempts"], *[topic_id] * 3),
        )
        message_id, went_to, learned = row
        if message_id is None:
            return DECLINED
        went_to = exact_key_text(went_to)
        fanout = {int(channel_id): 1 for channel_id in went_to.split(",")} if went_to else {}
        return Plain([int(message_id)], fanout, False, exact_key_text(learned) or "")

    def _publish_planned(
        self,
        dbapi: Any,
        fields: dict[str, Any],
        body: bytes,
        visible: int,
        plan: str,
    ) -> Plain | None:
        """The publish with the topic's ``plan`` (:func:`_planned_publish_block`),
        or None when it names a routed channel or no longer held (nothing
        written)."""
        planned = _plan_channels(plan)
        if planned is None:
            return None
        values: list[Any] = list(_message_params(fields, body))
        for channel_id, max_attempts in planned:
            values += (
                channel_id,
                visible,
                fields["max_attempts"] if max_attempts is None else max_attempts,
            )
        values += (fields["topic_id"], plan or None)
        block = _planned_publish_block(len(planned)).format(body=_hex_literal(body))
        (message_id,) = _one_row(dbapi, block, values)
        if message_id is None:
            return None
        return Plain([int(message_id)], dict.fromkeys((c for c, _ in planned), 1), False, plan)

    def fan_out(
        self,
        conn: sa.Connection,
        topic: str,
        topic_id: int,
        message_ids: list[int],
        visible: int,
        max_attempts: int,
    ) -> tuple[dict[int, int], bool]:
        if not conn.dialect.insert_returning:  # MySQL proper: no INSERT ... RETURNING
            return super().fan_out(conn, topic, topic_id, message_ids, visible, max_attempts)
        if len(message_ids) > 1:
            return self._fan_out_counted(conn, topic_id, message_ids, visible, max_attempts)
        counts: dict[int, int] = {}
        special = None
        for channel_id, routed in conn.execute(
            self._fan_out_returning,
            {
                "p_topic_id": topic_id,
                "p_ids": message_ids,
                "p_visible": visible,
                "p_max_attempts": max_attempts,
            },
        ):
            counts[channel_id] = counts.get(channel_id, 0) + 1
            special = bool(routed)
        if special is None:  # no plain channel said: ask
            special = bool(conn.execute(self._has_routed, {"p_topic_id": topic_id}).scalar())
        return counts, special

    #: MariaDB's fan-out of a batch (see :meth:`_fan_out_counted`): the
    #: deliveries written, then counted per channel by the server, and
    #: whether the topic has routed channels (a locking read, as the
    #: INSERT's: the latest committed channels), in one round trip.
    _fan_out_block = (
        "BEGIN NOT ATOMIC "
        f"INSERT INTO {d.name} (message_id, channel_id, state, visible_at, attempts, "
        f"max_attempts) SELECT msg.id, ch.id, {STATE_READY}, %(visible)s, 0, "
        "coalesce(ch.max_attempts, %(max_attempts)s) "
        f"FROM {m.name} AS msg JOIN {channels.name} AS ch ON ch.topic_id = msg.topic_id "
        f"WHERE ch.topic_id = %(topic_id)s AND msg.id IN {{ids}} AND "
        f"{PLAIN_CHANNEL_SQL.format(c='ch.')} ORDER BY msg.id, ch.id; "
        f"SELECT channel_id, count(*) FROM {d.name} WHERE message_id IN {{ids}} "
        "GROUP BY channel_id "
        f"UNION ALL SELECT NULL, EXISTS (SELECT 1 FROM {channels.name} "
        f"WHERE topic_id = %(topic_id)s AND NOT ({PLAIN_CHANNEL_SQL.format(c='')}) "
        "LOCK IN SHARE MODE); END"
    )

    def _fan_out_counted(
        self,
        conn: sa.Connection,
        topic_id: int,
        message_ids: list[int],
        visible: int,
        max_attempts: int,
    ) -> tuple[dict[int, int], bool]:
        """:meth:`fan_out` of fresh messages (no deliveries yet) on MariaDB, the
        counts from the server instead of one returned row per delivery
        (2,500 rows for 500 messages to 5 channels, each parsed by PyMySQL in
        Python). The routed check reads the channels after the INSERT: the
        channels that took deliveries are held by their foreign key's shared
        locks until the commit, so none of them turns routed meanwhile."""
        counts: dict[int, int] = {}
        special = False
        params = {"topic_id": topic_id, "visible": visible, "max_attempts": max_attempts}
        block = self._fan_out_block.format(ids=f"({','.join(str(int(i)) for i in message_ids)})")
        for channel_id, n in conn.exec_driver_sql(block, params):
            if channel_id is None:
                special = bool(n)
            else:
                counts[int(channel_id)] = int(n)
        return counts, special

    _group_head = (
        sa.select(groups.c.head_id)
        .where(
            groups.c.channel_id == sa.bindparam("p_channel"),
            groups.c.group_key == sa.bindparam("p_key"),
        )
        .with_for_update()
    )

    def lock_group(
        self, conn: sa.Connection, channel_id: int, group_key: str, proposed: int
    ) -> int:
        # No RETURNING of an upsert: insert or lock the existing row (a no-op
        # update locks it), then read it, ours for the rest of the transaction.
        insert = mysql_dialect.insert(groups).values(
            channel_id=channel_id, group_key=group_key, head_id=proposed
        )
        conn.execute(insert.on_duplicate_key_update(head_id=groups.c.head_id))
        return int(
            conn.execute(
                self._group_head, {"p_channel": channel_id, "p_key": group_key}
            ).scalar_one()
        )

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

    def read_latest(self, stmt: SelectT) -> SelectT:
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

    def upsert_stats(
        self, conn: sa.Connection, rows: list[dict[str, Any]], table: sa.Table = stats
    ) -> None:
        if not rows:
            return
        insert = mysql_dialect.insert(table)
        stmt = insert.on_duplicate_key_update(
            {c: table.c[c] + insert.inserted[c] for c in COUNTER_COLUMNS}
        )
        conn.execute(stmt, rows)
