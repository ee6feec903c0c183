"""PostgreSQL: the claim's pick starts where its client's claim cursor says.

Every claim, ack and retry leaves a dead version of a delivery behind in the
claim index, at the ``visible_at`` it had. While any session holds a
snapshot open, vacuum cannot remove them, and a pick that reads the channel's
range from its first entry walks every one churned since that snapshot
began: its cost grows with time. ``novaque_claim_pick`` takes ``p_from``,
where its client's claim cursor says nothing due is left before (see the
client's ``novaque._claim_cursors``), and reads the range from there: the
dead versions before it are never visited.

It reads the cursor only for a channel of one lane and standard ordering: in
a channel of several lanes a claim that filled from a low lane never looked
at the others, and an ordered channel moves a group's next delivery back to
the time it was published; those are read from the first, as before. The
channel's lanes come from its row (``low_lane``, ``high_lane``: migration
0013) instead of a probe of the claim index, which walked the same dead
versions to find the lowest; a channel of several lanes still probes for
each lane, between the two.

No row is touched. Downgrade restores the function of 0011.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# The tables and columns as of this revision (a migration keeps its own SQL).
CREATE_PICK = """
CREATE FUNCTION novaque_claim_pick(
    p_channel integer, p_now bigint, p_limit integer, p_skip bigint[],
    p_held boolean DEFAULT false, p_from bigint DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE ROWS 1
SET enable_sort = off
AS $$
DECLARE
    lane smallint;
    top smallint;
    scan_from bigint;
    want integer := p_limit;
    got integer;
BEGIN
    SELECT c.low_lane, c.high_lane,
           coalesce(CASE WHEN c.ordering = 0 AND c.low_lane = c.high_lane THEN p_from END,
                    -4611686018427387904)
    INTO lane, top, scan_from
    FROM novaque_channels AS c
    WHERE c.id = p_channel AND NOT c.paused AND (p_held OR (
        c.max_leased IS NULL AND c.rate_count IS NULL AND c.group_max_leased IS NULL));
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF lane < top THEN
        SELECT min(d.priority) INTO lane FROM novaque_deliveries AS d
        WHERE d.channel_id = p_channel AND d.priority >= lane AND d.priority <= top;
    END IF;
    WHILE lane IS NOT NULL AND want > 0 LOOP
        RETURN QUERY
        SELECT d.id FROM novaque_deliveries AS d
        WHERE d.channel_id = p_channel AND d.priority = lane
          AND d.visible_at >= scan_from AND d.visible_at <= p_now
          AND d.attempts < d.max_attempts AND d.id <> ALL(p_skip)
        ORDER BY d.visible_at, d.id
        LIMIT want
        FOR UPDATE OF d SKIP LOCKED;
        GET DIAGNOSTICS got = ROW_COUNT;
        want := want - got;
        IF want > 0 AND lane < top THEN
            SELECT min(d.priority) INTO lane FROM novaque_deliveries AS d
            WHERE d.channel_id = p_channel AND d.priority > lane AND d.priority <= top;
        ELSE
            lane := NULL;
        END IF;
    END LOOP;
END
$$
"""

# 0011's function, for the downgrade.
CREATE_PICK_0011 = """
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


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION novaque_claim_pick(integer, bigint, integer, bigint[], boolean)")
        op.execute(CREATE_PICK)
    op.execute(f"UPDATE novaque_schema SET revision = '{revision}'")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "DROP FUNCTION novaque_claim_pick(integer, bigint, integer, bigint[], boolean, bigint)"
        )
        op.execute(CREATE_PICK_0011)
    op.execute(f"UPDATE novaque_schema SET revision = '{down_revision}'")
