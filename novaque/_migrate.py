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
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

from novaque import dialects
from novaque._tables import REVISION_TABLE, VERSION_TABLE, metadata
from novaque.errors import SchemaOutOfDate

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext

MIGRATE_HINT = "run `novaque migrate` (or client.migrate())"

#: Alembic's default version table, where an application that runs novaque's
#: migrations as the ``novaque`` branch of its own history usually keeps them.
APP_VERSION_TABLE = "alembic_version"
BRANCH_HINT = "run `alembic upgrade heads` (novaque's migrations are a branch of your history)"
#: The first revision that writes :data:`~novaque._tables.REVISION_TABLE`.
REVISION_TABLE_SINCE = "0009"
#: The targets of ``migrate()`` that mean "the newest revision".
HEADS = frozenset({"head", "heads"})


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


def is_head(to: str) -> bool:
    return to in HEADS or to == head()


# -- which databases were found current (once per database per process) ----------

#: Databases (:func:`database_key`) whose schema this process found at
#: :func:`head`. A forked child (a Celery or gunicorn worker) keeps what its
#: parent found, which is the point; a migration run in this process updates
#: it (:func:`remember`, :func:`forget`).
_found_current: set[str] = set()


def database_key(url: sa.URL) -> str:
    """The database a URL points at: the same for every driver and password
    of it, and for a relative SQLite path and its absolute form."""
    database = url.database
    backend = url.get_backend_name()
    if backend == "sqlite" and database and not database.startswith((":memory:", "file:")):
        database = os.path.abspath(database)
    shown = url.set(drivername=backend, password=None, database=database)
    return shown.render_as_string(hide_password=True)


def remember(url: sa.URL) -> None:
    """The database at ``url`` was just migrated to :func:`head` (and committed)."""
    _found_current.add(database_key(url))


def forget(url: sa.URL | None = None) -> None:
    """Check the database at ``url`` (every database, without one) again."""
    if url is None:
        _found_current.clear()
    else:
        _found_current.discard(database_key(url))


@contextlib.contextmanager
def _nested_alembic_safe() -> Iterator[None]:
    """Let an Alembic command run inside another one's ``env.py``.

    Alembic publishes the running environment as module globals of
    ``alembic.context`` and ``alembic.op`` and deletes them when a command
    ends. Run from an application's ``env.py`` (docs/how-to/migrations.md), novaque's
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


# -- where a database's revision is recorded --------------------------------------


@dataclass
class Survey:
    """What a database holds of novaque's schema and of its revision."""

    #: The revision in :data:`~novaque._tables.REVISION_TABLE` (from 0009 on).
    marker: str | None = None
    #: The revision in novaque's own version table (``novaque migrate``).
    own: str | None = None
    #: novaque's tables in the database.
    tables: list[str] = field(default_factory=list)
    #: The other Alembic version tables and what they hold.
    versions: dict[str, list[str]] = field(default_factory=dict)

    def elsewhere(self) -> dict[str, str]:
        """novaque's revisions in other Alembic version tables (an application
        that runs novaque's migrations as a branch of its history), by table.

        Only while novaque's tables exist, so that an application revision that
        shares a name with one of novaque's is not taken for it.
        """
        if not self.tables:
            return {}
        known = known_revisions()
        found: dict[str, str] = {}
        for table, revisions in self.versions.items():
            ours = [revision for revision in revisions if revision in known]
            if len(ours) == 1:
                found[table] = ours[0]
        return found

    @property
    def revision(self) -> str | None:
        """novaque's revision, wherever it was found (None when nowhere, or
        when several version tables disagree)."""
        if self.marker is not None:
            return self.marker
        if self.own is not None:
            return self.own
        revisions = set(self.elsewhere().values())
        return revisions.pop() if len(revisions) == 1 else None

    @property
    def recorded_in(self) -> str:
        if self.marker is not None:
            return REVISION_TABLE
        if self.own is not None:
            return VERSION_TABLE
        return ", ".join(sorted(self.elsewhere()))

    @property
    def in_own_history(self) -> bool:
        """Whether ``novaque migrate`` (novaque's own version table) keeps the
        revision, rather than an application's Alembic history."""
        return self.own is not None or self.revision is None

    def problem(self) -> str | None:
        """Why a client cannot use this schema, and what to do; None when current."""
        revision = self.revision
        if revision == head():
            return None
        hint = MIGRATE_HINT if self.in_own_history else BRANCH_HINT
        if revision is None and not self.tables:
            # No chained driver error: "no such table" adds nothing to this.
            return f"novaque's tables are missing from this database: {MIGRATE_HINT}"
        if revision is None:
            return (
                f"novaque's tables are in this database ({len(self.tables)} of them), but no "
                f"table records their revision: {REVISION_TABLE} and {VERSION_TABLE} are "
                f"missing or empty, and {self._versions_text()}. If an Alembic environment "
                "of yours ran novaque's migrations, run `alembic upgrade heads` there: from "
                f"revision {REVISION_TABLE_SINCE} on they record their revision in "
                f"{REVISION_TABLE}, whatever the environment's version table"
            )
        at = (
            f"the database's novaque schema is at revision {revision!r} "
            f"(recorded in {self.recorded_in})"
        )
        if revision not in known_revisions():
            return (
                f"{at}, which this version of novaque does not know (newer library "
                f"elsewhere?); it needs {head()!r}"
            )
        return f"{at}, this version of novaque needs {head()!r}: {hint}"

    def _versions_text(self) -> str:
        if not self.versions:
            return "the database has no other Alembic version table"
        held = "; ".join(
            f"{table}: {', '.join(repr(r) for r in revisions[:5]) or 'empty'}"
            + (", ..." if len(revisions) > 5 else "")
            for table, revisions in sorted(self.versions.items())
        )
        return f"no Alembic version table holds exactly one of novaque's revisions ({held})"


def _values(connection: sa.Connection, table: str, column: str) -> list[str]:
    query: sa.Select[Any] = sa.select(sa.column(column)).select_from(sa.table(table))
    return sorted(str(value) for value in connection.execute(query).scalars())


def survey(connection: sa.Connection) -> Survey:
    """Look everywhere novaque's revision may be recorded.

    Runs no statement that can fail (it may run inside a migration's
    transaction); the other version tables are looked for (any table of the
    default schema with only Alembic's ``version_num`` column) only when
    neither of novaque's own records holds a revision.
    """
    inspector = sa.inspect(connection)
    names = set(inspector.get_table_names())
    found = Survey(tables=sorted(names & {table.name for table in metadata.sorted_tables}))
    if REVISION_TABLE in names:
        found.marker = next(iter(_values(connection, REVISION_TABLE, "revision")), None)
    if VERSION_TABLE in names:
        found.own = next(iter(_values(connection, VERSION_TABLE, "version_num")), None)
    if found.marker is None and found.own is None and found.tables:
        others = sorted(names - {VERSION_TABLE, REVISION_TABLE, *found.tables})
        columns = inspector.get_multi_columns(filter_names=others) if others else {}
        for (_, table), described in columns.items():
            if [column["name"] for column in described] == ["version_num"]:
                found.versions[table] = _values(connection, table, "version_num")
    return found


def current(connection: sa.Connection) -> str | None:
    """The database's novaque revision, or None when never migrated."""
    return survey(connection).revision


def _marker(connection: sa.Connection) -> str | None:
    """The revision in :data:`~novaque._tables.REVISION_TABLE` in one query, or
    None when the table is missing or empty (the connection's transaction, if
    the query failed, rolled back: PostgreSQL refuses more statements after it)."""
    try:
        return next(iter(_values(connection, REVISION_TABLE, "revision")), None)
    except sa.exc.DBAPIError as exc:
        if exc.connection_invalidated:
            raise
        if connection.in_transaction():
            connection.rollback()
        return None


def require_current(connection: sa.Connection) -> None:
    """Raise :class:`SchemaOutOfDate` unless the database is at :func:`head`.

    Once per database in a process: no query when this process found it
    current before, else one query on a database migrated from revision 0009
    on; an older one is surveyed (:func:`survey`).
    """
    key = database_key(connection.engine.url)
    if key in _found_current:
        return
    if _marker(connection) != head():
        problem = survey(connection).problem()
        if problem is not None:
            raise SchemaOutOfDate(problem)
    _found_current.add(key)


def is_current(connection: sa.Connection) -> bool:
    """Whether the database is at :func:`head` (:func:`require_current`'s check)."""
    try:
        require_current(connection)
    except SchemaOutOfDate:
        return False
    return True


def upgrade(connection: sa.Connection, to: str = "head") -> str | None:
    """Apply novaque's migrations up to ``to``; the revision the database was at.

    A database whose revision an application's Alembic history keeps (the
    ``version_locations`` recipe) is left to that history: running the
    scripts here would record them in a second version table and create the
    tables twice.
    """
    forget(connection.engine.url)
    found = survey(connection)
    if not found.in_own_history:
        if found.revision == head() and is_head(to):
            return found.revision
        raise SchemaOutOfDate(
            found.problem()
            or f"novaque's revision {found.revision!r} is kept by your Alembic history (in "
            f"{found.recorded_in}): move it with `alembic upgrade` or `alembic downgrade` "
            f"there, not with migrate(to={to!r})"
        )
    unknown = found.revision is not None and found.revision not in known_revisions()
    if unknown or (found.revision is None and found.tables):
        # A newer novaque's revision, or tables without one: no script of ours applies.
        raise SchemaOutOfDate(str(found.problem()))
    from alembic import command

    with _nested_alembic_safe():
        command.upgrade(config(connection), to)
    return found.revision


def upgrade_checked(connection: sa.Connection, to: str = "head") -> None:
    """Check the version floor, then upgrade under the migration lock.

    Commits what it ran when ``connection`` was not in a transaction before
    (as in an ``env.py`` after the application's own migrations).
    """
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

    forget(connection.engine.url)
    with _nested_alembic_safe():
        command.downgrade(config(connection), to)
