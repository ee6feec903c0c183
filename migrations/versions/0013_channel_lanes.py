"""The lanes a channel has had: ``low_lane`` and ``high_lane`` on channels.

A channel's deliveries lie in claim lanes, their messages' priorities
(migration 0011). ``low_lane`` and ``high_lane`` (SMALLINT, default 0) are
the lowest and highest lane its deliveries have had: a publish of a
priority other than 0, a dead letter moved in from another channel and a
replay widen them in their own transaction, before their deliveries are
written, and nothing narrows them. MariaDB's claim reads them with the
channel's lease: a channel whose two lanes are one (one that never saw a
priority other than 0) is claimed from its one range with no probe at all,
as before 0011; a channel of several probes the claim index for its lanes
between the two only.

Existing channels get the lanes of the messages they hold deliveries of
(dead and deferred ones included: they get their message's priority back
when they return). Downgrade drops the columns; no other row is touched.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

COLUMNS = ("low_lane", "high_lane")

# A channel's lowest and highest lane from its deliveries' messages, not past 0.
_FROM_DELIVERIES = """
UPDATE novaque_channels SET
    low_lane = coalesce((
        SELECT min(m.priority) FROM novaque_deliveries AS d
        JOIN novaque_messages AS m ON m.id = d.message_id
        WHERE d.channel_id = novaque_channels.id AND m.priority < 0), 0),
    high_lane = coalesce((
        SELECT max(m.priority) FROM novaque_deliveries AS d
        JOIN novaque_messages AS m ON m.id = d.message_id
        WHERE d.channel_id = novaque_channels.id AND m.priority > 0), 0)
"""


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column(
            "novaque_channels",
            sa.Column(name, sa.SmallInteger, nullable=False, server_default="0"),
        )
    op.execute(_FROM_DELIVERIES)
    op.execute(f"UPDATE novaque_schema SET revision = '{revision}'")


def downgrade() -> None:
    with op.batch_alter_table("novaque_channels") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
    op.execute(f"UPDATE novaque_schema SET revision = '{down_revision}'")
