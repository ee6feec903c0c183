"""novaque's tables, their column types and the constants stored in them.

Declared once in SQLAlchemy Core, and imported by every module of novaque that
reads or writes them; this module imports nothing of novaque (the public
:mod:`novaque.schema` re-exports it for applications' Alembic ``env.py``).

Alembic migrations in the top-level ``migrations/`` folder create exactly this
schema (a test compares them on every backend). Times are stored as integer
microseconds since the Unix epoch (UTC): exact, comparable and identical on
every backend, with no naive-datetime or fractional-second pitfalls.
"""

from __future__ import annotations

from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

__all__ = [
    "CLAIM_INDEX",
    "COUNTER_COLUMNS",
    "DEAD_VISIBLE_AT",
    "DEFERRED_VISIBLE_AT",
    "ENGINE_CHECKED",
    "FAR_PAST",
    "ORDERINGS",
    "PARKED_OFFSET",
    "QUEUE_AUTOVACUUM",
    "REVISION_TABLE",
    "STATE_DEAD",
    "STATE_DEFERRED",
    "STATE_INDEX",
    "STATE_LEASED",
    "STATE_READY",
    "VERSION_TABLE",
    "BigId",
    "Body",
    "ExactKey",
    "Micros",
    "Name",
    "channels",
    "consumers",
    "deliveries",
    "exact_key_text",
    "exists_on",
    "groups",
    "messages",
    "metadata",
    "minute_stats",
    "schedules",
    "stats",
    "topics",
]

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)

#: Delivery states stored in ``novaque_deliveries.state``.
STATE_READY = 0  # waiting; "pending" while visible_at is in the future
STATE_LEASED = 1  # claimed; visible_at is the lease expiry
STATE_DEAD = 2  # dead letter; visible_at is DEAD_VISIBLE_AT
STATE_DEFERRED = 3  # set aside by defer(); visible_at is DEFERRED_VISIBLE_AT

#: ``visible_at`` of every dead delivery: far beyond any real time, so dead
#: rows sit at the end of the claim index, outside every claim's range, and in
#: delivery-id order for dead-letter listing.
DEAD_VISIBLE_AT = 2**62

#: ``visible_at`` of every deferred delivery: beyond every claim's range, just
#: before the dead letters' tail of the claim index.
DEFERRED_VISIBLE_AT = DEAD_VISIBLE_AT - 1

#: Added to the ``visible_at`` of a ready delivery of an ordered channel that
#: waits behind its group's head ("parked"): it leaves every claim's range
#: (beyond any real time, below DEAD_VISIBLE_AT) and keeps its due time, which
#: comes back when the delivery becomes its group's head.
PARKED_OFFSET = 2**61
#: Before every real ``visible_at``: a scan of the claim index's range (or the
#: state index's) that starts here reads it from its first entry.
FAR_PAST = -(2**62)
#: The claim index of the deliveries: (channel, lane, due time, id).
CLAIM_INDEX = "ix_novaque_deliveries_claim"
#: The state index of the deliveries: (channel, state, due time or lease expiry).
STATE_INDEX = "ix_novaque_deliveries_state"

#: ``novaque_channels.ordering``: the code stored for each ordering.
ORDERINGS = {"standard": 0, "group_fifo": 1, "strict_fifo": 2}

# Names are case-sensitive everywhere: MySQL/MariaDB get a binary collation.
Name = sa.String(200).with_variant(
    mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)


class ExactKey(sa.types.TypeDecorator[str]):
    """A key of up to 200 characters that compares exactly on every backend.

    MySQL/MariaDB store it as bytes (``VARBINARY``): their ``_bin`` collations
    pad, so ``"a"`` and ``"a "`` would be one key. Elsewhere it is a string.
    """

    impl = sa.String(200)
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.VARBINARY(800))
        return dialect.type_descriptor(sa.String(200))

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> Any:
        if value is not None and dialect.name in ("mysql", "mariadb"):
            return value.encode("utf-8")
        return value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> str | None:
        return exact_key_text(value)


def exact_key_text(value: Any) -> str | None:
    """An :class:`ExactKey` as read, as text: MySQL/MariaDB hand it over as
    bytes (also to novaque's driver path, which has no SQLAlchemy type)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8")
    return value  # type: ignore[no-any-return]


# Bodies up to Options.max_body_bytes (1 MiB by default): BLOB is 64 KiB on MySQL.
Body = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
# SQLite only makes INTEGER PRIMARY KEY an alias of the rowid.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Micros = sa.BigInteger  # microseconds since the Unix epoch, UTC

_mysql_table: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}

#: PostgreSQL's autovacuum settings of the tables that turn over whole (the
#: deliveries, the messages): vacuum after a number of dead row versions
#: whatever the table's size, unthrottled (migration 0012 says why each value).
QUEUE_AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": 0,
    "autovacuum_vacuum_threshold": 5000,
    "autovacuum_vacuum_insert_scale_factor": 0,
    "autovacuum_vacuum_insert_threshold": 20000,
    "autovacuum_vacuum_cost_delay": 0,
    "autovacuum_analyze_scale_factor": 0,
    "autovacuum_analyze_threshold": 10000,
}

#: Where the foreign keys of ``novaque_messages.topic_id`` and
#: ``novaque_deliveries.message_id`` and ``channel_id`` exist: not on
#: PostgreSQL, whose per-row trigger checks cost half of a publish (migration
#: 0006 says how novaque's writes hold the parent rows there instead).
ENGINE_CHECKED = frozenset({"sqlite", "mysql", "mariadb"})


_Item = TypeVar("_Item", bound="sa.Constraint | sa.Index")


def _only_on(item: _Item, names: frozenset[str]) -> _Item:
    """``item`` created only on the databases ``names`` (by create_all), and
    compared only there (:func:`exists_on`)."""
    item.info["novaque_dialects"] = names
    # A sequence of names works (SQLAlchemy tests "dialect.name in names"); its stub says str.
    item.ddl_if(dialect=sorted(names))  # type: ignore[arg-type]  # (sets it on item)
    return item


def _engine_checked_fk(column: str, parent: sa.Column[Any]) -> sa.ForeignKeyConstraint:
    return _only_on(sa.ForeignKeyConstraint([column], [parent], ondelete="CASCADE"), ENGINE_CHECKED)


def exists_on(item: Any, dialect_name: str) -> bool:
    """Whether a schema item of the metadata exists on a database of ``dialect_name``
    (what create_all makes, and what the migrations and ``alembic check`` compare)."""
    only = getattr(item, "info", {}).get("novaque_dialects")
    return only is None or dialect_name in only


topics = sa.Table(
    "novaque_topics",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", Name, nullable=False),
    sa.Column("created_at", Micros, nullable=False),
    sa.UniqueConstraint("name"),
    # Ids are never reused: a client holding a deleted topic's id must not
    # reach the next topic created.
    sqlite_autoincrement=True,
    **_mysql_table,
)

channels = sa.Table(
    "novaque_channels",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column(
        "topic_id", sa.Integer, sa.ForeignKey(topics.c.id, ondelete="CASCADE"), nullable=False
    ),
    sa.Column("name", Name, nullable=False),
    sa.Column("created_at", Micros, nullable=False),
    sa.Column("dead_max_age", Micros, nullable=True),  # microseconds
    sa.Column("dead_max_count", sa.Integer, nullable=True),
    # Channel settings: ordering, filter, lease, attempts; NULL: the client's default.
    sa.Column("ordering", sa.SmallInteger, nullable=False, server_default="0"),  # ORDERINGS
    sa.Column("filter_expr", sa.Text, nullable=True),  # CEL, NULL: every message
    sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("lease", Micros, nullable=True),  # microseconds
    sa.Column("max_attempts", sa.Integer, nullable=True),
    # Dead-letter retention; NULL: the client's default.
    sa.Column("dead_max_bytes", sa.BigInteger, nullable=True),
    sa.Column("dead_letter_expired", sa.Boolean, nullable=True),
    # Limits; NULL: unlimited. rate_count deliveries per rate_period
    # (microseconds) in windows aligned to the Unix epoch; rate_window (the
    # current window's start) and rate_used count what the window handed out.
    sa.Column("max_leased", sa.Integer, nullable=True),
    sa.Column("rate_count", sa.Integer, nullable=True),
    sa.Column("rate_period", Micros, nullable=True),
    sa.Column("group_max_leased", sa.Integer, nullable=True),
    sa.Column("rate_window", Micros, nullable=True),
    sa.Column("rate_used", sa.Integer, nullable=True),
    # The lowest and highest claim lane the channel's deliveries have had (0
    # and 0 until a message of another priority reaches it), widened in the
    # transaction that brings one and never narrowed: MariaDB's claim looks
    # for lanes between the two only, and with no probe of the claim index
    # when they are one.
    sa.Column("low_lane", sa.SmallInteger, nullable=False, server_default="0"),
    sa.Column("high_lane", sa.SmallInteger, nullable=False, server_default="0"),
    sa.UniqueConstraint("topic_id", "name"),
    sqlite_autoincrement=True,
    **_mysql_table,
)

messages = sa.Table(
    "novaque_messages",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("topic_id", sa.Integer, nullable=False),
    sa.Column("body", Body, nullable=False),
    sa.Column("headers", sa.Text, nullable=True),  # JSON object of str -> str, NULL when empty
    sa.Column("published_at", Micros, nullable=False),
    sa.Column("expires_at", Micros, nullable=False),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("dedup_key", ExactKey(), nullable=True),
    sa.Column("group_key", ExactKey(), nullable=True),  # publish(group=...)
    # publish(priority=...): -100..100, lower first.
    sa.Column("priority", sa.SmallInteger, nullable=False, server_default="0"),
    # The key's uniqueness: a constraint, or on PostgreSQL a partial unique
    # index, which messages without a key (nearly all) cost nothing.
    _only_on(sa.UniqueConstraint("topic_id", "dedup_key"), ENGINE_CHECKED),
    _only_on(
        sa.Index(
            "ix_novaque_messages_dedup_key",
            "topic_id",
            "dedup_key",
            unique=True,
            postgresql_where=sa.text("dedup_key IS NOT NULL"),
        ),
        frozenset({"postgresql"}),
    ),
    _engine_checked_fk("topic_id", topics.c.id),
    sa.Index(None, "topic_id", "published_at", "id"),
    sa.Index(None, "expires_at"),
    sqlite_autoincrement=True,
    postgresql_with=QUEUE_AUTOVACUUM,
    **_mysql_table,
)

deliveries = sa.Table(
    "novaque_deliveries",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("message_id", BigId, nullable=False),
    sa.Column("channel_id", sa.Integer, nullable=False),
    sa.Column("state", sa.SmallInteger, nullable=False),
    # ready: when due; leased: lease expiry; dead: DEAD_VISIBLE_AT;
    # deferred: DEFERRED_VISIBLE_AT
    sa.Column("visible_at", Micros, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("lease_token", sa.String(32), nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("dead_reason", sa.Text, nullable=True),
    sa.Column("died_at", Micros, nullable=True),
    # The delivery's ordering key in its channel: the message's group on a
    # group_fifo channel, "" (no group can be empty) on a strict_fifo one,
    # NULL when it waits for no one.
    sa.Column("group_key", ExactKey(), nullable=True),
    # The attempt id of the claim that holds the lease (claim(attempt_id=)).
    sa.Column("attempt_id", ExactKey(), nullable=True),
    # The claim's lane: the message's priority while the delivery can be
    # claimed (ready or leased); 0 while it is dead or deferred, so that those
    # lie in one range of lane 0 (their message keeps the priority, which
    # comes back with them).
    sa.Column("priority", sa.SmallInteger, nullable=False, server_default="0"),
    # claim: one index range per (channel, lane), ordered; dead and delayed
    # rows lie beyond "now" and cost nothing. Dead-letter listing reads the
    # tail of lane 0.
    _engine_checked_fk("message_id", messages.c.id),
    _engine_checked_fk("channel_id", channels.c.id),
    sa.Index(CLAIM_INDEX, "channel_id", "priority", "visible_at", "id"),
    # backlog counts and the lease reaper, without touching the table.
    sa.Index(STATE_INDEX, "channel_id", "state", "visible_at"),
    sa.Index(None, "message_id"),
    # the next delivery of a group, when its head leaves.
    # (Partial on PostgreSQL: the deliveries of unordered channels cost it nothing.)
    sa.Index(
        "ix_novaque_deliveries_group",
        "channel_id",
        "group_key",
        "id",
        postgresql_where=sa.text("group_key IS NOT NULL"),
    ),
    sqlite_autoincrement=True,
    postgresql_with=QUEUE_AUTOVACUUM,
    **_mysql_table,
)

#: One row per (channel, group) with live deliveries on an ordered channel:
#: the delivery at its head, the only one of the group in the claim's range.
#: Publishers lock the row, so two of them never both start a group.
groups = sa.Table(
    "novaque_groups",
    metadata,
    sa.Column(
        "channel_id",
        sa.Integer,
        sa.ForeignKey(channels.c.id, ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("group_key", ExactKey(), primary_key=True),
    sa.Column("head_id", BigId, nullable=False),
    **_mysql_table,
)

stats = sa.Table(
    "novaque_stats",
    metadata,
    sa.Column(
        "channel_id",
        sa.Integer,
        sa.ForeignKey(channels.c.id, ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("day", sa.Date, primary_key=True),  # UTC day
    sa.Column("published", sa.BigInteger, nullable=False),
    sa.Column("claimed", sa.BigInteger, nullable=False),
    sa.Column("acked", sa.BigInteger, nullable=False),
    sa.Column("requeued", sa.BigInteger, nullable=False),
    sa.Column("dead", sa.BigInteger, nullable=False),
    sa.Column("purged", sa.BigInteger, nullable=False),
    **_mysql_table,
)

#: The same counters per (channel, UTC minute), for the last 24 hours (live
#: throughput): ``minute`` is the minute's first microsecond since the Unix
#: epoch (a multiple of 60,000,000), like every other time column. The index
#: on ``minute`` serves the prune of rows older than a day.
minute_stats = sa.Table(
    "novaque_minute_stats",
    metadata,
    sa.Column(
        "channel_id",
        sa.Integer,
        sa.ForeignKey(channels.c.id, ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("minute", Micros, primary_key=True),
    sa.Column("published", sa.BigInteger, nullable=False),
    sa.Column("claimed", sa.BigInteger, nullable=False),
    sa.Column("acked", sa.BigInteger, nullable=False),
    sa.Column("requeued", sa.BigInteger, nullable=False),
    sa.Column("dead", sa.BigInteger, nullable=False),
    sa.Column("purged", sa.BigInteger, nullable=False),
    sa.Index(None, "minute"),
    **_mysql_table,
)

#: One row per running consumer (consumers online): registered at start,
#: refreshed every ``Options.consumer_heartbeat`` with its ``in_flight``,
#: deleted at shutdown; maintenance drops rows whose ``heartbeat_at`` is
#: older than three heartbeats (a process that died). ``topic`` and
#: ``channel`` are names, not ids: the row describes a process, and outlives
#: nothing but itself. Ids are never reused (a late heartbeat of a dropped
#: row must not refresh another consumer's).
consumers = sa.Table(
    "novaque_consumers",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("topic", Name, nullable=False),
    sa.Column("channel", Name, nullable=False),
    sa.Column("max_in_flight", sa.Integer, nullable=False),
    sa.Column("in_flight", sa.Integer, nullable=False),
    sa.Column("started_at", Micros, nullable=False),
    sa.Column("heartbeat_at", Micros, nullable=False),
    # the cleanup of the dead: a range of old heartbeats.
    sa.Index(None, "heartbeat_at"),
    sqlite_autoincrement=True,
    **_mysql_table,
)

#: One row per schedule (recurring publishes, ``Client.schedule``): its
#: definition (exactly one of ``cron``, a five-field expression evaluated in
#: ``timezone``, and ``every_us``, a period on a fixed grid), what each fire
#: publishes (``body``, ``headers`` as stored for messages, ``ttl_us`` and
#: ``max_attempts`` or None for the client's defaults at the fire), and its
#: state: ``next_fire_at``, ``last_fire_at`` (the scheduled time of the last
#: fire published, None before the first) and ``paused``. ``topic`` is a name:
#: the topic is looked up (created if missing) at each fire. The index on
#: ``next_fire_at`` serves the maintenance pass's search for due schedules.
schedules = sa.Table(
    "novaque_schedules",
    metadata,
    sa.Column("name", Name, primary_key=True),
    sa.Column("topic", Name, nullable=False),
    sa.Column("body", Body, nullable=False),
    sa.Column("headers", sa.Text, nullable=True),
    sa.Column("cron", sa.String(200), nullable=True),
    sa.Column("every_us", Micros, nullable=True),
    sa.Column("timezone", sa.String(64), nullable=False),
    sa.Column("ttl_us", Micros, nullable=True),
    sa.Column("max_attempts", sa.Integer, nullable=True),
    sa.Column("priority", sa.SmallInteger, nullable=False, server_default="0"),
    sa.Column("catch_up", sa.String(8), nullable=False),
    sa.Column("next_fire_at", Micros, nullable=False),
    sa.Column("last_fire_at", Micros, nullable=True),
    sa.Column("paused", sa.Boolean, nullable=False),
    sa.Index(None, "next_fire_at"),
    **_mysql_table,
)

#: Counter columns of :data:`stats`, in :class:`novaque.Counters` order.
COUNTER_COLUMNS = ("published", "claimed", "acked", "requeued", "dead", "purged")

#: Alembic's version table for novaque's own history.
VERSION_TABLE = "novaque_alembic_version"

#: The revision of novaque's schema, one row written by the migrations
#: themselves (from revision 0009 on): found whichever Alembic environment
#: ran them, and whatever its version table is named.
REVISION_TABLE = "novaque_schema"
