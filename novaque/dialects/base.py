"""What every database shares: the :class:`Dialect` base, its statements and row types.

A dialect holds the SQL that differs between PostgreSQL, MySQL/MariaDB and
SQLite and the facts about each database (which errors are worth a retry,
which operations are one statement, the version floor). Subclasses live in
:mod:`~novaque.dialects.postgres`, :mod:`~novaque.dialects.mysql` and
:mod:`~novaque.dialects.sqlite`; :mod:`~novaque.dialects.engines` picks one
for an engine. The client, consumers and maintenance call these methods and
never branch on the database themselves.

Statements are built once, at import, from bound parameters, so SQLAlchemy's
compiled cache serves every call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from novaque._tables import (
    CLAIM_INDEX,
    COUNTER_COLUMNS,
    FAR_PAST,
    STATE_LEASED,
    STATE_READY,
    channels,
    deliveries,
    groups,
    messages,
    stats,
)
from novaque.dialects.params import (
    AckClaimParams,
    ClaimParams,
    Link,
    Plain,
    PublishParams,
)
from novaque.errors import UnsupportedDatabase

T = TypeVar("T")
#: A SELECT of any columns (its type kept through a locking clause added).
SelectT = TypeVar("SelectT", bound=sa.Select[Any])

d = deliveries
m = messages

NOTIFY_CHANNEL = "novaque"


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

    def hurry(self) -> None:
        """Messages move in this process: a listener that looks on a schedule
        (the change watcher) looks often again. Called from any thread; one
        the server wakes (``LISTEN``) ignores it."""
        ...

    def close(self) -> None:
        """Close the connection (safe to call twice, and on a broken connection)."""
        ...


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    """One claimed delivery with its message, as the dialects return it
    (made by :func:`claimed_rows` alone, from columns named as its fields)."""

    delivery_id: int
    message_id: int
    attempts: int
    max_attempts: int
    body: bytes
    headers: str | None
    published_at: int
    #: The lease's expiry, and the channel's own lease setting (microseconds,
    #: None when it has none) as the claim read it.
    until: int
    channel_lease: int | None
    #: The message's group, and the delivery's key in its channel's ordering
    #: (None: unordered; the group on group_fifo, "" on strict_fifo).
    group_key: str | None = None
    order_key: str | None = None
    #: The message's priority (lower first).
    priority: int = 0
    #: The lease's token where it is not the claim's own (None): a repeated
    #: ``attempt_id`` returns leases taken by earlier claims.
    token: str | None = None


def _as_is(value: Any) -> Any:
    return value


#: A result by position: its columns' names and its rows.
Table = tuple[Sequence[str], Sequence[Sequence[Any]]]
#: The fields of :class:`ClaimedRow`, in order.
CLAIMED_FIELDS = tuple(field.name for field in dataclasses.fields(ClaimedRow))


def claimed_rows(
    table: Table, *, text: Callable[[Any], Any] = _as_is, **fixed: Any
) -> list[ClaimedRow]:
    """The claimed deliveries of ``table``'s rows, each field read from the
    column of its name (``fixed``: values given instead, for every row; a row
    without a ``token`` column has none), lowest priority first, then in
    delivery id order. ``text``: how
    a driver's value of a group key becomes text, where the driver path reads
    it raw (MySQL's binary keys). The columns are found once per result, then
    each row is read by position."""
    names, rows = table
    at = {name: i for i, name in enumerate(names)}
    extra: list[Any] = []
    where = []
    for field in CLAIMED_FIELDS:
        if field in fixed or field not in at:
            if field not in fixed and field != "token":
                raise KeyError(f"the claim's result has no column {field!r}")
            where.append(len(names) + len(extra))
            extra.append(fixed.get(field))
        else:
            where.append(at[field])
    pick = operator.itemgetter(*where)
    tail = tuple(extra)
    found = []
    for r in rows:
        did, mid, att, most, body, headers, at_us, until, lease, group, order, prio, token = pick(
            (*r, *tail)
        )
        found.append(
            ClaimedRow(
                did,
                mid,
                att,
                most,
                bytes(body),
                headers,
                at_us,
                until,
                lease,
                text(group),
                text(order),
                prio,
                token,
            )
        )
    found.sort(key=_claim_order)
    return found


def _claim_order(row: ClaimedRow) -> tuple[int, int]:
    return row.priority, row.delivery_id


def described(cursor: Any) -> Table:
    """A DBAPI ``cursor``'s current result: its columns' names and rows."""
    return [column[0] for column in cursor.description], cursor.fetchall()


def table_of(result: Any) -> Table:
    """A SQLAlchemy result's columns' names and rows."""
    return list(result.keys()), result.all()


def table_of_dicts(rows: Sequence[Mapping[str, Any]]) -> Table:
    """Rows built as dicts (the same keys in each), as a :data:`Table`."""
    if not rows:
        return (), ()
    names = list(rows[0])
    return names, [tuple(row[name] for name in names) for row in rows]


def mappings(result: Iterable[Any]) -> Iterator[Mapping[str, Any]]:
    """The rows of a SQLAlchemy result, each by column name."""
    return (row._mapping for row in result)


# -- statements shared by several dialects ------------------------------------

#: The channel's settings, read by the claim in its own statement: a change
#: committed elsewhere holds for the next claim (no cache to go stale).
_channel_lease = (
    sa.select(channels.c.lease).where(channels.c.id == sa.bindparam("p_channel")).scalar_subquery()
)
#: Whether the channel has a limit: its claims take the channel's row first
#: and ask for what fits (``p_held`` = 1, see :mod:`novaque.ops.limits`);
#: any other claim takes nothing from it.
limited_channel = sa.or_(
    channels.c.max_leased.is_not(None),
    channels.c.rate_count.is_not(None),
    channels.c.group_max_leased.is_not(None),
)
_channel_paused = sa.exists().where(
    channels.c.id == sa.bindparam("p_channel"),
    sa.or_(
        channels.c.paused == sa.true(),
        # (A literal 0: a driver's statement has no anonymous parameter.)
        sa.and_(
            sa.bindparam("p_held", 0, type_=sa.Integer) == sa.literal_column("0"), limited_channel
        ),
    ),
)
#: The lease's expiry: ``p_until``, or ``p_now`` plus the channel's lease when
#: the caller named no lease (``p_channel_lease`` = 1) and the channel has one.
_until = sa.func.coalesce(
    sa.case(
        (
            sa.bindparam("p_channel_lease", 0, type_=sa.Integer) == 1,
            sa.bindparam("p_now", type_=sa.BigInteger) + _channel_lease,
        )
    ),
    sa.bindparam("p_until", type_=sa.BigInteger),
)
#: Below every lane: a claim's first statement takes the lowest lane.
FIRST_LANE = -32768


def _lowest_lane(*above: sa.ColumnElement[bool]) -> sa.ScalarSelect[Any]:
    return (
        sa.select(sa.func.min(lanes.c.priority))
        .where(lanes.c.channel_id == sa.bindparam("p_channel"), *above)
        .scalar_subquery()
    )


lanes = d.alias("lanes")
#: The claim's lane: the channel's lowest priority at or above ``p_lane``
#: (one probe of the claim index; a channel of priority 0 alone has one lane).
claim_lane = _lowest_lane(lanes.c.priority >= sa.bindparam("p_lane", FIRST_LANE, type_=sa.Integer))
#: The lane after the one a claim took from, where a claim that took too few
#: goes on (None: none): after ``p_after``, the priority of what it took
#: (a pop deletes it), else after the lane it found empty.
NEXT_LANE = sa.select(sa.func.min(d.c.priority)).where(
    d.c.channel_id == sa.bindparam("p_channel"),
    d.c.priority > sa.func.coalesce(sa.bindparam("p_after", None, type_=sa.Integer), claim_lane),
)


#: Where a claim's scan of the channel starts: ``p_from`` (the claim cursor,
#: see :mod:`novaque._claim_cursors`) for a channel of one lane and standard
#: ordering; from the first for any other (a delivery of a lane above the
#: one a claim filled from, or of a group moved on, may be due earlier).
scan_from = sa.func.coalesce(
    sa.case(
        (
            # (Literals: a driver's statement has no anonymous parameter.)
            sa.and_(
                channels.c.ordering == sa.literal_column("0"),
                channels.c.low_lane == channels.c.high_lane,
            ),
            sa.bindparam("p_from", None, type_=sa.BigInteger),
        )
    ),
    sa.literal_column(str(FAR_PAST), sa.BigInteger),
)
_scan_from = (
    sa.select(scan_from).where(channels.c.id == sa.bindparam("p_channel")).scalar_subquery()
)


_SelectT = TypeVar("_SelectT", bound=sa.Select[Any])


def on_index(select: _SelectT, table: sa.Table, index: str) -> _SelectT:
    """``select`` reading ``table`` through ``index`` on MySQL and MariaDB (a
    ``FORCE INDEX`` hint); unchanged on the other databases.

    For lookups whose right index depends on the data, not the statement: with
    statistics taken on an empty table (a fresh deploy, a drained one) MariaDB
    reads a group's next delivery through the claim index, the channel's whole
    backlog sorted, for every group of every ack. And for reads that must take
    a range of their index, not its prefix: InnoDB counts the dead entries a
    held snapshot keeps into a range's estimate but not into its statistics,
    so under churn MariaDB would read a claim's whole lane (the equal first
    columns) rather than the range from its cursor; with the hint it takes
    the range.
    """
    hint = f"FORCE INDEX ({index})"
    return select.with_hint(table, hint, "mysql").with_hint(table, hint, "mariadb")


def claim_range(
    lane: sa.ColumnElement[Any] = claim_lane, since: sa.ColumnElement[Any] = _scan_from
) -> sa.ColumnElement[bool]:
    """Due deliveries of a channel in one ``lane`` from ``since`` (the claim's
    index range; a lane known before the statement, where the planner takes a
    subquery's value for no bound of the range that follows)."""
    return sa.and_(
        d.c.channel_id == sa.bindparam("p_channel"),
        d.c.priority == lane,
        d.c.visible_at >= since,
        d.c.visible_at <= sa.bindparam("p_now"),
        d.c.attempts < d.c.max_attempts,
    )


def claim_ids(
    lane: sa.ColumnElement[Any] = claim_lane, since: sa.ColumnElement[Any] = _scan_from
) -> sa.Select[Any]:
    """The claim's pick in ``lane`` from ``since``: its range, unless the channel
    is paused, or limited and the claim not one that holds its row; oldest due
    first, skipping others' locks."""
    pick = (
        sa.select(d.c.id)
        .where(claim_range(lane, since), ~_channel_paused)
        .order_by(d.c.visible_at, d.c.id)
        .limit(sa.bindparam("p_limit", type_=sa.Integer))
        .with_for_update(skip_locked=True)
    )
    return on_index(pick, d, CLAIM_INDEX)


_claim_range = claim_range()
_claim_ids = claim_ids()
#: What every lease writes. ``attempt_id`` too, NULL for a claim without one,
#: so a delivery leased again never keeps the attempt id of an earlier lease.
_lease_values = {
    "state": STATE_LEASED,
    "visible_at": _until,
    "lease_token": sa.bindparam("p_token"),
    "attempts": d.c.attempts + 1,
    "attempt_id": sa.bindparam("p_attempt_id", None, type_=d.c.attempt_id.type),
}


def leasing(pick: sa.Select[Any]) -> sa.Update:
    """The lease of the deliveries ``pick`` selects (their ids), each returned
    with what the claim needs: the one claim statement, whichever pick a
    dialect uses (PostgreSQL's is a function: migration 0007)."""
    return (
        sa.update(d)
        .where(d.c.id.in_(pick.scalar_subquery()))
        .values(_lease_values)
        .returning(
            d.c.id.label("delivery_id"),
            d.c.message_id,
            d.c.attempts,
            d.c.max_attempts,
            d.c.visible_at.label("until"),
            _channel_lease.label("channel_lease"),
            d.c.group_key.label("order_key"),
            d.c.priority,
        )
    )


#: The message fields of each delivery a statement reads, as primary-key
#: subqueries (RETURNING cannot join), named as a claimed row's.
message_columns = tuple(
    sa.select(col).where(m.c.id == d.c.message_id).correlate(d).scalar_subquery().label(col.name)
    for col in (m.c.body, m.c.headers, m.c.published_at, m.c.group_key, m.c.priority)
)

_claim_update_returning = leasing(_claim_ids)
#: Receive-and-delete: the due deliveries the claim would lease, deleted, each
#: returned with its message's fields (primary-key subqueries: RETURNING
#: cannot join) and its attempt counted.
_pop_delete_returning = (
    sa.delete(d)
    .where(d.c.id.in_(_claim_ids.scalar_subquery()))
    .returning(
        d.c.id.label("delivery_id"),
        d.c.message_id,
        (d.c.attempts + 1).label("attempts"),
        d.c.max_attempts,
        *message_columns,
        d.c.group_key.label("order_key"),
    )
)
_message_fields = sa.select(
    m.c.id.label("message_id"), m.c.body, m.c.headers, m.c.published_at, m.c.group_key, m.c.priority
).where(m.c.id.in_(sa.bindparam("p_ids", expanding=True)))
#: A channel every message of its topic goes to in publish order: no filter,
#: standard ordering. The others are "routed": the publish's own statements
#: skip them and ``novaque.ops.publish`` writes their deliveries.
PLAIN_CHANNEL_SQL = "{c}filter_expr IS NULL AND {c}ordering = 0"
plain_channel = sa.and_(channels.c.filter_expr.is_(None), channels.c.ordering == 0)


def in_lanes(
    take: Callable[[dict[str, Any]], list[T]],
    next_lane: Callable[[dict[str, Any]], int | None],
    params: dict[str, Any],
    lane_of: Callable[[T], int] = operator.attrgetter("priority"),
) -> list[T]:
    """What a claim statement (``take``, with ``params``) takes lane after lane:
    from the lowest lane, then, while it took fewer than ``p_limit``, from the
    next (``next_lane``: :data:`NEXT_LANE` run; ``lane_of``: a row's lane),
    for what is left. A channel of one lane costs one statement when the
    claim fills, two when not."""
    limit = params["p_limit"]
    found = took = take(params)
    while len(found) < limit:
        after = lane_of(took[-1]) if took else None
        lane = next_lane({**params, "p_after": after})
        if lane is None:
            break
        params = {**params, "p_lane": lane, "p_limit": limit - len(found)}
        took = take(params)
        found = found + took
    return found


def by_token(pairs: Sequence[tuple[int, str]]) -> dict[str, list[int]]:
    """The delivery ids of ``(delivery_id, lease_token)`` pairs per token, sorted."""
    grouped: dict[str, list[int]] = {}
    for delivery_id, token in pairs:
        grouped.setdefault(token, []).append(delivery_id)
    return {token: sorted(ids) for token, ids in grouped.items()}


@dataclass(frozen=True)
class DriverStatement:
    """A Core statement compiled once for a driver: its SQL, the order of its
    parameters (None: the driver takes them by name) and the values SQLAlchemy
    bound itself (literals of the statement)."""

    sql: str
    names: tuple[str, ...] | None
    defaults: dict[str, Any]

    def args(self, params: dict[str, Any]) -> Any:
        """The driver's parameters for ``params`` (raw values: no type of the
        statement may need SQLAlchemy's bind processing)."""
        merged = {**self.defaults, **params}
        return merged if self.names is None else [merged[n] for n in self.names]


@functools.lru_cache(maxsize=64)
def driver_statement(stmt: sa.ClauseElement, sql_dialect: sa.Dialect) -> DriverStatement:
    """``stmt`` compiled for the driver of ``sql_dialect`` (cached)."""
    compiled: Any = stmt.compile(dialect=sql_dialect)  # an SQLCompiler
    sql = str(compiled)
    if "POSTCOMPILE" in sql:  # expanding parameters: compiled per call by SQLAlchemy
        raise ValueError("a statement with expanding parameters has no driver form")
    names = compiled.positiontup
    required = {b.key for b in compiled.binds.values() if b.required}
    literals = compiled.construct_params(_check=False).items()
    defaults = {key: value for key, value in literals if key not in required}
    return DriverStatement(sql, None if names is None else tuple(names), defaults)


def insert_message_sql(mark: str, body: str | None = None) -> str:
    """A message insert in the driver's SQL (``mark``: its parameter marker):
    topic id, body, headers, published_at, expires_at, max_attempts, group
    (:func:`message_values`); ``body``: what stands in the body's place instead
    of a parameter (the parameters are then the six others)."""
    values = [mark, mark if body is None else body, *[mark] * 5]
    return (
        f"INSERT INTO {m.name} (topic_id, body, headers, published_at, expires_at, max_attempts, "
        f"group_key) VALUES ({', '.join(values)})"
    )


def message_values(fields: dict[str, Any], body: bytes) -> tuple[Any, ...]:
    """The parameters of :func:`insert_message_sql` for one message without a
    group (``fields``: as :class:`PublishParams` holds them)."""
    return (
        fields["topic_id"],
        body,
        fields["headers"],
        fields["published_at"],
        fields["expires_at"],
        fields["max_attempts"],
        None,
    )


def fan_out_one_sql(mark: str) -> str:
    """The deliveries of one message to its topic's plain channels, in the
    driver's SQL (``mark``: its parameter marker), returning each channel id
    and whether the topic has routed channels: message id, visible_at,
    max_attempts, topic id, topic id."""
    plain = PLAIN_CHANNEL_SQL.format(c="")
    return (
        f"INSERT INTO {d.name} (message_id, channel_id, state, visible_at, attempts, "
        f"max_attempts) SELECT {mark}, id, {STATE_READY}, {mark}, 0, coalesce(max_attempts, "
        f"{mark}) FROM {channels.name} WHERE topic_id = {mark} AND {plain} "
        f"ORDER BY id RETURNING channel_id, EXISTS (SELECT 1 FROM {channels.name} "
        f"WHERE topic_id = {mark} AND NOT ({plain}))"
    )


def has_routed_sql(mark: str) -> str:
    """Whether a topic (the parameter) has routed channels, in the driver's SQL."""
    return (
        f"SELECT EXISTS (SELECT 1 FROM {channels.name} "
        f"WHERE topic_id = {mark} AND NOT ({PLAIN_CHANNEL_SQL.format(c='')}))"
    )


#: What a publish declined: the topic has routed channels, nothing was written.
DECLINED = Plain([], {}, True)


def publish_one_committed(
    dbapi: Any, sql: tuple[str, str, str], p: PublishParams, begin: str | None = None
) -> Plain:
    """The one message of ``p`` and its deliveries to the plain channels in a
    transaction of its own on the DBAPI connection ``dbapi`` (``begin``: the
    statement that starts it, where the driver begins none itself), with the
    dialect's :func:`insert_message_sql`, :func:`fan_out_one_sql` and
    :func:`has_routed_sql`: committed, or rolled back (:data:`DECLINED`) when
    the topic has routed channels."""
    cursor = dbapi.cursor()
    try:
        if begin is not None:
            cursor.execute(begin)
        done = _publish_one_on(cursor, sql, p)
    finally:
        cursor.close()
    if done is DECLINED:
        dbapi.rollback()
    else:
        dbapi.commit()
    return done


def _publish_one_on(cursor: Any, sql: tuple[str, str, str], p: PublishParams) -> Plain:
    """:func:`publish_one_committed`'s statements, on ``cursor``."""
    insert, fan_out, has_routed = sql
    [body] = p.bodies
    topic_id = p.fields["topic_id"]
    cursor.execute(insert, message_values(p.fields, body))
    message_id = int(cursor.lastrowid)
    cursor.execute(fan_out, (message_id, p.visible, p.fields["max_attempts"], topic_id, topic_id))
    found = cursor.fetchall()
    if found:
        special = bool(found[0][1])
    else:  # no plain channel said: ask
        cursor.execute(has_routed, (topic_id,))
        special = bool(cursor.fetchone()[0])
    if special:
        return DECLINED
    return Plain([message_id], {int(row[0]): 1 for row in found}, False)


_channels_of_topic = (
    sa.select(channels.c.id, channels.c.max_attempts, plain_channel)
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


def core(link: Link) -> sa.Connection:
    """``link`` as the SQLAlchemy connection it must be: only the operations of
    :meth:`Dialect.driver_ops` are ever handed a :class:`Driver`."""
    assert isinstance(link, sa.Connection), "no driver form of this operation"
    return link


class FileSpace(NamedTuple):
    """A database file's size and free space (:meth:`Dialect.space`)."""

    #: Bytes in the database's pages (the file's size once its write-ahead log
    #: is checkpointed).
    size: int
    #: Bytes of those in free pages: space that deleted rows left, reused by
    #: later writes before the file grows.
    free: int
    #: Whether free pages can be given back a few at a time (SQLite's
    #: incremental auto-vacuum), rather than only by rewriting the whole file.
    incremental: bool
    #: Bytes of free pages that one step of :meth:`Dialect.return_free_pages`
    #: gives back at most.
    step: int


class Dialect:
    """Behaviour shared by every backend; subclasses override what differs."""

    name: ClassVar[str] = ""
    #: (major, minor, ...) below which :meth:`check_floor` refuses the database.
    floor: ClassVar[tuple[int, ...]] = ()
    #: Whether the server pushes wake-ups (PostgreSQL LISTEN/NOTIFY).
    supports_notify: ClassVar[bool] = False
    #: Whether new deliveries of other connections can be watched for by
    #: looking often at a cheap marker (:meth:`open_watcher`), where nothing
    #: is pushed (SQLite, MySQL/MariaDB).
    supports_watch: ClassVar[bool] = False

    #: Whether one transaction at a time may write (SQLite locks the whole
    #: file): the executor then makes novaque's threads take turns per file.
    one_writer: ClassVar[bool] = False

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
    def migration_session(self, conn: sa.Connection) -> Iterator[None]:
        """Around the transaction a migration runs in, on its connection (none here).

        For what must be switched outside a transaction; the executor's
        ``migration_transaction`` begins the transaction inside it.
        """
        yield

    def check_migration(self, conn: sa.Connection) -> None:
        """Checks at the end of a migration's transaction, before it commits."""

    def learn_server(self, conn: sa.Connection) -> None:
        """Note what the SQL of this client depends on beyond the version (a
        MySQL dialect learns whether the server is a node of a Galera
        cluster); called once, when the client first reaches the database."""

    # -- transactions -------------------------------------------------------------

    def is_retryable(self, exc: DBAPIError) -> bool:
        """True for errors a repeat of the same transaction can cure (deadlock, busy)."""
        return False

    def is_unavailable(self, exc: DBAPIError) -> bool:
        """True for errors that say the database cannot serve now rather than
        refuse what was asked: the connection was lost or could not be
        opened, the server shuts down or takes no writes (a standby, a
        failover in progress, a cluster node still joining). novaque's own
        transactions raise them as :class:`~novaque.DatabaseUnavailable`
        (after the retries :meth:`is_retryable` allows, for an error that is
        both).

        Here: a connection that SQLAlchemy found lost (the driver's
        ``is_disconnect``); each dialect adds its database's codes.
        """
        return bool(exc.connection_invalidated)

    #: Whether :meth:`cancel` can stop a statement from another thread: the
    #: executor then bounds each of novaque's transactions by
    #: ``Options.transaction_timeout``.
    can_cancel: ClassVar[bool] = False

    def cancel(self, driver_conn: Any) -> None:
        """Ask the server to cancel what runs on ``driver_conn`` (the driver's
        own connection, used by another thread meanwhile), where
        :attr:`can_cancel`. It may block while it reaches the server."""
        raise NotImplementedError(f"{self.name} statements cannot be cancelled")

    #: Operations ("publish", "claim", "ack", "ack_claim", "ack_ordered": an
    #: ack of ordered deliveries, "settle": requeue, reject, renew) that this
    #: dialect does in a single statement; their callers pass
    #: ``one_statement=True`` to the executor's ``run``, which then runs them
    #: in autocommit (a statement is a transaction by itself: one round trip
    #: instead of BEGIN, statement, COMMIT). Empty: never.
    one_statement_ops: ClassVar[frozenset[str]] = frozenset()

    def begin_transaction(self, conn: sa.Connection) -> None:
        """First statement of each of novaque's own transactions, if any.

        The executor skips it on engines made by :func:`novaque.connect`, whose
        connections are set up once instead (see
        :func:`novaque.dialects.engines.session_ready`).
        """

    # -- publishing -----------------------------------------------------------------

    #: Whether :meth:`hold_topic` locks (no foreign key holds the topic and its
    #: channels: a writer reads them again after the hold).
    holds_parents: ClassVar[bool] = False

    def hold_topic(self, conn: sa.Connection, topic_id: int) -> bool:
        """Keep the topic ``topic_id`` (and its channels) from being deleted until
        the transaction ends, before writing its messages or deliveries
        outside :meth:`publish_plain`: whether it exists.

        Here the foreign keys of the messages and deliveries do it, as each row
        is written: nothing to run. Where the schema has none (PostgreSQL,
        migration 0006) the topic row is locked, ``delete_topic`` and
        ``delete_channel`` lock it first (:func:`novaque.ops.topology.lock_topic`),
        and the topic's channels are read after this call.
        """
        return True

    def insert_messages(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> list[int]:
        """Insert message rows in one round trip and return their ids, in order."""
        if len(rows) == 1:
            return [_inserted_id(conn.execute(sa.insert(m), rows[0]))]
        result = conn.execute(sa.insert(m).returning(m.c.id, sort_by_parameter_order=True), rows)
        return [int(row[0]) for row in result]

    def insert_plain_messages(
        self,
        conn: sa.Connection,
        fields: dict[str, Any],
        bodies: Sequence[bytes],
        groups: Sequence[str | None],
    ) -> list[int]:
        """Insert messages without dedup keys that share ``fields`` (as
        :meth:`publish_plain` takes them), one per body with its group, in one
        round trip: their ids, in order."""
        return self.insert_messages(
            conn,
            [
                {**fields, "body": b, "dedup_key": None, "group_key": g}
                for b, g in zip(bodies, groups, strict=True)
            ],
        )

    def publish_plain(self, link: Link, p: PublishParams) -> Plain:
        """Insert messages without dedup keys and one delivery per plain channel.

        ``p.groups``: one ordering key (or None) per body (default: none).
        Returns the message ids in the order of the bodies, the number of
        deliveries written per channel id, and whether the topic has routed
        channels (with a filter or an ordering), whose deliveries the caller
        writes in the same transaction; wakes listeners when it wrote any.

        ``p.routed=False``: the caller expects no routed channel and may run
        this as one statement outside a transaction; a dialect that does so
        then writes nothing when the topic has some (returning no ids).

        On a :class:`Driver` link (``"publish_one"`` in :meth:`driver_ops`:
        one message without a group, ``routed=False``) the dialect runs the
        whole transaction in the driver's SQL, and may return a plan: what it
        learned of the topic's channels, for the caller to hand back with the
        next publish to the topic (``p.plan``), which may then cost less; the
        database checks it in the same transaction, so a stale one costs time,
        never a delivery.
        """
        conn = core(link)
        keys = p.groups if p.groups is not None else [None] * len(p.bodies)
        ids = self.insert_plain_messages(conn, p.fields, p.bodies, keys)
        counts, special = self.fan_out(
            conn, p.topic, p.fields["topic_id"], ids, p.visible, p.fields["max_attempts"]
        )
        return Plain(ids, counts, special)

    def driver_ops(self, sql_dialect: sa.Dialect) -> frozenset[str]:
        """The operations this dialect runs on a :class:`Driver` link, in the
        driver's own SQL, on this database (as ``sql_dialect``, SQLAlchemy's
        dialect of the engine, reports it): ``"publish_one"``
        (:meth:`publish_plain` of one message), ``"claim"`` (:meth:`claim`
        without an attempt id), ``"ack_claim"`` and ``"ack_ordered_claim"``
        (:meth:`ack_and_claim` of unordered or ordered acks). The executor
        hands those a :class:`Driver` unless something of the engine watches
        its statements."""
        return frozenset()

    def fan_out(
        self,
        conn: sa.Connection,
        topic: str,
        topic_id: int,
        message_ids: list[int],
        visible: int,
        max_attempts: int,
    ) -> tuple[dict[int, int], bool]:
        """One delivery per (message, plain channel the topic has now): the count
        per channel, and whether the topic has routed channels (see
        :meth:`publish_plain`). The channels are read with :meth:`read_held`, as
        the routed ones are (:mod:`novaque.ops.publish`)."""
        found = conn.execute(self.read_held(_channels_of_topic), {"p_topic_id": topic_id}).all()
        special = any(not r[2] for r in found)
        # A channel's max_attempts setting replaces the publish's.
        budgets = {r[0]: max_attempts if r[1] is None else r[1] for r in found if r[2]}
        if not budgets:
            return {}, special
        conn.execute(
            sa.insert(d),
            [
                {
                    "message_id": mid,
                    "channel_id": cid,
                    "state": STATE_READY,
                    "visible_at": visible,
                    "attempts": 0,
                    "max_attempts": budget,
                }
                for mid in message_ids
                for cid, budget in budgets.items()
            ],
        )
        self.notify(conn, topic)
        return {cid: len(message_ids) for cid in budgets}, special

    def notify(self, conn: sa.Connection, topic: str) -> None:
        """Wake listening consumers of ``topic`` when the transaction commits."""

    def open_listener(self, engine: sa.Engine, *, awaited: bool = False) -> NotifyListener | None:
        """Open a connection to ``engine``'s database that receives :meth:`notify` wake-ups.

        Returns None where the database has no such push (consumers then only
        poll). Raises if the server cannot be reached. ``awaited``: for the
        asyncio twin, called inside SQLAlchemy's greenlet bridge, every wait
        and statement awaited on the event loop.
        """
        return None

    def open_watcher(
        self,
        engine: sa.Engine,
        interval: float,
        *,
        idle_interval: float | None = None,
        awaited: bool = False,
    ) -> NotifyListener:
        """A connection to ``engine``'s database that looks every ``interval``
        seconds for deliveries committed by others and returns their topics
        (:mod:`~novaque.dialects.watch`), where :attr:`supports_watch`; less
        often while there is no news, down to every ``idle_interval`` (None:
        always every ``interval``).

        Raises if the database cannot be reached. ``awaited``: as for
        :meth:`open_listener`.
        """
        raise NotImplementedError(f"{self.name} has no change watcher")

    def read_latest(self, stmt: SelectT) -> SelectT:
        """``stmt`` made to see the latest committed rows in the caller's transaction.

        A plain read does on PostgreSQL and SQLite (READ COMMITTED, one writer).
        """
        return stmt

    def read_held(self, stmt: SelectT) -> SelectT:
        """``stmt``, a read of topic or channel rows, as :meth:`read_latest` and
        holding them as :meth:`hold_topic` does (where no foreign key holds a
        channel, a transaction that read it before it was deleted then fails
        instead of writing to it)."""
        return self.read_latest(stmt)

    def insert_ignore(self, conn: sa.Connection, table: sa.Table, values: dict[str, Any]) -> None:
        """Insert a row unless it would break a unique constraint (then do nothing).

        Never raises on a duplicate, so it is safe inside the caller's transaction
        while another transaction creates the same row.
        """
        conn.execute(self._insert(table).on_conflict_do_nothing(), values)

    def insert_delivery_rows(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> None:
        """Insert delivery rows (``message_id``, ``channel_id``, ``state``,
        ``visible_at``, ``attempts``, ``max_attempts``, ``group_key``), their ids
        ascending in the order of ``rows``."""
        conn.execute(sa.insert(d), rows)

    def insert_deduplicated(self, conn: sa.Connection, row: dict[str, Any]) -> int | None:
        """Insert a message with a dedup key; its id, or None if the key is taken."""
        stmt = (
            self._insert(m)
            .on_conflict_do_nothing(index_elements=[m.c.topic_id, m.c.dedup_key])
            .returning(m.c.id)
        )
        found = conn.execute(stmt, row).scalar_one_or_none()
        return None if found is None else int(found)

    def lock_group(
        self, conn: sa.Connection, channel_id: int, group_key: str, proposed: int
    ) -> int:
        """Lock the row of a (channel, group) of an ordered channel, creating it with
        ``proposed`` as its head if missing; return its head delivery id.

        Held to the end of the transaction: another writer of the group waits,
        then sees what this one committed.
        """
        insert = self._insert(groups).values(
            channel_id=channel_id, group_key=group_key, head_id=proposed
        )
        stmt = insert.on_conflict_do_update(
            index_elements=[groups.c.channel_id, groups.c.group_key],
            set_={"head_id": groups.c.head_id},
        ).returning(groups.c.head_id)
        return int(conn.execute(stmt).scalar_one())

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

        Parameters: ``p_channel``, ``p_now``, ``p_limit``, ``p_until``, ``p_token``,
        and ``p_channel_lease`` (1: the channel's lease, when it has one,
        replaces ``p_until``; default 0).
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
        ``params`` fill the statement's bound parameters (a list for an
        expanding one).
        """
        sql, values = _driver_sql(conn, stmt, params)
        rows = conn.exec_driver_sql(self._explain_prefix(conn, analyze) + sql, values).all()
        return "\n".join(" ".join(str(v) for v in row) for row in rows)

    def _explain_prefix(self, conn: sa.Connection, analyze: bool) -> str:
        return "EXPLAIN (ANALYZE, BUFFERS) " if analyze else "EXPLAIN "

    # -- claiming -------------------------------------------------------------------

    def claim(self, link: Link, p: ClaimParams) -> list[ClaimedRow]:
        """Lease up to ``p.limit`` due deliveries of a channel, oldest due first.

        The lease ends at ``p.until``, or with ``p.channel_lease`` after the
        channel's own lease if it has one; ``p.attempt_id`` is stored with
        each lease (NULL when None). A paused channel gives nothing.
        """
        conn = core(link)
        leased = in_lanes(
            lambda q: list(mappings(conn.execute(_claim_update_returning, q))),
            lambda q: conn.execute(NEXT_LANE, q).scalar(),
            p.bind(),
            operator.itemgetter("priority"),
        )
        return self._with_messages(conn, leased)

    def pop(self, conn: sa.Connection, p: ClaimParams) -> list[ClaimedRow]:
        """Delete up to ``p.limit`` due deliveries of a channel, oldest due first
        (the ones :meth:`claim` would lease), and return them with their
        messages, their attempt counted and ``until`` = ``p.now``. A paused
        channel gives nothing.

        Groups are the caller's: an ordered delivery popped was its group's head.
        """
        return in_lanes(
            lambda q: claimed_rows(
                table_of(conn.execute(_pop_delete_returning, q)), until=p.now, channel_lease=None
            ),
            lambda q: conn.execute(NEXT_LANE, q).scalar(),
            p.bind(),
        )

    def _with_messages(
        self, conn: sa.Connection, leased: Sequence[Mapping[str, Any]]
    ) -> list[ClaimedRow]:
        """Leases (``delivery_id``, ``message_id``, ``attempts``, ``max_attempts``,
        ``until``, ``channel_lease``, ``order_key``, maybe ``token``) with their
        messages read."""
        if not leased:
            return []
        ids = sorted({row["message_id"] for row in leased})
        found = {
            r["message_id"]: r for r in mappings(conn.execute(_message_fields, {"p_ids": ids}))
        }
        return claimed_rows(table_of_dicts([{**found[row["message_id"]], **row} for row in leased]))

    def ack_and_claim(
        self, link: Link, p: AckClaimParams
    ) -> tuple[set[tuple[int, str]], list[ClaimedRow]] | None:
        """Delete the acked pairs still leased with their token
        (:meth:`delete_leased_pairs`), then :meth:`claim`, in one transaction:
        the pairs deleted and the rows claimed.

        The deliveries acked are gone before the claim looks, so it never
        leases one of them (not even one whose lease had expired). Ordered
        acks (``p.ordered``) move their groups on first, where the dialect
        does that itself (:meth:`delete_leased_pairs_moving_groups`); else it
        returns None, having done nothing, and the caller moves them on.
        """
        conn = core(link)
        if p.ordered:
            done = self.delete_leased_pairs_moving_groups(conn, p.pairs)
            if done is None:
                return None
        else:
            done = self.delete_leased_pairs(conn, p.pairs)
        return done, self.claim(conn, p.claim)

    # -- settling -------------------------------------------------------------------

    def delete_leased(self, conn: sa.Connection, ids: Sequence[int], token: str) -> set[int]:
        """Delete the deliveries among ``ids`` still leased with ``token``; return those."""
        result = conn.execute(_ack_delete_returning, {"p_ids": list(ids), "p_token": token})
        return {int(r[0]) for r in result}

    def delete_leased_pairs_moving_groups(
        self, conn: sa.Connection, pairs: Sequence[tuple[int, str]]
    ) -> set[tuple[int, str]] | None:
        """:meth:`delete_leased_pairs` of ordered deliveries, each group whose
        head was deleted given its next delivery (as :meth:`move_heads`), in
        one statement (``"ack_ordered"`` in :attr:`one_statement_ops`): the
        pairs deleted. None where the dialect has no such statement (the
        caller then moves the groups on itself)."""
        return None

    def move_heads(self, conn: sa.Connection, channel_id: int, keys: Sequence[str]) -> bool:
        """Give each group of ``keys`` (their rows locked, their heads gone) its
        lowest parked delivery as head, unparked, or drop the group's row if it
        has none, in one statement; False where the dialect has no such
        statement (the caller then runs its own)."""
        return False

    def delete_leased_pairs(
        self, conn: sa.Connection, pairs: Sequence[tuple[int, str]]
    ) -> set[tuple[int, str]]:
        """Delete each delivery of ``(delivery_id, lease_token)`` still leased with that
        token; return the pairs deleted."""
        done: set[tuple[int, str]] = set()
        for token, ids in by_token(pairs).items():
            done.update((i, token) for i in self.delete_leased(conn, ids, token))
        return done

    # -- stats ----------------------------------------------------------------------

    def upsert_stats(
        self, conn: sa.Connection, rows: list[dict[str, Any]], table: sa.Table = stats
    ) -> None:
        """Add counter deltas to their buckets, creating missing ones: (channel,
        day) in ``novaque_stats``, or (channel, minute) in ``table``
        ``novaque_minute_stats`` (one upsert statement either way)."""
        if not rows:
            return
        insert = self._insert(table)
        stmt = insert.on_conflict_do_update(
            index_elements=list(table.primary_key.columns),
            set_={c: table.c[c] + insert.excluded[c] for c in COUNTER_COLUMNS},
        )
        conn.execute(stmt, rows)

    def _insert(self, table: sa.Table) -> Any:
        """The dialect's own INSERT construct (with its upsert clauses)."""
        raise NotImplementedError

    # -- space ----------------------------------------------------------------------

    #: Whether the database file keeps the pages that deleted rows leave free
    #: until it is asked to give them back (SQLite: :meth:`return_free_pages`,
    #: :meth:`vacuum`). PostgreSQL (autovacuum) and MySQL/MariaDB (InnoDB)
    #: reuse and manage that space themselves: nothing is asked of them.
    keeps_free_pages: ClassVar[bool] = False

    def space(self, conn: sa.Connection) -> FileSpace:
        """How big the database file is and how much of it is free, where
        :attr:`keeps_free_pages`."""
        raise NotImplementedError(f"{self.name} manages its own space")

    def return_free_pages(self, conn: sa.Connection) -> int:
        """Give a bounded number of the file's free pages back to the file
        system, in the caller's write transaction, where :attr:`keeps_free_pages`;
        return how many bytes the database shrank by (0: none free, or free
        pages that only :meth:`vacuum` can give back)."""
        raise NotImplementedError(f"{self.name} manages its own space")

    def vacuum(self, conn: sa.Connection) -> int:
        """Rewrite the whole database without its free pages, on ``conn``
        outside any transaction, where :attr:`keeps_free_pages`; return how
        many bytes it shrank by."""
        raise NotImplementedError(f"{self.name} manages its own space")

    def checkpoint(self, conn: sa.Connection) -> None:
        """Let the file shrink now, on ``conn`` outside any transaction, where
        :attr:`keeps_free_pages` (SQLite: copy the write-ahead log into the
        file and empty the log)."""
        raise NotImplementedError(f"{self.name} manages its own space")


def _driver_sql(
    conn: sa.Connection, stmt: sa.ClauseElement, params: dict[str, Any]
) -> tuple[str, Any]:
    """``stmt`` compiled for the connection's driver, with its parameters in driver form."""
    compiled = stmt.compile(dialect=conn.dialect)
    assert isinstance(compiled, sa.sql.compiler.SQLCompiler)
    # Expanding parameters (``IN`` lists) become one parameter per value here.
    state = compiled.construct_expanded_state(params)
    values = state.parameters
    if compiled.positional:
        return state.statement, tuple(values[name] for name in state.positiontup or ())
    return state.statement, values


def _dotted(version: Iterable[object]) -> str:
    return ".".join(str(part) for part in version)


def _inserted_id(result: sa.CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])
