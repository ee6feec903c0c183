"""PostgreSQL: no foreign-key triggers on the publish path, and partial indexes.

PostgreSQL checks a foreign key with a trigger per inserted row: on a
500-message publish to one channel, the checks of
``novaque_messages.topic_id``, ``novaque_deliveries.channel_id`` and
``novaque_deliveries.message_id`` took 16 of 31 ms of the statement (EXPLAIN
ANALYZE). The three constraints are dropped on PostgreSQL;
novaque's own writes hold what they held:

- every publish, replay, routed fan-out and dead-letter move holds the topic
  row ``FOR KEY SHARE`` (once per statement, where the constraint locked it
  once per row), and the one-statement publish holds each channel row it
  fans out to;
- ``delete_topic`` and ``delete_channel`` lock the topic row ``FOR UPDATE``
  before deleting anything, so a publish either commits first (and its rows
  are deleted with the rest) or waits and writes nothing to what is gone;
- a delivery of an existing message is only written by a replay, which
  locks the message row first, and every delete of messages (TTL purge,
  prune, ``delete_message``) locks them before deleting their deliveries:
  one waits for the other, and the second sees what the first committed.

Two indexes become partial on PostgreSQL, so that a message without a dedup
key and a delivery without an ordering key (nearly all of them) cost no
entry there: the unique ``(topic_id, dedup_key)`` (a constraint until now,
the index ``ix_novaque_messages_dedup_key`` ``WHERE dedup_key IS NOT NULL``
from here; dedup lookups name a key,
which the planner proves not null) and ``ix_novaque_deliveries_group``
(``WHERE group_key IS NOT NULL``).

MySQL/MariaDB and SQLite keep their foreign keys: InnoDB and SQLite check
them inside the storage engine, where they cost nothing measurable (and
SQLite could change the unique constraint only by rebuilding the table). No
row is touched. Downgrade adds the three constraints back and makes the two
indexes whole again.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

DROPPED = (
    ("fk_novaque_messages_topic_id", "novaque_messages", "topic_id", "novaque_topics"),
    ("fk_novaque_deliveries_message_id", "novaque_deliveries", "message_id", "novaque_messages"),
    ("fk_novaque_deliveries_channel_id", "novaque_deliveries", "channel_id", "novaque_channels"),
)


DEDUP = "uq_novaque_messages_topic_id_dedup_key"
#: The partial index's own name (one name for two kinds of object confuses
#: Alembic's comparison of the schema).
DEDUP_PARTIAL = "ix_novaque_messages_dedup_key"
GROUP = "ix_novaque_deliveries_group"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, table, _, _ in DROPPED:
        op.drop_constraint(name, table, type_="foreignkey")
    op.drop_constraint(DEDUP, "novaque_messages", type_="unique")
    op.create_index(
        DEDUP_PARTIAL,
        "novaque_messages",
        ["topic_id", "dedup_key"],
        unique=True,
        postgresql_where=sa.text("dedup_key IS NOT NULL"),
    )
    op.drop_index(GROUP, table_name="novaque_deliveries")
    op.create_index(
        GROUP,
        "novaque_deliveries",
        ["channel_id", "group_key", "id"],
        postgresql_where=sa.text("group_key IS NOT NULL"),
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index(GROUP, table_name="novaque_deliveries")
    op.create_index(GROUP, "novaque_deliveries", ["channel_id", "group_key", "id"])
    op.drop_index(DEDUP_PARTIAL, table_name="novaque_messages")
    op.create_unique_constraint(DEDUP, "novaque_messages", ["topic_id", "dedup_key"])
    for name, table, column, parent in DROPPED:
        op.create_foreign_key(name, table, parent, [column], ["id"], ondelete="CASCADE")
