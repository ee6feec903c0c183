"""PostgreSQL: no foreign-key triggers on the publish path.

PostgreSQL checks a foreign key with a trigger per inserted row: on a
500-message publish to one channel, the checks of
``novaque_messages.topic_id``, ``novaque_deliveries.channel_id`` and
``novaque_deliveries.message_id`` took 16 of 31 ms of the statement (EXPLAIN
ANALYZE, issue 13). The three constraints are dropped on PostgreSQL;
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

MySQL/MariaDB and SQLite keep their foreign keys: InnoDB and SQLite check
them inside the storage engine, where they cost nothing measurable. No row
is touched. Downgrade adds the three constraints back.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

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


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, table, _, _ in DROPPED:
        op.drop_constraint(name, table, type_="foreignkey")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, table, column, parent in DROPPED:
        op.create_foreign_key(name, table, parent, [column], ["id"], ondelete="CASCADE")
