"""Ordering, routing and flow control: channel settings, groups.

- ``novaque_channels`` gets its settings: ``ordering`` (0 standard, 1
  group_fifo, 2 strict_fifo), ``filter_expr`` (a CEL expression), ``paused``,
  ``lease`` (microseconds) and ``max_attempts``; NULL means the client's
  default. Existing channels become standard, unfiltered and running.
- ``novaque_messages.group_key``: the ordering key given at publish.
- ``novaque_deliveries.group_key``: the delivery's key in its channel (NULL
  for every delivery written before), with the index that finds a group's
  next delivery.
- ``novaque_groups``: the head delivery of each (channel, group) with live
  deliveries on an ordered channel.

Every change adds a column, an index or a table, so no table is rebuilt, on
SQLite either (``ADD COLUMN`` with a constant default, and ``DROP COLUMN``
since SQLite 3.35, novaque's floor). Every row written before survives.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

KEY = sa.String(200).with_variant(mysql.VARBINARY(800), "mysql", "mariadb")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
MYSQL = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}

_CHANNEL_SETTINGS = ("ordering", "filter_expr", "paused", "lease", "max_attempts")


def upgrade() -> None:
    op.add_column(
        "novaque_channels",
        sa.Column("ordering", sa.SmallInteger, nullable=False, server_default="0"),
    )
    op.add_column("novaque_channels", sa.Column("filter_expr", sa.Text, nullable=True))
    op.add_column(
        "novaque_channels",
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.add_column("novaque_channels", sa.Column("lease", sa.BigInteger, nullable=True))
    op.add_column("novaque_channels", sa.Column("max_attempts", sa.Integer, nullable=True))
    op.add_column("novaque_messages", sa.Column("group_key", KEY, nullable=True))
    op.add_column("novaque_deliveries", sa.Column("group_key", KEY, nullable=True))
    op.create_index(
        "ix_novaque_deliveries_group", "novaque_deliveries", ["channel_id", "group_key", "id"]
    )
    op.create_table(
        "novaque_groups",
        sa.Column("channel_id", sa.Integer, nullable=False),
        sa.Column("group_key", KEY, nullable=False),
        sa.Column("head_id", BIG_ID, nullable=False),
        sa.PrimaryKeyConstraint("channel_id", "group_key", name="pk_novaque_groups"),
        sa.ForeignKeyConstraint(
            ["channel_id"],
            ["novaque_channels.id"],
            name="fk_novaque_groups_channel_id",
            ondelete="CASCADE",
        ),
        **MYSQL,
    )


def downgrade() -> None:
    # Ordering promises end here: waiting (parked) deliveries become due at
    # their own time again, as every delivery of a standard channel is.
    op.execute(
        "UPDATE novaque_deliveries SET visible_at = visible_at - 2305843009213693952 "
        "WHERE state = 0 AND visible_at >= 2305843009213693952"
    )
    op.drop_table("novaque_groups")
    op.drop_index("ix_novaque_deliveries_group", table_name="novaque_deliveries")
    op.drop_column("novaque_deliveries", "group_key")
    op.drop_column("novaque_messages", "group_key")
    for column in reversed(_CHANNEL_SETTINGS):
        op.drop_column("novaque_channels", column)
