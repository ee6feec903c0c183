"""novaque's schema, for an application's Alembic environment.

The tables are declared once in SQLAlchemy Core (:mod:`novaque._tables`, whose
every name this module re-exports): Alembic migrations in the top-level
``migrations/`` folder create exactly this schema (a test compares them on
every backend). Times are stored as integer microseconds since the Unix epoch
(UTC): exact, comparable and identical on every backend, with no
naive-datetime or fractional-second pitfalls.

Applications with their own Alembic environment either add :data:`metadata`
to their ``target_metadata`` or keep novaque's tables out of their
autogenerate with :func:`include_object` (see docs/how-to/migrations.md); their ``env.py``
runs novaque's migrations with :func:`upgrade`, or lists
:func:`version_location` in its ``version_locations``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from novaque import _migrate
from novaque._migrate import AlembicEnvironment
from novaque._tables import (
    COUNTER_COLUMNS,
    DEAD_VISIBLE_AT,
    DEFERRED_VISIBLE_AT,
    ENGINE_CHECKED,
    ORDERINGS,
    PARKED_OFFSET,
    QUEUE_AUTOVACUUM,
    REVISION_TABLE,
    STATE_DEAD,
    STATE_DEFERRED,
    STATE_LEASED,
    STATE_READY,
    VERSION_TABLE,
    BigId,
    Body,
    ExactKey,
    Micros,
    Name,
    channels,
    consumers,
    deliveries,
    exact_key_text,
    exists_on,
    groups,
    messages,
    metadata,
    minute_stats,
    stats,
    topics,
)

#: Every name of :mod:`novaque._tables`, and the hooks of an Alembic ``env.py``.
__all__ = [
    "COUNTER_COLUMNS",
    "DEAD_VISIBLE_AT",
    "DEFERRED_VISIBLE_AT",
    "ENGINE_CHECKED",
    "ORDERINGS",
    "PARKED_OFFSET",
    "QUEUE_AUTOVACUUM",
    "REVISION_TABLE",
    "STATE_DEAD",
    "STATE_DEFERRED",
    "STATE_LEASED",
    "STATE_READY",
    "VERSION_TABLE",
    "BigId",
    "Body",
    "ExactKey",
    "Micros",
    "Name",
    "channels",
    "consumers",
    "deliveries",
    "exact_key_text",
    "exists_on",
    "groups",
    "include_object",
    "messages",
    "metadata",
    "minute_stats",
    "stats",
    "topics",
    "upgrade",
    "version_location",
]


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic ``include_object`` hook that keeps novaque's tables out of an
    application's autogenerate (and its version table too).

    Pass it as ``context.configure(include_object=novaque.schema.include_object)``
    in the application's ``env.py``; chain it with an existing hook if needed.
    """
    table_name = (
        obj.table.name
        if type_ in ("column", "index", "unique_constraint", "foreign_key_constraint")
        else name
    )
    return not (table_name or "").startswith("novaque_")


def upgrade(target: sa.Connection | AlembicEnvironment, to: str = "head") -> None:
    """Apply novaque's migrations from an application's Alembic ``env.py``.

    Call ``novaque.schema.upgrade(context)`` (``context`` being ``from alembic
    import context``) after the application's own ``context.run_migrations()``,
    in the online and the offline branch alike: one ``alembic upgrade head``
    then brings both histories up to date, novaque's in its own version table
    ``novaque_alembic_version`` (see docs/how-to/migrations.md).

    - Only an ``upgrade`` command runs novaque's migrations; ``revision
      --autogenerate``, ``current``, ``check``, ``stamp``, ``history`` and
      ``downgrade`` run none of novaque's DDL.
    - Offline (``alembic upgrade head --sql``) novaque's DDL is written into
      the printed SQL, after the application's, and nothing touches a
      database.
    - Online it checks the database version floor, takes novaque's migration
      lock, and commits novaque's work.

    Given a :class:`~sqlalchemy.engine.Connection` instead (the older recipe),
    it applies the same rules while an Alembic command runs, and outside one
    it simply upgrades on that connection.
    """
    _migrate.upgrade_in_environment(target, to)


def version_location() -> str:
    """The folder of novaque's migration scripts, for ``version_locations``.

    An application that runs novaque's migrations as the ``novaque`` branch
    of its own Alembic history lists it in its ``version_locations``; from an
    installed novaque the same folder is the package resource
    ``novaque:migrations/versions`` (see docs/how-to/migrations.md).
    """
    return str(Path(_migrate.script_location()) / "versions")
