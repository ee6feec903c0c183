"""PostgreSQL: an ordered ack in one call, its groups moved on inside it.

Acking deliveries of an ordered channel deletes them and, for each group
whose head left, makes the group's lowest parked delivery its new
head. Under READ COMMITTED the next deliveries must be read *after* the
groups' rows are locked, by a statement with a snapshot of its own: a
publisher that held a group's lock meanwhile may have added to it. So the
ack was two statements in a transaction of its own, four round trips with
BEGIN and COMMIT, and W7's drain (the consumer's ack-and-claim on a
group_fifo channel) paid five where W2's pays one.

``novaque_ack_ordered(p_ids, p_tokens)`` runs both statements on the server:
the DELETE of the deliveries still leased with their tokens, which also
locks (in (channel, group key) order, as every writer of groups does) the
rows of their groups; then, in a second statement of the function (PL/pgSQL
gives each a new snapshot under READ COMMITTED), the heads moved to the next
deliveries, these unparked, and the groups left empty dropped. It returns
the (id, token) pairs it deleted. One call is one statement for the client,
so it runs in autocommit: one round trip.

MySQL/MariaDB and SQLite keep their statements: no function is created
there. Downgrade drops the function; no row is touched either way.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# The tables, columns and constants as of this revision (a migration keeps its
# own SQL): state 0 is ready, and a parked delivery's visible_at carries 2**61.
CREATE = """
CREATE FUNCTION novaque_ack_ordered(p_ids bigint[], p_tokens text[])
RETURNS TABLE (acked_id bigint, acked_token text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ids bigint[];
    v_tokens text[];
    v_channels integer[];
    v_keys text[];
    v_moved integer;
BEGIN
    WITH acked AS (
        DELETE FROM novaque_deliveries AS d
        USING unnest(p_ids, p_tokens) AS a(id, token)
        WHERE d.id = a.id AND d.lease_token = a.token
        RETURNING d.id, d.lease_token, d.channel_id, d.group_key
    ), locked AS (
        SELECT g.channel_id, g.group_key, g.head_id FROM novaque_groups AS g
        WHERE (g.channel_id, g.group_key) IN (
            SELECT k.channel_id, k.group_key FROM acked AS k WHERE k.group_key IS NOT NULL)
        ORDER BY g.channel_id, g.group_key
        FOR UPDATE OF g
    )
    SELECT
        (SELECT array_agg(k.id ORDER BY k.id) FROM acked AS k),
        (SELECT array_agg(k.lease_token ORDER BY k.id) FROM acked AS k),
        (SELECT array_agg(l.channel_id ORDER BY l.channel_id, l.group_key) FROM locked AS l
         WHERE l.head_id IN (SELECT k.id FROM acked AS k)),
        (SELECT array_agg(l.group_key ORDER BY l.channel_id, l.group_key) FROM locked AS l
         WHERE l.head_id IN (SELECT k.id FROM acked AS k))
    INTO v_ids, v_tokens, v_channels, v_keys;

    IF v_channels IS NOT NULL THEN
        WITH nx AS (
            SELECT m.channel_id, m.group_key, (
                SELECT n.id FROM novaque_deliveries AS n
                WHERE n.channel_id = m.channel_id AND n.group_key = m.group_key
                  AND n.state + 0 = 0 AND n.visible_at + 0 >= 2305843009213693952
                ORDER BY n.id LIMIT 1
            ) AS next_id
            FROM unnest(v_channels, v_keys) AS m(channel_id, group_key)
        ), moved AS (
            UPDATE novaque_groups AS g SET head_id = nx.next_id FROM nx
            WHERE g.channel_id = nx.channel_id AND g.group_key = nx.group_key
              AND nx.next_id IS NOT NULL
            RETURNING g.group_key
        ), unparked AS (
            UPDATE novaque_deliveries AS u SET visible_at = u.visible_at - 2305843009213693952
            WHERE u.id IN (SELECT nx.next_id FROM nx WHERE nx.next_id IS NOT NULL)
              AND u.state = 0 AND u.visible_at >= 2305843009213693952
            RETURNING u.id
        ), dropped AS (
            DELETE FROM novaque_groups AS g USING nx
            WHERE g.channel_id = nx.channel_id AND g.group_key = nx.group_key
              AND nx.next_id IS NULL
            RETURNING g.group_key
        )
        SELECT count(*) INTO v_moved FROM moved;
    END IF;

    RETURN QUERY SELECT * FROM unnest(v_ids, v_tokens);
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
    op.execute("DROP FUNCTION novaque_ack_ordered(bigint[], text[])")
