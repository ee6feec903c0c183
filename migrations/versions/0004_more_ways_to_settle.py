"""More ways to settle: deferred deliveries, idempotent claims,
dead letters on expiry and dead-letter bytes.

- ``novaque_deliveries.state`` may be 3 (deferred: set aside by ``defer``,
  ``visible_at`` 2**62 - 1, beyond every claim); no column change is needed.
- ``novaque_deliveries.attempt_id``: the ``claim(attempt_id=)`` that holds a
  lease (NULL for every lease taken without one, and every row written before).
- ``novaque_channels.dead_max_bytes`` and ``dead_letter_expired``: channel
  settings, NULL meaning the client's ``Options``.

Every change adds a nullable column, so no table is rebuilt and every row
written before survives.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

KEY = sa.String(200).with_variant(mysql.VARBINARY(800), "mysql", "mariadb")


def upgrade() -> None:
    op.add_column("novaque_channels", sa.Column("dead_max_bytes", sa.BigInteger, nullable=True))
    op.add_column("novaque_channels", sa.Column("dead_letter_expired", sa.Boolean, nullable=True))
    op.add_column("novaque_deliveries", sa.Column("attempt_id", KEY, nullable=True))


def downgrade() -> None:
    # 0003 knows no deferred state: deferred deliveries become ready at once,
    # outside any group (they had left theirs when they were deferred).
    op.execute(
        "UPDATE novaque_deliveries SET state = 0, visible_at = 0, group_key = NULL, "
        "lease_token = NULL WHERE state = 3"
    )
    op.drop_column("novaque_deliveries", "attempt_id")
    op.drop_column("novaque_channels", "dead_letter_expired")
    op.drop_column("novaque_channels", "dead_max_bytes")
