"""Ids never reused on SQLite; dedup keys compared exactly on MySQL/MariaDB.

- SQLite: ``novaque_topics`` and ``novaque_channels`` get ``AUTOINCREMENT``.
  Without it SQLite hands the id of a deleted last row to the next insert, so
  a consumer or publisher holding the id of a deleted channel or topic acted
  on whatever was created next (another topic's messages under the old name).
  SQLite cannot add ``AUTOINCREMENT`` to a table in place: both tables are
  rebuilt (copied, dropped, renamed), which needs ``PRAGMA foreign_keys=OFF``
  (dropping a parent table with foreign keys enforced deletes its children).
  ``client.migrate()`` and ``novaque migrate`` run SQLite migrations so; an
  application's own Alembic environment must do the same on SQLite.
- MySQL/MariaDB: ``novaque_messages.dedup_key`` becomes ``VARBINARY``. The
  ``utf8mb4_bin`` collation pads, so ``"order-1"`` and ``"order-1 "`` were one
  key; bytes compare exactly on every server version.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

NAME = sa.String(200)
KEY_TEXT = mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin")
KEY_BYTES = mysql.VARBINARY(800)  # 200 characters of up to 4 bytes in UTF-8


def _topics(name: str, autoincrement: bool) -> None:
    op.create_table(
        name,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", NAME, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_novaque_topics"),
        sa.UniqueConstraint("name", name="uq_novaque_topics_name"),
        sqlite_autoincrement=autoincrement,
    )


def _channels(name: str, autoincrement: bool) -> None:
    op.create_table(
        name,
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
        sqlite_autoincrement=autoincrement,
    )


_COLUMNS = {
    "novaque_topics": "id, name, created_at",
    "novaque_channels": "id, topic_id, name, created_at, dead_max_age, dead_max_count",
}


def _rebuild_sqlite(autoincrement: bool) -> None:
    if not op.get_context().as_sql:
        enforced = op.get_bind().exec_driver_sql("PRAGMA foreign_keys").scalar()
        if enforced:
            raise RuntimeError(
                "novaque's migration 0002 rebuilds two tables on SQLite and must run with "
                "PRAGMA foreign_keys=OFF (set it before the migration's transaction begins); "
                "`novaque migrate` and client.migrate() do so"
            )
    for table, create in (("novaque_topics", _topics), ("novaque_channels", _channels)):
        create(f"{table}_rebuilt", autoincrement)
        columns = _COLUMNS[table]
        op.execute(f"INSERT INTO {table}_rebuilt ({columns}) SELECT {columns} FROM {table}")
        op.drop_table(table)
        op.rename_table(f"{table}_rebuilt", table)


def _dedup_key_type(to: sa.types.TypeEngine[str], was: sa.types.TypeEngine[str]) -> None:
    op.alter_column(
        "novaque_messages", "dedup_key", type_=to, existing_type=was, existing_nullable=True
    )


def upgrade() -> None:
    name = op.get_context().dialect.name
    if name == "sqlite":
        _rebuild_sqlite(autoincrement=True)
    elif name in ("mysql", "mariadb"):
        _dedup_key_type(KEY_BYTES, KEY_TEXT)


def downgrade() -> None:
    name = op.get_context().dialect.name
    if name == "sqlite":
        _rebuild_sqlite(autoincrement=False)
    elif name in ("mysql", "mariadb"):
        # Fails with a duplicate key if two live keys differ only by trailing spaces.
        _dedup_key_type(KEY_TEXT, KEY_BYTES)
