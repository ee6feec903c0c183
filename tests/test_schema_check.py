"""The schema check: once per database in a process (a forked worker keeps
what its parent found), updated by a migration in the process; migrate() on
an up-to-date schema runs nothing and logs nothing."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import novaque
from novaque import _migrate, schema
from tests import _twin
from tests.conftest import Backend, _twin_loop

pytestmark = pytest.mark.usefixtures("twin")

ROOT = Path(__file__).resolve().parent.parent
#: What a statement reading novaque's revision names: its revision table, or
#: an Alembic version table (novaque_alembic_version, alembic_version).
RECORDS = ("novaque_schema", "alembic_version")


def new_client(backend: Backend, url: str) -> novaque.Client:
    """A client of the running kind (sync or the asyncio twin) on ``url``."""
    if backend.twin == "aio":
        made_twin = _twin.make(backend.name, url, _twin_loop(), novaque.Options())
        backend.twins.append(made_twin)
        return made_twin  # type: ignore[return-value]  # the same surface
    made = novaque.Client(backend.engine(url))
    backend.clients.append(made)
    return made


@contextlib.contextmanager
def revision_reads() -> Iterator[list[str]]:
    """The statements of every engine of the process that read a revision record."""
    seen: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if any(name in statement for name in RECORDS):
            seen.append(statement)

    sa.event.listen(sa.Engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", before)


def migrated_elsewhere(backend: Backend, tmp_path: Path) -> str:
    """A database migrated by another process: this one has not seen it."""
    url = backend.scratch_url(tmp_path)
    code = "import sys, novaque; novaque.connect(sys.argv[1]).migrate()"
    subprocess.run([sys.executable, "-c", code, url], cwd=ROOT, check=True, timeout=120)
    return url


def test_the_schema_is_checked_once_per_database_in_a_process(
    backend: Backend, tmp_path: Path
) -> None:
    url = migrated_elsewhere(backend, tmp_path)
    with revision_reads() as seen:
        new_client(backend, url).list_topics()
        assert len(seen) == 1  # one statement reads the revision
        seen.clear()
        second = new_client(backend, url)
        second.ensure_channel("t", "c")
        second.publish("t", b"x")
        assert [m.body for m in second.claim("t", "c")] == [b"x"]
        assert seen == []


def test_migrate_on_an_up_to_date_schema_runs_and_logs_nothing(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = migrated_elsewhere(backend, tmp_path)
    caplog.set_level(logging.INFO)  # the root logger: Alembic's loggers included
    with revision_reads() as seen:
        new_client(backend, url).migrate()  # checks, once
        assert len(seen) == 1
        seen.clear()
        for _ in range(2):
            client = new_client(backend, url)
            client.migrate()
            client.list_topics()
        assert seen == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    assert "alembic" not in {r.name.split(".")[0] for r in caplog.records}


def test_a_migration_in_the_process_updates_what_it_knows(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = backend.scratch_url(tmp_path)
    caplog.set_level(logging.INFO, logger="novaque")
    new_client(backend, url).migrate()
    assert f"novaque schema migrated from base to {_migrate.head()}" in caplog.messages
    with revision_reads() as seen:
        new_client(backend, url).list_topics()
        assert seen == []  # the migration left it known current
    new_client(backend, url).downgrade("base")
    with pytest.raises(novaque.SchemaOutOfDate, match="novaque migrate"):
        new_client(backend, url).list_topics()
    new_client(backend, url).migrate(to="0008")
    with pytest.raises(novaque.SchemaOutOfDate, match="'0008'"):
        new_client(backend, url).list_topics()
    new_client(backend, url).migrate()
    assert new_client(backend, url).list_topics() == []


def test_a_schema_kept_in_an_applications_own_version_table_is_found(
    backend: Backend, tmp_path: Path
) -> None:
    """The rows an application's ``alembic upgrade heads`` leaves with
    ``version_table="app_alembic_version"`` (tests/test_alembic_app.py runs the
    real command): both clients accept them, and an older revision recorded
    there is named with the command that upgrades it."""
    url = backend.scratch_url(tmp_path)
    engine = backend.engine(url)
    novaque.Client(engine).migrate()
    with engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {schema.VERSION_TABLE}"))
        conn.execute(sa.text("CREATE TABLE app_alembic_version (version_num VARCHAR(32))"))
        conn.execute(
            sa.text("INSERT INTO app_alembic_version VALUES ('a1'), (:head)"),
            {"head": _migrate.head()},
        )
    _migrate.forget(engine.url)  # as in the application's processes
    client = new_client(backend, url)
    client.migrate()  # nothing to do, and nothing written
    assert client.list_topics() == []
    with engine.begin() as conn:  # the same, migrated by a novaque older than 0009
        conn.execute(sa.text(f"DROP TABLE {schema.REVISION_TABLE}"))
        conn.execute(
            sa.text("UPDATE app_alembic_version SET version_num = '0008' WHERE version_num <> 'a1'")
        )
    _migrate.forget(engine.url)
    with pytest.raises(
        novaque.SchemaOutOfDate,
        match=r"at revision '0008' \(recorded in app_alembic_version\).*`alembic upgrade heads`",
    ):
        new_client(backend, url).list_topics()
    with engine.connect() as conn:
        assert {
            table: conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in (schema.VERSION_TABLE, "app_alembic_version")
        } == {schema.VERSION_TABLE: 0, "app_alembic_version": 2}


@pytest.mark.sync_only  # a fork of the process that runs the twin's event loop
def test_a_forked_worker_keeps_what_its_parent_found(backend: Backend, tmp_path: Path) -> None:
    url = migrated_elsewhere(backend, tmp_path)
    new_client(backend, url).list_topics()  # the parent checks, before the fork
    context = multiprocessing.get_context("fork")
    reads = context.Queue()
    child = context.Process(target=_child, args=(url, reads))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert reads.get(timeout=10) == []


def _child(url: str, reads: Any) -> None:
    with revision_reads() as seen:
        engine = sa.create_engine(url)
        client = novaque.Client(engine)
        client.migrate()  # a Celery worker's start
        client.publish("t", b"x")
        engine.dispose()
    reads.put(seen)


def test_the_database_key_hides_the_password_and_the_driver() -> None:
    key = _migrate.database_key(sa.make_url("postgresql+psycopg://u:secret@db:5432/app"))
    assert "secret" not in key
    assert key == _migrate.database_key(sa.make_url("postgresql+asyncpg://u:other@db:5432/app"))
    assert key != _migrate.database_key(sa.make_url("postgresql://u@db:5432/other"))
    relative = _migrate.database_key(sa.make_url("sqlite:///app.db"))
    assert relative == _migrate.database_key(sa.make_url(f"sqlite:///{Path('app.db').resolve()}"))
