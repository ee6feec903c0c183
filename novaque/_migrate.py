"""Applying novaque's Alembic migrations from code, and checking they were."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path

import alembic.context
import alembic.op
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from novaque.errors import SchemaOutOfDate
from novaque.schema import VERSION_TABLE

MIGRATE_HINT = "run `novaque migrate` (or client.migrate())"


def script_location() -> str:
    """The migration scripts: inside the installed package, or the source tree's."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return str(candidate)
    raise RuntimeError(f"novaque's migrations are missing (looked in {package})")


def config(connection: sa.Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", script_location())
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.lru_cache(maxsize=1)
def head() -> str:
    """The newest revision this version of novaque knows."""
    revision = ScriptDirectory.from_config(config()).get_current_head()
    assert revision is not None
    return revision


@functools.lru_cache(maxsize=1)
def known_revisions() -> frozenset[str]:
    return frozenset(s.revision for s in ScriptDirectory.from_config(config()).walk_revisions())


@contextlib.contextmanager
def _nested_alembic_safe() -> Iterator[None]:
    """Let an Alembic command run inside another one's ``env.py``.

    Alembic publishes the running environment as module globals of
    ``alembic.context`` and ``alembic.op`` and deletes them when a command
    ends. Run from an application's ``env.py`` (see the guide), novaque's
    command would delete the application's globals before its own command
    ends; keep a copy and put it back.
    """
    modules = [alembic.context, alembic.op]
    saved = [dict(vars(module)) for module in modules]
    try:
        yield
    finally:
        for module, before in zip(modules, saved, strict=True):
            vars(module).update(before)


def upgrade(connection: sa.Connection, to: str = "head") -> None:
    with _nested_alembic_safe():
        command.upgrade(config(connection), to)


def downgrade(connection: sa.Connection, to: str = "base") -> None:
    with _nested_alembic_safe():
        command.downgrade(config(connection), to)


def current(connection: sa.Connection) -> str | None:
    """The database's novaque revision, or None when never migrated."""
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    return connection.execute(
        sa.text(f"SELECT version_num FROM {VERSION_TABLE}")
    ).scalar_one_or_none()


def require_current(connection: sa.Connection) -> None:
    """Raise :class:`SchemaOutOfDate` unless the database is at :func:`head`."""
    try:
        revision = connection.execute(
            sa.text(f"SELECT version_num FROM {VERSION_TABLE}")
        ).scalar_one_or_none()
    except sa.exc.DBAPIError as exc:
        raise SchemaOutOfDate(
            f"novaque's tables are missing from this database: {MIGRATE_HINT}"
        ) from exc
    if revision == head():
        return
    if revision is None:
        raise SchemaOutOfDate(f"novaque's tables are missing from this database: {MIGRATE_HINT}")
    if revision not in known_revisions():
        raise SchemaOutOfDate(
            f"the database's novaque schema is at revision {revision!r}, which this "
            f"version of novaque does not know (newer library elsewhere?); it needs {head()!r}"
        )
    raise SchemaOutOfDate(
        f"the database's novaque schema is at revision {revision!r}, this version of "
        f"novaque needs {head()!r}: {MIGRATE_HINT}"
    )
