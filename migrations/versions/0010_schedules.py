"""Schedules: recurring publishes kept in the database.

``novaque_schedules``: one row per named schedule, its definition (a cron
expression with its time zone, or a period in microseconds; the topic, body,
headers, TTL and attempt budget of each fire; how missed fires are caught
up) and its state (``next_fire_at``, ``last_fire_at``, ``paused``), with an
index on ``next_fire_at`` for the maintenance pass that publishes due fires.
No other table is touched; downgrade drops the table (and the schedules).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

NAME = sa.String(200).with_variant(
    mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)
BODY = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
MYSQL = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}


def upgrade() -> None:
    op.create_table(
        "novaque_schedules",
        sa.Column("name", NAME, nullable=False),
        sa.Column("topic", NAME, nullable=False),
        sa.Column("body", BODY, nullable=False),
        sa.Column("headers", sa.Text, nullable=True),
        sa.Column("cron", sa.String(200), nullable=True),
        sa.Column("every_us", sa.BigInteger, nullable=True),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("ttl_us", sa.BigInteger, nullable=True),
        sa.Column("max_attempts", sa.Integer, nullable=True),
        sa.Column("catch_up", sa.String(8), nullable=False),
        sa.Column("next_fire_at", sa.BigInteger, nullable=False),
        sa.Column("last_fire_at", sa.BigInteger, nullable=True),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_novaque_schedules"),
        **MYSQL,
    )
    op.create_index("ix_novaque_schedules_next_fire_at", "novaque_schedules", ["next_fire_at"])
    op.execute(f"UPDATE novaque_schema SET revision = '{revision}'")


def downgrade() -> None:
    op.drop_index("ix_novaque_schedules_next_fire_at", table_name="novaque_schedules")
    op.drop_table("novaque_schedules")
    op.execute(f"UPDATE novaque_schema SET revision = '{down_revision}'")
