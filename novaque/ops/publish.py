"""Publishing: messages and their deliveries, one per channel of the topic."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from novaque import _filters, _validate, dialects
from novaque._stats import MINUTE_US, Tally
from novaque._tables import (
    ORDERINGS,
    PARKED_OFFSET,
    STATE_READY,
    Body,
    ExactKey,
    channels,
    deliveries,
    messages,
    minute_stats,
)
from novaque.dialects.base import core, plain_channel
from novaque.dialects.params import Link, PublishParams
from novaque.errors import DedupConflict, TopicGone
from novaque.ops import Effects, _groups, _sql
from novaque.ops.maintain import stats_rows
from novaque.ops.topology import topic_id_in

#: Largest batch of bodies sent in one INSERT. PyMySQL sends bodies escaped
#: into the statement text (up to twice their size), and MariaDB's default
#: ``max_allowed_packet`` is 16 MiB: 4 MiB batches fit with room to spare.
INSERT_BATCH_BYTES = 4 * 1024 * 1024
INSERT_BATCH_ROWS = 1000


@dataclasses.dataclass(frozen=True)
class Published:
    """What a publish wrote: the message ids in order, the deliveries per channel,
    its time, how many messages were stored (a repeated dedup key stores none)
    and the topic's id if it was looked up (to cache once committed).

    ``routed``: the topic has routed channels (a filter, an ordering).
    ``declined``: it has, and the publish ran as one statement outside a
    transaction (``routed=False``): nothing was written; publish again with
    ``routed=True`` in a transaction. ``warnings``: filters that failed.
    ``filters``: the filters of the topic's channels as the publish read
    them (None: not read), to evaluate before the next publish to it.
    """

    ids: list[int]
    fanout: Counter[int]
    now: int
    stored: int
    learned_topic_id: int | None
    routed: bool = False
    declined: bool = False
    warnings: tuple[str, ...] = ()
    #: The topic's plan for its next publish (see
    #: :meth:`novaque.dialects.Dialect.publish_plain`), or None.
    plan: str | None = None
    filters: frozenset[str] | None = None

    def effects(self, topic: str) -> Effects:
        """After the commit: count the deliveries and wake local consumers, or
        warn that the topic has no channel."""
        tally = Tally()
        tally.add("published", self.now, self.fanout)
        return Effects(
            tally=tally,
            wake=(topic,) if self.fanout else (),
            topic_ids=() if self.learned_topic_id is None else ((topic, self.learned_topic_id),),
            no_channel=topic if not self.fanout and self.stored and not self.routed else None,
            warnings=self.warnings,
        )


def one_statement(bodies: Sequence[bytes], dedup_keys: Sequence[str | None]) -> bool:
    """Whether the bodies fit one INSERT batch with no dedup keys (so a dialect
    may publish them in one statement once the topic id is known)."""
    return (
        all(k is None for k in dedup_keys)
        and len(bodies) <= INSERT_BATCH_ROWS
        and sum(map(len, bodies)) <= INSERT_BATCH_BYTES
    )


def publish(
    link: Link,
    dialect: dialects.Dialect,
    now: int,
    *,
    topic: str,
    topic_id: int | None,
    bodies: Sequence[bytes],
    dedup_keys: Sequence[str | None],
    headers: str | None,
    ttl_us: int,
    delay_us: int,
    max_attempts: int,
    groups: Sequence[str | None] | None = None,
    priority: int = 0,
    routed: bool = True,
    verdicts: Verdicts | None = None,
    evaluate_here: bool = True,
    plan: str | None = None,
) -> Published:
    """Publish ``bodies`` to ``topic``; with ``topic_id`` None the id is read (the
    topic created if missing) in this transaction. ``routed=False``: see
    :attr:`Published.declined`. ``verdicts``: filters evaluated before the
    transaction (:func:`evaluate`); the others are evaluated in it, or with
    ``evaluate_here=False`` raise :class:`Unevaluated`. ``plan``: the one the
    last publish to the topic returned (:attr:`Published.plan`), if any.
    ``priority``: the messages' (0, the columns' default, unless given: a
    publish of another priority runs with ``routed=True``, and sets it on the
    messages it stored and their deliveries, :func:`prioritize`).

    On a :class:`~novaque.dialects.params.Driver` link (the executor's choice
    for ``op="publish_one"``: one message without dedup key or group, the
    topic id known, ``routed=False``) the dialect writes it in a transaction
    of its own."""
    learned = None
    keys = groups or [None] * len(bodies)
    if routed:
        conn = core(link)
        if topic_id is None:
            topic_id = learned = topic_id_in(conn, dialect, now, topic)
        elif any(k is not None for k in dedup_keys) and not dialect.hold_topic(conn, topic_id):
            # (Without dedup keys, publish_plain holds the topic itself.)
            raise TopicGone(topic)
        if priority:
            # Before the fan-out reads the channels (see widen_lanes).
            of_topic = channels.c.topic_id == topic_id
            _sql.widen_lanes(conn, dialect, of_topic, priority, priority)
        rows = [
            {
                "body": body,
                "headers": headers,
                "published_at": now,
                "expires_at": now + ttl_us,
                "max_attempts": max_attempts,
                "dedup_key": key,
                "group_key": group,
            }
            for body, key, group in zip(bodies, dedup_keys, keys, strict=True)
        ]
        written = _write_messages(conn, dialect, topic, topic_id, rows, now + delay_us)
        ids, fanout, fresh, special = written
        learned_plan = None
    else:
        # The caller's one-statement case (the topic id known, no dedup key,
        # one INSERT batch, priority 0): one call of the dialect, which may decline.
        assert topic_id is not None, "routed=False needs the topic id"
        assert not priority, "routed=False writes priority 0"
        fields = {
            "topic_id": topic_id,
            "headers": headers,
            "published_at": now,
            "expires_at": now + ttl_us,
            "max_attempts": max_attempts,
        }
        plain = dialect.publish_plain(
            link, PublishParams(topic, fields, bodies, now + delay_us, keys, False, plan)
        )
        ids = fresh = plain.ids
        fanout, special, learned_plan = Counter(plain.counts), plain.routed, plain.plan
    if special and not ids:
        return Published([], Counter(), now, 0, learned, routed=True, declined=True)
    warnings: list[str] = []
    filters = None if special else frozenset[str]()
    if special and fresh:
        group_of: dict[int, Any] = dict(zip(ids, keys, strict=True))
        routed_fanout, filters = _fan_out_routed(
            core(link),
            dialect,
            topic,
            topic_id,
            {i: group_of.get(i) for i in fresh},
            headers,
            now + delay_us,
            max_attempts,
            warnings,
            {} if verdicts is None else verdicts,
            evaluate_here,
        )
        fanout.update(routed_fanout)
    if priority and fresh:
        prioritize(core(link), fresh, priority)
    return Published(
        ids,
        fanout,
        now,
        len(fresh),
        learned,
        special,
        False,
        tuple(warnings),
        plan=learned_plan,
        filters=filters,
    )


_prioritize_messages = (
    sa.update(messages)
    .where(messages.c.id.in_(sa.bindparam("p_ids", expanding=True)))
    .values(priority=sa.bindparam("p_priority"))
)
_prioritize_deliveries = (
    sa.update(deliveries)
    .where(deliveries.c.message_id.in_(sa.bindparam("p_ids", expanding=True)))
    .values(priority=sa.bindparam("p_priority"))
)


def prioritize(conn: sa.Connection, message_ids: Sequence[int], priority: int) -> None:
    """Give messages just stored, and all their deliveries (their claim lane),
    a priority other than 0, in the transaction that wrote them."""
    params = {"p_ids": sorted(message_ids), "p_priority": priority}
    conn.execute(_prioritize_messages, params)
    conn.execute(_prioritize_deliveries, params)


#: The routed channels of a topic, read as the plain fan-out reads the plain
#: ones (:meth:`~novaque.dialects.Dialect.read_held`): the latest committed,
#: held until the transaction ends, even in a caller's REPEATABLE READ
#: transaction whose snapshot is older (MariaDB would read a filter or an
#: ordering as it was then; PostgreSQL would write to a channel deleted since).
_routed_channels = (
    sa.select(channels.c.id, channels.c.filter_expr, channels.c.max_attempts, channels.c.ordering)
    .where(channels.c.topic_id == sa.bindparam("p_topic_id"), ~plain_channel)
    .order_by(channels.c.id)
)


#: Filters' verdicts on the messages of one publish, by (filter, group): True,
#: False, or (failing closed) the text of the error.
Verdicts = dict[tuple[str, str | None], bool | str]


class Unevaluated(Exception):
    """A publish met filters that were not evaluated before its transaction
    (``evaluate_here=False``): raised there, so that the transaction rolls
    back instead of holding its locks while they are evaluated (on SQLite the
    database's write lock, which every writer of the file waits for).
    ``filters``: those of the topic's channels as the transaction read them;
    evaluate them (:func:`evaluate`) and publish again."""

    def __init__(self, filters: frozenset[str]) -> None:
        super().__init__(f"{len(filters)} filters to evaluate before the publish")
        self.filters = filters


def evaluate(
    filters: Iterable[str],
    headers: str | None,
    groups: Iterable[str | None],
    topic: str,
    verdicts: Verdicts | None = None,
) -> Verdicts:
    """``verdicts`` (a new dict if None) with the verdicts of ``filters`` on
    messages of ``topic`` with ``headers`` (as stored) and ``groups`` that it
    lacks. The messages of one publish share their headers and topic: a
    filter's verdict depends on the group alone."""
    found: Verdicts = {} if verdicts is None else verdicts
    decoded: dict[str, str] | None = None
    for text in filters:
        for group in set(groups):
            if (text, group) not in found:
                if decoded is None:
                    decoded = _validate.decode_headers(headers)
                found[(text, group)] = _filters.matches(text, decoded, group, topic)
    return found


def order_key(ordering: int, group: str | None) -> str | None:
    """A delivery's key in its channel's ordering (see novaque.ops._groups)."""
    if ordering == ORDERINGS["strict_fifo"]:
        return ""
    if ordering == ORDERINGS["group_fifo"]:
        return group
    return None


def _fan_out_routed(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    topic: str,
    topic_id: int,
    message_groups: dict[int, str | None],
    headers: str | None,
    visible: int,
    max_attempts: int,
    warnings: list[str],
    verdicts: Verdicts,
    evaluate_here: bool,
) -> tuple[Counter[int], frozenset[str]]:
    """The deliveries of the routed channels (a filter, an ordering) of messages
    ``message_groups`` (id: group): those whose filter takes the message
    (failing closed, the error added to ``warnings``), ordered in their
    groups; and the filters of those channels. ``verdicts``: the filters'
    verdicts evaluated before, the others added (``evaluate_here``) or
    :class:`Unevaluated` raised.

    The channels' settings are read here, in the transaction: a verdict is
    found by the filter's text, so one evaluated for a filter changed since
    is never used."""
    rows: list[dict[str, Any]] = []
    fanout: Counter[int] = Counter()
    found = conn.execute(dialect.read_held(_routed_channels), {"p_topic_id": topic_id}).all()
    filters = frozenset(expression for _, expression, _, _ in found if expression is not None)
    groups = set(message_groups.values())
    if evaluate_here:
        evaluate(filters, headers, groups, topic, verdicts)
    elif any((text, group) not in verdicts for text in filters for group in groups):
        raise Unevaluated(filters)
    warned: set[tuple[str, str | None]] = set()
    for channel_id, expression, budget, ordering in found:
        for message_id, group in message_groups.items():
            if expression is not None:
                verdict = verdicts[(expression, group)]
                if isinstance(verdict, str) and (expression, group) not in warned:
                    warned.add((expression, group))
                    warnings.append(f"channel {channel_id} of topic {topic}: {verdict}")
                if verdict is not True:
                    continue
            rows.append(
                {
                    "message_id": message_id,
                    "channel_id": channel_id,
                    "state": STATE_READY,
                    "visible_at": visible,
                    "attempts": 0,
                    "max_attempts": max_attempts if budget is None else budget,
                    "group_key": order_key(ordering, group),
                }
            )
            fanout[channel_id] += 1
    insert_deliveries(conn, dialect, rows)
    if rows:
        dialect.notify(conn, topic)
    return fanout, filters


def insert_deliveries(
    conn: sa.Connection, dialect: dialects.Dialect, rows: list[dict[str, Any]]
) -> None:
    """Insert delivery rows (with their ``group_key``): the ordered ones parked,
    each group's first new one its head if the group has none."""
    if not rows:
        return
    _groups.park(conn, rows)
    dialect.insert_delivery_rows(conn, rows)
    keyed: dict[int, list[int]] = {}
    for row in rows:
        if row["group_key"] is not None:
            keyed.setdefault(row["channel_id"], []).append(row["message_id"])
    members: list[_groups.Member] = []
    for channel_id, message_ids in sorted(keyed.items()):
        members += (
            (channel_id, str(key), int(first))
            for key, first in conn.execute(
                _new_heads, {"p_channel": channel_id, "p_ids": sorted(set(message_ids))}
            )
        )
    _groups.enter(conn, dialect, members)


# The lowest new delivery of each group of a channel, among messages p_ids.
_new_heads = (
    sa.select(deliveries.c.group_key, sa.func.min(deliveries.c.id))
    .where(
        deliveries.c.channel_id == sa.bindparam("p_channel"),
        deliveries.c.message_id.in_(sa.bindparam("p_ids", expanding=True)),
        deliveries.c.group_key.is_not(None),
        deliveries.c.state == STATE_READY,
        deliveries.c.visible_at >= PARKED_OFFSET,
    )
    .group_by(deliveries.c.group_key)
)


def count_here(conn: sa.Connection, dialect: dialects.Dialect, done: Published) -> None:
    """Write a publish's counters in ``conn``'s transaction (a database other than
    the client's own, whose buffer is for its own)."""
    if done.fanout:
        minute = done.now // MINUTE_US
        days, minutes = stats_rows({(c, minute): n for c, n in done.fanout.items()}, "published")
        dialect.upsert_stats(conn, days)
        dialect.upsert_stats(conn, minutes, minute_stats)


def _write_messages(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    topic: str,
    topic_id: int,
    rows: list[dict[str, Any]],
    visible: int,
) -> tuple[list[int], Counter[int], list[int], bool]:
    """Insert messages and their deliveries to plain channels, in a transaction
    that writes the routed ones next: the ids in order, the deliveries per
    channel, the ids of the messages stored (a repeated dedup key stores none),
    and whether the topic has routed channels.

    A dedup key held with another body, headers or group raises
    :class:`DedupConflict` and leaves nothing of the call written."""
    for row in rows:
        row["topic_id"] = topic_id
    if all(row["dedup_key"] is None for row in rows):
        fields = {k: v for k, v in rows[0].items() if k not in ("body", "dedup_key", "group_key")}
        new_ids: list[int] = []
        counts: Counter[int] = Counter()
        special = False
        for chunk in _chunks(list(range(len(rows))), rows):
            done = dialect.publish_plain(
                conn,
                PublishParams(
                    topic,
                    fields,
                    [rows[i]["body"] for i in chunk],
                    visible,
                    [rows[i]["group_key"] for i in chunk],
                ),
            )
            special = done.routed
            new_ids += done.ids
            counts.update(done.counts)
        return new_ids, counts, new_ids, special
    ids: dict[int, int] = {}  # row index: message id
    new_at: list[int] = []  # indexes of the rows really inserted
    # The keyed rows first: a conflict is found before anything else of the
    # call is written, and what it wrote so far (keyed messages without
    # deliveries) is deleted before raising, so a caller's transaction that
    # goes on holds nothing of the call.
    try:
        for i, row in enumerate(rows):
            if row["dedup_key"] is not None:
                ids[i], inserted = _insert_deduplicated(conn, dialect, row)
                if inserted:
                    new_at.append(i)
    except DedupConflict:
        if new_at:
            written = sorted(ids[i] for i in new_at)
            conn.execute(sa.delete(messages).where(messages.c.id.in_(written)))
        raise
    plain = [i for i, row in enumerate(rows) if row["dedup_key"] is None]
    for chunk in _chunks(plain, rows):
        for i, message_id in zip(
            chunk,
            dialect.insert_messages(conn, [rows[i] for i in chunk]),
            strict=True,
        ):
            ids[i] = message_id
            new_at.append(i)
    fresh = [ids[i] for i in sorted(new_at)]  # deliveries in the order of the bodies
    fanout: Counter[int] = Counter()
    special = False
    if fresh:
        counts_fresh, special = dialect.fan_out(
            conn, topic, topic_id, fresh, visible, rows[0]["max_attempts"]
        )
        fanout.update(counts_fresh)
    return [ids[i] for i in range(len(rows))], fanout, fresh, special


def _insert_deduplicated(
    conn: sa.Connection, dialect: dialects.Dialect, row: dict[str, Any]
) -> tuple[int, bool]:
    """Insert a message with a dedup key: its id and True, or the id of the
    message holding the key and False when that one has the same body, headers
    and group; raise :class:`DedupConflict` when it has not.

    The unique index decides (two publishers of one key at once: one inserts,
    the other waits for it to commit, then finds it); the holder is read with
    a locking read, which sees the latest committed row even when the
    caller's transaction is REPEATABLE READ (MySQL's default), whose snapshot
    may predate the winner's commit. Its body is compared in the database
    (bytes, exactly), its headers and group here (MySQL compares text by
    collation).
    """
    params = {"p_topic_id": row["topic_id"], "p_key": row["dedup_key"], "p_body": row["body"]}
    for _ in range(5):
        inserted = dialect.insert_deduplicated(conn, row)
        if inserted is not None:
            return inserted, True
        existing = conn.execute(_key_holder, params).one_or_none()
        if existing is not None:
            holder, same_body, stored_headers, group = existing
            if (
                not same_body
                or group != row["group_key"]
                or _untraced(stored_headers) != _untraced(row["headers"])
            ):
                raise DedupConflict(row["dedup_key"], int(holder))
            return int(holder), False
        # The holder of the key was purged in between: try the insert again.
    raise RuntimeError(f"could not settle dedup_key {row['dedup_key']!r}")  # pragma: no cover


#: Headers that carry a trace context (W3C Trace Context and Baggage), not a
#: message's content: novaque.otel adds them to each publish, so a publish
#: repeated from another trace (a retried request) must still find its key's
#: holder the same message.
TRACE_HEADERS = frozenset({"traceparent", "tracestate", "baggage"})


def _untraced(text: str | None) -> dict[str, str]:
    """Stored headers as compared for a dedup key: without the trace context."""
    return {
        key: value
        for key, value in _validate.decode_headers(text).items()
        if key.lower() not in TRACE_HEADERS
    }


#: The message holding a dedup key, whether its body is ``p_body``, its
#: headers and group: a locking read by the unique index (see above).
_key_holder = (
    sa.select(
        messages.c.id,
        sa.case((messages.c.body == sa.bindparam("p_body", type_=Body), 1), else_=0),
        messages.c.headers,
        messages.c.group_key,
    )
    .where(
        messages.c.topic_id == sa.bindparam("p_topic_id"),
        messages.c.dedup_key == sa.bindparam("p_key", type_=ExactKey()),
    )
    .with_for_update(read=True)
)


def _chunks(indexes: list[int], rows: list[dict[str, Any]]) -> Iterator[list[int]]:
    """Split row indexes into batches bounded in rows and in body bytes."""
    chunk: list[int] = []
    size = 0
    for i in indexes:
        length = len(rows[i]["body"])
        if chunk and (size + length > INSERT_BATCH_BYTES or len(chunk) >= INSERT_BATCH_ROWS):
            yield chunk
            chunk, size = [], 0
        chunk.append(i)
        size += length
    if chunk:
        yield chunk
