"""Priorities and limits.

Priorities: ``priority`` (SMALLINT, default 0) on messages, deliveries and
schedules. A delivery's ``priority`` is its claim *lane*: the message's
priority while the delivery can be claimed, 0 while it is dead or deferred
(so those stay one range of the index, and the message's priority comes back
with them). The claim index becomes ``(channel_id, priority, visible_at,
id)``: a claim takes the lanes in ascending order, each an index range of
due deliveries as before, and finds the next lane by one probe of the index
(the smallest priority above the last). A channel whose deliveries all have
priority 0 has one lane: the range it had.

Limits: ``max_leased``, ``rate_count`` and ``rate_period`` (microseconds),
``group_max_leased`` on channels, NULL for unlimited, and the rate window's
state (``rate_window``, its start, and ``rate_used``).

PostgreSQL's ``novaque_claim_pick`` (migration 0007) walks the lanes, and
takes nothing from a channel that has a limit unless ``p_held`` says the
caller holds the channel's row and asks for what fits (a limited channel's
claims take that row's lock first, so they count and lease one at a time).

Existing rows get priority 0 (the order they had); no channel gets a limit.
Downgrade drops the columns and restores the index and the function of 0007:
priorities and limits are lost, every row is kept.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

CLAIM_INDEX = "ix_novaque_deliveries_claim"

# The tables and columns as of this revision (a migration keeps its own SQL).
CREATE_PICK = """
CREATE FUNCTION novaque_claim_pick(
    p_channel integer, p_now bigint, p_limit integer, p_skip bigint[],
    p_held boolean DEFAULT false
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE ROWS 1
SET enable_sort = off
AS $$
DECLARE
    lane smallint;
    want integer := p_limit;
    got integer;
BEGIN
    IF EXISTS (
        SELECT 1 FROM novaque_channels AS c WHERE c.id = p_channel AND (c.paused OR (
            NOT p_held AND (c.max_leased IS NOT NULL OR c.rate_count IS NOT NULL
                            OR c.group_max_leased IS NOT NULL)))
    ) THEN
        RETURN;
    END IF;
    SELECT min(d.priority) INTO lane FROM novaque_deliveries AS d
    WHERE d.channel_id = p_channel;
    WHILE lane IS NOT NULL AND want > 0 LOOP
        RETURN QUERY
        SELECT d.id FROM novaque_deliveries AS d
        WHERE d.channel_id = p_channel AND d.priority = lane AND d.visible_at <= p_now
          AND d.attempts < d.max_attempts AND d.id <> ALL(p_skip)
        ORDER BY d.visible_at, d.id
        LIMIT want
        FOR UPDATE OF d SKIP LOCKED;
        GET DIAGNOSTICS got = ROW_COUNT;
        want := want - got;
        IF want > 0 THEN
            SELECT min(d.priority) INTO lane FROM novaque_deliveries AS d
            WHERE d.channel_id = p_channel AND d.priority > lane;
        END IF;
    END LOOP;
END
$$
"""

# 0007's function, for the downgrade.
CREATE_PICK_0007 = """
CREATE FUNCTION novaque_claim_pick(
    p_channel integer, p_now bigint, p_limit integer, p_skip bigint[]
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE ROWS 1
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    SELECT d.id FROM novaque_deliveries AS d
    WHERE d.channel_id = p_channel AND d.visible_at <= p_now
      AND d.attempts < d.max_attempts AND d.id <> ALL(p_skip)
      AND NOT EXISTS (
          SELECT 1 FROM novaque_channels AS c WHERE c.id = p_channel AND c.paused
      )
    ORDER BY d.visible_at, d.id
    LIMIT p_limit
    FOR UPDATE OF d SKIP LOCKED;
END
$$
"""

_LIMITS = (
    ("max_leased", sa.Integer),
    ("rate_count", sa.Integer),
    ("rate_period", sa.BigInteger),
    ("group_max_leased", sa.Integer),
    ("rate_window", sa.BigInteger),
    ("rate_used", sa.Integer),
)
_PRIORITIZED = ("novaque_messages", "novaque_deliveries", "novaque_schedules")


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    for table in _PRIORITIZED:
        op.add_column(
            table, sa.Column("priority", sa.SmallInteger, nullable=False, server_default="0")
        )
    for name, type_ in _LIMITS:
        op.add_column("novaque_channels", sa.Column(name, type_, nullable=True))
    op.drop_index(CLAIM_INDEX, table_name="novaque_deliveries")
    op.create_index(
        CLAIM_INDEX, "novaque_deliveries", ["channel_id", "priority", "visible_at", "id"]
    )
    if _postgresql():
        op.execute("DROP FUNCTION novaque_claim_pick(integer, bigint, integer, bigint[])")
        op.execute(CREATE_PICK)
    op.execute(f"UPDATE novaque_schema SET revision = '{revision}'")


def downgrade() -> None:
    if _postgresql():
        op.execute("DROP FUNCTION novaque_claim_pick(integer, bigint, integer, bigint[], boolean)")
        op.execute(CREATE_PICK_0007)
    op.drop_index(CLAIM_INDEX, table_name="novaque_deliveries")
    op.create_index(CLAIM_INDEX, "novaque_deliveries", ["channel_id", "visible_at", "id"])
    with op.batch_alter_table("novaque_channels") as batch:
        for name, _ in reversed(_LIMITS):
            batch.drop_column(name)
    for table in reversed(_PRIORITIZED):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("priority")
    op.execute(f"UPDATE novaque_schema SET revision = '{down_revision}'")
