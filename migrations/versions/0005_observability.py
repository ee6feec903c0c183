"""Observability: minute counters and consumers online.

- ``novaque_minute_stats``: the six counters per (channel, UTC minute) for the
  last 24 hours; ``minute`` is the minute's first microsecond since the Unix
  epoch (a multiple of 60,000,000), indexed for the prune of old minutes.
- ``novaque_consumers``: one row per running consumer (host, pid, topic,
  channel, max_in_flight, in_flight, started_at, heartbeat_at), indexed on
  ``heartbeat_at`` for the cleanup of consumers that died.

Both tables are new: no row written before is touched. Downgrade drops them
(what they hold is at most a day of minute counts and who runs now).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

NAME = sa.String(200).with_variant(
    mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
MYSQL = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}
COUNTERS = ("published", "claimed", "acked", "requeued", "dead", "purged")


def upgrade() -> None:
    op.create_table(
        "novaque_minute_stats",
        sa.Column("channel_id", sa.Integer, nullable=False),
        sa.Column("minute", sa.BigInteger, nullable=False),
        *(sa.Column(name, sa.BigInteger, nullable=False) for name in COUNTERS),
        sa.PrimaryKeyConstraint("channel_id", "minute", name="pk_novaque_minute_stats"),
        sa.ForeignKeyConstraint(
            ["channel_id"],
            ["novaque_channels.id"],
            name="fk_novaque_minute_stats_channel_id",
            ondelete="CASCADE",
        ),
        **MYSQL,
    )
    op.create_index("ix_novaque_minute_stats_minute", "novaque_minute_stats", ["minute"])
    op.create_table(
        "novaque_consumers",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("topic", NAME, nullable=False),
        sa.Column("channel", NAME, nullable=False),
        sa.Column("max_in_flight", sa.Integer, nullable=False),
        sa.Column("in_flight", sa.Integer, nullable=False),
        sa.Column("started_at", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_novaque_consumers"),
        sqlite_autoincrement=True,
        **MYSQL,
    )
    op.create_index("ix_novaque_consumers_heartbeat_at", "novaque_consumers", ["heartbeat_at"])


def downgrade() -> None:
    op.drop_index("ix_novaque_consumers_heartbeat_at", table_name="novaque_consumers")
    op.drop_table("novaque_consumers")
    op.drop_index("ix_novaque_minute_stats_minute", table_name="novaque_minute_stats")
    op.drop_table("novaque_minute_stats")
