"""Applying novaque's Alembic migrations from code, and checking they were.

Alembic is imported only when migrations run (importing it costs about as
much as importing SQLAlchemy): checking a database's revision reads novaque's
tables with plain SQL, and the revisions this version of novaque knows come
from the scripts' own ``revision`` lines.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

from novaque.errors import SchemaOutOfDate
from novaque.schema import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext

MIGRATE_HINT = "run `novaque migrate` (or client.migrate())"

#: Alembic's default version table: where an application that runs novaque's
#: migrations as the ``novaque`` branch of its own history keeps their revision.
APP_VERSION_TABLE = "alembic_version"
BRANCH_HINT = "run `alembic upgrade heads` (novaque's migrations are a branch of your history)"


def script_location() -> str:
    """The migration scripts: inside the installed package, or the source tree's."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return str(candidate)
    raise RuntimeError(f"novaque's migrations are missing (looked in {package})")


def config(connection: sa.Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", script_location())
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


_ASSIGNED = re.compile(r"^(revision|down_revision)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)


@functools.lru_cache(maxsize=1)
def history() -> dict[str, tuple[str, ...]]:
    """Each revision of novaque's scripts and the revisions it revises.

    Read from the scripts' ``revision`` and ``down_revision`` lines (as
    Alembic writes them), without importing Alembic.
    """
    found: dict[str, tuple[str, ...]] = {}
    for path in sorted((Path(script_location()) / "versions").glob("*.py")):
        assigned = {
            name: ast.literal_eval(value)
            for name, value in _ASSIGNED.findall(path.read_text(encoding="utf-8"))
        }
        down = assigned.get("down_revision")
        found[str(assigned["revision"])] = (
            () if down is None else (down,) if isinstance(down, str) else tuple(down)
        )
    return found


@functools.lru_cache(maxsize=1)
def head() -> str:
    """The newest revision this version of novaque knows."""
    revised = {down for downs in history().values() for down in downs}
    (newest,) = set(history()) - revised
    return newest


def known_revisions() -> frozenset[str]:
    return frozenset(history())


@contextlib.contextmanager
def _nested_alembic_safe() -> Iterator[None]:
    """Let an Alembic command run inside another one's ``env.py``.

    Alembic publishes the running environment as module globals of
    ``alembic.context`` and ``alembic.op`` and deletes them when a command
    ends. Run from an application's ``env.py`` (see the guide), novaque's
    command would delete the application's globals before its own command
    ends; keep a copy and put it back.
    """
    import alembic.context
    import alembic.op

    modules = [alembic.context, alembic.op]
    saved = [dict(vars(module)) for module in modules]
    try:
        yield
    finally:
        for module, before in zip(modules, saved, strict=True):
            vars(module).update(before)


def upgrade(connection: sa.Connection, to: str = "head") -> None:
    branch = branch_revision(connection)
    if branch is not None:
        # Applied as a branch of the application's own history (the
        # ``version_locations`` recipe): novaque's version table is empty, and
        # running the scripts again would create the tables twice.
        if branch == head() and to in ("head", "heads", head()):
            return
        raise SchemaOutOfDate(
            f"the application's {APP_VERSION_TABLE} holds novaque's revision {branch!r}, "
            f"this version of novaque needs {head()!r}: {BRANCH_HINT}"
        )
    from alembic import command

    with _nested_alembic_safe():
        command.upgrade(config(connection), to)


def upgrade_checked(connection: sa.Connection, to: str = "head") -> None:
    """Check the version floor, then upgrade under the migration lock.

    Commits what it ran when ``connection`` was not in a transaction before
    (as in an ``env.py`` after the application's own migrations).
    """
    from novaque import dialects

    began = not connection.in_transaction()
    dialect = dialects.class_for(connection)
    try:
        dialect.check_floor(connection)
        with dialect.migration_lock(connection):
            upgrade(connection, to)
    except BaseException:
        if began and connection.in_transaction():
            connection.rollback()
        raise
    if began and connection.in_transaction():
        connection.commit()


class AlembicEnvironment(Protocol):
    """What ``from alembic import context`` in an ``env.py`` offers (or an
    :class:`alembic.runtime.environment.EnvironmentContext`)."""

    def get_context(self) -> MigrationContext: ...


def running_context() -> MigrationContext | None:
    """The migration context of the Alembic command running now, if any."""
    import alembic.context

    try:
        migration_context: MigrationContext = alembic.context.get_context()
    except NameError:  # Alembic's proxy is not set up: no command is running
        return None
    return migration_context


def is_upgrade(migration_context: MigrationContext) -> bool:
    """Whether the running Alembic command is an ``upgrade`` (online or ``--sql``).

    ``alembic.command`` hands the environment the function it runs: named
    ``upgrade`` for the upgrade command; ``current``, ``check``, ``stamp``,
    ``downgrade``, ``history`` and ``revision --autogenerate`` pass others.
    """
    environment = migration_context.environment_context
    fn = environment.context_opts.get("fn") if environment is not None else None
    return getattr(fn, "__name__", None) == "upgrade"


def upgrade_in_environment(target: sa.Connection | AlembicEnvironment, to: str = "head") -> None:
    """:func:`novaque.schema.upgrade`: see there."""
    if isinstance(target, sa.Connection):
        migration_context = running_context()
        connection: sa.Connection | None = target
    else:
        migration_context = target.get_context()
        connection = migration_context.connection
    if migration_context is not None:
        if not is_upgrade(migration_context):
            return  # autogenerate, current, check, stamp, downgrade: no DDL
        if migration_context.as_sql:
            upgrade_offline(migration_context, to)
            return
    if connection is None:
        raise TypeError("novaque.schema.upgrade needs a connection or a configured Alembic context")
    upgrade_checked(connection, to)


def upgrade_offline(migration_context: MigrationContext, to: str = "head") -> None:
    """Write novaque's migrations as SQL into the running offline (``--sql``) output.

    Nothing touches a database: the script starts from novaque's base, since
    offline mode cannot know which revision a database is at.
    """
    cfg = config()
    offline: dict[str, Any] = {
        "dialect_name": migration_context.dialect.name,
        "output_buffer": migration_context.output_buffer,
    }
    cfg.attributes["offline"] = offline
    from alembic import command

    with _nested_alembic_safe():
        command.upgrade(cfg, to, sql=True)


def downgrade(connection: sa.Connection, to: str = "base") -> None:
    from alembic import command

    with _nested_alembic_safe():
        command.downgrade(config(connection), to)


def _own_revision(connection: sa.Connection) -> str | None:
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    return connection.execute(
        sa.text(f"SELECT version_num FROM {VERSION_TABLE}")
    ).scalar_one_or_none()


def branch_revision(connection: sa.Connection) -> str | None:
    """novaque's revision in the application's ``alembic_version``, when the
    application applies novaque's migrations as its ``novaque`` branch.

    Only when novaque's own version table is missing or empty and novaque's
    tables exist, so an application revision that happens to share a name
    with one of novaque's is not taken for it.
    """
    inspector = sa.inspect(connection)
    if _own_revision(connection) is not None or not inspector.has_table(APP_VERSION_TABLE):
        return None
    rows = connection.execute(sa.text(f"SELECT version_num FROM {APP_VERSION_TABLE}")).scalars()
    ours: list[str] = [revision for revision in rows if revision in known_revisions()]
    if not ours or not inspector.has_table("novaque_topics"):
        return None
    return ours[0]


def current(connection: sa.Connection) -> str | None:
    """The database's novaque revision, or None when never migrated."""
    return _own_revision(connection) or branch_revision(connection)


def require_current(connection: sa.Connection) -> None:
    """Raise :class:`SchemaOutOfDate` unless the database is at :func:`head`.

    One query when novaque's own version table is current; the application's
    ``alembic_version`` is looked at only when that table is missing or empty.
    """
    hint = MIGRATE_HINT
    try:
        revision = connection.execute(
            sa.text(f"SELECT version_num FROM {VERSION_TABLE}")
        ).scalar_one_or_none()
    except sa.exc.DBAPIError:
        revision = None
    if revision is None:
        if connection.in_transaction():
            connection.rollback()  # PostgreSQL refuses more statements after the error
        revision = branch_revision(connection)
        hint = BRANCH_HINT
    if revision == head():
        return
    if revision is None:
        # No chained driver error: "no such table" adds nothing to this.
        raise SchemaOutOfDate(f"novaque's tables are missing from this database: {MIGRATE_HINT}")
    if revision not in known_revisions():
        raise SchemaOutOfDate(
            f"the database's novaque schema is at revision {revision!r}, which this "
            f"version of novaque does not know (newer library elsewhere?); it needs {head()!r}"
        )
    raise SchemaOutOfDate(
        f"the database's novaque schema is at revision {revision!r}, this version of "
        f"novaque needs {head()!r}: {hint}"
    )
