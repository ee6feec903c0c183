"""Migration 0012: PostgreSQL's queue tables (deliveries, messages) get
autovacuum settings of their own, the ones the schema declares; downgrading
resets them to the server's. Elsewhere only ``novaque_schema`` moves. Live
rows are kept both ways."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from novaque.schema import QUEUE_AUTOVACUUM
from tests._migration_rows import rows
from tests.conftest import Backend
from tests.test_migration_0005 import _migrated_0004
from tests.test_migration_0009 import TABLES, _recorded

QUEUE_TABLES = ("novaque_deliveries", "novaque_messages")


def _settings(engine: sa.Engine) -> dict[str, dict[str, str]]:
    """The storage settings of the queue tables (PostgreSQL's reloptions)."""
    if engine.dialect.name != "postgresql":
        return {}
    with engine.connect() as conn:
        found = conn.execute(
            sa.text("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(:names)"),
            {"names": list(QUEUE_TABLES)},
        )
        return {
            name: dict(option.split("=", 1) for option in options or ()) for name, options in found
        }


def test_the_queue_tables_get_their_autovacuum_settings_and_lose_them_on_downgrade(
    backend: Backend, tmp_path: Path
) -> None:
    engine, client, _ = _migrated_0004(backend, tmp_path)
    client.migrate(to="0011")
    before = rows(engine, TABLES)
    expected = {name: str(value) for name, value in QUEUE_AUTOVACUUM.items()}

    client.migrate(to="0012")
    assert _recorded(engine) == ["0012"]
    assert rows(engine, TABLES) == before
    if backend.name == "postgres":
        assert _settings(engine) == dict.fromkeys(QUEUE_TABLES, expected)

    client.downgrade(to="0011")
    assert _recorded(engine) == ["0011"]
    assert rows(engine, TABLES) == before
    if backend.name == "postgres":
        assert _settings(engine) == {table: {} for table in QUEUE_TABLES}


def test_a_schema_made_from_the_metadata_has_the_same_settings(backend: Backend) -> None:
    """What the schema declares (an application's own Alembic environment or
    ``create_all``) and what the migration sets agree."""
    if backend.name != "postgres":
        return
    engine = backend.engine()
    expected = {name: str(value) for name, value in QUEUE_AUTOVACUUM.items()}
    assert _settings(engine) == dict.fromkeys(QUEUE_TABLES, expected)
