"""Publishing: messages and their deliveries, one per channel of the topic."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from novaque import dialects
from novaque._stats import Tally
from novaque._time import day_of
from novaque.ops import Effects
from novaque.ops.maintain import stats_rows
from novaque.ops.topology import topic_id_in
from novaque.schema import messages

#: Largest batch of bodies sent in one INSERT. PyMySQL sends bodies escaped
#: into the statement text (up to twice their size), and MariaDB's default
#: ``max_allowed_packet`` is 16 MiB: 4 MiB batches fit with room to spare.
INSERT_BATCH_BYTES = 4 * 1024 * 1024
INSERT_BATCH_ROWS = 1000


@dataclasses.dataclass(frozen=True)
class Published:
    """What a publish wrote: the message ids in order, the deliveries per channel,
    its time, how many messages were stored (a repeated dedup key stores none)
    and the topic's id if it was looked up (to cache once committed)."""

    ids: list[int]
    fanout: Counter[int]
    now: int
    stored: int
    learned_topic_id: int | None

    def effects(self, topic: str) -> Effects:
        """After the commit: count the deliveries and wake local consumers, or
        warn that the topic has no channel."""
        tally = Tally()
        tally.add("published", day_of(self.now), self.fanout)
        return Effects(
            tally=tally,
            wake=(topic,) if self.fanout else (),
            topic_ids=() if self.learned_topic_id is None else ((topic, self.learned_topic_id),),
            no_channel=topic if not self.fanout and self.stored else None,
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
    conn: sa.Connection,
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
) -> Published:
    """Publish ``bodies`` to ``topic``; with ``topic_id`` None the id is read (the
    topic created if missing) in this transaction."""
    learned = None
    if topic_id is None:
        topic_id = learned = topic_id_in(conn, dialect, now, topic)
    rows = [
        {
            "body": body,
            "headers": headers,
            "published_at": now,
            "expires_at": now + ttl_us,
            "max_attempts": max_attempts,
            "dedup_key": key,
        }
        for body, key in zip(bodies, dedup_keys, strict=True)
    ]
    ids, fanout, stored = _write_messages(conn, dialect, topic, topic_id, rows, now + delay_us)
    return Published(ids, fanout, now, stored, learned)


def count_here(conn: sa.Connection, dialect: dialects.Dialect, done: Published) -> None:
    """Write a publish's counters in ``conn``'s transaction (a database other than
    the client's own, whose buffer is for its own)."""
    if done.fanout:
        dialect.upsert_stats(
            conn,
            stats_rows({(c, day_of(done.now)): n for c, n in done.fanout.items()}, "published"),
        )


def _write_messages(
    conn: sa.Connection,
    dialect: dialects.Dialect,
    topic: str,
    topic_id: int,
    rows: list[dict[str, Any]],
    visible: int,
) -> tuple[list[int], Counter[int], int]:
    """Insert messages and their deliveries: the ids in order, the deliveries per
    channel, and how many messages were stored (a repeated dedup key stores none)."""
    for row in rows:
        row["topic_id"] = topic_id
    if all(row["dedup_key"] is None for row in rows):
        fields = {k: v for k, v in rows[0].items() if k not in ("body", "dedup_key")}
        new_ids: list[int] = []
        counts: Counter[int] = Counter()
        for chunk in _chunks(list(range(len(rows))), rows):
            chunk_ids, chunk_counts = dialect.publish_plain(
                conn, topic, fields, [rows[i]["body"] for i in chunk], visible
            )
            new_ids += chunk_ids
            counts.update(chunk_counts)
        return new_ids, counts, len(new_ids)
    ids: list[int | None] = [None] * len(rows)
    fresh: list[int] = []  # ids of the messages really inserted
    plain = [i for i, row in enumerate(rows) if row["dedup_key"] is None]
    for chunk in _chunks(plain, rows):
        for i, message_id in zip(
            chunk,
            dialect.insert_messages(conn, [rows[i] for i in chunk]),
            strict=True,
        ):
            ids[i] = message_id
            fresh.append(message_id)
    for i, row in enumerate(rows):
        if row["dedup_key"] is not None:
            ids[i], inserted = _insert_deduplicated(conn, dialect, row)
            if inserted:
                fresh.append(ids[i])  # type: ignore[arg-type]
    fanout: Counter[int] = Counter()
    if fresh:
        fanout.update(
            dialect.fan_out(conn, topic, topic_id, fresh, visible, rows[0]["max_attempts"])
        )
    return [int(i) for i in ids if i is not None], fanout, len(fresh)


def _insert_deduplicated(
    conn: sa.Connection, dialect: dialects.Dialect, row: dict[str, Any]
) -> tuple[int, bool]:
    # A locking read sees the latest committed row even when the caller's
    # transaction is REPEATABLE READ (MySQL's default), whose snapshot may
    # predate the winner's commit.
    lookup = (
        sa.select(messages.c.id)
        .where(messages.c.topic_id == row["topic_id"], messages.c.dedup_key == row["dedup_key"])
        .with_for_update(read=True)
    )
    for _ in range(5):
        inserted = dialect.insert_deduplicated(conn, row)
        if inserted is not None:
            return inserted, True
        existing = conn.execute(lookup).scalar_one_or_none()
        if existing is not None:
            return int(existing), False
        # The holder of the key was purged in between: try the insert again.
    raise RuntimeError(f"could not settle dedup_key {row['dedup_key']!r}")  # pragma: no cover


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
