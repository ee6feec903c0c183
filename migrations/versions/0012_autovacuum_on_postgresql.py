"""PostgreSQL: autovacuum settings of the queue tables' own.

A queue table turns over whole: every delivery is inserted, updated at each
claim and deleted at its ack, so its dead row versions pile up as fast as
messages flow, while the live rows stay few. PostgreSQL's defaults vacuum a
table once its dead rows pass 20 % of its size (``scale_factor`` 0.2) and
throttle the vacuum to spare the disk (``cost_delay`` 2 ms per 200 pages):
a backlog of a million deliveries then waits for 200,000 dead versions
before any vacuum, and a vacuum that sleeps falls behind a busy queue. Every
claim walks the dead versions left in the claim index's range until a vacuum
removes them (once no snapshot older than them is held), so they cost time
on the hot path.

For ``novaque_deliveries`` and ``novaque_messages``:

- ``autovacuum_vacuum_scale_factor = 0`` and ``autovacuum_vacuum_threshold =
  5000``: vacuum after 5,000 dead versions whatever the size (at 300
  messages a second, about every 8 seconds of deliveries); the cost of a
  vacuum is the pages it visits, which the few live rows keep small.
- ``autovacuum_vacuum_insert_scale_factor = 0`` and
  ``autovacuum_vacuum_insert_threshold = 20000``: a backlog that only grows
  is vacuumed too, which sets the visibility map that the backlog counts'
  index-only scans read.
- ``autovacuum_vacuum_cost_delay = 0``: vacuum these tables unthrottled; a
  pass over a queue's small heap ends sooner than its sleeps would.
- ``autovacuum_analyze_scale_factor = 0`` and
  ``autovacuum_analyze_threshold = 10000``: statistics that follow a table
  whose size swings (the claim's plan does not depend on them: migration
  0007; the operator's queries do).

MySQL/MariaDB purge and SQLite reuse pages on their own: nothing is set
there. Downgrade resets the settings to the server's; no row is touched.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TABLES = ("novaque_deliveries", "novaque_messages")
SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "5000",
    "autovacuum_vacuum_insert_scale_factor": "0",
    "autovacuum_vacuum_insert_threshold": "20000",
    "autovacuum_vacuum_cost_delay": "0",
    "autovacuum_analyze_scale_factor": "0",
    "autovacuum_analyze_threshold": "10000",
}


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    if _postgresql():
        values = ", ".join(f"{name} = {value}" for name, value in SETTINGS.items())
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} SET ({values})")
    op.execute(f"UPDATE novaque_schema SET revision = '{revision}'")


def downgrade() -> None:
    if _postgresql():
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} RESET ({', '.join(SETTINGS)})")
    op.execute(f"UPDATE novaque_schema SET revision = '{down_revision}'")
