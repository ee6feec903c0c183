"""novaque's initial schema: topics, channels, messages, deliveries, stats.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = ("novaque",)
depends_on = None

NAME = sa.String(200).with_variant(
    mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)
BODY = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
MYSQL = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}


def upgrade() -> None:
    op.create_table(
        "novaque_topics",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", NAME, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_novaque_topics"),
        sa.UniqueConstraint("name", name="uq_novaque_topics_name"),
        **MYSQL,
    )
    op.create_table(
        "novaque_channels",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("topic_id", sa.Integer, nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("dead_max_age", sa.BigInteger, nullable=True),
        sa.Column("dead_max_count", sa.Integer, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_novaque_channels"),
        sa.ForeignKeyConstraint(
            ["topic_id"],
            ["novaque_topics.id"],
            name="fk_novaque_channels_topic_id",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("topic_id", "name", name="uq_novaque_channels_topic_id_name"),
        **MYSQL,
    )
    op.create_table(
        "novaque_messages",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("topic_id", sa.Integer, nullable=False),
        sa.Column("body", BODY, nullable=False),
        sa.Column("headers", sa.Text, nullable=True),
        sa.Column("published_at", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("dedup_key", NAME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_novaque_messages"),
        sa.ForeignKeyConstraint(
            ["topic_id"],
            ["novaque_topics.id"],
            name="fk_novaque_messages_topic_id",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("topic_id", "dedup_key", name="uq_novaque_messages_topic_id_dedup_key"),
        sqlite_autoincrement=True,
        **MYSQL,
    )
    op.create_index(
        "ix_novaque_messages_topic_id_published_at_id",
        "novaque_messages",
        ["topic_id", "published_at", "id"],
    )
    op.create_index("ix_novaque_messages_expires_at", "novaque_messages", ["expires_at"])
    op.create_table(
        "novaque_deliveries",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("message_id", BIG_ID, nullable=False),
        sa.Column("channel_id", sa.Integer, nullable=False),
        sa.Column("state", sa.SmallInteger, nullable=False),
        sa.Column("visible_at", sa.BigInteger, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("lease_token", sa.String(32), nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("dead_reason", sa.Text, nullable=True),
        sa.Column("died_at", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_novaque_deliveries"),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["novaque_messages.id"],
            name="fk_novaque_deliveries_message_id",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["channel_id"],
            ["novaque_channels.id"],
            name="fk_novaque_deliveries_channel_id",
            ondelete="CASCADE",
        ),
        sqlite_autoincrement=True,
        **MYSQL,
    )
    op.create_index(
        "ix_novaque_deliveries_claim", "novaque_deliveries", ["channel_id", "visible_at", "id"]
    )
    op.create_index(
        "ix_novaque_deliveries_state", "novaque_deliveries", ["channel_id", "state", "visible_at"]
    )
    op.create_index("ix_novaque_deliveries_message_id", "novaque_deliveries", ["message_id"])
    op.create_table(
        "novaque_stats",
        sa.Column("channel_id", sa.Integer, nullable=False),
        sa.Column("day", sa.Date, nullable=False),
        sa.Column("published", sa.BigInteger, nullable=False),
        sa.Column("claimed", sa.BigInteger, nullable=False),
        sa.Column("acked", sa.BigInteger, nullable=False),
        sa.Column("requeued", sa.BigInteger, nullable=False),
        sa.Column("dead", sa.BigInteger, nullable=False),
        sa.Column("purged", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("channel_id", "day", name="pk_novaque_stats"),
        sa.ForeignKeyConstraint(
            ["channel_id"],
            ["novaque_channels.id"],
            name="fk_novaque_stats_channel_id",
            ondelete="CASCADE",
        ),
        **MYSQL,
    )


def downgrade() -> None:
    op.drop_table("novaque_stats")
    op.drop_table("novaque_deliveries")
    op.drop_table("novaque_messages")
    op.drop_table("novaque_channels")
    op.drop_table("novaque_topics")
