"""The schema's revision, recorded by novaque's migrations themselves.

Alembic keeps a history's revision in the version table of the environment
that runs it: ``novaque_alembic_version`` for ``novaque migrate``, but the
application's own table (whatever its ``version_table`` is named) when an
application runs novaque's migrations as a branch of its history. The client
could not find the revision there and took a migrated database for an empty
one.

``novaque_schema`` holds one row, the revision of novaque's schema, written
by the migrations: this one inserts it, and every later migration sets it in
its ``upgrade`` (to its own revision) and its ``downgrade`` (to the revision
it revises), so it is right whichever environment ran them. No other table is
touched. Downgrade drops the table; the revision is then read from the
version tables again, as before.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

MYSQL = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}


def upgrade() -> None:
    op.create_table(
        "novaque_schema",
        sa.Column("revision", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("revision", name="pk_novaque_schema"),
        **MYSQL,
    )
    op.execute(f"INSERT INTO novaque_schema (revision) VALUES ('{revision}')")


def downgrade() -> None:
    op.drop_table("novaque_schema")
