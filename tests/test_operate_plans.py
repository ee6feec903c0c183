"""Query plans: claim, dead-letter pages and backlog counts use their index on every backend.

The planner is asked about a channel among many, with statistics gathered, so
a table scan would be a real choice it could make. Plan text differs per
backend; the checks look for the index name and for the usual markers of a
full scan of ``novaque_deliveries``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque import _operator_calls
from novaque._time import to_us
from novaque.ops import _sql
from novaque.schema import (
    DEAD_VISIBLE_AT,
    STATE_DEAD,
    STATE_LEASED,
    STATE_READY,
    channels,
    deliveries,
    messages,
)
from novaque.testing import FakeClock
from tests.conftest import Backend

CHANNELS = 20
MESSAGES = 200

# Full scans of the deliveries table, as each backend prints them.
FULL_SCAN = re.compile(
    r"Seq Scan on novaque_deliveries"  # PostgreSQL
    r"|table=novaque_deliveries .*type=ALL"  # MySQL/MariaDB
    r"|^SCAN novaque_deliveries"  # SQLite (SEARCH is a range, SCAN is everything)
)


def load(client: novaque.Client, now: int, *, lanes: bool = False) -> int:
    """A topic with many channels and mixed states (``lanes``: its live
    deliveries in five priorities); return one channel's id."""
    for i in range(CHANNELS):
        client.ensure_channel("plans", f"c{i}")
    ids = client.publish_many("plans", [b"x"] * MESSAGES)
    with client._context.executor.engine.begin() as conn:
        channel_ids = [
            int(r[0]) for r in conn.execute(sa.select(deliveries.c.channel_id).distinct())
        ]
        conn.execute(sa.delete(deliveries))
        rows: list[dict[str, Any]] = []
        for cid in channel_ids:
            for n, mid in enumerate(ids):
                state, visible, died = STATE_READY, now - 1, None
                if n % 10 < 2:
                    visible = now + 3_600_000_000  # delayed
                elif n % 10 == 2:
                    state, visible = STATE_LEASED, now + 30_000_000
                elif n % 10 == 3:
                    state, visible, died = STATE_DEAD, DEAD_VISIBLE_AT, now - n
                rows.append(
                    {
                        "message_id": mid,
                        "channel_id": cid,
                        "state": state,
                        "visible_at": visible,
                        "attempts": 1 if state != STATE_READY else 0,
                        "max_attempts": 5,
                        "dead_reason": "rejected" if died else None,
                        "died_at": died,
                        "priority": n % 5 - 2 if lanes and not died else 0,
                    }
                )
        conn.execute(sa.insert(deliveries), rows)
        if lanes:
            for n, mid in enumerate(ids):
                conn.execute(
                    sa.update(messages).where(messages.c.id == mid).values(priority=n % 5 - 2)
                )
            # The channels' lanes, as the publishes of those priorities widen them.
            conn.execute(sa.update(channels).values(low_lane=-2, high_lane=2))
    analyze(client)
    return channel_ids[len(channel_ids) // 2]


def analyze(client: novaque.Client) -> None:
    """Gather planner statistics (and, on PostgreSQL, the visibility map)."""
    engine = client._context.executor.engine
    name = engine.dialect.name
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if name == "postgresql":
            conn.exec_driver_sql("VACUUM ANALYZE novaque_deliveries")
            conn.exec_driver_sql("VACUUM ANALYZE novaque_messages")
        elif name in ("mysql", "mariadb"):
            conn.exec_driver_sql("ANALYZE TABLE novaque_deliveries, novaque_messages").all()
        else:
            conn.exec_driver_sql("ANALYZE")


def plan_of(client: novaque.Client, stmt: sa.Executable, params: dict[str, Any]) -> str:
    with client._context.executor.engine.connect() as conn:
        return client._context.dialect.explain(conn, stmt, params)


def claim_params(channel_id: int, now: int) -> dict[str, Any]:
    """The claim statement's parameters: 10 deliveries of a channel, leased 30 s."""
    return {
        "p_channel": channel_id,
        "p_now": now,
        "p_limit": 10,
        "p_until": now + 30_000_000,
        "p_token": "0" * 32,
    }


def check(plan: str, index: str) -> None:
    # MySQL/MariaDB list every candidate index (possible_keys): only the one
    # chosen (key=) counts.
    assert index in re.sub(r"possible_keys=\S*", "", plan), plan
    scans = [line for line in plan.splitlines() if FULL_SCAN.search(line.strip())]
    assert not scans, plan


def check_claim(client: novaque.Client, channel_id: int, now: int, most: int = 34) -> None:
    """The claim reads its channel's range of the claim index.

    On PostgreSQL the pick is the function ``novaque_claim_pick`` (migration
    0007), whose plan EXPLAIN does not show: there the pick must run on few
    buffers (the probe of the lowest lane, a batch of the index and its
    rows; not the backlog's pages).
    """
    plan = plan_of(client, client._context.dialect.claim_statement(), claim_params(channel_id, now))
    if client._context.executor.engine.dialect.name != "postgresql":
        check(plan, "ix_novaque_deliveries_claim")
        return
    check(plan, "novaque_claim_pick")
    pick = "novaque_claim_pick(:c, :now, 10, CAST('{}' AS BIGINT[]))"
    args = {"c": channel_id, "now": now}
    with client._context.executor.engine.connect() as conn:
        conn.execute(sa.text(f"SELECT count(*) FROM {pick}"), args)  # compiles the function
        conn.rollback()
        rows = conn.execute(sa.text(f"EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM {pick}"), args)
        plan = "\n".join(str(r[0]) for r in rows)
        conn.rollback()
    found = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
    buffers = int(found.group(1)) + int(found.group(2) or 0) if found else 0
    assert 0 < buffers <= most, plan


@pytest.mark.parametrize(
    "query", ["claim", "list_dead", "backlog", "dead_bytes", "dead_bytes_boundary"]
)
def test_query_uses_its_index(backend: Backend, clock: FakeClock, query: str) -> None:
    client = backend.client(clock=clock)
    now = to_us(clock())
    channel_id = load(client, now)
    if query == "claim":
        check_claim(client, channel_id, now)
        return
    if query == "list_dead":
        stmt = _operator_calls.DEAD_PAGE
        params = {"p_channel": channel_id, "p_after": 0, "p_limit": 100}
        index = "ix_novaque_deliveries_claim"
    elif query.startswith("dead_bytes"):  # dead-letter bytes: the channel's dead range
        stmt = getattr(_sql, "_" + query)
        params = {"p_channel": channel_id, "p_max": 10}
        index = "ix_novaque_deliveries_claim"
    else:
        stmt = _operator_calls.BACKLOG
        params = {"p_channel": channel_id, "p_now": now}
        index = "ix_novaque_deliveries_state"
    check(plan_of(client, stmt, params), index)
    # The statement is the one the client runs: it still answers correctly.
    if query == "backlog":
        backlog = client.channel_backlog("plans", f"c{CHANNELS // 2}")
        assert backlog.total == MESSAGES


def test_a_claim_across_priority_lanes_reads_each_lanes_range(
    backend: Backend, clock: FakeClock
) -> None:
    """With five priorities in play the claim still reads index ranges: a
    probe and a range per lane it takes from, never the channel's backlog."""
    client = backend.client(clock=clock)
    now = to_us(clock())
    channel_id = load(client, now, lanes=True)
    check_claim(client, channel_id, now, most=60)
    claimed = client.claim("plans", f"c{CHANNELS // 2}", max_messages=10)
    assert [m.priority for m in claimed] == sorted(m.priority for m in claimed)
    assert claimed[0].priority == -2


def test_explain_reports_the_plan_of_a_messages_query(
    backend: Backend, client: novaque.Client
) -> None:
    message_id = client.publish("t", b"x")
    stmt = sa.select(messages.c.body).where(messages.c.id == sa.bindparam("p_id"))
    plan = plan_of(client, stmt, {"p_id": message_id})
    assert "novaque_messages" in plan or "PRIMARY" in plan or "pk_novaque_messages" in plan


def test_group_fifo_claim_and_next_of_group_use_their_index(
    backend: Backend, clock: FakeClock
) -> None:
    """A group FIFO channel with 2,000 deliveries waiting behind 100 heads: the
    claim still reads one range of its index (the waiting ones lie beyond every
    claim's range), and a head's successor is found on the group index."""
    from novaque.ops import _groups

    client = backend.client(clock=clock)
    now = to_us(clock())
    for i in range(4):
        client.ensure_channel("ordered", f"c{i}", ordering="group_fifo" if i % 2 else None)
    groups = [f"g{n % 100}" for n in range(2100)]
    client.publish_many("ordered", [b"x"] * len(groups), groups=groups)
    analyze(client)
    with client._context.executor.engine.connect() as conn:
        channel_id = int(
            conn.execute(sa.text("SELECT id FROM novaque_channels WHERE name = 'c1'")).scalar_one()
        )
    check_claim(client, channel_id, now)
    check(
        plan_of(client, _groups._next, {"p_channel": channel_id, "p_key": "g7"}),
        "ix_novaque_deliveries_group",
    )
    # A head given back looks below itself in its group on the same index.
    below = {"p_channel": channel_id, "p_key": "g7", "p_below": 2**62}
    check(plan_of(client, _groups._next_below, below), "ix_novaque_deliveries_group")
    # Where an ack moves heads without a statement of the dialect's own: the
    # groups' new heads are found on the group index too, never by a scan.
    check(
        plan_of(client, _groups._next_as_head, {"p_channel": channel_id, "p_keys": ["g7", "g8"]}),
        "ix_novaque_deliveries_group",
    )
    # The plan's statement is the one the client runs: 100 heads, one per group.
    got = client.claim("ordered", "c1", max_messages=1000)
    assert sorted(m.group for m in got) == sorted({*groups})
    assert client.channel_backlog("ordered", "c1") == novaque.Backlog(ready=2000, in_flight=100)


def test_a_groups_next_delivery_is_found_on_its_index_whatever_the_statistics(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Statistics taken while the table was empty, then 8,000 deliveries over
    400 groups of a group FIFO channel: an ack's head move still finds each
    group's next delivery on the group index. On MariaDB such statistics made
    the planner read the channel's range of the claim index and sort it, for
    each group of each batch (65 ms a statement against under 1 ms)."""
    from novaque.ops import _groups

    client = novaque.Client(
        backend.engine(backend.scratch_url(tmp_path)), novaque.Options(clock=clock)
    )
    backend.clients.append(client)
    client.migrate()  # a new database: no statistics of any earlier test
    client.ensure_channel("stale", "c", ordering="group_fifo")
    analyze(client)
    keys = [f"g{n % 400}" for n in range(8000)]
    client.publish_many("stale", [b"x" * 200] * len(keys), groups=keys)
    channel_id = client._topology.channel_id("stale", "c")
    for stmt in (_groups._nexts, _groups._next_as_head):
        plan = plan_of(client, stmt, {"p_channel": channel_id, "p_keys": ["g7", "g8"]})
        check(plan, "ix_novaque_deliveries_group")
    # The statements are the ones an ack runs: the group's next one is its head.
    [msg] = [m for m in client.claim("stale", "c", max_messages=400) if m.group == "g7"]
    client.ack(msg)
    [head] = [m for m in client.claim("stale", "c", max_messages=10) if m.group == "g7"]
    assert head.id > msg.id


@pytest.mark.parametrize("query", ["oldest_dead", "dead_chunk_died_before"])
def test_redrive_reads_use_the_dead_range(backend: Backend, clock: FakeClock, query: str) -> None:
    """requeue_dead / delete_dead with limit and died_before read the channel's
    dead range of the claim index, never the table."""
    from novaque.ops import _sql

    client = backend.client(clock=clock)
    now = to_us(clock())
    channel_id = load(client, now)
    params: dict[str, Any] = {"p_channel": channel_id, "p_before": now - 50, "p_limit": 100}
    if query == "oldest_dead":
        stmt: sa.Executable = _sql.OLDEST_DEAD[True]
    else:
        stmt = _sql.DEAD_CHUNKS[(False, True)]
        params["p_after"] = 0
    check(plan_of(client, stmt, params), "ix_novaque_deliveries_claim")
    # The statements are the ones the client runs (the channel has 20 dead letters).
    assert client.requeue_dead("plans", f"c{CHANNELS // 2}", limit=3, died_before=clock()) == 3


def test_claim_reads_a_batch_whatever_the_statistics(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Statistics taken while the table was empty (a fresh deploy), then a
    backlog of 8,000 in each of two channels: the claim still reads a batch of
    its index range, and again once the statistics are fresh. On PostgreSQL
    statistics of the empty table made the planner believe the channel held a
    row or two, and every claim read and sorted the channel's whole backlog
    (14 ms against 0.07 ms for 20,000) until autovacuum analyzed the table
    again; the pick has been a function since migration 0007."""
    client = novaque.Client(
        backend.engine(backend.scratch_url(tmp_path)), novaque.Options(clock=clock)
    )
    backend.clients.append(client)
    client.migrate()  # a new database: no statistics of any earlier test
    now = to_us(clock())
    client.ensure_channel("stats", "c")
    client.ensure_channel("stats", "d")
    analyze(client)
    ids = client.publish_many("stats", [b"x" * 200] * 8000)
    with client._context.executor.engine.connect() as conn:
        channel_id = int(
            conn.execute(sa.text("SELECT id FROM novaque_channels WHERE name = 'c'")).scalar_one()
        )
    check_claim(client, channel_id, now + 1)
    analyze(client)
    check_claim(client, channel_id, now + 1)
    # The statement is the one the client runs: the oldest batch.
    got = client.claim("stats", "c", max_messages=10)
    assert [m.id for m in got] == ids[:10]
    assert client.channel_backlog("stats", "c") == novaque.Backlog(ready=7990, in_flight=10)


@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_mariadbs_claim_reads_its_range_while_a_snapshot_keeps_dead_entries(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """3,000 deliveries claimed and acked while another session holds a
    snapshot open, then statistics taken: InnoDB's statistics count the 30
    live rows, its estimate of the claim's range the dead entries too. The
    claim block's pick still reads the range of its lane from the cursor
    (three columns of the claim index), not the lane from its first entry
    (two columns, the due time checked entry by entry): a locking read pays
    about a page access per dead entry, and W9 fell minutes behind. Its read
    of what it leased finds them by the state index's three columns, not by
    the channel in the claim index (1.9 ms a claim in W9's fifth minute, up
    to 10 ms, and growing)."""
    from novaque.dialects import mysql

    client = novaque.Client(
        backend.engine(backend.scratch_url(tmp_path)), novaque.Options(clock=clock)
    )
    backend.clients.append(client)
    client.migrate()  # a new database: no statistics of any earlier test
    client.ensure_channel("churn", "c")
    holder = client._context.executor.engine.raw_connection()
    try:
        cursor = holder.cursor()
        cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cursor.execute("SELECT count(*) FROM novaque_topics")
        cursor.fetchall()
        for _ in range(100):
            client.publish_many("churn", [b"x"] * 30)
            for _ in range(3):
                client.ack_many(client.claim("churn", "c", max_messages=10))
            clock.advance(0.1)
        waiting = client.publish_many("churn", [b"x"] * 30)
        analyze(client)
        now = to_us(clock())
        channel_id = client._topology.channel_id("churn", "c")
        params = {
            **claim_params(channel_id, now),
            "p_lane_at": 0,
            "p_scan_from": now - 2_000_000,
            "p_held": 0,
        }
        plan = plan_of(client, mysql.BLOCK_PICK, params)
        [pick] = [line for line in plan.splitlines() if "table=novaque_deliveries" in line]
        assert "key=ix_novaque_deliveries_claim" in pick, plan
        assert "type=range" in pick, plan
        # And the block's read of what it leased takes the state index by its
        # three columns, not the channel's whole claim index: here at the
        # expiry of the last round's leases, where their acked entries lie.
        leased = plan_of(
            client,
            mysql.BLOCK_LEASED,
            {**params, "p_lease_until": now - 100_000 + 30_000_000, "p_block_lease": None},
        )
        [read] = [line for line in leased.splitlines() if "table=novaque_deliveries" in line]
        assert "key=ix_novaque_deliveries_state" in read, leased
        assert "key_len=14" in read, leased
        # The statements are the ones the client runs: the oldest waiting batch.
        assert [m.id for m in client.claim("churn", "c", max_messages=10)] == waiting[:10]
    finally:
        holder.rollback()
        holder.close()
