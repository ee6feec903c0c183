"""PostgreSQL: the claim's pick in a function that always walks the claim index.

A claim takes the oldest due deliveries of one channel. The fast way is the
index ``ix_novaque_deliveries_claim (channel_id, visible_at, id)`` read in
order and left after a batch, whatever the backlog. PostgreSQL takes that
way only while its statistics tell it the channel holds many rows. When they
tell it "a row or two" (statistics taken while the table was empty: a
fresh deploy, a table just drained), a bitmap scan followed by a sort looks
as cheap, and that reads and sorts the channel's whole backlog on every
claim: 14 ms for a claim of 10 from 20,000 deliveries against 0.07 ms,
growing with the backlog, until autovacuum analyzes the table again (issue
13).

``novaque_claim_pick`` runs the pick with ``enable_sort = off``: a plan that
needs a sort is priced out, and the only one left that yields the order is
the claim index's range. It is PL/pgSQL so that its plan is kept for the
session, as a prepared statement's would be. It returns the ids it locked
(``FOR UPDATE SKIP LOCKED``), oldest first, none for a paused channel, and
leaves out ``p_skip`` (the deliveries being acked by the same statement).
It is declared ``ROWS 1``, as the planner estimated the subquery it
replaces, so the statement around it reaches the picked rows by their
primary key (the default of 1,000 rows, or even 10 with the same statistics,
made a hash join over the whole table look cheaper).

MySQL/MariaDB and SQLite need nothing: InnoDB's range estimates read the
index itself, and SQLite keeps no statistics unless asked. Downgrade drops
the function; no row is touched either way.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# The tables and columns as of this revision (a migration keeps its own SQL).
CREATE = """
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


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(CREATE)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION novaque_claim_pick(integer, bigint, integer, bigint[])")
